//! Rows: a binary value encoding with one fixed-width slot per field, in the spirit of Flink's
//! `BinaryRowData`, so any field is read at a computed offset without decoding the others.
//!
//! Candidate for the data plane of issue 11 (measured against postcard and JSON in
//! `benches/row_formats.rs`; the numbers and the choice are in `docs/architecture.md`). The
//! schema — which field index holds which type — is agreed out of band (the pipeline), so a
//! row carries no names and no types. Layout, all integers little-endian:
//!
//! ```text
//! u32 field count n | u32 reserved (0)
//! null bits: ceil(n / 64) u64 words; bit i of word i / 64 set = field i is null
//! n slots of 8 bytes: i64 / u64 / f64 bits / bool (0 or 1) in place, or for bytes and
//!                     strings `u32 offset from the row's start | u32 length`
//! variable region: the bytes of the byte and string fields
//! ```
//!
//! Every read is bounds-checked; strings are checked UTF-8 when read as `&str`. A reader in
//! any language needs only little-endian loads (Python: `struct.unpack_from("<q", row, 8 + 8 *
//! words + 8 * i)`; JavaScript: `DataView.getBigInt64(…, true)`).
//!
//! ```
//! use eddy_wire::row::{RowRef, RowWriter};
//!
//! let mut buf = Vec::new();
//! let mut row = RowWriter::new(&mut buf, 3);
//! row.u64(0, 1007);
//! row.str(1, "Google");
//! row.null(2);
//! row.finish();
//! let read = RowRef::new(&buf).expect("a whole row");
//! assert_eq!(read.u64(0), Ok(1007));
//! assert_eq!(read.str(1), Ok(Some("Google")));
//! assert_eq!(read.str(2), Ok(None));
//! ```

use alloc::vec::Vec;
use core::fmt;

const HEADER: usize = 8;
const SLOT: usize = 8;

/// A row that does not hold what was asked of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowError {
    /// Shorter than its header, null bits and slots say it must be.
    Truncated,
    /// Field index at or past the field count.
    NoField(usize),
    /// A byte or string field points outside the row.
    BadSpan(usize),
    /// A string field is not UTF-8.
    NotUtf8(usize),
    /// A field that may not be null is null.
    Null(usize),
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowError::Truncated => write!(f, "row shorter than its header and slots"),
            RowError::NoField(i) => write!(f, "row has no field {i}"),
            RowError::BadSpan(i) => write!(f, "field {i} points outside the row"),
            RowError::NotUtf8(i) => write!(f, "field {i} is not UTF-8"),
            RowError::Null(i) => write!(f, "field {i} is null"),
        }
    }
}

fn null_words(fields: usize) -> usize {
    fields.div_ceil(64)
}

/// A row in a byte buffer, read in place.
#[derive(Debug, Clone, Copy)]
pub struct RowRef<'a> {
    bytes: &'a [u8],
    fields: usize,
    slots: usize,
}

impl<'a> RowRef<'a> {
    /// The row in `bytes`, if its header, null bits and slots are whole.
    pub fn new(bytes: &'a [u8]) -> Result<Self, RowError> {
        let count = bytes.get(..4).ok_or(RowError::Truncated)?;
        let fields = u32::from_le_bytes([count[0], count[1], count[2], count[3]]) as usize;
        let slots = HEADER + 8 * null_words(fields);
        let end = fields.checked_mul(SLOT).and_then(|s| s.checked_add(slots)).ok_or(RowError::Truncated)?;
        if bytes.len() < end {
            return Err(RowError::Truncated);
        }
        Ok(Self { bytes, fields, slots })
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields
    }

    /// Whether the row has no fields.
    pub fn is_empty(&self) -> bool {
        self.fields == 0
    }

