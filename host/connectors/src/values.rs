//! Record values at the edges of a job: rows (Eddy's binary records, `eddy_wire::row`) become
//! JSON where a person or another system reads them — sinks, `print` — and a `key_by` pointer
//! reads one field of a row without rendering the rest. JSON values pass through untouched.

use std::borrow::Cow;

use eddy_wire::json::{pointer_to_json, row_to_json};
use eddy_wire::row::{Kind, RowFrame, is_row};
use eddy_wire::schema::Schema;

/// `bytes` as JSON text: a row rendered with its field names, anything else as it is. A row
/// that cannot be read renders as a JSON string saying why, so a sink never stops on it.
pub fn json_text(bytes: &[u8]) -> Cow<'_, [u8]> {
    if !is_row(bytes) {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len());
    match row_to_json(bytes, eddy_runtime::schemas(), &mut out) {
        Ok(()) => Cow::Owned(out),
        Err(e) => Cow::Owned(serde_json::Value::String(format!("<unreadable row: {e}>")).to_string().into_bytes()),
    }
}

/// The JSON text of the part of `value` that JSON pointer `pointer` names (`Ok(None)`: no such
/// part), reading a row in place and parsing JSON otherwise.
pub fn pointer_text(value: &[u8], pointer: &str) -> Result<Option<Vec<u8>>, String> {
    if is_row(value) {
        return pointer_to_json(value, pointer, eddy_runtime::schemas())
            .map_err(|e| format!("the value is a damaged row ({e})"));
    }
    crate::json_pointer::pointer_json(value, pointer)
        .map_err(|e| format!("`{pointer}` selected, but the value is not JSON ({e})"))
}

/// A window's result that is a row, as the row `{"start", "end", "result"}` (the result
/// nested), the shape a JSON result gets as an object.
pub fn window_row(start: i64, end: i64, result: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(result.len() + 64);
    write_window_row(&mut out, start, end, result);
    out
}

/// [`window_row`] appended to `out` (a batch's buffer: no buffer per result).
pub fn write_window_row(out: &mut Vec<u8>, start: i64, end: i64, result: &[u8]) {
    static SCHEMA: std::sync::LazyLock<u32> = std::sync::LazyLock::new(|| {
        let schema = Schema::new("window", &["start", "end", "result"]);
        // Three short names: within every limit and, as a fixed shape, its id is stable.
        eddy_runtime::schemas().declare(&schema).unwrap_or_else(|_| schema.id())
    });
    let row = RowFrame::begin(out, 3, *SCHEMA);
    row.i64(out, 0, start);
    row.i64(out, 1, end);
    row.variable(out, 2, Kind::Row, result);
}
