//! Pending firing and cleanup times of every window that has state.
//!
//! Kept in memory rather than in the backend because firing needs them in time order across
//! all keys, while the backend orders by key group first; and they need no snapshot of their
//! own: every accumulator entry is exactly one window with a cleanup time, and a firing time
//! unless its fired flag is set, so the operator rebuilds them from the backend alone on its
//! first call.
//!
//! Two layouts, by what the windows do with their times. Windows of a fixed size share their
//! times across keys (every key's `[s, e)` fires at `e - 1`) and none gives a timer back
//! before it is due, so their timers are appended to a list per time and sorted by key only
//! when taken: one push per new window instead of a descent of one ordered set of every
//! (time, key, window) comparing key bytes (5% of q5's CPU). A time's keys sit back to back
//! in one buffer, and the timers taken lend them out: no allocation per timer (an allocation
//! and a free per key copy were 2% of q5's CPU in glibc's malloc). Sessions' times rarely repeat,
//! so they stay in an ordered set. (Grouping both by time in hash sets was tried: no faster for
//! sliding windows, 10% slower for sessions.)
//!
//! A session's timers are set when it first takes records and are not moved as it grows: a
//! session of q11 grows by ~25 records, and moving its timer each time (a removal and an
//! insertion in the ordered set, a key copy and a free) was a fifth of its window step. So a
//! session's timer names the window it had then, due no later than the session is (sessions
//! only grow). When such a timer comes due, [`Timers::take_due`] looks up the session that
//! window now lies in: due by its own times, it is handed out (once, however many timers named
//! it); not yet, it gets one timer at its own time. A merge keeps the timers of the sessions it
//! absorbs for the same reason; the operator sets new ones only where none is pending (see
//! `WindowOperator::process_sessions`).

use std::collections::{BTreeMap, BTreeSet};

use eddy_plan::window::{Window, WindowKind};

/// One pending timer: (time, key, window). Ordering by time then key is the emission order.
pub(super) type Timer = (i64, Vec<u8>, Window);

/// The timers of fixed windows due at one time: their keys back to back, and per timer the
/// span of its key there and its window.
#[derive(Debug, Default)]
pub(super) struct Bucket {
    keys: Vec<u8>,
    timers: Vec<Pending>,
}

/// A timer in a [`Bucket`].
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// The key's first eight bytes as one big-endian integer, zero-padded: keys whose heads
    /// differ are in the order of their bytes, so sorting compares these first (see
    /// [`Bucket::sorted`]).
    head: u64,
    at: usize,
    len: usize,
    window: Window,
}

impl Bucket {
    fn key(&self, t: &Pending) -> &[u8] {
        &self.keys[t.at..t.at + t.len]
    }

    fn push(&mut self, key: &[u8], window: Window) {
        let mut head = [0u8; 8];
        let n = key.len().min(8);
        head[..n].copy_from_slice(&key[..n]);
        self.timers.push(Pending { head: u64::from_be_bytes(head), at: self.keys.len(), len: key.len(), window });
        self.keys.extend_from_slice(key);
    }

    /// Sorted by key, then window: the emission order within a time. Keys are compared by
    /// their heads and by their bytes only where the heads tie: keys are mostly short ids, and
    /// a `memcmp` call per comparison was most of the sort, ~4% of q5's samples.
    fn sorted(mut self) -> Self {
        let mut timers = std::mem::take(&mut self.timers);
        timers.sort_unstable_by(|a, b| {
            a.head.cmp(&b.head).then_with(|| self.key(a).cmp(self.key(b))).then(a.window.cmp(&b.window))
        });
        self.timers = timers;
        self
    }
}

/// The timers of one kind (firing, or cleanup) of an operator.
#[derive(Debug)]
enum TimerQueue {
    /// Fixed windows: per time, its (key, window)s in the order they came.
    ByTime(BTreeMap<i64, Bucket>),
    /// Sessions: every timer in emission order.
    Ordered(BTreeSet<Timer>),
}

/// Timers taken from a queue, which lend out their keys in emission order ([`Due::iter`]).
#[derive(Debug)]
pub(super) enum Due {
    /// Fixed windows' buckets, each sorted, by time.
    ByTime(Vec<(i64, Bucket)>),
    /// Sessions' timers in order.
    Ordered(Vec<Timer>),
}

impl Due {
    /// The timers as (time, key, window), in emission order.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = (i64, &[u8], Window)> + '_> {
        match self {
            Due::ByTime(buckets) => {
                Box::new(buckets.iter().flat_map(|(time, b)| b.timers.iter().map(move |t| (*time, b.key(t), t.window))))
            }
            Due::Ordered(timers) => Box::new(timers.iter().map(|(time, key, window)| (*time, key.as_slice(), *window))),
        }
    }
}

impl TimerQueue {
    fn new(kind: WindowKind) -> Self {
        match kind {
            WindowKind::Tumbling { .. } | WindowKind::Sliding { .. } => TimerQueue::ByTime(BTreeMap::new()),
            WindowKind::Session { .. } => TimerQueue::Ordered(BTreeSet::new()),
        }
    }