    /// Whether field `i` is null.
    pub fn is_null(&self, i: usize) -> Result<bool, RowError> {
        if i >= self.fields {
            return Err(RowError::NoField(i));
        }
        let word = HEADER + 8 * (i / 64);
        let byte = self.bytes[word + (i % 64) / 8];
        Ok(byte & (1 << (i % 8)) != 0)
    }

    fn slot(&self, i: usize) -> Result<[u8; 8], RowError> {
        if i >= self.fields {
            return Err(RowError::NoField(i));
        }
        let at = self.slots + SLOT * i;
        let s = &self.bytes[at..at + SLOT];
        Ok([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
    }

    fn present(&self, i: usize) -> Result<[u8; 8], RowError> {
        if self.is_null(i)? {
            return Err(RowError::Null(i));
        }
        self.slot(i)
    }

    /// Field `i` as an `i64` (not null).
    pub fn i64(&self, i: usize) -> Result<i64, RowError> {
        self.present(i).map(i64::from_le_bytes)
    }

    /// Field `i` as a `u64` (not null).
    pub fn u64(&self, i: usize) -> Result<u64, RowError> {
        self.present(i).map(u64::from_le_bytes)
    }

    /// Field `i` as an `f64` (not null).
    pub fn f64(&self, i: usize) -> Result<f64, RowError> {
        self.present(i).map(f64::from_le_bytes)
    }

    /// Field `i` as a `bool` (not null).
    pub fn bool(&self, i: usize) -> Result<bool, RowError> {
        self.present(i).map(|s| s[0] != 0)
    }

    /// Field `i`'s bytes, `None` if null.
    pub fn bytes(&self, i: usize) -> Result<Option<&'a [u8]>, RowError> {
        if self.is_null(i)? {
            return Ok(None);
        }
        let s = self.slot(i)?;
        let offset = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
        let len = u32::from_le_bytes([s[4], s[5], s[6], s[7]]) as usize;
        let end = offset.checked_add(len).ok_or(RowError::BadSpan(i))?;
        self.bytes.get(offset..end).map(Some).ok_or(RowError::BadSpan(i))
    }

    /// Field `i` as a string, `None` if null.
    pub fn str(&self, i: usize) -> Result<Option<&'a str>, RowError> {
        match self.bytes(i)? {
            Some(b) => core::str::from_utf8(b).map(Some).map_err(|_| RowError::NotUtf8(i)),
            None => Ok(None),
        }
    }
}

impl<'a> RowRef<'a> {
    /// The row with its variable region checked UTF-8 once, for reading several strings: each
    /// then costs a bounds and char-boundary check instead of a UTF-8 pass of its own. Fails
    /// with [`RowError::NotUtf8`] when the region also holds non-UTF-8 bytes fields.
    pub fn utf8(self) -> Result<Utf8Row<'a>, RowError> {
        let start = self.slots + SLOT * self.fields;
        let text = core::str::from_utf8(&self.bytes[start..]).map_err(|_| RowError::NotUtf8(self.fields))?;
        Ok(Utf8Row { row: self, text, start })
    }
}

/// A [`RowRef`] whose variable region is known to be UTF-8 (see [`RowRef::utf8`]).
#[derive(Debug, Clone, Copy)]
pub struct Utf8Row<'a> {
    row: RowRef<'a>,
    text: &'a str,
    start: usize,
}

impl<'a> Utf8Row<'a> {
    /// The row, for its other fields.
    pub fn row(&self) -> &RowRef<'a> {
        &self.row
    }

    /// Field `i` as a string, `None` if null.
    pub fn str(&self, i: usize) -> Result<Option<&'a str>, RowError> {
        if self.row.is_null(i)? {
            return Ok(None);
        }
        let s = self.row.slot(i)?;
        let offset = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
        let len = u32::from_le_bytes([s[4], s[5], s[6], s[7]]) as usize;
        let from = offset.checked_sub(self.start).ok_or(RowError::BadSpan(i))?;
        let to = from.checked_add(len).ok_or(RowError::BadSpan(i))?;
        // `get` checks bounds and char boundaries: a slice of UTF-8 cut at boundaries is UTF-8.
        self.text.get(from..to).map(Some).ok_or(RowError::BadSpan(i))
    }
}

