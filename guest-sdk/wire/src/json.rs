//! Rows as JSON text, for the edges: sinks, `print`, and keys picked by a JSON pointer.
//!
//! A row with a known schema renders as an object with its fields in slot order (what
//! `serde_json` writes for the struct the row was written from, so output does not change
//! when values become rows); without one, as an array. Numbers, strings and floats are
//! written by `serde_json` itself.

use alloc::string::String;
use alloc::vec::Vec;

use crate::row::{Kind, RowError, RowRef};
use crate::schema::Schemas;

fn put<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Writing plain values into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
}

/// Appends the row in `bytes` to `out` as JSON.
pub fn row_to_json(bytes: &[u8], schemas: &dyn Schemas, out: &mut Vec<u8>) -> Result<(), RowError> {
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
        field_to_json(&row, i, schemas, out)?;
    }
    out.push(if names.is_some() { b'}' } else { b']' });
    Ok(())
}

/// Appends field `i` of `row` to `out` as JSON.
pub fn field_to_json(row: &RowRef<'_>, i: usize, schemas: &dyn Schemas, out: &mut Vec<u8>) -> Result<(), RowError> {
    if row.is_null(i)? {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    match row.kind(i)? {
        Kind::Unset => out.extend_from_slice(b"null"),
        Kind::Bool => put(out, &row.bool(i)?),
        Kind::I64 => put(out, &row.i64(i)?),
        Kind::U64 => put(out, &row.u64(i)?),
        Kind::F64 => put(out, &row.f64(i)?),
        Kind::Str => put(out, row.str(i)?.unwrap_or_default()),
        Kind::Bytes => put(out, row.bytes(i)?.unwrap_or_default()),
        Kind::Row => row_to_json(row.variable(i)?.unwrap_or_default(), schemas, out)?,
        Kind::Json => out.extend_from_slice(row.variable(i)?.unwrap_or_default()),
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
