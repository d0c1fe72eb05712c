//! The timer service: timers per (key, timestamp), fired in timestamp order as time advances.
//!
//! The engine owns one per keyed subtask; the runtime's `timers` imports register and delete
//! through it, and the engine advances it on watermarks and processing-time ticks.

use std::collections::{BTreeSet, HashMap};

use crate::{KeyGroup, TimeDomain, WATERMARK_MIN, key_hash};

/// A timer that came due.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FiredTimer {
    /// When it was set to fire (ms).
    pub timestamp: i64,
    /// Key group of its key.
    pub key_group: KeyGroup,
    /// The key it was registered for.
    pub key: Vec<u8>,
    /// Its clock.
    pub domain: TimeDomain,
}

/// Timers of one subtask.
///
/// Contract: (domain, key, timestamp) identifies a timer, so registering it twice fires it
/// once; time only moves forward (advancing to an earlier time changes nothing and fires
/// nothing new); timers fire in timestamp order, each exactly once, at the first advance that
/// finds them due (a timer registered for a time already passed fires at the next advance).
pub trait TimerService: Send {
    /// Registers a timer.
    fn register(&mut self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64);
    /// Deletes a timer if it exists.
    fn delete(&mut self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64);
    /// The current event-time watermark.
    fn current_watermark(&self) -> i64;
    /// The current processing time.
    fn current_processing_time(&self) -> i64;
    /// Moves the watermark to `watermark` and returns the event-time timers now due.
    fn advance_watermark(&mut self, watermark: i64) -> Vec<FiredTimer>;
    /// Moves processing time to `now_ms` and returns the processing-time timers now due.
    fn advance_processing_time(&mut self, now_ms: i64) -> Vec<FiredTimer>;
    /// Whether this timer is registered (and not yet fired).
    fn contains(&self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64) -> bool;
    /// Number of registered timers in both domains.
    fn len(&self) -> usize;
    /// Number of registered timers of one key, both domains. May count more, never fewer
    /// (an implementation may count keys by hash).
    fn len_of_key(&self, key_group: KeyGroup, key: &[u8]) -> usize;
    /// Every registered timer, not yet fired (for checkpoints), event time first.
    fn pending(&self) -> Vec<FiredTimer>;
    /// Whether no timer is registered.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

type Queue = BTreeSet<(i64, KeyGroup, Vec<u8>)>;

/// Timers on the heap, ordered by timestamp.
#[derive(Debug)]
pub struct HeapTimerService {
    event_time: Queue,
    processing_time: Queue,
    /// Registered timers per key hash: ~20 bytes per key with timers, against ~100 per timer
    /// for a map by key bytes. Keys whose hashes collide share a count, which can only make
    /// a per-key limit stricter for them, with odds of about n²/2⁶⁵ among n keys.
    per_key: HashMap<u64, u32>,
    watermark: i64,
    now_ms: i64,
}

impl Default for HeapTimerService {
    fn default() -> Self {
        Self {
            event_time: Queue::new(),
            processing_time: Queue::new(),
            per_key: HashMap::new(),
            watermark: WATERMARK_MIN,
            now_ms: 0,
        }
    }
}

impl HeapTimerService {
    /// A timer service whose processing time starts at `now_ms`.
    pub fn starting_at(now_ms: i64) -> Self {
        Self { now_ms, ..Self::default() }
    }

    fn queue(&mut self, domain: TimeDomain) -> &mut Queue {
        match domain {
            TimeDomain::EventTime => &mut self.event_time,
            TimeDomain::ProcessingTime => &mut self.processing_time,
        }
    }

    fn fire(&mut self, domain: TimeDomain, up_to: i64) -> Vec<FiredTimer> {
        let queue = self.queue(domain);
        let later = match up_to.checked_add(1) {
            Some(bound) => queue.split_off(&(bound, 0, Vec::new())),
            None => Queue::new(),
        };
        let due = std::mem::replace(queue, later);
        due.into_iter()
            .map(|(timestamp, key_group, key)| {
                self.forget_one(&key);
                FiredTimer { timestamp, key_group, key, domain }
            })
            .collect()
    }

    fn forget_one(&mut self, key: &[u8]) {
        let hash = key_hash(key);
        if let Some(n) = self.per_key.get_mut(&hash) {
            *n -= 1;
            if *n == 0 {
                self.per_key.remove(&hash);
            }
        }
    }
}

impl TimerService for HeapTimerService {
    fn register(&mut self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64) {
        if self.queue(domain).insert((timestamp, key_group, key.to_vec())) {
            *self.per_key.entry(key_hash(key)).or_default() += 1;
        }
    }

    fn delete(&mut self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64) {
        if self.queue(domain).remove(&(timestamp, key_group, key.to_vec())) {
            self.forget_one(key);
        }
    }

