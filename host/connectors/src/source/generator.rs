//! The generator source: deterministic synthetic events for tests and benchmarks.
//!
//! Event `i` is a pure function of `(seed, i)`, so any reader can produce any event without
//! state, parallel readers split the indices by residue, and a position is just the next index.

use eddy_core::Record;
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::indexed::IndexedEvents;
use eddy_plan::GeneratorSpec;

// Distinct salts give each drawn quantity its own independent hash of `(seed, i)`.
const KEY_SALT: u64 = 0x9E37_79B9_7F4A_7C15;
const VALUE_SALT: u64 = 0xC2B2_AE3D_27D4_EB4F;
const DISORDER_SALT: u64 = 0x1656_67B1_9E37_79F9;

/// Event `index` of the generator `spec`: key `None`, value
/// `{"<key_field>": "<key_prefix><k>", "<value_field>": v, "ts": t, "seq": index}` and
/// timestamp `t`.
///
/// The key `k` is uniform in `0..keys`, the value uniform in `min_value..=max_value` and the
/// disorder `d` uniform in `0..=max_disorder_ms`; `t = start_ms + index * interval_ms - d`,
/// saturating at the ends of `i64`. Everything depends only on `(seed, index)`.
pub fn generator_event(spec: &GeneratorSpec, index: u64) -> Record {
    let mut value = Vec::new();
    let timestamp = write_event(spec, index, &mut value);
    Record { key: None, value, timestamp: Some(timestamp) }
}

/// Appends event `index`'s JSON to `out` and returns its event time.
fn write_event(spec: &GeneratorSpec, index: u64, out: &mut Vec<u8>) -> i64 {
    // A spec that skipped validation (keys 0, min > max, negative disorder) still gets events
    // rather than a panic: one key, the range between the bounds, no disorder.
    let key = draw(mix(spec.seed, index, KEY_SALT), u128::from(spec.keys.max(1)));
    let (lo, hi) = (spec.min_value.min(spec.max_value), spec.min_value.max(spec.max_value));
    let span = (i128::from(hi) - i128::from(lo) + 1) as u128;
    let value = i128::from(lo) + draw(mix(spec.seed, index, VALUE_SALT), span) as i128;
    let disorder = draw(mix(spec.seed, index, DISORDER_SALT), spec.max_disorder_ms.max(0) as u128 + 1) as i128;
    let time = i128::from(spec.start_ms)
        .saturating_add(i128::from(index).saturating_mul(i128::from(spec.interval_ms)))
        .saturating_sub(disorder)
        .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    let event = Event {
        spec,
        key: KeyText { prefix: &spec.key_prefix, key },
        // In range by construction: lo <= value <= hi.
        value: value as i64,
        time,
        index,
    };
    // Serializing integers and strings into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &event);
    time
}

/// A 64-bit hash of `(seed, index, salt)`; xxh3 is a fixed algorithm, so events stay the same
/// across builds and machines.
fn mix(seed: u64, index: u64, salt: u64) -> u64 {
    let mut input = [0u8; 16];
    input[..8].copy_from_slice(&index.to_le_bytes());
    input[8..].copy_from_slice(&salt.to_le_bytes());
    xxh3_64_with_seed(&input, seed)
}

/// Maps a uniform 64-bit hash to `0..n` (`1 <= n <= 2^64`) by multiply-high: no division and
/// a bias of at most `n / 2^64`.
fn draw(hash: u64, n: u128) -> u128 {
    (u128::from(hash) * n) >> 64
}

/// The event's JSON object, fields in the documented order.
struct Event<'a> {
    spec: &'a GeneratorSpec,
    key: KeyText<'a>,
    value: i64,
    time: i64,
    index: u64,
}

impl Serialize for Event<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry(&self.spec.key_field, &self.key)?;
        map.serialize_entry(&self.spec.value_field, &self.value)?;
        map.serialize_entry("ts", &self.time)?;
        map.serialize_entry("seq", &self.index)?;
        map.end()
    }
}

/// `<prefix><k>`, serialized without building the string first.
struct KeyText<'a> {
    prefix: &'a str,
    key: u128,
}

impl Serialize for KeyText<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{}{}", self.prefix, self.key))
    }
}

/// The generator as an index-addressed event stream.
impl IndexedEvents for GeneratorSpec {
    fn source_name(&self) -> &str {
        &self.name
    }

    fn events(&self) -> Option<u64> {
        self.events
    }

