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
//!
//! A result that is a row (q7's and q11's aggregates write rows) becomes a row: its fields'
//! slots copied as they are, then the bounds, under a schema declared once per result schema.
//! Anything else goes through a JSON object. Both read as the same JSON object downstream; the
//! row path skips decoding the result into a map and encoding it again, which was ~4% of q11's
//! CPU.

use eddy_sdk::codec::{Field, FieldName};
use eddy_sdk::row::{Kind, RowFrame, RowRef};
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
    /// The window row's fields, their slots remembered per schema.
    start: Field,
    end: Field,
    result: Field,
    /// Per result schema id: the output's schema id and the result's field count.
    shapes: Vec<(u32, u32, usize)>,
    /// The output row being written (reused).
    out: Vec<u8>,
}

fn damaged(e: impl std::fmt::Display) -> Error {
    Error::bad_record(format!("a damaged window row: {e}"))
}

/// Results of more fields than this go through JSON: the row path adds the bounds to the
/// result's fields, and the host limits how many a schema has.
const MAX_ROW_FIELDS: usize = 256;

impl WindowRow {
    /// Writes the window row `value` flattened into `self.out` if its result is a row;
    /// `Ok(false)` if it is something else (JSON, say), for the JSON path to take.
    fn flatten_row(&mut self, value: &[u8]) -> Result<bool> {
        let Ok(window) = RowRef::new(value) else { return Ok(false) };
        let (Some(s), Some(e), Some(r)) =
            ((&self.start).slot_in(&window), (&self.end).slot_in(&window), (&self.result).slot_in(&window))
        else {
            return Ok(false);
        };
        // Bounds as the host writes them and a result that is a row; else the JSON path.
        let (Ok(start), Ok(end), Ok(Kind::Row)) = (window.i64(s), window.i64(e), window.kind(r)) else {
            return Ok(false);
        };
        if window.is_null(r).map_err(damaged)? {
            return Ok(false);
        }
        let result = RowRef::new(window.variable(r).map_err(damaged)?.unwrap_or_default()).map_err(damaged)?;
        let Some((schema, fields)) = self.shape(&result)? else { return Ok(false) };
        // The bounds the config names, in the order `shape` named them.
        let added = [self.config.start.is_some().then_some(start), self.config.end.is_some().then_some(end)];
        let added = added.into_iter().flatten();
        self.out.clear();
        let frame = RowFrame::begin(&mut self.out, fields + added.clone().count(), schema);
        for i in 0..fields {
            frame.copy_field(&mut self.out, i, &result, i).map_err(damaged)?;
        }
        for (i, bound) in (fields..).zip(added) {
            frame.i64(&mut self.out, i, bound);
        }
        Ok(true)
    }

    /// The bound names the output adds, in order.
    fn bounds(&self) -> impl Iterator<Item = &str> {
        [&self.config.start, &self.config.end].into_iter().flatten().map(String::as_str)
    }

    /// The output schema for results of `result`'s schema and the result's field count:
    /// declared the first time; `None` for a result too wide for the row path.
    fn shape(&mut self, result: &RowRef<'_>) -> Result<Option<(u32, usize)>> {
        let id = result.schema();
        if let Some(&(_, out, fields)) = self.shapes.iter().find(|(known, _, _)| *known == id) {
            return Ok(Some((out, fields)));
        }
        let schema = eddy_sdk::row::schema(id).ok_or_else(|| {
            Error::bad_record(format!("a window result of schema {id}, which the host does not know"))
        })?;
        if schema.fields.len() != result.len() || schema.fields.len() > MAX_ROW_FIELDS {
            return Ok(None);
        }
        let mut names: Vec<&str> = schema.fields.iter().map(String::as_str).collect();
        for bound in self.bounds() {
            if names.contains(&bound) {
                return Err(Error::bad_record(format!("the window result already has a field `{bound}`")));
            }
        }
        names.extend(self.bounds());
        let out = eddy_sdk::row::declare(&schema.name, &names);
        self.shapes.push((id, out, schema.fields.len()));
        Ok(Some((out, schema.fields.len())))
    }
}

impl Operator for WindowRow {
    type Config = Option<RowConfig>;

    fn open(config: Option<RowConfig>, _ctx: &mut OpenContext) -> Result<Self> {
        let config = config.unwrap_or_default();
        if config.start.is_some() && config.start == config.end {
            return Err(Error::bad_config("`start` and `end` must name different fields"));
        }
        Ok(WindowRow {
            config,
            start: Field::new("start"),
            end: Field::new("end"),
            result: Field::new("result"),
            shapes: Vec::new(),
            out: Vec::new(),
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        if self.flatten_row(record.value_bytes())? {
            return ctx.emit_raw(None, record.key_bytes(), &self.out, record.timestamp());
        }
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
