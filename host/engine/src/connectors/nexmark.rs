//! The Nexmark source: the benchmark's persons, auctions and bids from `eddy_nexmark`.
//!
//! Like the generator source, event `i` is a pure function of `(config, i)`: parallel readers
//! split the indices by residue, and a position is just the next index. A record has no key,
//! the event's compact JSON as value and its `date_time` as timestamp.

use eddy_nexmark::NexmarkConfig;

use super::indexed::IndexedEvents;
use crate::NexmarkSourceSpec;

/// The Nexmark generator as an index-addressed event stream.
#[derive(Debug)]
pub(super) struct NexmarkEvents {
    name: String,
    config: NexmarkConfig,
}

impl NexmarkEvents {
    pub(super) fn new(spec: &NexmarkSourceSpec) -> Self {
        Self { name: spec.name.clone(), config: spec.config() }
    }
}

impl IndexedEvents for NexmarkEvents {
    fn source_name(&self) -> &str {
        &self.name
    }

    fn events(&self) -> Option<u64> {
        self.config.events
    }

    fn write(&self, index: u64, out: &mut Vec<u8>) -> i64 {
        let event = eddy_nexmark::event(&self.config, index);
        out.clear();
        eddy_nexmark::write_json(&event, out);
        event.date_time()
    }
}

#[cfg(test)]
mod tests {
    use eddy_core::{Record, RecordBatch};
    use eddy_nexmark::{Event, event, to_json};
    use proptest::prelude::*;

    use super::*;
    use crate::SourceSpec;
    use crate::connectors::{Source, SourceError, SourcePosition, SourceStatus, open_source};

    fn spec(seed: u64, events: Option<u64>) -> SourceSpec {
        SourceSpec::Nexmark(NexmarkSourceSpec {
            name: "nex".into(),
            seed,
            events,
            max_disorder_ms: 40,
            ..NexmarkSourceSpec::default()
        })
    }

    fn config(spec: &SourceSpec) -> NexmarkConfig {
        let SourceSpec::Nexmark(n) = spec else { panic!("nexmark spec") };
        n.config()
    }

    /// The records event `i` should become.
    fn expected(config: &NexmarkConfig, i: u64) -> Record {
        let e = event(config, i);
        Record { key: None, value: to_json(&e), timestamp: Some(e.date_time()) }
    }

    /// Polls with `max` until the reader ends.
    fn drain(src: &mut dyn Source, max: usize) -> Vec<Record> {
        let mut batch = RecordBatch::default();
        loop {
            let before = batch.len();
            match src.poll(&mut batch, max).unwrap() {
                SourceStatus::Ready => assert!(batch.len() > before && batch.len() - before <= max),
                SourceStatus::End => return batch.iter().map(|r| r.to_owned()).collect(),
                SourceStatus::Idle => panic!("an unpaced source went idle"),
            }
        }
    }

    fn read(spec: &SourceSpec, subtask: u32, parallelism: u32, start: Option<u64>, max: usize) -> Vec<Record> {
        let start = start.map(|next_index| SourcePosition::Generator { next_index });
        let mut src = open_source(spec, subtask, parallelism, start.as_ref()).unwrap();
        drain(src.as_mut(), max)
    }

