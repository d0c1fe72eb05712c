//! Rows as JSON text, for the edges: sinks, `print`, and keys picked by a JSON pointer.
//!
//! A row with a known schema renders as an object with its fields in slot order (what
//! `serde_json` writes for the struct the row was written from, so output does not change
//! when values become rows); without one, as an array. Numbers, strings and floats are
//! written by `serde_json` itself.

use alloc::string::String;
use alloc::vec::Vec;

use crate::row::{Kind, MAX_DEPTH, RowError, RowRef};
use crate::schema::Schemas;

fn put<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Writing plain values into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
}

/// Appends the row in `bytes` to `out` as JSON.
pub fn row_to_json(bytes: &[u8], schemas: &dyn Schemas, out: &mut Vec<u8>) -> Result<(), RowError> {
    render_row(bytes, schemas, out, Fidelity::Render, 1).map_err(|e| match e {
        NotExact::Row(e) => e,
        // Only `Fidelity::Exact` refuses fields.
        NotExact::Field { field } => RowError::BadKind(field),
    })
}

/// Appends field `i` of `row` to `out` as JSON.
pub fn field_to_json(row: &RowRef<'_>, i: usize, schemas: &dyn Schemas, out: &mut Vec<u8>) -> Result<(), RowError> {
    render_field(row, i, schemas, out, Fidelity::Render, 1).map_err(|e| match e {
        NotExact::Row(e) => e,
        NotExact::Field { field } => RowError::BadKind(field),
    })
}

/// Appends the row in `bytes` to `out` as JSON that reads back as exactly what the row holds,
/// or refuses: bytes (JSON has no bytes; rendered they read back as a list of numbers),
/// floats that are not finite (rendered as `null`) and embedded JSON that is not one JSON value. What SDKs whose rows are read through JSON
/// need, so a value reads the same whichever way it came.
pub fn row_to_exact_json(bytes: &[u8], schemas: &dyn Schemas, out: &mut Vec<u8>) -> Result<(), NotExact> {
    render_row(bytes, schemas, out, Fidelity::Exact, 1)
}

/// Why a row has no exact JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotExact {
    /// The row is malformed.
    Row(RowError),
    /// Field `field` (of the row or a row nested in it) holds bytes, a float that is not
    /// finite or embedded text that is not JSON.
    Field {
        /// Its index in the row that holds it.
        field: usize,
    },
}

impl From<RowError> for NotExact {
    fn from(e: RowError) -> Self {
        NotExact::Row(e)
    }
}

