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
pub(super) mod tests {
    use eddy_core::Record;
    use eddy_nexmark::{Event, event, to_json};

    use super::*;
    use crate::SourceSpec;
    use crate::connectors::indexed::tests::read;

    pub(in crate::connectors) fn spec(seed: u64, events: Option<u64>) -> SourceSpec {
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
    pub(in crate::connectors) fn expected(config: &NexmarkConfig, i: u64) -> Record {
        let e = event(config, i);
        Record { key: None, value: to_json(&e), timestamp: Some(e.date_time()) }
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
}