    fn contains(&self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64) -> bool {
        let queue = match domain {
            TimeDomain::EventTime => &self.event_time,
            TimeDomain::ProcessingTime => &self.processing_time,
        };
        queue.contains(&(timestamp, key_group, key.to_vec()))
    }

    fn current_watermark(&self) -> i64 {
        self.watermark
    }

    fn current_processing_time(&self) -> i64 {
        self.now_ms
    }

    fn advance_watermark(&mut self, watermark: i64) -> Vec<FiredTimer> {
        self.watermark = self.watermark.max(watermark);
        self.fire(TimeDomain::EventTime, self.watermark)
    }

    fn advance_processing_time(&mut self, now_ms: i64) -> Vec<FiredTimer> {
        self.now_ms = self.now_ms.max(now_ms);
        self.fire(TimeDomain::ProcessingTime, self.now_ms)
    }

    fn len(&self) -> usize {
        self.event_time.len() + self.processing_time.len()
    }

    fn len_of_key(&self, _key_group: KeyGroup, key: &[u8]) -> usize {
        self.per_key.get(&key_hash(key)).map_or(0, |&n| n as usize)
    }

    fn pending(&self) -> Vec<FiredTimer> {
        let listed = |queue: &Queue, domain: TimeDomain| {
            queue
                .iter()
                .map(move |(timestamp, key_group, key)| FiredTimer {
                    timestamp: *timestamp,
                    key_group: *key_group,
                    key: key.clone(),
                    domain,
                })
                .collect::<Vec<_>>()
        };
        let mut all = listed(&self.event_time, TimeDomain::EventTime);
        all.extend(listed(&self.processing_time, TimeDomain::ProcessingTime));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_in_order_once_and_deduplicates() {
        let mut t = HeapTimerService::default();
        t.register(TimeDomain::EventTime, 3, b"b", 20);
        t.register(TimeDomain::EventTime, 1, b"a", 10);
        t.register(TimeDomain::EventTime, 1, b"a", 10);
        t.register(TimeDomain::EventTime, 1, b"a", 30);
        t.register(TimeDomain::ProcessingTime, 1, b"a", 5);
        assert_eq!(t.len(), 4);
        let fired: Vec<_> = t.advance_watermark(20).into_iter().map(|f| (f.timestamp, f.key)).collect();
        assert_eq!(fired, vec![(10, b"a".to_vec()), (20, b"b".to_vec())]);
        assert!(t.advance_watermark(20).is_empty());
        assert!(t.advance_watermark(15).is_empty(), "watermarks never go back");
        assert_eq!(t.current_watermark(), 20);
        assert_eq!(t.advance_processing_time(5).len(), 1);
        assert_eq!(t.advance_watermark(i64::MAX).len(), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn timers_are_counted_per_key_as_they_come_and_go() {
        let mut t = HeapTimerService::default();
        let count = |t: &HeapTimerService| (t.len_of_key(1, b"a"), t.len_of_key(2, b"b"), t.len());
        assert_eq!(count(&t), (0, 0, 0));
        t.register(TimeDomain::EventTime, 1, b"a", 10);
        t.register(TimeDomain::EventTime, 1, b"a", 10);
        t.register(TimeDomain::ProcessingTime, 1, b"a", 10);
        t.register(TimeDomain::EventTime, 1, b"a", 30);
        t.register(TimeDomain::EventTime, 2, b"b", 20);
        assert_eq!(count(&t), (3, 1, 4), "a twice-registered timer counts once");
        assert!(t.contains(TimeDomain::ProcessingTime, 1, b"a", 10));
        assert!(!t.contains(TimeDomain::ProcessingTime, 1, b"a", 30));
        t.delete(TimeDomain::EventTime, 1, b"a", 30);
        t.delete(TimeDomain::EventTime, 1, b"a", 99);
        assert_eq!(count(&t), (2, 1, 3), "deleting a missing timer changes nothing");
        assert_eq!(t.advance_watermark(20).len(), 2);
        assert_eq!(count(&t), (1, 0, 1), "fired timers no longer count");
        assert_eq!(t.advance_processing_time(10).len(), 1);
        assert_eq!(count(&t), (0, 0, 0));
        assert!(t.per_key.is_empty(), "no entry is left for keys without timers");
    }

    #[test]
    fn deleted_timers_do_not_fire() {
        let mut t = HeapTimerService::default();
        t.register(TimeDomain::ProcessingTime, 0, b"k", 100);
        t.delete(TimeDomain::ProcessingTime, 0, b"k", 100);
        t.delete(TimeDomain::EventTime, 0, b"missing", 1);
        assert!(t.advance_processing_time(1_000).is_empty());
    }
}
