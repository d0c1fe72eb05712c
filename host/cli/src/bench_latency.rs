//! Latency of a paced `eddy bench nexmark` run: from the moment the input that made a result
//! entered the job to the moment the result reached the sink.
//!
//! Event times are the unpaced run's (so a paced run has the same windows, keys and state as
//! the run that measured the peak), not the wall clock, so a result's timestamp alone says
//! nothing about when its input arrived. Instead every source reader's batches are logged as
//! they enter the job ([`EntryLog`], fed by the engine's source observer), and the sink logs
//! when each result arrived with its timestamp; after the run, each result is matched to the
//! input that made it:
//!
//! - a per-event row (q0–q3 carry their event's time) was made by its own event; the first
//!   moment any reader had passed its time is when that event had entered at the latest, so
//!   the latency is exact without disorder and at most the disorder's span too high with it;
//! - a window or timer result with time `t` (q5, q7, q8, q11) fired once the watermark reached
//!   `t`: the input that made it is the batch that took the slowest reader's event time past
//!   `t + bound` (its watermark being `max - bound - 1`), or that reader's end.
//!
//! Either way a latency can never be negative: the input is matched at or before it entered.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use eddy_core::RecordBatch;
use eddy_engine::{SourceEntry, SourceObserver};

/// Nanoseconds since the log's origin.
type Nanos = u64;

/// How the query's results come about, which decides what input made each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// A row per event, carrying that event's time.
    ByItsEvent,
    /// Fired by the watermark (windows, event-time timers); `bound_ms` is the out-of-orderness
    /// bound of the sources' watermarks.
    ByWatermark {
        /// The spec's `out_of_orderness_ms`.
        bound_ms: i64,
    },
}

/// What one reader passed in: each new maximum event time with the moment it entered, then
/// the moment its input ended.
#[derive(Debug, Default, Clone)]
struct Reader {
    source: usize,
    reader: u32,
    /// `(entered, max event time so far)`, both increasing.
    maxima: Vec<(Nanos, i64)>,
    ended: Option<Nanos>,
}

impl Reader {
    /// When this reader first passed event time `t` (had read an event at `t` or later).
    fn reached(&self, t: i64) -> Option<Nanos> {
        let at = self.maxima.partition_point(|&(_, max)| max < t);
        self.maxima.get(at).map(|&(entered, _)| entered)
    }
}

/// The readers' entries and the sinks' arrivals, on one clock.
#[derive(Debug)]
pub struct EntryLog {
    origin: Instant,
    readers: Mutex<Vec<Reader>>,
}

impl EntryLog {
    /// A log whose clock starts now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self { origin: Instant::now(), readers: Mutex::new(Vec::new()) })
    }

    /// Now, on the log's clock.
    pub fn now(&self) -> Nanos {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The observer to give the job.
    pub fn observer(self: &Arc<Self>) -> SourceObserver {
        let log = self.clone();
        Arc::new(move |source, reader, entry| log.enter(source, reader, entry))
    }

    fn enter(&self, source: usize, reader: u32, entry: SourceEntry<'_>) {
        let now = self.now();
        let batch_max = match entry {
            SourceEntry::Batch(batch) => batch_max(batch),
            SourceEntry::End => None,
        };
        let Ok(mut readers) = self.readers.lock() else { return };
        let at = match readers.iter().position(|r| (r.source, r.reader) == (source, reader)) {
            Some(at) => at,
            None => {
                readers.push(Reader { source, reader, ..Reader::default() });
                readers.len() - 1
            }
        };
        let log = &mut readers[at];
        match (entry, batch_max) {
            (SourceEntry::End, _) => log.ended = Some(now),
            (SourceEntry::Batch(_), Some(max)) if log.maxima.last().is_none_or(|&(_, before)| max > before) => {
                log.maxima.push((now, max));
            }
            (SourceEntry::Batch(_), _) => {}
        }
    }

    /// The latency in ms of each result that arrived at `arrived` with event time `timestamp`;
    /// results no logged input accounts for are left out.
    pub fn latencies(&self, results: &[(Nanos, i64)], made: Made) -> Vec<f64> {
        let readers = self.readers.lock().map(|r| r.clone()).unwrap_or_default();
        results
            .iter()
            .filter_map(|&(arrived, t)| {
                let entered = made_at(&readers, t, made)?;
                Some(arrived.saturating_sub(entered) as f64 / 1e6)
            })
            .collect()
    }
}

