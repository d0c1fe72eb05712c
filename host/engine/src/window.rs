//! Window assignment: which windows a timestamp belongs to (tumbling, sliding), and session
//! windows that grow and merge as records arrive. Pure functions and one small state machine;
//! the window operator stores accumulators per window in keyed state and calls the guest's
//! aggregate to add and merge them.

use serde::Deserialize;

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
}

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
            WindowKind::Session { gap_ms } if gap_ms <= 0 => Err(format!("gap_ms must be positive, got {gap_ms}")),
            _ => Ok(()),
        }
    }

    /// The windows a record at `timestamp` belongs to, earliest first. A session record gets
    /// its own `[t, t + gap)` window, which [`SessionWindows`] merges with its neighbours.
    pub fn assign(&self, timestamp: i64) -> Vec<Window> {
        match *self {
            WindowKind::Tumbling { size_ms } => {
                let start = timestamp - timestamp.rem_euclid(size_ms);
                vec![Window { start, end: start + size_ms }]
            }
            WindowKind::Sliding { size_ms, slide_ms } => {
                let last = timestamp - timestamp.rem_euclid(slide_ms);
                let mut windows: Vec<Window> = (0..size_ms / slide_ms)
                    .map(|i| last - i * slide_ms)
                    .map(|start| Window { start, end: start + size_ms })
                    .collect();
                windows.reverse();
                windows
            }
            WindowKind::Session { gap_ms } => vec![Window { start: timestamp, end: timestamp + gap_ms }],
        }
    }
}

/// The result of adding a window to a key's sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merge {
    /// The session the new window now belongs to.
    pub result: Window,
    /// Earlier sessions absorbed into it (their accumulators must be merged into `result`'s).
    pub absorbed: Vec<Window>,
}

/// The open sessions of one key, merged as windows arrive (out of order is fine).
///
/// Contract: sessions never overlap or touch each other; every added window lies inside
/// exactly one session; a session is the cover of the windows added to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionWindows {
    sessions: Vec<Window>,
}

impl SessionWindows {
    /// Adds a record's window and merges it with every session it overlaps or touches.
    pub fn add(&mut self, window: Window) -> Merge {
        let mut result = window;
        let mut absorbed = Vec::new();
        self.sessions.retain(|s| {
            if s.overlaps_or_touches(&result) {
                result = result.cover(s);
                absorbed.push(*s);
                false
            } else {
                true
            }
        });
        // A merge can make the cover reach a session that did not touch the new window alone.
        while let Some(i) = self.sessions.iter().position(|s| s.overlaps_or_touches(&result)) {
            let s = self.sessions.remove(i);
            result = result.cover(&s);
            absorbed.push(s);
        }
        self.sessions.push(result);
        self.sessions.sort();
        absorbed.sort();
        Merge { result, absorbed }
    }

    /// Removes and returns the sessions the watermark has passed (ready to fire).
    pub fn take_complete(&mut self, watermark: i64) -> Vec<Window> {
        let (done, open): (Vec<Window>, Vec<Window>) =
            self.sessions.iter().partition(|s| s.max_timestamp() <= watermark);
        self.sessions = open;
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
    fn negative_timestamps_align_like_positive_ones() {
        let w = WindowKind::Tumbling { size_ms: 10 }.assign(-1);
        assert_eq!(w, vec![Window { start: -10, end: 0 }]);
    }

    proptest! {
        #[test]
        fn tumbling_puts_each_record_in_exactly_one_aligned_window(ts in -1_000_000i64..1_000_000, size in 1i64..10_000) {
            let w = WindowKind::Tumbling { size_ms: size }.assign(ts);
            prop_assert_eq!(w.len(), 1);
            prop_assert!(w[0].start <= ts && ts < w[0].end && w[0].start.rem_euclid(size) == 0);
        }

        #[test]
        fn sliding_puts_each_record_in_size_over_slide_windows(ts in -1_000_000i64..1_000_000, slide in 1i64..500, n in 1i64..8) {
            let kind = WindowKind::Sliding { size_ms: slide * n, slide_ms: slide };
            let w = kind.assign(ts);
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
                let merge = sessions.add(Window { start: t, end: t + gap });
                prop_assert!(merge.result.start <= t && t + gap <= merge.result.end);
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
