//! Window assignment: which windows a timestamp belongs to (tumbling, sliding), and session
//! windows that grow and merge as records arrive. Pure functions and one small state machine;
//! the window operator stores accumulators per window in keyed state and calls the guest's
//! aggregate to add and merge them.
//!
//! Timestamps come from input, so window bounds are computed with checked arithmetic: a record
//! whose window would start or end outside `i64` (within one window length of ±2^63 ms) is
//! assigned no window ([`WindowKind::assign`] returns `None`).

use serde::Deserialize;
use smallvec::SmallVec;

/// A window `[start, end)` in event time (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    /// First millisecond inside.
    pub start: i64,
    /// First millisecond after.
    pub end: i64,
}

impl Window {
    /// The last timestamp inside: the window fires once the watermark reaches it.
    pub fn max_timestamp(&self) -> i64 {
        self.end - 1
    }

    fn overlaps_or_touches(&self, other: &Window) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    fn cover(&self, other: &Window) -> Window {
        Window { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// `[start, start + length)`, if its end fits in i64.
    fn starting_at(start: i64, length: i64) -> Option<Window> {
        Some(Window { start, end: start.checked_add(length)? })
    }
}

/// The most windows one record may belong to: `size_ms / slide_ms` of a sliding window. Each
/// is one accumulator read, fold and write per record (and one result per watermark), so the
/// ratio multiplies state and work per record; a spec past it is refused at validation.
pub const MAX_WINDOWS_PER_RECORD: i64 = 1_000;

/// How records are grouped in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WindowKind {
    /// Fixed, non-overlapping windows of `size_ms`, aligned to the epoch.
    Tumbling {
        /// Window length.
        size_ms: i64,
    },
    /// Windows of `size_ms` starting every `slide_ms`; a record falls in `size/slide` of them.
    Sliding {
        /// Window length.
        size_ms: i64,
        /// Distance between window starts.
        slide_ms: i64,
    },
    /// Per-key activity sessions closed by a gap of `gap_ms` without records.
    Session {
        /// Inactivity that ends a session.
        gap_ms: i64,
    },
}

impl WindowKind {
    /// Checks the parameters; the message names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            WindowKind::Tumbling { size_ms } if size_ms <= 0 => Err(format!("size_ms must be positive, got {size_ms}")),
            WindowKind::Sliding { size_ms, slide_ms } if size_ms <= 0 || slide_ms <= 0 => {
                Err(format!("size_ms and slide_ms must be positive, got {size_ms} and {slide_ms}"))
            }
            WindowKind::Sliding { size_ms, slide_ms } if size_ms % slide_ms != 0 => {
                Err(format!("size_ms ({size_ms}) must be a multiple of slide_ms ({slide_ms})"))
            }
            WindowKind::Sliding { size_ms, slide_ms } if size_ms / slide_ms > MAX_WINDOWS_PER_RECORD => Err(format!(
                "size_ms / slide_ms = {size_ms} / {slide_ms} = {} windows per record, above the limit of \
                 {MAX_WINDOWS_PER_RECORD}: use a larger slide_ms or a smaller size_ms",
                size_ms / slide_ms
            )),
            WindowKind::Session { gap_ms } if gap_ms <= 0 => Err(format!("gap_ms must be positive, got {gap_ms}")),
            _ => Ok(()),
        }
    }

    /// The windows a record at `timestamp` belongs to, earliest first, or `None` if one of
    /// them would start or end outside i64: such a record belongs to no window. A session
    /// record gets its own `[t, t + gap)` window, which [`SessionWindows`] merges with its
    /// neighbours.
    pub fn assign(&self, timestamp: i64) -> Option<Vec<Window>> {
        let mut windows = Vec::new();
        self.assign_into(timestamp, &mut windows).then_some(windows)
    }

    /// [`Self::assign`] into `windows` (cleared first; left empty for a record that belongs to
    /// no window, and then `false`), so a window operator reuses one buffer for every record.
    pub fn assign_into(&self, timestamp: i64, windows: &mut Vec<Window>) -> bool {
        windows.clear();
        let assigned = match *self {
            WindowKind::Tumbling { size_ms } => timestamp
                .checked_sub(timestamp.rem_euclid(size_ms))
                .and_then(|start| Window::starting_at(start, size_ms))
                .map(|w| windows.push(w)),
            WindowKind::Sliding { size_ms, slide_ms } => {
                timestamp.checked_sub(timestamp.rem_euclid(slide_ms)).and_then(|last| {
                    // `i * slide_ms < size_ms` for every i here, so only the subtraction can overflow.
                    (0..size_ms / slide_ms).rev().try_for_each(|i| {
                        windows.push(Window::starting_at(last.checked_sub(i * slide_ms)?, size_ms)?);
                        Some(())
                    })
                })
            }
            WindowKind::Session { gap_ms } => Window::starting_at(timestamp, gap_ms).map(|w| windows.push(w)),
        };
        if assigned.is_none() {
            windows.clear();
        }
        assigned.is_some()
    }
}