    /// Adds a timer; for fixed windows, the caller adds each (key, window) at most once (a
    /// window gets its timers when it is first stored, or when the operator rebuilds them).
    fn insert(&mut self, time: i64, key: &[u8], window: Window) {
        match self {
            TimerQueue::ByTime(by_time) => by_time.entry(time).or_default().push(key, window),
            TimerQueue::Ordered(set) => {
                set.insert((time, key.to_vec(), window));
            }
        }
    }

    /// Removes and returns the timers due at `watermark`.
    fn take_due(&mut self, watermark: i64) -> Due {
        match self {
            TimerQueue::ByTime(by_time) => {
                let due = match watermark.checked_add(1) {
                    Some(bound) => {
                        let later = by_time.split_off(&bound);
                        std::mem::replace(by_time, later)
                    }
                    None => std::mem::take(by_time),
                };
                Due::ByTime(due.into_iter().map(|(time, bucket)| (time, bucket.sorted())).collect())
            }
            TimerQueue::Ordered(set) => {
                let due = match watermark.checked_add(1) {
                    Some(bound) => {
                        let later = set.split_off(&(bound, Vec::new(), Window { start: i64::MIN, end: i64::MIN }));
                        std::mem::replace(set, later)
                    }
                    None => std::mem::take(set),
                };
                Due::Ordered(due.into_iter().collect())
            }
        }
    }

    /// Sessions' timers taken as due, as of their sessions now (see the module docs): `now`
    /// gives the session a timer's window lies in and its time in this queue, or `None` once
    /// that session is purged (its other timers came due with it).
    fn settle<E>(
        &mut self,
        due: Due,
        watermark: i64,
        mut now: impl FnMut(&[u8], Window) -> Result<Option<(Window, i64)>, E>,
    ) -> Result<Due, E> {
        match (self, due) {
            (TimerQueue::Ordered(set), Due::Ordered(timers)) => {
                let mut settled = Vec::with_capacity(timers.len());
                for (_, key, window) in timers {
                    match now(&key, window)? {
                        Some((session, at)) if at <= watermark => settled.push((at, key, session)),
                        Some((session, at)) => {
                            set.insert((at, key, session));
                        }
                        None => {}
                    }
                }
                settled.sort_unstable();
                settled.dedup();
                Ok(Due::Ordered(settled))
            }
            (_, due) => Ok(due),
        }
    }
}

/// An operator's timers: when its windows fire, and when their state is purged.
///
/// Without allowed lateness a window is purged when it fires, so one queue serves both: the
/// two would hold the same timers, and every window would pay a second insert (and, for
/// sessions, a second key copy, tree descent and removal on each merge). That is Flink's
/// default, and that of q5, q7 and q11.
#[derive(Debug)]
pub(super) struct Timers {
    fire: TimerQueue,
    /// `None`: purged when fired, from `fire`.
    cleanup: Option<TimerQueue>,
}

/// The timers a watermark made due.
#[derive(Debug)]
pub(super) struct DueTimers {
    /// Windows to fire; with a shared queue, some may have fired already (within no
    /// lateness only a restored fired flag can say so), which only get purged.
    pub(super) fire: Due,
    /// `None`: the same as `fire`.
    cleanup: Option<Due>,
}

impl DueTimers {
    /// The windows to purge, in emission order.
    pub(super) fn cleanup(&self) -> &Due {
        self.cleanup.as_ref().unwrap_or(&self.fire)
    }
}

impl Timers {
    /// Timers of windows of `kind` kept `allowed_lateness_ms` after they fire.
    pub(super) fn new(kind: WindowKind, allowed_lateness_ms: i64) -> Self {
        let cleanup = (allowed_lateness_ms > 0).then(|| TimerQueue::new(kind));
        Timers { fire: TimerQueue::new(kind), cleanup }
    }

    /// Registers a window's timers; a window that `fired` gets only its cleanup.
    pub(super) fn insert(&mut self, fire_time: i64, cleanup_time: i64, key: &[u8], window: Window, fired: bool) {
        match &mut self.cleanup {
            Some(cleanup) => {
                if !fired {
                    self.fire.insert(fire_time, key, window);
                }
                cleanup.insert(cleanup_time, key, window);
            }
            None => self.fire.insert(fire_time, key, window),
        }
    }

    /// Removes and returns the windows due at `watermark`. For sessions, `session_of` gives the
    /// session a timer's window now lies in (`None` once purged) and `times` its firing and
    /// cleanup times: a session's timers stay where they were set as it grows (module docs).
    pub(super) fn take_due<E>(
        &mut self,
        watermark: i64,
        mut session_of: impl FnMut(&[u8], Window) -> Result<Option<Window>, E>,
        times: impl Fn(&Window) -> (i64, i64),
    ) -> Result<DueTimers, E> {
        let due = self.fire.take_due(watermark);
        let fire = self.fire.settle(due, watermark, |key, w| Ok(session_of(key, w)?.map(|s| (s, times(&s).0))))?;
        let cleanup = match &mut self.cleanup {
            Some(queue) => {
                let due = queue.take_due(watermark);
                Some(queue.settle(due, watermark, |key, w| Ok(session_of(key, w)?.map(|s| (s, times(&s).1))))?)
            }
            None => None,
        };
        Ok(DueTimers { fire, cleanup })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: i64) -> Window {
        Window { start, end: start + 10 }
    }