    fn write(&self, index: u64, out: &mut Vec<u8>) -> i64 {
        write_event(self, index, out)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use eddy_plan::SourceSpec;

    pub(in crate::source) fn gen_spec(seed: u64, events: Option<u64>) -> GeneratorSpec {
        GeneratorSpec {
            name: "gen".into(),
            seed,
            events,
            parallelism: 1,
            keys: 7,
            key_field: "user".into(),
            key_prefix: "u".into(),
            value_field: "amount".into(),
            min_value: -20,
            max_value: 20,
            start_ms: 1_000_000,
            interval_ms: 10,
            max_disorder_ms: 35,
            rate_per_sec: None,
        }
    }

    fn read(spec: &GeneratorSpec, subtask: u32, parallelism: u32, start: Option<u64>, max: usize) -> Vec<Record> {
        crate::source::indexed::tests::read(&SourceSpec::Generator(spec.clone()), subtask, parallelism, start, max)
    }

    fn json(r: &Record) -> serde_json::Value {
        serde_json::from_slice(&r.value).unwrap()
    }

    #[test]
    fn events_have_the_documented_shape() {
        let spec = gen_spec(3, Some(5));
        let got = read(&spec, 0, 1, None, 2);
        assert_eq!(got.len(), 5);
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r, &generator_event(&spec, i as u64));
            assert_eq!(r.key, None);
            let text = std::str::from_utf8(&r.value).unwrap();
            let v = json(r);
            let (key, amount) = (v["user"].as_str().unwrap(), v["amount"].as_i64().unwrap());
            let ts = r.timestamp.unwrap();
            assert_eq!(text, format!(r#"{{"user":"{key}","amount":{amount},"ts":{ts},"seq":{i}}}"#));
            assert!(key.starts_with('u'));
        }
    }

    #[test]
    fn same_seed_same_events_other_seed_other_events() {
        let a = read(&gen_spec(42, Some(500)), 0, 1, None, 64);
        let b = read(&gen_spec(42, Some(500)), 0, 1, None, 7);
        let c = read(&gen_spec(43, Some(500)), 0, 1, None, 64);
        assert_eq!(a, b);
        assert_eq!(a.len(), 500);
        // Each drawn part depends on the seed: with 7 keys, 41 values and 36 disorders,
        // independent draws agree for well under 1 in 5 events.
        for field in ["user", "amount", "ts"] {
            let differing = a.iter().zip(&c).filter(|(x, y)| json(x)[field] != json(y)[field]).count();
            assert!(differing > 300, "only {differing} of 500 events differ in `{field}` between seeds");
        }
    }

    #[test]
    fn parallel_readers_partition_the_events() {
        let spec = gen_spec(9, Some(301));
        let mut single = read(&spec, 0, 1, None, 50);
        let mut union = Vec::new();
        for subtask in 0..3 {
            let part = read(&spec, subtask, 3, None, 17);
            for r in &part {
                assert_eq!(json(r)["seq"].as_u64().unwrap() % 3, u64::from(subtask));
            }
            let seqs: Vec<u64> = part.iter().map(|r| json(r)["seq"].as_u64().unwrap()).collect();
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "reader {subtask} is not in index order");
            union.extend(part);
        }
        assert_eq!(union.len(), 301);
        single.sort();
        union.sort();
        assert_eq!(union, single);
    }

    #[test]
    fn events_stay_within_their_bounds_and_cover_them() {
        let spec = gen_spec(5, Some(5000));
        let mut keys = std::collections::BTreeSet::new();
        let (mut min_v, mut max_v, mut max_d) = (i64::MAX, i64::MIN, 0);
        for r in read(&spec, 0, 1, None, 256) {
            let v = json(&r);
            let i = v["seq"].as_i64().unwrap();
            let base = spec.start_ms + i * spec.interval_ms;
            let t = r.timestamp.unwrap();
            assert_eq!(v["ts"].as_i64(), Some(t));
            assert!((base - spec.max_disorder_ms..=base).contains(&t), "event {i}: t {t} vs base {base}");
            max_d = max_d.max(base - t);
            let amount = v["amount"].as_i64().unwrap();
            assert!((spec.min_value..=spec.max_value).contains(&amount), "event {i}: value {amount}");
            (min_v, max_v) = (min_v.min(amount), max_v.max(amount));
            let key: u64 = v["user"].as_str().unwrap().strip_prefix('u').unwrap().parse().unwrap();
            assert!(key < spec.keys, "event {i}: key {key}");
            keys.insert(key);
        }
        // Uniform draws over 5000 events reach every key, both value bounds and the full disorder.
        assert_eq!(keys.len() as u64, spec.keys);
        assert_eq!((min_v, max_v), (spec.min_value, spec.max_value));
        assert_eq!(max_d, spec.max_disorder_ms);
    }

    #[test]
    fn extreme_ranges_neither_overflow_nor_collapse() {
        let mut spec = gen_spec(1, Some(200));
        (spec.min_value, spec.max_value) = (i64::MIN, i64::MAX);
        (spec.start_ms, spec.interval_ms, spec.max_disorder_ms) = (i64::MAX - 5, i64::MAX, i64::MAX);
        spec.keys = u64::MAX;
        let got = read(&spec, 0, 1, None, 64);
        let values: std::collections::BTreeSet<i64> = got.iter().map(|r| json(r)["amount"].as_i64().unwrap()).collect();
        assert!(values.len() > 190, "values collapsed: {}", values.len());
        assert!(values.iter().any(|v| *v < 0) && values.iter().any(|v| *v > 0));
        let mut far = spec.clone();
        far.max_disorder_ms = 0;
        assert_eq!(generator_event(&far, u64::MAX).timestamp, Some(i64::MAX));
        let mut fixed = spec;
        (fixed.min_value, fixed.max_value, fixed.keys) = (4, 4, 1);
        for i in [0, 1, u64::MAX] {
            let v = json(&generator_event(&fixed, i));
            assert_eq!((v["amount"].as_i64(), v["user"].as_str()), (Some(4), Some("u0")));
        }
    }
}