    #[test]
    fn records_are_the_generator_events_as_json() {
        let spec = spec(7, Some(120));
        let got = read(&spec, 0, 1, None, 16);
        assert_eq!(got.len(), 120);
        let config = config(&spec);
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r, &expected(&config, i as u64), "event {i}");
            let parsed: Event = serde_json::from_slice(&r.value).unwrap();
            assert_eq!(parsed.date_time(), r.timestamp.unwrap());
        }
        assert!(got[0].value.starts_with(br#"{"type":"person","id":1000,"#));
        assert!(got[1].value.starts_with(br#"{"type":"auction","id":1000,"#));
        assert!(got[4].value.starts_with(br#"{"type":"bid","auction":"#));
    }

    #[test]
    fn parallel_readers_partition_the_events() {
        let spec = spec(9, Some(301));
        let mut single = read(&spec, 0, 1, None, 50);
        let mut union = Vec::new();
        for subtask in 0..3 {
            let part = read(&spec, subtask, 3, None, 17);
            let config = config(&spec);
            let indices = (0..301).filter(|i| i % 3 == u64::from(subtask));
            assert_eq!(part, indices.map(|i| expected(&config, i)).collect::<Vec<_>>(), "reader {subtask}");
            union.extend(part);
        }
        single.sort();
        union.sort();
        assert_eq!(union, single);
    }

    #[test]
    fn bad_start_positions_are_rejected() {
        let spec = spec(0, Some(10));
        let cases = [
            (1, 3, SourcePosition::Generator { next_index: 5 }, "i % 3 == 1"),
            (0, 1, SourcePosition::File { line: 0, byte: 0 }, "not a generator position"),
        ];
        for (subtask, parallelism, position, needle) in cases {
            let err = open_source(&spec, subtask, parallelism, Some(&position)).err().unwrap();
            assert!(matches!(err, SourceError::BadPosition { .. }));
            let err = err.to_string();
            assert!(err.contains("source `nex`") && err.contains(needle), "{err}");
        }
        assert!(matches!(open_source(&spec, 3, 3, None), Err(SourceError::BadReader { .. })));
    }

    #[test]
    fn unbounded_source_runs_to_the_last_index() {
        let spec = spec(0, None);
        let mut src = open_source(&spec, 1, 2, Some(&SourcePosition::Generator { next_index: u64::MAX - 2 })).unwrap();
        let mut batch = RecordBatch::default();
        assert_eq!(src.poll(&mut batch, 1000).unwrap(), SourceStatus::Ready);
        // Only u64::MAX - 2 and u64::MAX remain in this reader's residue class.
        assert_eq!(batch.len(), 2);
        assert_eq!(src.poll(&mut batch, 1000).unwrap(), SourceStatus::End);
    }

    #[test]
    fn rate_limit_paces_the_reader() {
        let SourceSpec::Nexmark(mut n) = spec(0, None) else { panic!("nexmark spec") };
        n.rate_per_sec = Some(10);
        let mut src = open_source(&SourceSpec::Nexmark(n), 0, 1, None).unwrap();
        let mut batch = RecordBatch::default();
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(300) {
            src.poll(&mut batch, 1000).unwrap();
        }
        // Event n is due at n / 10 s: at most 1 + 10 * elapsed events by now.
        let bound = 1 + (10.0 * start.elapsed().as_secs_f64()) as usize;
        assert!((1..=bound).contains(&batch.len()), "{} events", batch.len());
    }

    proptest! {
        /// A reader resumed at the position reached after any number of polls of any size
        /// yields exactly the tail of the uninterrupted read.
        #[test]
        fn resume_from_position_yields_the_tail(
            seed in any::<u64>(),
            events in 0u64..200,
            parallelism in 1u32..5,
            subtask_pick in any::<u32>(),
            batch_sizes in prop::collection::vec(1usize..20, 1..6),
            polls_before in 0usize..20,
        ) {
            let spec = spec(seed, Some(events));
            let subtask = subtask_pick % parallelism;
            let all = read(&spec, subtask, parallelism, None, 1000);
            let mut src = open_source(&spec, subtask, parallelism, None).unwrap();
            let mut batch = RecordBatch::default();
            for i in 0..polls_before {
                if src.poll(&mut batch, batch_sizes[i % batch_sizes.len()]).unwrap() == SourceStatus::End {
                    break;
                }
            }
            let SourcePosition::Generator { next_index } = src.position() else { panic!("generator position") };
            let mut got: Vec<Record> = batch.iter().map(|r| r.to_owned()).collect();
            got.extend(read(&spec, subtask, parallelism, Some(next_index), batch_sizes[0]));
            prop_assert_eq!(got, all);
        }
    }
}