/// The result of adding a window to a key's sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merge {
    /// The session the new window now belongs to.
    pub result: Window,
    /// Earlier sessions absorbed into it, in start order (their accumulators must be merged
    /// into `result`'s). Inline up to two: a record usually extends one session, and this is
    /// built per record.
    pub absorbed: SmallVec<[Window; 2]>,
}

/// The open sessions of one key, merged as windows arrive (out of order is fine).
///
/// Contract: sessions never overlap or touch each other; every added window lies inside
/// exactly one session; a session is the cover of the windows added to it.
///
/// Inline up to two sessions: a key's set is built per batch, and a key rarely has more open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionWindows {
    sessions: SmallVec<[Window; 2]>,
}

impl SessionWindows {
    /// The session `window` would belong to if added: its cover with every session it
    /// overlaps or touches. Nothing changes; the window operator judges lateness on this.
    pub fn cover(&self, window: Window) -> Window {
        if let Some(only) = self.only_touching(&window) {
            return self.sessions[only].cover(&window);
        }
        let mut result = window;
        // Under the contract one pass finds every such session; repeat until stable anyway,
        // so the answer never rests on it.
        loop {
            let grown = self.sessions.iter().filter(|s| s.overlaps_or_touches(&result)).fold(result, |c, s| c.cover(s));
            if grown == result {
                return result;
            }
            result = grown;
        }
    }

    /// Adds a record's window and merges it with every session it overlaps or touches.
    pub fn add(&mut self, window: Window) -> Merge {
        // Most records fall in or extend one session, which grows where it lies.
        if let Some(only) = self.only_touching(&window) {
            let session = self.sessions[only];
            let result = session.cover(&window);
            self.sessions[only] = result;
            return Merge { result, absorbed: smallvec::smallvec![session] };
        }
        let result = self.cover(window);
        // Every session touching the stable cover lies inside it. In place, without a new list
        // per record: the sessions stay in start order, and so do the absorbed ones.
        let mut absorbed = SmallVec::new();
        self.sessions.retain(|s| {
            let inside = s.overlaps_or_touches(&result);
            if inside {
                absorbed.push(*s);
            }
            !inside
        });
        let at = self.sessions.partition_point(|s| *s < result);
        self.sessions.insert(at, result);
        Merge { result, absorbed }
    }

    /// The one session `window` overlaps or touches, if exactly one does. Their cover is then
    /// the session `window` belongs to, and it reaches no other session: an interval that
    /// touches the cover of two touching intervals touches one of them.
    fn only_touching(&self, window: &Window) -> Option<usize> {
        let mut touching = self.sessions.iter().enumerate().filter(|(_, s)| s.overlaps_or_touches(window));
        match (touching.next(), touching.next()) {
            (Some((only, _)), None) => Some(only),
            _ => None,
        }
    }

    /// Removes and returns the sessions the watermark has passed (ready to fire).
    pub fn take_complete(&mut self, watermark: i64) -> Vec<Window> {
        let done = self.sessions.iter().filter(|s| s.max_timestamp() <= watermark).copied().collect();
        self.sessions.retain(|s| s.max_timestamp() > watermark);
        done
    }

