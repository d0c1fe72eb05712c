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
//! so records are never decoded. Used by q5 (bids per auction in sliding windows:
//! `{key_as: auction, count_as: count}`) and q11 (bids per bidder in sessions:
//! `{key_as: bidder, count_as: bids}`). Merging adds the counts, so sessions merge exactly.

use eddy_sdk::{Aggregate, Error, Record, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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

/// The aggregate function.
#[derive(Debug)]
pub struct CountPerKey {
    config: CountConfig,
}

impl Aggregate for CountPerKey {
    type Config = Option<CountConfig>;
    type Accumulator = Counted;
    type Output = Value;

    fn open(config: Option<CountConfig>) -> Result<Self> {
        let Some(config) = config else {
            return Err(Error::bad_config("nexmark-count needs `config: {key_as: <field>, count_as: <field>}`"));
        };
        if config.key_as == config.count_as {
            return Err(Error::bad_config("`key_as` and `count_as` must name different fields"));
        }
        Ok(CountPerKey { config })
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

    fn result(&self, acc: Counted) -> Value {
        let mut row = Map::new();
        row.insert(self.config.key_as.clone(), acc.key.unwrap_or(Value::Null));
        row.insert(self.config.count_as.clone(), acc.count.into());
        Value::Object(row)
    }
}

eddy_sdk::export_aggregate!(CountPerKey);
