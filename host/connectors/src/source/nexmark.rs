//! The Nexmark source: the benchmark's persons, auctions and bids from `eddy_nexmark`.
//!
//! Like the generator source, event `i` is a pure function of `(config, i)`: parallel readers
//! split the indices by residue, and a position is just the next index. A record has no key,
//! the event as a row (`eddy_nexmark::write_row`: its JSON object's fields, `type` first, named
//! by the schemas this source declares) and its `date_time` as timestamp.

use eddy_nexmark::NexmarkConfig;

use super::indexed::IndexedEvents;
use eddy_plan::NexmarkSourceSpec;

/// The Nexmark generator as an index-addressed event stream.
#[derive(Debug)]
pub(super) struct NexmarkEvents {
    name: String,
    config: NexmarkConfig,
    /// The generator's reused text buffers (one reader owns this source).
    scratch: std::cell::RefCell<eddy_nexmark::Scratch>,
}

impl NexmarkEvents {
    pub(super) fn new(spec: &NexmarkSourceSpec) -> Self {
        for schema in eddy_nexmark::row_schemas() {
            // Fixed names far inside every limit; a collision would be a bug caught by tests.
            let _ = eddy_runtime::schemas().declare(&schema);
        }
        Self { name: spec.name.clone(), config: spec.config(), scratch: Default::default() }
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
        let mut scratch = self.scratch.borrow_mut();
        let event = eddy_nexmark::event_ref(&self.config, index, &mut scratch);
        eddy_nexmark::write_row(&event, out);
        event.date_time()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use eddy_core::Record;
    use eddy_nexmark::event;

    use super::*;
    use crate::source::indexed::tests::read;
    use eddy_plan::SourceSpec;

    pub(in crate::source) fn spec(seed: u64, events: Option<u64>) -> SourceSpec {
        SourceSpec::Nexmark(NexmarkSourceSpec {
            name: "nex".into(),
            seed,
            events,
            max_disorder_ms: 40,
            ..NexmarkSourceSpec::default()
        })
    }

    /// The records event `i` should become.
    pub(in crate::source) fn expected(config: &NexmarkConfig, i: u64) -> Record {
        let e = event(config, i);
        let mut value = Vec::new();
        eddy_nexmark::write_row(&e.as_ref(), &mut value);
        Record { key: None, value, timestamp: Some(e.date_time()) }
    }

    /// Fields of some events at seed 7 with `max_disorder_ms: 40` (the rest of the config at
    /// its defaults), computed by a second implementation of the generator's documented draws,
    /// not by `eddy_nexmark`: `host/nexmark/oracle.py` (Python, the `xxhash` package), run as
    /// `python3 host/nexmark/oracle.py 0 1 4 ...`. Each choice is `xxh3_64(index as LE u64 ++ salt
    /// as LE u64, seed)` mapped to `0..n` by `(h * n) >> 64`; event times are
    /// `first_event_time_ms + index * inter_event_us / 1000 - disorder`.
    const DOCUMENTED: [(u64, &str); 17] = [
        (
            0,
            r#"{"type":"person","id":1000,"date_time":1699999999989,"state":"AZ","city":"San Francisco","credit_card":"5275 0979 9881 0419","name":"Walter Shultz"}"#,
        ),
        (
            1,
            r#"{"type":"auction","id":1000,"date_time":1699999999965,"seller":1000,"initial_bid":302758,"reserve":5278480,"category":12,"expires":1700000000061}"#,
        ),
        (
            4,
            r#"{"type":"bid","auction":1002,"bidder":1000,"price":49802,"channel":"channel-3582","date_time":1699999999964}"#,
        ),
        (
            5,
            r#"{"type":"bid","auction":1000,"bidder":1000,"price":55305270,"channel":"Google","date_time":1699999999978}"#,
        ),
        (49, r#"{"type":"bid","auction":1002,"bidder":1000,"price":605,"channel":"Google","date_time":1699999999989}"#),
        (
            50,
            r#"{"type":"person","id":1001,"date_time":1699999999980,"state":"ID","city":"Phoenix","credit_card":"3951 6816 2405 0747","name":"Saul Noris"}"#,
        ),
        (
            53,
            r#"{"type":"auction","id":1005,"date_time":1699999999975,"seller":1000,"initial_bid":64675407,"reserve":65017074,"category":14,"expires":1700000000203}"#,
        ),
        (
            54,
            r#"{"type":"bid","auction":1005,"bidder":1001,"price":3817,"channel":"Google","date_time":1699999999972}"#,
        ),
        (
            99,
            r#"{"type":"bid","auction":1000,"bidder":1001,"price":7122,"channel":"channel-3555","date_time":1699999999990}"#,
        ),
        (
            100,
            r#"{"type":"person","id":1002,"date_time":1699999999975,"state":"OR","city":"Seattle","credit_card":"4215 9800 8150 5233","name":"Peter Walton"}"#,
        ),
        (
            119,
            r#"{"type":"bid","auction":1001,"bidder":1001,"price":1247,"channel":"channel-6003","date_time":1699999999974}"#,
        ),
        (
            250000,
            r#"{"type":"person","id":6000,"date_time":1700000024982,"state":"WA","city":"Los Angeles","credit_card":"5112 1943 4512 3624","name":"Peter Walton"}"#,
        ),
        (
            250001,
            r#"{"type":"auction","id":16000,"date_time":1700000024984,"seller":5273,"initial_bid":3521,"reserve":883518,"category":12,"expires":1700000025037}"#,
        ),
        (
            250002,
            r#"{"type":"auction","id":16001,"date_time":1700000024963,"seller":6000,"initial_bid":645,"reserve":8386765,"category":13,"expires":1700000025095}"#,
        ),
        (
            250005,
            r#"{"type":"bid","auction":15976,"bidder":6000,"price":4984761,"channel":"Facebook","date_time":1700000024968}"#,
        ),
        (
            250007,
            r#"{"type":"bid","auction":15942,"bidder":6000,"price":245391,"channel":"channel-7828","date_time":1700000024989}"#,
        ),
        (
            250049,
            r#"{"type":"bid","auction":16000,"bidder":5428,"price":796,"channel":"Apple","date_time":1700000024968}"#,
        ),
    ];

    /// The kind the definition gives index `i`: per 50 events, 1 person, 3 auctions, 46 bids.
    fn documented_type(i: u64) -> &'static str {
        match i % 50 {
            0 => "person",
            1..=3 => "auction",
            _ => "bid",
        }
    }

    /// Checks every record of one reader (indices `first..`) against the definition and the
    /// table: no key, the event as a row that renders as JSON tagged by `"type"` first, its
    /// `date_time` as timestamp.
    /// Returns how many table rows it checked.
    fn check_documented(records: &[Record], first: u64) -> usize {
        let mut checked = 0;
        for (i, r) in (first..).zip(records) {
            assert_eq!(r.key, None, "event {i}");
            let json = crate::values::json_text(&r.value);
            let value: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
            let tag = format!(r#"{{"type":"{}","#, documented_type(i));
            assert!(json.starts_with(tag.as_bytes()), "event {i}: {value}");
            assert_eq!(Some(value["date_time"].as_i64().expect("date_time")), r.timestamp, "event {i}");
            let Some((_, fields)) = DOCUMENTED.iter().find(|(index, _)| *index == i) else { continue };
            let fields: serde_json::Map<String, serde_json::Value> = serde_json::from_str(fields).expect("table");
            for (name, expected) in fields {
                assert_eq!(value[&name], expected, "event {i}, field `{name}`: {value}");
            }
            checked += 1;
        }
        checked
    }

    #[test]
    fn records_are_the_documented_events_as_rows() {
        let got = read(&spec(7, Some(120)), 0, 1, None, 16);
        assert_eq!(got.len(), 120);
        let early = check_documented(&got, 0);
        // Later, where hot and cold sellers, bidders and auctions differ.
        let got = read(&spec(7, Some(250_050)), 0, 1, Some(250_000), 16);
        assert_eq!(got.len(), 50);
        assert_eq!(early + check_documented(&got, 250_000), DOCUMENTED.len(), "every row of the table was checked");
    }

    #[test]
    fn parallel_readers_partition_the_events() {
        // In order and one event per ms, event `i`'s timestamp is `first_event_time_ms + i`:
        // which events a reader yields can be read off its timestamps.
        let SourceSpec::Nexmark(mut n) = spec(9, Some(301)) else { unreachable!() };
        (n.max_disorder_ms, n.inter_event_us, n.first_event_time_ms) = (0, 1000, 5_000);
        let spec = SourceSpec::Nexmark(n);
        let indices =
            |records: &[Record]| -> Vec<i64> { records.iter().map(|r| r.timestamp.unwrap() - 5_000).collect() };
        let mut single = read(&spec, 0, 1, None, 50);
        assert_eq!(indices(&single), (0..301).collect::<Vec<_>>());
        let mut union = Vec::new();
        for subtask in 0..3 {
            let part = read(&spec, subtask, 3, None, 17);
            let expected: Vec<i64> = (0..301).filter(|i| i % 3 == i64::from(subtask)).collect();
            assert_eq!(indices(&part), expected, "reader {subtask}: the indices i % 3 == {subtask}, in order");
            union.extend(part);
        }
        single.sort();
        union.sort();
        assert_eq!(union, single, "the readers together yield exactly the events of one reader");
    }
}