    /// Open sessions, in start order.
    pub fn sessions(&self) -> &[Window] {
        &self.sessions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn invalid_parameters_are_named() {
        assert!(WindowKind::Tumbling { size_ms: 0 }.validate().unwrap_err().contains("size_ms"));
        assert!(WindowKind::Sliding { size_ms: 10, slide_ms: 3 }.validate().unwrap_err().contains("multiple"));
        assert!(WindowKind::Session { gap_ms: -1 }.validate().unwrap_err().contains("gap_ms"));
    }

    #[test]
    fn sliding_windows_past_the_windows_per_record_limit_are_refused_naming_ratio_and_limit() {
        let at_limit = WindowKind::Sliding { size_ms: 1000 * 5, slide_ms: 5 };
        assert_eq!(at_limit.validate(), Ok(()));
        let err = WindowKind::Sliding { size_ms: 1001 * 5, slide_ms: 5 }.validate().expect_err("past the limit");
        assert!(err.contains("1001 windows per record") && err.contains("limit of 1000"), "{err}");
    }

    #[test]
    fn windows_that_would_leave_i64_are_not_assigned() {
        // (kind, timestamps whose windows fit in i64, timestamps whose windows do not);
        // i64::MAX is 7 and i64::MIN is 2 (mod 10).
        let cases = [
            (WindowKind::Tumbling { size_ms: 10 }, [i64::MAX - 8, i64::MIN + 8], [i64::MAX - 7, i64::MIN + 7]),
            (
                WindowKind::Sliding { size_ms: 20, slide_ms: 10 },
                [i64::MAX - 18, i64::MIN + 18],
                [i64::MAX - 17, i64::MIN + 17],
            ),
            (WindowKind::Session { gap_ms: 10 }, [i64::MAX - 10, i64::MIN], [i64::MAX - 9, i64::MAX]),
        ];
        for (kind, inside, outside) in cases {
            for t in inside {
                let windows = kind.assign(t).unwrap_or_else(|| panic!("{kind:?} {t} fits"));
                assert!(windows.iter().all(|w| w.start <= t && t < w.end), "{kind:?} {t}: {windows:?}");
            }
            for t in outside {
                assert_eq!(kind.assign(t), None, "{kind:?} {t}");
            }
        }
    }

    #[test]
    fn negative_timestamps_align_like_positive_ones() {
        let w = WindowKind::Tumbling { size_ms: 10 }.assign(-1);
        assert_eq!(w, Some(vec![Window { start: -10, end: 0 }]));
    }

    proptest! {
        #[test]
        fn tumbling_puts_each_record_in_exactly_one_aligned_window(ts in -1_000_000i64..1_000_000, size in 1i64..10_000) {
            let w = WindowKind::Tumbling { size_ms: size }.assign(ts).expect("fits");
            prop_assert_eq!(w.len(), 1);
            prop_assert!(w[0].start <= ts && ts < w[0].end && w[0].start.rem_euclid(size) == 0);
        }

        #[test]
        fn sliding_puts_each_record_in_size_over_slide_windows(ts in -1_000_000i64..1_000_000, slide in 1i64..500, n in 1i64..8) {
            let kind = WindowKind::Sliding { size_ms: slide * n, slide_ms: slide };
            let w = kind.assign(ts).expect("fits");
            prop_assert_eq!(w.len() as i64, n);
            for win in &w {
                prop_assert!(win.start <= ts && ts < win.end && win.start.rem_euclid(slide) == 0);
            }
            // Oracle: every aligned start within reach, enumerated another way.
            let oracle: Vec<i64> = ((ts - slide * n - slide)..=ts).filter(|s| s.rem_euclid(slide) == 0 && s + slide * n > ts).collect();
            prop_assert_eq!(w.iter().map(|x| x.start).collect::<Vec<_>>(), oracle);
        }

        /// Sessions built incrementally from records in any order equal sessions computed in
        /// batch: sort the timestamps and split where the gap to the next one is >= gap.
        #[test]
        fn sessions_equal_the_batch_oracle(ts in proptest::collection::vec(0i64..10_000, 1..60), gap in 1i64..500) {
            let mut sessions = SessionWindows::default();
            for &t in &ts {
                let before = sessions.sessions().to_vec();
                let merge = sessions.add(Window { start: t, end: t + gap });
                prop_assert!(merge.result.start <= t && t + gap <= merge.result.end);
                // Absorbed: the sessions before that overlap or touch the result, in order.
                let r = merge.result;
                let touching: Vec<Window> = before.into_iter().filter(|s| s.start <= r.end && r.start <= s.end).collect();
                prop_assert_eq!(merge.absorbed.to_vec(), touching);
                prop_assert!(sessions.sessions().windows(2).all(|p| p[0].end < p[1].start), "apart, in order");
            }
            let mut sorted = ts.clone();
            sorted.sort();
            let mut oracle: Vec<Window> = Vec::new();
            for t in sorted {
                match oracle.last_mut() {
                    Some(last) if t <= last.end => last.end = last.end.max(t + gap),
                    _ => oracle.push(Window { start: t, end: t + gap }),
                }
            }
            prop_assert_eq!(sessions.sessions(), &oracle[..]);
            let all = sessions.take_complete(i64::MAX);
            prop_assert_eq!(all, oracle);
            prop_assert!(sessions.sessions().is_empty());
        }
    }
}
