//! Event time per partition, combined per reader as Flink does: each partition has its own
//! bounded out-of-orderness watermark, and the reader's watermark is the smallest of the
//! partitions that are not idle, so one quiet partition does not stall the windows behind it.
//! I/O-free: time since the reader opened is passed in.

use std::time::Duration;

use eddy_core::{BoundedOutOfOrderness, WatermarkTracker};

/// The partitions' watermarks and the reader's.
#[derive(Debug)]
pub(crate) struct PartitionClock {
    bound_ms: i64,
    partitions: Vec<BoundedOutOfOrderness>,
    ended: Vec<bool>,
    tracker: WatermarkTracker,
}

fn ms(at: Duration) -> i64 {
    i64::try_from(at.as_millis()).unwrap_or(i64::MAX)
}

impl PartitionClock {
    /// Partitions whose events are at most `bound_ms` out of order, idle after `idleness_ms`
    /// without a record (none: a quiet partition holds the reader back, as correctness needs
    /// when every partition matters).
    pub(crate) fn new(bound_ms: i64, idleness_ms: Option<i64>) -> Self {
        Self { bound_ms, partitions: Vec::new(), ended: Vec::new(), tracker: WatermarkTracker::new(0, idleness_ms, 0) }
    }

    /// A partition joins at `now`; returns its index. It holds the reader back until it
    /// speaks or goes idle, but never pulls the reader's watermark back.
    pub(crate) fn add(&mut self, now: Duration) -> usize {
        self.partitions.push(BoundedOutOfOrderness::new(self.bound_ms));
        self.ended.push(false);
        self.tracker.add_channel(ms(now))
    }

    /// A record of `partition` with event time `time` was read at `now`.
    pub(crate) fn on_record(&mut self, partition: usize, time: i64, now: Duration) {
        let Some(p) = self.partitions.get_mut(partition) else { return };
        p.on_event(time);
        let watermark = p.current();
        self.tracker.on_watermark(partition, watermark, ms(now));
    }

    /// `partition` reached its end (a bounded source): it holds nothing back any more.
    pub(crate) fn end(&mut self, partition: usize) {
        if let Some(e) = self.ended.get_mut(partition) {
            *e = true;
            self.tracker.on_end(partition);
        }
    }

    /// Whether `partition` ended.
    pub(crate) fn ended(&self, partition: usize) -> bool {
        self.ended.get(partition).copied().unwrap_or(false)
    }

    /// The reader's watermark at `now` (partitions quiet for the idleness timeout excluded).
    pub(crate) fn current(&mut self, now: Duration) -> i64 {
        self.tracker.on_tick(ms(now));
        self.tracker.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = eddy_core::WATERMARK_MIN;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_reader_follows_its_slowest_partition() {
        let mut c = PartitionClock::new(0, None);
        let (a, b) = (c.add(at(0)), c.add(at(0)));
        c.on_record(a, 10_000, at(1));
        // b has said nothing: without idleness it holds the reader back.
        assert_eq!(c.current(at(60_000)), MIN);
        c.on_record(b, 4_000, at(60_001));
        assert_eq!(c.current(at(60_001)), 3_999);
        c.on_record(b, 20_000, at(60_002));
        assert_eq!(c.current(at(60_002)), 9_999);
    }

    #[test]
    fn an_idle_partition_stops_holding_the_reader_back_until_it_speaks() {
        let mut c = PartitionClock::new(1_000, Some(500));
        let (a, b) = (c.add(at(0)), c.add(at(0)));
        c.on_record(a, 10_000, at(100));
        assert_eq!(c.current(at(499)), MIN, "b is not idle yet");
        assert_eq!(c.current(at(500)), 8_999, "b went idle; a alone decides");
        c.on_record(a, 12_000, at(600));
        c.on_record(b, 2_000, at(700));
        assert_eq!(c.current(at(700)), 10_999, "b speaks again but cannot pull the reader back");
        // a goes idle in turn; b, active, now decides and is behind, so the watermark holds.
        assert_eq!(c.current(at(1_100)), 10_999);
        c.on_record(b, 30_000, at(1_200));
        assert_eq!(c.current(at(1_200)), 28_999);
    }

    #[test]
    fn an_ended_partition_holds_nothing_back_and_a_new_one_joins_without_going_back() {
        let mut c = PartitionClock::new(0, None);
        let a = c.add(at(0));
        let b = c.add(at(0));
        c.on_record(a, 5_000, at(1));
        c.end(b);
        assert!(c.ended(b) && !c.ended(a));
        assert_eq!(c.current(at(2)), 4_999);
        let late = c.add(at(3));
        assert_eq!(c.current(at(3)), 4_999, "a partition joining never moves the watermark back");
        c.on_record(late, 1_000, at(4));
        c.on_record(a, 9_000, at(5));
        assert_eq!(c.current(at(5)), 4_999, "the new partition is behind: the reader holds");
        c.on_record(late, 50_000, at(6));
        assert_eq!(c.current(at(6)), 8_999);
    }
}
