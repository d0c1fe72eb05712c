//! `nexmark-count`'s next version, for live swaps of a window step: it reads and writes the
//! same accumulators (the key and a count, as `nexmark-count` encodes them) and gives the same
//! result row, but adds two per record, so a window's count shows which code counted its
//! records. Its config is `nexmark-count`'s: `{key_as: <field>, count_as: <field>}`.

use eddy_sdk::{Aggregate, Error, Record, Result};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// The step's `config`, as `nexmark-count` takes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountConfig {
    /// Field of the result holding the key.
    pub key_as: String,
    /// Field of the result holding the count.
    pub count_as: String,
}

/// `nexmark-count`'s accumulator, field for field: its bytes read as written by either
/// version.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Counted")]
pub struct Counted {
    /// The key (absent only in an empty accumulator).
    pub key: Option<Value>,
    /// What the records added.
    pub count: u64,
}

/// A window's result, named by the config.
#[derive(Debug)]
pub struct CountRow {
    names: [&'static str; 2],
    key: Value,
    count: u64,
}

impl Serialize for CountRow {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut row = serializer.serialize_struct("Count", 2)?;
        row.serialize_field(self.names[0], &self.key)?;
        row.serialize_field(self.names[1], &self.count)?;
        row.end()
    }
}

/// The aggregate function.
#[derive(Debug)]
pub struct CountByTwo {
    names: [&'static str; 2],
}

impl Aggregate for CountByTwo {
    type Config = Option<CountConfig>;
    type Accumulator = Counted;
    type Output = CountRow;

    fn open(config: Option<CountConfig>) -> Result<Self> {
        let Some(config) = config else {
            return Err(Error::bad_config("count-per-key-v2 needs `config: {key_as: <field>, count_as: <field>}`"));
        };
        let leak = |name: String| -> &'static str { Box::leak(name.into_boxed_str()) };
        Ok(CountByTwo { names: [leak(config.key_as), leak(config.count_as)] })
    }

    fn create_accumulator(&self) -> Counted {
        Counted::default()
    }

    fn add(&self, acc: &mut Counted, record: &Record<'_>) -> Result<()> {
        if acc.key.is_none() {
            acc.key = Some(record.key()?);
        }
        acc.count += 2;
        Ok(())
    }

    fn merge(&self, a: Counted, b: Counted) -> Counted {
        Counted { key: a.key.or(b.key), count: a.count + b.count }
    }

    fn result(&self, acc: Counted) -> CountRow {
        CountRow { names: self.names, key: acc.key.unwrap_or(Value::Null), count: acc.count }
    }
}

eddy_sdk::export_aggregate!(CountByTwo);
