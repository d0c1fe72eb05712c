//! The last minutes of a running job, a point a second: throughput at the sources and the
//! sink, the most backpressured task's share of time blocked, and how far event time trails
//! the wall clock. Kept per job while it runs (across its attempts), bounded, and shown on the
//! job page as timelines.

use std::collections::VecDeque;
use std::time::Duration;

use eddy_engine::MetricsSnapshot;
use serde::Serialize;
use utoipa::ToSchema;

/// Points kept: five minutes at one a second.
pub const TIMELINE_POINTS: usize = 300;

/// The time between two points.
pub const TIMELINE_STEP: Duration = Duration::from_secs(1);

/// One second of a job.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TimelinePoint {
    /// When it was taken, ms since the epoch.
    pub at_ms: i64,
    /// Records the sources read per second since the point before.
    pub source_records_per_sec: f64,
    /// Records that reached the sink per second since the point before.
    pub sink_records_per_sec: f64,
    /// The most backpressured task's share of the interval spent waiting for credit (0-1).
    pub backpressure: f64,
    /// `at_ms` minus the job's lowest watermark, ms; none before the first watermark.
    pub watermark_lag_ms: Option<i64>,
}

impl TimelinePoint {
    /// The interval from `before` to `now` (snapshots of one attempt), taken at `at_ms`.
    pub fn between(at_ms: i64, now: &MetricsSnapshot, before: &MetricsSnapshot, parallelisms: &[u32]) -> Self {
        let secs = now.elapsed.saturating_sub(before.elapsed).as_secs_f64().max(1e-3);
        let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / secs;
        TimelinePoint {
            at_ms,
            source_records_per_sec: rate(now.source_records, before.source_records),
            sink_records_per_sec: rate(now.sink_records, before.sink_records),
            backpressure: now.backpressure_since(before, parallelisms),
            watermark_lag_ms: now.watermark().map(|w| at_ms.saturating_sub(w)),
        }
    }
}

/// The newest [`TIMELINE_POINTS`] points, oldest first.
#[derive(Debug, Default)]
pub struct Timeline {
    points: VecDeque<TimelinePoint>,
}

impl Timeline {
    /// Adds `point`, dropping the oldest past the bound.
    pub fn push(&mut self, point: TimelinePoint) {
        if self.points.len() == TIMELINE_POINTS {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }

    /// The points, oldest first.
    pub fn points(&self) -> Vec<TimelinePoint> {
        self.points.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use eddy_engine::TaskSnapshot;

    use super::*;

    fn snapshot(ms: u64, source: u64, sink: u64, blocked_ns: [u64; 2], watermarks: [i64; 2]) -> MetricsSnapshot {
        let task =
            |i: usize| TaskSnapshot { blocked_ns: blocked_ns[i], watermark: watermarks[i], ..TaskSnapshot::default() };
        MetricsSnapshot {
            elapsed: Duration::from_millis(ms),
            tasks: vec![task(0), task(1)],
            source_records: source,
            sink_records: sink,
        }
    }

    /// Rates, the busiest task's backpressure and the lag, each worked out by hand.
    #[test]
    fn a_point_is_the_interval_between_two_snapshots() {
        let before = snapshot(1_000, 500, 100, [0, 0], [i64::MIN, i64::MIN]);
        // 2 s later: 4 000 records read, 1 000 written; task 0 (one subtask) blocked 0.5 s,
        // task 1 (two subtasks) 3 s in all, 0.75 of the interval each on average.
        let now = snapshot(3_000, 4_500, 1_100, [500_000_000, 3_000_000_000], [9_000, 7_500]);
        let point = TimelinePoint::between(10_000, &now, &before, &[1, 2]);
        let expected = TimelinePoint {
            at_ms: 10_000,
            source_records_per_sec: 2_000.0,
            sink_records_per_sec: 500.0,
            backpressure: 0.75,
            watermark_lag_ms: Some(2_500),
        };
        assert_eq!(point, expected);
        let unset = TimelinePoint::between(10_000, &before, &before, &[1, 2]);
        assert_eq!((unset.watermark_lag_ms, unset.source_records_per_sec), (None, 0.0), "no watermark, no records");
    }

    #[test]
    fn the_timeline_keeps_the_newest_points_in_order() {
        let mut timeline = Timeline::default();
        let at = |ms| TimelinePoint {
            at_ms: ms,
            source_records_per_sec: 0.0,
            sink_records_per_sec: 0.0,
            backpressure: 0.0,
            watermark_lag_ms: None,
        };
        for ms in 0..(TIMELINE_POINTS as i64 + 7) {
            timeline.push(at(ms));
        }
        let kept: Vec<i64> = timeline.points().iter().map(|p| p.at_ms).collect();
        assert_eq!(kept, (7..TIMELINE_POINTS as i64 + 7).collect::<Vec<_>>());
    }
}