fn batch_max(batch: &RecordBatch) -> Option<i64> {
    batch.iter().filter_map(|r| r.timestamp).max()
}

/// When the input that made a result with event time `t` entered.
fn made_at(readers: &[Reader], t: i64, made: Made) -> Option<Nanos> {
    match made {
        Made::ByItsEvent => readers.iter().filter_map(|r| r.reached(t)).min(),
        Made::ByWatermark { bound_ms } => {
            let passed = t.saturating_add(bound_ms).saturating_add(1);
            readers.iter().map(|r| r.reached(passed).or(r.ended)).collect::<Option<Vec<_>>>()?.into_iter().max()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(maxima: &[(Nanos, i64)], ended: Option<Nanos>) -> Reader {
        Reader { maxima: maxima.to_vec(), ended, ..Reader::default() }
    }

    #[test]
    fn results_are_matched_to_the_input_that_made_them() {
        // Two readers: one ahead in event time, one behind that ends.
        let readers = [reader(&[(10, 100), (20, 200), (30, 300)], None), reader(&[(15, 150), (25, 250)], Some(40))];
        let by_watermark = Made::ByWatermark { bound_ms: 49 };
        // (event time, made by, entered): worked out by hand from the table above.
        let cases: [(i64, Made, Option<Nanos>); 8] = [
            (100, Made::ByItsEvent, Some(10)),
            (150, Made::ByItsEvent, Some(15)),
            (160, Made::ByItsEvent, Some(20)),
            (300, Made::ByItsEvent, Some(30)),
            (301, Made::ByItsEvent, None),
            // Watermark = max - 50: reaching 100 needs max 150 on both readers.
            (100, by_watermark, Some(20)),
            (150, by_watermark, Some(25)),
            // Reader 2 never reached 250 + 50: its end fired it, after reader 1 reached 300.
            (250, by_watermark, Some(40)),
        ];
        for (t, made, entered) in cases {
            assert_eq!(made_at(&readers, t, made), entered, "{t} {made:?}");
        }
        let open = [reader(&[(10, 100)], None)];
        assert_eq!(made_at(&open, 100, by_watermark), None, "not fired by anything logged");
    }

    #[test]
    fn the_log_keeps_each_readers_new_maxima_and_its_end() {
        let log = EntryLog::new();
        let observe = log.observer();
        let batch = |times: &[i64]| {
            let mut b = RecordBatch::default();
            for t in times {
                b.push(None, b"e", Some(*t));
            }
            b
        };
        observe(0, 0, SourceEntry::Batch(&batch(&[5, 3])));
        observe(0, 1, SourceEntry::Batch(&batch(&[4])));
        observe(0, 0, SourceEntry::Batch(&batch(&[2])));
        observe(0, 0, SourceEntry::End);
        let readers = log.readers.lock().unwrap().clone();
        let maxima: Vec<Vec<i64>> = readers.iter().map(|r| r.maxima.iter().map(|m| m.1).collect()).collect();
        assert_eq!(maxima, [vec![5], vec![4]], "a batch that sets no new maximum adds nothing");
        assert!(readers[0].ended.is_some() && readers[1].ended.is_none());
        let arrived = log.now();
        let latencies = log.latencies(&[(arrived, 4), (arrived, 5)], Made::ByItsEvent);
        assert_eq!(latencies.len(), 2);
        assert!(latencies.iter().all(|l| *l >= 0.0), "{latencies:?}");
    }
}