impl core::fmt::Display for NotExact {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NotExact::Row(e) => e.fmt(f),
            NotExact::Field { field } => {
                write!(f, "field {field} holds bytes, a float that is not finite or text that is not JSON")
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fidelity {
    /// As sinks show values: bytes as a list of numbers, NaN and infinities as `null`.
    Render,
    /// Only what reads back as it was.
    Exact,
}

/// Renders the row in `bytes`, itself nested `depth` deep (1: a top-level row).
fn render_row(
    bytes: &[u8],
    schemas: &dyn Schemas,
    out: &mut Vec<u8>,
    fidelity: Fidelity,
    depth: usize,
) -> Result<(), NotExact> {
    if depth > MAX_DEPTH {
        return Err(RowError::TooDeep.into());
    }
    let row = RowRef::new(bytes)?;
    let schema = match row.schema() {
        0 => None,
        id => schemas.get(id),
    };
    let names = schema.as_ref().filter(|s| s.fields.len() == row.len());
    out.push(if names.is_some() { b'{' } else { b'[' });
    for i in 0..row.len() {
        if i > 0 {
            out.push(b',');
        }
        if let Some(schema) = names {
            put(out, schema.fields[i].as_str());
            out.push(b':');
        }
        render_field(&row, i, schemas, out, fidelity, depth)?;
    }
    out.push(if names.is_some() { b'}' } else { b']' });
    Ok(())
}

fn render_field(
    row: &RowRef<'_>,
    i: usize,
    schemas: &dyn Schemas,
    out: &mut Vec<u8>,
    fidelity: Fidelity,
    depth: usize,
) -> Result<(), NotExact> {
    if row.is_null(i)? {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    let exact = fidelity == Fidelity::Exact;
    match row.kind(i)? {
        Kind::Unset => out.extend_from_slice(b"null"),
        Kind::Bool => put(out, &row.bool(i)?),
        Kind::I64 => put(out, &row.i64(i)?),
        Kind::U64 => put(out, &row.u64(i)?),
        Kind::F64 if exact && !row.f64(i)?.is_finite() => return Err(NotExact::Field { field: i }),
        Kind::F64 => put(out, &row.f64(i)?),
        Kind::Str => put(out, row.str(i)?.unwrap_or_default()),
        Kind::Bytes if exact => return Err(NotExact::Field { field: i }),
        Kind::Bytes => put(out, row.bytes(i)?.unwrap_or_default()),
        Kind::Row => render_row(row.variable(i)?.unwrap_or_default(), schemas, out, fidelity, depth + 1)?,
        Kind::Json => {
            let text = row.variable(i)?.unwrap_or_default();
            // Spliced in as it is: text that is not one JSON value would shift what follows.
            if exact && serde_json::from_slice::<serde::de::IgnoredAny>(text).is_err() {
                return Err(NotExact::Field { field: i });
            }
            out.extend_from_slice(text);
        }
    }
    Ok(())
}

/// The JSON text of the part of a row a JSON pointer (RFC 6901, such as `/bidder` or
/// `/person/id`) names, without rendering the rest; `Ok(None)` if the row has no such part.
/// Object steps go by field name (through the schema) and, in rows without one, by index.
pub fn pointer_to_json(bytes: &[u8], pointer: &str, schemas: &dyn Schemas) -> Result<Option<Vec<u8>>, RowError> {
    let mut row = RowRef::new(bytes)?;
    let mut tokens = pointer.split('/').skip(1).map(unescape).peekable();
    if pointer.is_empty() {
        let mut out = Vec::new();
        row_to_json(bytes, schemas, &mut out)?;
        return Ok(Some(out));
    }
    while let Some(token) = tokens.next() {
        let index = match schemas.get(row.schema()).filter(|s| s.fields.len() == row.len()) {
            Some(schema) => schema.index_of(&token),
            None => token.parse::<usize>().ok().filter(|i| *i < row.len()),
        };
        let Some(i) = index else { return Ok(None) };
        let last = tokens.peek().is_none();
        match row.kind(i)? {
            Kind::Row if !last && !row.is_null(i)? => {
                row = RowRef::new(row.variable(i)?.unwrap_or_default())?;
            }
            Kind::Json if !last && !row.is_null(i)? => {
                let rest: Vec<_> = tokens.collect();
                let mut sub = String::new();
                for t in &rest {
                    sub.push('/');
                    sub.push_str(&t.replace('~', "~0").replace('/', "~1"));
                }
                let value: serde_json::Value =
                    serde_json::from_slice(row.variable(i)?.unwrap_or_default()).map_err(|_| RowError::BadSpan(i))?;
                return Ok(value.pointer(&sub).map(|v| serde_json::to_vec(v).unwrap_or_default()));
            }
            _ if last => {
                let mut out = Vec::new();
                field_to_json(&row, i, schemas, &mut out)?;
                return Ok(Some(out));
            }
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// A pointer token with its escapes undone; most tokens have none and are not copied.
fn unescape(token: &str) -> alloc::borrow::Cow<'_, str> {
    match token.contains('~') {
        true => token.replace("~1", "/").replace("~0", "~").into(),
        false => token.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::{Kind, RowFrame};
    use crate::schema::NoSchemas;
    use alloc::format;
    use alloc::string::String;

    /// A row nested `depth` deep: each level's one field holds the next, the innermost holds 7.
    fn nested(depth: usize) -> Vec<u8> {
        let mut row = Vec::new();
        RowFrame::begin(&mut row, 1, 0).u64(&mut row, 0, 7);
        for _ in 1..depth {
            let mut outer = Vec::new();
            RowFrame::begin(&mut outer, 1, 0).variable(&mut outer, 0, Kind::Row, &row);
            row = outer;
        }
        row
    }

    #[test]
    fn rows_nested_past_the_limit_are_refused() {
        // At the limit: rendered, and JSON parses it back.
        let mut out = Vec::new();
        row_to_json(&nested(MAX_DEPTH), &NoSchemas, &mut out).expect("at the limit");
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(text, format!("{}7{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH)));
        serde_json::from_str::<serde_json::Value>(&text).expect("parses back");
        // One past it, and far past it (that a walk would not outlive 100 000 levels is
        // `tests/e2e/hostile.rs`'s to show).
        for depth in [MAX_DEPTH + 1, 2_000] {
            let row = nested(depth);
            assert_eq!(row_to_json(&row, &NoSchemas, &mut Vec::new()), Err(RowError::TooDeep), "{depth}");
            assert_eq!(row_to_exact_json(&row, &NoSchemas, &mut Vec::new()), Err(NotExact::Row(RowError::TooDeep)));
            let top = RowRef::new(&row).expect("a row");
            assert_eq!(field_to_json(&top, 0, &NoSchemas, &mut Vec::new()), Err(RowError::TooDeep));
        }
    }
}