/// Writes one row of a known field count at the end of a buffer (reused across rows).
#[derive(Debug)]
pub struct RowWriter<'b> {
    buf: &'b mut Vec<u8>,
    start: usize,
    slots: usize,
}

impl<'b> RowWriter<'b> {
    /// Starts a row of `fields` fields at the end of `buf`; every field starts as 0, not null.
    pub fn new(buf: &'b mut Vec<u8>, fields: usize) -> Self {
        let start = buf.len();
        let slots = HEADER + 8 * null_words(fields);
        buf.resize(start + slots + SLOT * fields, 0);
        buf[start..start + 4].copy_from_slice(&(fields as u32).to_le_bytes());
        Self { buf, start, slots }
    }

    fn put(&mut self, i: usize, slot: [u8; 8]) {
        let at = self.start + self.slots + SLOT * i;
        self.buf[at..at + SLOT].copy_from_slice(&slot);
    }

    /// Sets field `i` to `v`.
    pub fn i64(&mut self, i: usize, v: i64) {
        self.put(i, v.to_le_bytes());
    }

    /// Sets field `i` to `v`.
    pub fn u64(&mut self, i: usize, v: u64) {
        self.put(i, v.to_le_bytes());
    }

    /// Sets field `i` to `v`.
    pub fn f64(&mut self, i: usize, v: f64) {
        self.put(i, v.to_le_bytes());
    }

    /// Sets field `i` to `v`.
    pub fn bool(&mut self, i: usize, v: bool) {
        self.put(i, u64::from(v).to_le_bytes());
    }

    /// Sets field `i` to `v`, appended to the variable region.
    pub fn bytes(&mut self, i: usize, v: &[u8]) {
        let offset = (self.buf.len() - self.start) as u32;
        self.buf.extend_from_slice(v);
        let mut slot = [0; 8];
        slot[..4].copy_from_slice(&offset.to_le_bytes());
        slot[4..].copy_from_slice(&(v.len() as u32).to_le_bytes());
        self.put(i, slot);
    }

    /// Sets field `i` to `v`.
    pub fn str(&mut self, i: usize, v: &str) {
        self.bytes(i, v.as_bytes());
    }

    /// Marks field `i` null.
    pub fn null(&mut self, i: usize) {
        let at = self.start + HEADER + 8 * (i / 64) + (i % 64) / 8;
        self.buf[at] |= 1 << (i % 8);
    }

    /// Ends the row; returns its length in bytes.
    pub fn finish(self) -> usize {
        self.buf.len() - self.start
    }
}

#[cfg(test)]
mod tests {
    use alloc::string::String;
    use alloc::vec;

    use proptest::prelude::*;

    use super::*;

    /// A field as a test sees it: the oracle is this enum, not the layout.
    #[derive(Debug, Clone, PartialEq)]
    enum Field {
        I64(i64),
        U64(u64),
        Bool(bool),
        Str(String),
        Null,
    }

    fn field() -> impl Strategy<Value = Field> {
        prop_oneof![
            any::<i64>().prop_map(Field::I64),
            any::<u64>().prop_map(Field::U64),
            any::<bool>().prop_map(Field::Bool),
            ".{0,40}".prop_map(Field::Str),
            Just(Field::Null),
        ]
    }

    fn write(fields: &[Field], buf: &mut Vec<u8>) -> usize {
        let mut row = RowWriter::new(buf, fields.len());
        for (i, f) in fields.iter().enumerate() {
            match f {
                Field::I64(v) => row.i64(i, *v),
                Field::U64(v) => row.u64(i, *v),
                Field::Bool(v) => row.bool(i, *v),
                Field::Str(s) => row.str(i, s),
                Field::Null => row.null(i),
            }
        }
        row.finish()
    }

