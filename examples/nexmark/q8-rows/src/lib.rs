//! Nexmark q8's last step: the window step (`nexmark-q8`) emits, per person id and window,
//! `{"start", "end", "result": {"names": [..]}}` with the names the person registered with if
//! they also created an auction in the window, none otherwise. This operator emits one row
//! `{"id", "name", "window_start"}` per name, keyed by the person's id (the window's key), with
//! the window result's timestamp (`end - 1`). In SQL terms:
//!
//! ```sql
//! SELECT key AS id, name, start AS window_start FROM <window step>, UNNEST(result.names) AS name
//! ```
//!
//! Stateless: it runs chained right after the window (no `key_by`).

use eddy_sdk::{Context, OpenContext, Operator, Record, Result};
use nexmark_model::WindowResult;
use serde::{Deserialize, Serialize};

/// What this step reads of a window's result.
#[derive(Debug, Deserialize)]
struct Sold {
    names: Vec<String>,
}

/// One output row.
#[derive(Debug, Serialize)]
struct NewUser<'a> {
    /// The person's id.
    id: u64,
    /// The person's name.
    name: &'a str,
    /// Start of the window (ms).
    window_start: i64,
}

/// The operator.
#[derive(Debug)]
pub struct NewUserRows;

impl Operator for NewUserRows {
    type Config = ();

    fn open(_config: (), _ctx: &mut OpenContext) -> Result<Self> {
        Ok(NewUserRows)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let window: WindowResult<Sold> = record.value()?;
        if window.result.names.is_empty() {
            return Ok(());
        }
        let id: u64 = record.key()?;
        for name in &window.result.names {
            ctx.emit(&id, &NewUser { id, name, window_start: window.start })?;
        }
        Ok(())
    }
}

eddy_sdk::export_operator!(NewUserRows);
