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

use eddy_sdk::{Aggregate, Error, Record, Result};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
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

/// The count of one key in one window.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counted {
    /// The key (absent only in an empty accumulator).
    pub key: Option<Value>,
    /// Records added.
    pub count: u64,
}

/// A window's result: the key, then the count, under the names the config gives.
#[derive(Debug, Clone, PartialEq)]
pub struct CountRow {
    /// `key_as` and `count_as`.
    names: [&'static str; 2],
    /// The key counted.
    pub key: Value,
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
            acc.key = Some(record.key()?);
        }
        acc.count += 1;
        Ok(())
    }

    fn merge(&self, a: Counted, b: Counted) -> Counted {
        // Every record of a window has the window's key, so both keys (when set) are equal.
        Counted { key: a.key.or(b.key), count: a.count + b.count }
    }

    fn result(&self, acc: Counted) -> CountRow {
        CountRow { names: self.names, key: acc.key.unwrap_or(Value::Null), count: acc.count }
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
        let row = eddy_sdk::codec::encode_value(&count.result(Counted { key: Some(Value::from(7u64)), count: 3 }))
            .expect("a row");
        assert!(eddy_wire::row::is_row(&row));
        let read: Value = eddy_sdk::codec::decode_value(&row).expect("read by name");
        assert_eq!(read, serde_json::json!({"bidder": 7, "bids": 3}));
        // A key of any JSON kind survives.
        let key = serde_json::json!({"id": [1, "x"]});
        let row =
            eddy_sdk::codec::encode_value(&count.result(Counted { key: Some(key.clone()), count: 1 })).expect("a row");
        let read: Value = eddy_sdk::codec::decode_value(&row).expect("read by name");
        assert_eq!(read, serde_json::json!({"bidder": key, "bids": 1}));
    }
}