    /// Both layouts hand out the same timers in the same order: by time, then key, then window.
    #[test]
    fn both_layouts_take_due_timers_in_time_then_key_order() {
        let inserts: [(i64, &[u8], i64); 6] =
            [(9, b"b", 0), (19, b"a", 10), (9, b"a", 0), (29, b"c", 20), (9, b"a", -5), (19, b"c", 10)];
        let expected: Vec<Timer> = vec![
            (9, b"a".to_vec(), w(-5)),
            (9, b"a".to_vec(), w(0)),
            (9, b"b".to_vec(), w(0)),
            (19, b"a".to_vec(), w(10)),
            (19, b"c".to_vec(), w(10)),
        ];
        for kind in [WindowKind::Sliding { size_ms: 10, slide_ms: 5 }, WindowKind::Session { gap_ms: 10 }] {
            let mut queue = TimerQueue::new(kind);
            for (time, key, start) in inserts {
                queue.insert(time, key, w(start));
            }
            let taken = |due: Due| -> Vec<Timer> { due.iter().map(|(t, k, w)| (t, k.to_vec(), w)).collect() };
            assert_eq!(taken(queue.take_due(19)), expected, "{kind:?}");
            assert_eq!(taken(queue.take_due(28)), Vec::new(), "{kind:?}");
            assert_eq!(taken(queue.take_due(i64::MAX)), vec![(29, b"c".to_vec(), w(20))], "{kind:?}");
        }
    }

    /// A session's timer hands out the session its window has grown into, once however many
    /// timers name it, when that is due; sets one at the session's own time when it is not;
    /// and goes when no session holds its window any more.
    #[test]
    fn a_sessions_timer_follows_what_its_session_grew_into() {
        let w = |start, end| Window { start, end };
        // Key a: [0, 10) grew to [0, 25). Key b: [0, 10) and [5, 15) merged into [0, 15).
        // Key c: [0, 10) is no session any more.
        let now = |key: &[u8], _: Window| -> Result<Option<Window>, ()> {
            Ok(match key {
                b"a" => Some(w(0, 25)),
                b"b" => Some(w(0, 15)),
                _ => None,
            })
        };
        for lateness in [0, 5] {
            let times = |s: &Window| (s.end - 1, s.end - 1 + lateness);
            let mut timers = Timers::new(WindowKind::Session { gap_ms: 10 }, lateness);
            for (key, window) in [(b"a", w(0, 10)), (b"b", w(0, 10)), (b"b", w(5, 15)), (b"c", w(0, 10))] {
                let (fire, cleanup) = times(&window);
                timers.insert(fire, cleanup, key, window, false);
            }
            let mut take = |watermark| {
                let due = timers.take_due(watermark, now, times).expect("no lookup fails");
                let listed = |due: &Due| -> Vec<Timer> { due.iter().map(|(t, k, w)| (t, k.to_vec(), w)).collect() };
                (listed(&due.fire), listed(due.cleanup()))
            };
            let b = vec![(14, b"b".to_vec(), w(0, 15))];
            let a = vec![(24, b"a".to_vec(), w(0, 25))];
            if lateness == 0 {
                assert_eq!(take(14), (b.clone(), b));
                assert_eq!(take(23), (vec![], vec![]));
                assert_eq!(take(24), (a.clone(), a));
            } else {
                assert_eq!(take(14), (b, vec![]));
                assert_eq!(take(19), (vec![], vec![(19, b"b".to_vec(), w(0, 15))]));
                assert_eq!(take(24), (a, vec![]));
                assert_eq!(take(28), (vec![], vec![]));
                assert_eq!(take(29), (vec![], vec![(29, b"a".to_vec(), w(0, 25))]));
            }
        }
    }

    proptest::proptest! {
        /// A bucket sorts by key bytes as the sessions' ordered set does (the oracle), for keys
        /// that share their first eight bytes, end in zero bytes or are prefixes of each other.
        #[test]
        fn fixed_windows_take_due_timers_in_the_ordered_sets_order(
            timers in proptest::collection::btree_set(
                (0i64..3, proptest::collection::vec(proptest::sample::select(vec![0u8, 1, b'a', 0xFF]), 0..12), -2i64..2),
                0..60,
            ),
        ) {
            let mut fixed = TimerQueue::new(WindowKind::Tumbling { size_ms: 10 });
            let mut ordered = TimerQueue::new(WindowKind::Session { gap_ms: 10 });
            for (time, key, start) in &timers {
                fixed.insert(*time, key, w(*start));
                ordered.insert(*time, key, w(*start));
            }
            let taken = |due: Due| -> Vec<Timer> { due.iter().map(|(t, k, w)| (t, k.to_vec(), w)).collect() };
            proptest::prop_assert_eq!(taken(fixed.take_due(i64::MAX)), taken(ordered.take_due(i64::MAX)));
        }
    }
}