    proptest! {
        #[test]
        fn every_field_reads_back_as_written(fields in proptest::collection::vec(field(), 0..140), prefix in 0usize..5) {
            let mut buf = vec![0xAA; prefix];
            let len = write(&fields, &mut buf);
            prop_assert_eq!(buf.len(), prefix + len);
            let row = RowRef::new(&buf[prefix..]).expect("whole");
            prop_assert_eq!(row.len(), fields.len());
            for (i, f) in fields.iter().enumerate() {
                let got = match f {
                    Field::I64(_) => Field::I64(row.i64(i).expect("i64")),
                    Field::U64(_) => Field::U64(row.u64(i).expect("u64")),
                    Field::Bool(_) => Field::Bool(row.bool(i).expect("bool")),
                    Field::Str(_) => Field::Str(row.str(i).expect("str").expect("present").into()),
                    Field::Null => {
                        prop_assert_eq!(row.u64(i), Err(RowError::Null(i)));
                        Field::Null
                    }
                };
                prop_assert_eq!(&got, f);
            }
            prop_assert_eq!(row.u64(fields.len()), Err(RowError::NoField(fields.len())));
        }

        #[test]
        fn any_bytes_read_as_an_error_or_in_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..200), i in 0usize..8) {
            if let Ok(row) = RowRef::new(&bytes) {
                let _ = (row.u64(i), row.str(i), row.bytes(i), row.is_null(i));
            }
        }
    }

    proptest! {
        #[test]
        fn a_utf8_view_reads_the_strings_the_field_reads_do(strings in proptest::collection::vec(proptest::option::of(".{0,20}"), 0..20)) {
            let mut buf = Vec::new();
            let mut row = RowWriter::new(&mut buf, strings.len());
            for (i, s) in strings.iter().enumerate() {
                match s {
                    Some(s) => row.str(i, s),
                    None => row.null(i),
                }
            }
            row.finish();
            let read = RowRef::new(&buf).expect("whole");
            let text = read.utf8().expect("only strings");
            for (i, s) in strings.iter().enumerate() {
                prop_assert_eq!(text.str(i).expect("in bounds"), s.as_deref());
            }
        }
    }

    #[test]
    fn a_utf8_view_refuses_bytes_fields_and_spans_inside_a_char() {
        let mut buf = Vec::new();
        let mut row = RowWriter::new(&mut buf, 2);
        row.bytes(0, &[0xFF]);
        row.str(1, "é");
        row.finish();
        let read = RowRef::new(&buf).expect("whole");
        assert_eq!(read.utf8().err(), Some(RowError::NotUtf8(2)));
        let mut buf = Vec::new();
        let mut row = RowWriter::new(&mut buf, 1);
        row.str(0, "é");
        row.finish();
        buf[20] = 1; // a length of one byte: half of a two-byte char
        assert_eq!(RowRef::new(&buf).expect("whole").utf8().expect("utf-8").str(0), Err(RowError::BadSpan(0)));
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let mut buf = Vec::new();
        let mut row = RowWriter::new(&mut buf, 2);
        row.i64(0, -2);
        row.str(1, "ab");
        row.finish();
        let expected: &[u8] = &[
            2, 0, 0, 0, 0, 0, 0, 0, // field count, reserved
            0, 0, 0, 0, 0, 0, 0, 0, // null bits
            0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, // -2
            32, 0, 0, 0, 2, 0, 0, 0, // offset 32, length 2
            b'a', b'b',
        ];
        assert_eq!(buf, expected);
        assert_eq!(RowRef::new(&buf[..31]).err(), Some(RowError::Truncated));
        let mut bad = buf.clone();
        bad[28] = 9;
        assert_eq!(RowRef::new(&bad).expect("header whole").str(1), Err(RowError::BadSpan(1)));
    }
}
