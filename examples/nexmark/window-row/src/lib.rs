//! Nexmark, shaping a window result into a query's row: a window step emits
//! `{"start": s, "end": e, "result": {...}}`; this operator emits the result's fields plus
//! the window bounds under the names the query's row uses. In SQL terms, for the q11 config:
//!
//! ```sql
//! SELECT result.*, window_start AS start, window_end AS end FROM <window step>
//! ```
//!
//! The step's `config` names the fields for the bounds; a bound not named is left out:
//!
//! ```yaml
//! config: {end: window_end}            # q7: {"window_end", "auction", "bidder", "price"}
//! config: {start: start, end: end}     # q11: {"bidder", "bids", "start", "end"}
//! ```
//!
//! Stateless: it runs chained right after the window (no `key_by`), keeps the record's key
//! and timestamp (`end - 1`), and fails on a result that is not a JSON object or that already
//! has a field of a bound's name (the row would be ambiguous).

use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result};
use nexmark_model::WindowResult;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The step's `config`: field names for the window bounds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowConfig {
    /// Field for the window start, if wanted.
    #[serde(default)]
    pub start: Option<String>,
    /// Field for the window end, if wanted.
    #[serde(default)]
    pub end: Option<String>,
}

/// The operator.
#[derive(Debug)]
pub struct WindowRow {
    config: RowConfig,
}

impl Operator for WindowRow {
    type Config = Option<RowConfig>;

    fn open(config: Option<RowConfig>, _ctx: &mut OpenContext) -> Result<Self> {
        let config = config.unwrap_or_default();
        if config.start.is_some() && config.start == config.end {
            return Err(Error::bad_config("`start` and `end` must name different fields"));
        }
        Ok(WindowRow { config })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let window: WindowResult<Map<String, Value>> = record.value()?;
        let mut row = window.result;
        for (name, bound) in [(&self.config.start, window.start), (&self.config.end, window.end)] {
            let Some(name) = name else { continue };
            if row.insert(name.clone(), bound.into()).is_some() {
                return Err(Error::bad_record(format!("the window result already has a field `{name}`")));
            }
        }
        let value = eddy_sdk::codec::encode(&row)?;
        ctx.emit_raw(None, record.key_bytes(), &value, record.timestamp())
    }
}

eddy_sdk::export_operator!(WindowRow);
