//! Rows written from JSON field values: how the host writes the rows that SDKs of dynamically
//! typed languages hand it as JSON text (`json-batch.emit` in `wit/dataflow.wit`), one native
//! JSON write in the guest instead of a row writer run in its interpreter.
//!
//! Each field's kind is picked from its JSON as those SDKs' own row writers pick it from a
//! value (Python's `eddy.rows.write_row`, JavaScript's `rows.js`), so a row comes out byte for
//! byte as the SDK would have written it: `null` null, `true`/`false` bool, a string str, a
//! number with a fraction or an exponent f64, any other number u64 (i64 when negative), an
//! array or object embedded JSON (its text as written).
//!
//! ```
//! use eddy_wire::from_json::row_from_json_fields;
//! use eddy_wire::row::{Kind, RowRef};
//!
//! let mut buf = Vec::new();
//! row_from_json_fields(r#"["bid", 1007, -5, 2.5, null, [1, 2]]"#, 9, &mut buf).expect("fields");
//! let row = RowRef::new(&buf).expect("a row");
//! assert_eq!((row.schema(), row.len()), (9, 6));
//! assert_eq!(row.str(0), Ok(Some("bid")));
//! assert_eq!((row.kind(1), row.u64(1)), (Ok(Kind::U64), Ok(1007)));
//! assert_eq!((row.kind(2), row.i64(2)), (Ok(Kind::I64), Ok(-5)));
//! assert_eq!(row.f64(3), Ok(2.5));
//! assert_eq!(row.is_null(4), Ok(true));
//! assert_eq!(row.variable(5), Ok(Some(&b"[1, 2]"[..])));
//! ```

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use serde_json::value::RawValue;

use crate::row::{MAX_FIELDS, RowWriter};

/// Why JSON field values could not be written as a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldsError {
    /// The text is not a JSON array.
    NotAnArray(String),
    /// More fields than a row holds.
    TooManyFields(usize),
    /// A field's JSON could not be read as the kind its first character says.
    BadField {
        /// The field.
        field: usize,
        /// What was wrong.
        reason: String,
    },
}

impl fmt::Display for FieldsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldsError::NotAnArray(e) => write!(f, "row fields are not a JSON array: {e}"),
            FieldsError::TooManyFields(n) => write!(f, "{n} fields; a row holds at most {MAX_FIELDS}"),
            FieldsError::BadField { field, reason } => write!(f, "field {field}: {reason}"),
        }
    }
}

impl core::error::Error for FieldsError {}

/// Appends to `out` a row of schema `schema` whose fields are the elements of the JSON array
/// `fields`; returns the row's length.
pub fn row_from_json_fields(fields: &str, schema: u32, out: &mut Vec<u8>) -> Result<usize, FieldsError> {
    let values: Vec<&RawValue> = serde_json::from_str(fields).map_err(|e| FieldsError::NotAnArray(e.to_string()))?;
    if values.len() > MAX_FIELDS {
        return Err(FieldsError::TooManyFields(values.len()));
    }
    let start = out.len();
    let mut row = RowWriter::new(out, values.len(), schema);
    for (i, value) in values.iter().enumerate() {
        if let Err(reason) = write_field(&mut row, i, value.get()) {
            out.truncate(start);
            return Err(FieldsError::BadField { field: i, reason });
        }
    }
    Ok(row.finish())
}

/// Field `i` from its JSON text (one value, no surrounding space: what `RawValue` holds).
fn write_field(row: &mut RowWriter<'_>, i: usize, text: &str) -> Result<(), String> {
    match text.as_bytes().first() {
        Some(b'n') => row.null(i),
        Some(b't') => row.bool(i, true),
        Some(b'f') => row.bool(i, false),
        Some(b'"') => {
            let s: Cow<'_, str> = serde_json::from_str(text).map_err(|e| e.to_string())?;
            row.str(i, &s);
        }
        Some(b'[' | b'{') => row.json(i, text.as_bytes()),
        Some(_) if text.contains(['.', 'e', 'E']) => {
            row.f64(i, text.parse::<f64>().map_err(|e| e.to_string())?);
        }
        Some(b'-') => row.i64(i, text.parse::<i64>().map_err(|_| format!("{text} does not fit in 64 bits"))?),
        Some(_) => row.u64(i, text.parse::<u64>().map_err(|_| format!("{text} does not fit in 64 bits"))?),
        None => return Err("no value".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::{Kind, RowRef};

    fn row(fields: &str) -> Vec<u8> {
        let mut buf = Vec::new();
        row_from_json_fields(fields, 7, &mut buf).expect("fields");
        buf
    }

    /// The kinds a dynamically typed writer picks, from the definition: a literal table.
    #[test]
    fn each_json_value_gets_the_kind_a_dynamic_writer_gives_it() {
        let table: &[(&str, Kind)] = &[
            ("true", Kind::Bool),
            ("false", Kind::Bool),
            ("0", Kind::U64),
            ("18446744073709551615", Kind::U64),
            ("-1", Kind::I64),
            ("-9223372036854775808", Kind::I64),
            ("1.0", Kind::F64),
            ("1e3", Kind::F64),
            ("-2.5E-3", Kind::F64),
            ("\"x\"", Kind::Str),
            ("[1]", Kind::Json),
            ("{\"a\":1}", Kind::Json),
        ];
        for (text, kind) in table {
            let buf = row(&format!("[{text}]"));
            let r = RowRef::new(&buf).expect("row");
            assert_eq!(r.kind(0), Ok(*kind), "{text}");
        }
        let buf = row("[null]");
        assert_eq!(RowRef::new(&buf).expect("row").is_null(0), Ok(true));
    }

    #[test]
    fn strings_are_unescaped_and_numbers_read_exactly() {
        let buf = row(r#"["a\"b\u00e9", 9007199254740993, -9007199254740993, 0.1]"#);
        let r = RowRef::new(&buf).expect("row");
        assert_eq!(r.str(0), Ok(Some("a\"bé")));
        assert_eq!(r.u64(1), Ok(9_007_199_254_740_993));
        assert_eq!(r.i64(2), Ok(-9_007_199_254_740_993));
        assert_eq!(r.f64(3), Ok(0.1));
    }

    #[test]
    fn what_no_row_can_hold_is_refused_and_the_buffer_left_as_it_was() {
        let mut buf = b"kept".to_vec();
        for (fields, want) in [
            ("{\"a\":1}", "not a JSON array"),
            ("[1,", "not a JSON array"),
            ("[18446744073709551616]", "field 0: 18446744073709551616 does not fit in 64 bits"),
            ("[1, -9223372036854775809]", "field 1: -9223372036854775809 does not fit in 64 bits"),
        ] {
            let err = row_from_json_fields(fields, 1, &mut buf).expect_err(fields).to_string();
            assert!(err.contains(want), "{fields}: {err}");
            assert_eq!(buf, b"kept", "{fields}");
        }
    }
}
