//! Nexmark, counting per key and window: an aggregate for host-side windows whose result
//! names the key it counted, so a later step that partitions differently (q5 re-keys window
//! results by window end) still knows it. In SQL terms, for the config below:
//!
//! ```sql
//! SELECT key AS auction, COUNT(*) AS count FROM <window's input> GROUP BY key, <window>
//! ```
//!
//! The step's `config` names the two fields of the result:
//!
//! ```yaml
//! config: {key_as: auction, count_as: count}   # result: {"auction": <key>, "count": <n>}
//! ```
//!
//! The key is the record's key as the window received it (the JSON of the `key_by` field),
//! so records are never decoded. The result is a row (read by name downstream and rendered as
//! the JSON above at a sink), so the next step and the host's `key_by` read it in place
//! instead of parsing JSON. Used by q5 (bids per auction in sliding windows:
//! `{key_as: auction, count_as: count}`) and q11 (bids per bidder in sessions:
//! `{key_as: bidder, count_as: bids}`). Merging adds the counts, so sessions merge exactly.

use eddy_sdk::row::{Kind, RowFrame, RowRef, Slot};
use eddy_sdk::{Aggregate, Error, Record, Result, Row, RowWrite};
use serde::de::{self, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The step's `config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountConfig {
    /// Field of the result holding the key.
    pub key_as: String,
    /// Field of the result holding the count.
    pub count_as: String,
}

/// The key counted: a JSON value, held as the kinds keys take (numbers and strings) apart
/// from the rest, because the accumulator is decoded and encoded per window per batch and a
/// `serde_json::Value` in it cost a third of that. It is written exactly as the `Value` it
/// stands for (a `u64` as a `u64`, text as a string), so accumulators written before it, in
/// savepoints, read back unchanged.
#[derive(Debug, Clone, PartialEq)]
pub enum Key {
    /// A number from 0 to 2^64 - 1.
    U64(u64),
    /// A negative number.
    I64(i64),
    /// A string.
    Str(String),
    /// Anything else (a float, a bool, null, an object, an array).
    Other(Value),
}

impl Key {
    /// The key the JSON text `text` holds, as serde reads it. Once per window and key, so the
    /// ids that q5 and q11 count (plain non-negative integers) are read without serde_json's
    /// parser, which took ~1.5% of q5's CPU.
    pub fn from_json(text: &[u8]) -> Result<Key> {
        match plain_u64(text) {
            Some(n) => Ok(Key::U64(n)),
            None => eddy_sdk::codec::decode(text),
        }
    }

    /// The key as a JSON value.
    pub fn into_value(self) -> Value {
        match self {
            Key::U64(n) => Value::from(n),
            Key::I64(n) => Value::from(n),
            Key::Str(s) => Value::String(s),
            Key::Other(v) => v,
        }
    }
}

/// `text` as a JSON number that is a `u64` without sign, fraction, exponent, leading zero
/// or spaces; `None` for anything else (left to serde). At most 19 digits cannot overflow.
fn plain_u64(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || (text[0] == b'0' && text.len() > 1) {
        return None;
    }
    text.iter().try_fold(0u64, |n, &d| d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0')))
}

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Key::U64(n) => serializer.serialize_u64(*n),
            Key::I64(n) => serializer.serialize_i64(*n),
            Key::Str(s) => serializer.serialize_str(s),
            Key::Other(v) => v.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(KeyVisitor)
    }
}

/// Reads what [`Key`] (or the `Value` before it) wrote; what is not a number or a string goes
/// through `Value` as before.
struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> std::result::Result<Key, E> {
        Ok(Key::U64(n))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> std::result::Result<Key, E> {
        // As `Value` holds it: a non-negative number is a `u64`.
        Ok(u64::try_from(n).map_or(Key::I64(n), Key::U64))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<Key, E> {
        Ok(Key::Str(s.to_owned()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> std::result::Result<Key, E> {
        Ok(Key::Str(s))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> std::result::Result<Key, E> {
        Ok(Key::Other(Value::from(n)))
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> std::result::Result<Key, E> {
        Ok(Key::Other(Value::Bool(b)))
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<Key, E> {
        Ok(Key::Other(Value::Null))
    }
    fn visit_none<E: de::Error>(self) -> std::result::Result<Key, E> {
        Ok(Key::Other(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Key, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> std::result::Result<Key, A::Error> {
        Value::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Key::Other)
    }
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> std::result::Result<Key, A::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(Key::Other)
    }
}

/// A key in a row's slot as serde's row codec holds it: a number or a string in a slot of
/// its kind, anything else as serde writes a `Value` (a bool, a float, null, or JSON text).
/// Read back on this path are numbers and strings, the keys there are; the rest is left to
/// serde.
impl Slot for Key {
    fn read(row: &RowRef<'_>, i: usize) -> Option<Key> {
        match row.kind(i).ok()? {
            Kind::U64 => row.u64(i).ok().map(Key::U64),
            Kind::I64 => row.i64(i).ok().map(|n| u64::try_from(n).map_or(Key::I64(n), Key::U64)),
            Kind::Str => Some(Key::Str(row.str(i).ok()??.to_owned())),
            _ => None,
        }
    }

    fn write(&self, frame: &RowFrame, buf: &mut Vec<u8>, i: usize) {
        match self {
            Key::U64(n) => frame.u64(buf, i, *n),
            Key::I64(n) => frame.i64(buf, i, *n),
            Key::Str(s) => frame.variable(buf, i, Kind::Str, s.as_bytes()),
            Key::Other(Value::Null) => frame.null(buf, i),
            Key::Other(Value::Bool(b)) => frame.bool(buf, i, *b),
            Key::Other(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => frame.u64(buf, i, u),
                (None, Some(s)) => frame.i64(buf, i, s),
                // Neither integer is a float, which `as_f64` always gives.
                (None, None) => frame.f64(buf, i, n.as_f64().unwrap_or(f64::NAN)),
            },
            Key::Other(Value::String(s)) => frame.variable(buf, i, Kind::Str, s.as_bytes()),
            // A list or map: its compact JSON text, as the row encoder writes one.
            Key::Other(v) => frame.variable(buf, i, Kind::Json, v.to_string().as_bytes()),
        }
    }
}

/// The count of one key in one window. A row read and written by its derived layout: a
/// window decodes and re-encodes it once per batch that touches it, and serde's visitor took
/// ~8% of q5's CPU there; the bytes are serde's, so savepoints and `eddy state` see no change.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize, Row)]
pub struct Counted {
    /// The key (absent only in an empty accumulator).
    pub key: Option<Key>,
    /// Records added.
    pub count: u64,
}

/// A window's result: the key, then the count, under the names the config gives.
#[derive(Debug, Clone, PartialEq)]
pub struct CountRow {
    /// `key_as` and `count_as`.
    names: [&'static str; 2],
    /// The key counted.
    pub key: Key,
    /// Its records in the window.
    pub count: u64,
}

impl Serialize for CountRow {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        // A struct, so the SDK writes a row; its schema is declared once per instance, since
        // the names are the same `'static` strings every time.
        let mut row = serializer.serialize_struct("Count", 2)?;
        row.serialize_field(self.names[0], &self.key)?;
        row.serialize_field(self.names[1], &self.count)?;
        row.end()
    }
}

/// The aggregate function.
#[derive(Debug)]
pub struct CountPerKey {
    /// The config's field names, leaked once per instance: a struct's field names are
    /// `'static` in serde, and the row writer knows a schema by their addresses.
    names: [&'static str; 2],
}

impl Aggregate for CountPerKey {
    type Config = Option<CountConfig>;
    type Accumulator = Counted;
    type Output = CountRow;

    fn open(config: Option<CountConfig>) -> Result<Self> {
        let Some(config) = config else {
            return Err(Error::bad_config("nexmark-count needs `config: {key_as: <field>, count_as: <field>}`"));
        };
        if config.key_as == config.count_as {
            return Err(Error::bad_config("`key_as` and `count_as` must name different fields"));
        }
        let leak = |name: String| -> &'static str { Box::leak(name.into_boxed_str()) };
        Ok(CountPerKey { names: [leak(config.key_as), leak(config.count_as)] })
    }

    fn create_accumulator(&self) -> Counted {
        Counted::default()
    }

    fn add(&self, acc: &mut Counted, record: &Record<'_>) -> Result<()> {
        if acc.key.is_none() {
            let text =
                record.key_bytes().ok_or_else(|| Error::bad_record("record has no key (is the stream keyed?)"))?;
            acc.key = Some(Key::from_json(text)?);
        }
        acc.count += 1;
        Ok(())
    }

    fn merge(&self, a: Counted, b: Counted) -> Counted {
        // Every record of a window has the window's key, so both keys (when set) are equal.
        Counted { key: a.key.or(b.key), count: a.count + b.count }
    }

    fn result(&self, acc: Counted) -> CountRow {
        CountRow { names: self.names, key: acc.key.unwrap_or(Key::Other(Value::Null)), count: acc.count }
    }

    fn read_accumulator(bytes: &[u8]) -> Result<Counted> {
        eddy_sdk::row::decode(bytes)
    }

    fn write_accumulator(acc: &Counted, buf: &mut Vec<u8>) -> Result<()> {
        acc.write_row(buf);
        Ok(())
    }
}

eddy_sdk::export_aggregate!(CountPerKey);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_result_is_a_row_named_by_the_config_and_reads_as_the_json_object() {
        let config = CountConfig { key_as: "bidder".into(), count_as: "bids".into() };
        let count = CountPerKey::open(Some(config)).expect("valid config");
        let row =
            eddy_sdk::codec::encode_value(&count.result(Counted { key: Some(Key::U64(7)), count: 3 })).expect("a row");
        assert!(eddy_wire::row::is_row(&row));
        let read: Value = eddy_sdk::codec::decode_value(&row).expect("read by name");
        assert_eq!(read, serde_json::json!({"bidder": 7, "bids": 3}));
        // A key of any JSON kind survives.
        let key = serde_json::json!({"id": [1, "x"]});
        let row =
            eddy_sdk::codec::encode_value(&count.result(Counted { key: Some(Key::Other(key.clone())), count: 1 }))
                .expect("a row");
        let read: Value = eddy_sdk::codec::decode_value(&row).expect("read by name");
        assert_eq!(read, serde_json::json!({"bidder": key, "bids": 1}));
    }

    /// The accumulator as it was written before [`Key`]: its bytes are what savepoints hold.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename = "Counted")]
    struct CountedBefore {
        key: Option<Value>,
        count: u64,
    }

    proptest::proptest! {
        /// Key texts read as serde_json reads them (the oracle), digits and near-misses alike.
        #[test]
        fn a_key_text_reads_as_serde_reads_it(text in "[-+ 0-9.eE\"a]{0,22}|[0-9]{1,21}|18446744073709551[0-9]{3}") {
            let ours = Key::from_json(text.as_bytes()).ok().map(Key::into_value);
            let serde = serde_json::from_str::<Value>(&text).ok();
            proptest::prop_assert_eq!(ours, serde, "text {:?}", text);
        }
    }

    #[test]
    fn accumulators_are_written_as_before_and_read_back_from_the_old_bytes() {
        let keys = [
            serde_json::json!(0),
            serde_json::json!(18446744073709551615u64),
            serde_json::json!(-7),
            serde_json::json!("auction é"),
            serde_json::json!(1.5),
            serde_json::json!(true),
            serde_json::json!({"id": [1, "x"]}),
            serde_json::json!([null, 2]),
            serde_json::json!(i64::MIN),
            serde_json::json!(""),
            serde_json::json!(-0.25),
            serde_json::json!({}),
            serde_json::json!([]),
            serde_json::json!({"b": {"c": "é\"q"}, "a": false}),
        ];
        for key in keys {
            let before = CountedBefore { key: Some(key.clone()), count: 5 };
            let old = eddy_sdk::codec::encode_value(&before).expect("encodes");
            let read: Counted = eddy_sdk::codec::decode_value(&old).expect("old bytes decode");
            assert_eq!(read.count, 5);
            assert_eq!(read.key.clone().map(Key::into_value), Some(key.clone()), "read back {key}");
            let new = eddy_sdk::codec::encode_value(&read).expect("encodes");
            assert_eq!(new, old, "written as before: {key}");
            // The derived layout, which the windows use, reads and writes what serde does.
            assert_eq!(CountPerKey::read_accumulator(&old).expect("reads"), read, "derived read of {key}");
            let mut derived = Vec::new();
            CountPerKey::write_accumulator(&read, &mut derived).expect("writes");
            assert_eq!(derived, old, "derived bytes of {key}");
            // The record key (JSON text) reads as the same key.
            let from_text: Key = serde_json::from_str(&key.to_string()).expect("JSON key");
            assert_eq!(from_text.into_value(), key);
        }
        let empty = eddy_sdk::codec::encode_value(&CountedBefore { key: None, count: 0 }).expect("encodes");
        assert_eq!(eddy_sdk::codec::decode_value::<Counted>(&empty).expect("decodes"), Counted::default());
        assert_eq!(CountPerKey::read_accumulator(&empty).expect("reads"), Counted::default());
        let mut derived = Vec::new();
        CountPerKey::write_accumulator(&Counted::default(), &mut derived).expect("writes");
        assert_eq!(derived, empty);
        // A key that is JSON null is written as an absent one, as serde writes `Some(null)`.
        let null = Counted { key: Some(Key::Other(Value::Null)), count: 2 };
        let mut derived = Vec::new();
        CountPerKey::write_accumulator(&null, &mut derived).expect("writes");
        assert_eq!(derived, eddy_sdk::codec::encode_value(&null).expect("encodes"));
    }
}
