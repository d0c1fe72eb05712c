//! Rows: Eddy's binary value encoding, one fixed-width slot per field in the spirit of Flink's
//! `BinaryRowData`, so any field is read at a computed offset without decoding the others.
//!
//! A row says what each slot holds (a kind byte per field) and names its field names by a
//! schema id ([`crate::schema`]): names are declared once per job, not carried per record, so
//! a row can still be read by field name, rendered as JSON at a sink, or routed by a
//! `key_by: /pointer` without a JSON parse. Layout, all integers little-endian:
//!
//! ```text
//! u8 magic 0xB7 | u8 version 1 | u16 field count n | u32 schema id (0: no names)
//! null bits: ceil(n / 64) u64 words; bit i of word i / 64 set = field i is null
//! kinds: n bytes (see [`Kind`]), zero-padded to a multiple of 8
//! n slots of 8 bytes: i64 / u64 / f64 bits / bool (0 or 1) in place; for the variable kinds
//!                     (string, bytes, nested row, embedded JSON) `u32 offset from this row's
//!                     start | u32 length`
//! variable region: the bytes of the variable fields
//! ```
//!
//! The magic byte is a UTF-8 continuation byte, so no JSON text (and no UTF-8 text) starts
//! with it: a value is a row exactly when its first byte is 0xB7 ([`is_row`]), and JSON values
//! from other producers stay valid beside rows. Every read is bounds-checked; strings are
//! checked UTF-8 when read as `&str`. A reader in any language needs only little-endian loads
//! (Python: `struct.unpack_from("<BBHI", row)`, then `"<q"` at the slot's offset).
//!
//! ```
//! use eddy_wire::row::{Kind, RowRef, RowWriter};
//!
//! let mut buf = Vec::new();
//! let mut row = RowWriter::new(&mut buf, 3, 0);
//! row.u64(0, 1007);
//! row.str(1, "Google");
//! row.null(2);
//! row.finish();
//! let read = RowRef::new(&buf).expect("a whole row");
//! assert_eq!(read.u64(0), Ok(1007));
//! assert_eq!(read.kind(1), Ok(Kind::Str));
//! assert_eq!(read.str(1), Ok(Some("Google")));
//! assert_eq!(read.str(2), Ok(None));
//! ```

use alloc::vec::Vec;
use core::fmt;

/// The first byte of every row.
pub const MAGIC: u8 = 0xB7;
/// The layout version this crate reads and writes.
pub const VERSION: u8 = 1;
/// Most fields a row can have.
pub const MAX_FIELDS: usize = u16::MAX as usize;
/// Deepest nesting of rows the host walks (a row holding a row is depth 2); deeper rows are
/// refused with [`RowError::TooDeep`]. A guest can nest rows as deep as a value's bytes allow
/// (a level costs 32 bytes), and a walk per level on the host's stack would let one record
/// overflow it and take the process down. 100 is far deeper than any struct nests, and within
/// the 128 levels `serde_json` parses, so a rendered row of plain fields parses back.
pub const MAX_DEPTH: usize = 100;

const HEADER: usize = 8;
const SLOT: usize = 8;

/// Whether `value` is a row (rather than JSON or other bytes).
pub fn is_row(value: &[u8]) -> bool {
    value.first() == Some(&MAGIC)
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// No value was ever written (the field is null).
    Unset = 0,
    /// `0` or `1`.
    Bool = 1,
    /// A signed integer.
    I64 = 2,
    /// An unsigned integer.
    U64 = 3,
    /// A float.
    F64 = 4,
    /// UTF-8 text in the variable region.
    Str = 5,
    /// Bytes in the variable region.
    Bytes = 6,
    /// A nested row (its own header, schema and variable region) in the variable region.
    Row = 7,
    /// A JSON text in the variable region (lists, maps and enums with data).
    Json = 8,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            0 => Kind::Unset,
            1 => Kind::Bool,
            2 => Kind::I64,
            3 => Kind::U64,
            4 => Kind::F64,
            5 => Kind::Str,
            6 => Kind::Bytes,
            7 => Kind::Row,
            8 => Kind::Json,
            _ => return None,
        })
    }

    /// Whether the slot is an offset and length into the variable region.
    pub fn is_variable(self) -> bool {
        matches!(self, Kind::Str | Kind::Bytes | Kind::Row | Kind::Json)
    }

    /// The kind's name in errors.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Unset => "unset",
            Kind::Bool => "bool",
            Kind::I64 => "i64",
            Kind::U64 => "u64",
            Kind::F64 => "f64",
            Kind::Str => "string",
            Kind::Bytes => "bytes",
            Kind::Row => "row",
            Kind::Json => "json",
        }
    }
}

/// A row that does not hold what was asked of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowError {
    /// Shorter than its header, null bits, kinds and slots say it must be.
    Truncated,
    /// The first byte is not [`MAGIC`]: not a row.
    NotARow,
    /// A layout version this crate does not read.
    Version(u8),
    /// Field index at or past the field count.
    NoField(usize),
    /// A field's kind byte is unknown.
    BadKind(usize),
    /// A field holds another kind than the one asked for.
    WrongKind {
        /// The field.
        field: usize,
        /// What it holds.
        found: Kind,
        /// What was asked.
        wanted: Kind,
    },
    /// A variable field points outside the row.
    BadSpan(usize),
    /// A string field is not UTF-8.
    NotUtf8(usize),
    /// A field that may not be null is null.
    Null(usize),
    /// Rows nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowError::Truncated => write!(f, "row shorter than its header and slots"),
            RowError::NotARow => write!(f, "not a row (the first byte is not 0xB7)"),
            RowError::Version(v) => write!(f, "row layout version {v}; this build reads version {VERSION}"),
            RowError::NoField(i) => write!(f, "row has no field {i}"),
            RowError::BadKind(i) => write!(f, "field {i} has an unknown kind byte"),
            RowError::WrongKind { field, found, wanted } => {
                write!(f, "field {field} holds {}, not {}", found.name(), wanted.name())
            }
            RowError::BadSpan(i) => write!(f, "field {i} points outside the row"),
            RowError::NotUtf8(i) => write!(f, "field {i} is not UTF-8"),
            RowError::Null(i) => write!(f, "field {i} is null"),
            RowError::TooDeep => write!(f, "rows nested more than {MAX_DEPTH} deep"),
        }
    }
}

impl core::error::Error for RowError {}

fn null_words(fields: usize) -> usize {
    fields.div_ceil(64)
}

/// Where the kinds, slots and variable region of a row of `fields` fields start.
fn offsets(fields: usize) -> (usize, usize, usize) {
    let kinds = HEADER + 8 * null_words(fields);
    let slots = kinds + fields.div_ceil(8) * 8;
    (kinds, slots, slots + SLOT * fields)
}

/// A row in a byte buffer, read in place.
#[derive(Debug, Clone, Copy)]
pub struct RowRef<'a> {
    bytes: &'a [u8],
    fields: usize,
    kinds: usize,
    slots: usize,
}

impl<'a> RowRef<'a> {
    /// The row in `bytes`, if its header, null bits, kinds and slots are whole.
    pub fn new(bytes: &'a [u8]) -> Result<Self, RowError> {
        let header = bytes.get(..HEADER).ok_or(if is_row(bytes) { RowError::Truncated } else { RowError::NotARow })?;
        if header[0] != MAGIC {
            return Err(RowError::NotARow);
        }
        if header[1] != VERSION {
            return Err(RowError::Version(header[1]));
        }
        let fields = usize::from(u16::from_le_bytes([header[2], header[3]]));
        let (kinds, slots, end) = offsets(fields);
        if bytes.len() < end {
            return Err(RowError::Truncated);
        }
        Ok(Self { bytes, fields, kinds, slots })
    }

    /// The whole row's bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of fields.
    #[inline]
    pub fn len(&self) -> usize {
        self.fields
    }

    /// Whether the row has no fields.
    pub fn is_empty(&self) -> bool {
        self.fields == 0
    }

    /// The id of the schema that names the fields (0: none).
    #[inline]
    pub fn schema(&self) -> u32 {
        u32::from_le_bytes([self.bytes[4], self.bytes[5], self.bytes[6], self.bytes[7]])
    }

    /// Whether field `i` is null.
    #[inline]
    pub fn is_null(&self, i: usize) -> Result<bool, RowError> {
        if i >= self.fields {
            return Err(RowError::NoField(i));
        }
        let byte = self.bytes[HEADER + 8 * (i / 64) + (i % 64) / 8];
        Ok(byte & (1 << (i % 8)) != 0)
    }

    /// What field `i` holds.
    #[inline]
    pub fn kind(&self, i: usize) -> Result<Kind, RowError> {
        if i >= self.fields {
            return Err(RowError::NoField(i));
        }
        Kind::from_byte(self.bytes[self.kinds + i]).ok_or(RowError::BadKind(i))
    }

    /// The raw 8 bytes of slot `i` (`i` below the field count: the caller checked it).
    #[inline]
    pub(crate) fn slot(&self, i: usize) -> [u8; 8] {
        let at = self.slots + SLOT * i;
        let s = &self.bytes[at..at + SLOT];
        [s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]
    }

    /// Field `i`'s slot if it is not null and holds `wanted`.
    #[inline]
    pub(crate) fn present(&self, i: usize, wanted: Kind) -> Result<[u8; 8], RowError> {
        if self.is_null(i)? {
            return Err(RowError::Null(i));
        }
        match self.kind(i)? {
            found if found == wanted => Ok(self.slot(i)),
            found => Err(RowError::WrongKind { field: i, found, wanted }),
        }
    }

    /// Field `i` as an `i64` (not null).
    #[inline]
    pub fn i64(&self, i: usize) -> Result<i64, RowError> {
        self.present(i, Kind::I64).map(i64::from_le_bytes)
    }

    /// Field `i` as a `u64` (not null).
    #[inline]
    pub fn u64(&self, i: usize) -> Result<u64, RowError> {
        self.present(i, Kind::U64).map(u64::from_le_bytes)
    }

    /// Field `i` as an `f64` (not null).
    pub fn f64(&self, i: usize) -> Result<f64, RowError> {
        self.present(i, Kind::F64).map(f64::from_le_bytes)
    }

    /// Field `i` as a `bool` (not null).
    pub fn bool(&self, i: usize) -> Result<bool, RowError> {
        self.present(i, Kind::Bool).map(|s| s[0] != 0)
    }

    /// The raw slot of a fixed-width field (`Bool`, `I64`, `U64`, `F64`), `None` if null.
    pub fn fixed(&self, i: usize) -> Result<Option<[u8; 8]>, RowError> {
        if self.is_null(i)? {
            return Ok(None);
        }
        Ok(Some(self.slot(i)))
    }

    /// The bytes slot `i` points at (`i` below the field count, the field a non-null variable
    /// kind: the caller checked both).
    #[inline]
    pub(crate) fn span(&self, i: usize) -> Result<&'a [u8], RowError> {
        let s = self.slot(i);
        let offset = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
        let len = u32::from_le_bytes([s[4], s[5], s[6], s[7]]) as usize;
        let end = offset.checked_add(len).ok_or(RowError::BadSpan(i))?;
        self.bytes.get(offset..end).ok_or(RowError::BadSpan(i))
    }

    /// The bytes of variable field `i` whatever its kind, `None` if null.
    #[inline]
    pub fn variable(&self, i: usize) -> Result<Option<&'a [u8]>, RowError> {
        if self.is_null(i)? {
            return Ok(None);
        }
        let kind = self.kind(i)?;
        if !kind.is_variable() {
            return Err(RowError::WrongKind { field: i, found: kind, wanted: Kind::Bytes });
        }
        self.span(i).map(Some)
    }

    #[inline]
    fn variable_of(&self, i: usize, wanted: Kind) -> Result<Option<&'a [u8]>, RowError> {
        match self.kind(i)? {
            found if found == wanted || self.is_null(i)? => self.variable(i),
            found => Err(RowError::WrongKind { field: i, found, wanted }),
        }
    }

    /// Field `i`'s bytes, `None` if null.
    pub fn bytes(&self, i: usize) -> Result<Option<&'a [u8]>, RowError> {
        self.variable_of(i, Kind::Bytes)
    }

    /// Field `i` as a string, `None` if null.
    #[inline]
    pub fn str(&self, i: usize) -> Result<Option<&'a str>, RowError> {
        match self.variable_of(i, Kind::Str)? {
            Some(b) => core::str::from_utf8(b).map(Some).map_err(|_| RowError::NotUtf8(i)),
            None => Ok(None),
        }
    }

    /// Field `i` as a nested row, `None` if null.
    pub fn row(&self, i: usize) -> Result<Option<RowRef<'a>>, RowError> {
        self.variable_of(i, Kind::Row)?.map(RowRef::new).transpose()
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
        let s = self.row.present(i, Kind::Str)?;
        let offset = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
        let len = u32::from_le_bytes([s[4], s[5], s[6], s[7]]) as usize;
        let from = offset.checked_sub(self.start).ok_or(RowError::BadSpan(i))?;
        let to = from.checked_add(len).ok_or(RowError::BadSpan(i))?;
        // `get` checks bounds and char boundaries: a slice of UTF-8 cut at boundaries is UTF-8.
        self.text.get(from..to).map(Some).ok_or(RowError::BadSpan(i))
    }
}

/// Where one row being written sits in its buffer: plain offsets, so a writer of nested rows
/// can keep a frame per level while the buffer itself is borrowed by whoever writes next.
#[derive(Debug, Clone, Copy)]
pub struct RowFrame {
    start: usize,
    kinds: usize,
    slots: usize,
    fields: usize,
}

impl RowFrame {
    /// Starts a row of `fields` fields (at most [`MAX_FIELDS`]) named by schema `schema` at the
    /// end of `buf`; every field starts null until written.
    pub fn begin(buf: &mut Vec<u8>, fields: usize, schema: u32) -> Self {
        assert!(fields <= MAX_FIELDS, "a row has at most {MAX_FIELDS} fields");
        let start = buf.len();
        let (kinds, slots, end) = offsets(fields);
        buf.resize(start + end, 0);
        let header = &mut buf[start..start + HEADER];
        header[0] = MAGIC;
        header[1] = VERSION;
        header[2..4].copy_from_slice(&(fields as u16).to_le_bytes());
        header[4..8].copy_from_slice(&schema.to_le_bytes());
        // Every field starts null: whole bytes of null bits at once, then the last few.
        let nulls = &mut buf[start + HEADER..start + kinds];
        nulls[..fields / 8].fill(0xFF);
        if !fields.is_multiple_of(8) {
            nulls[fields / 8] = (1u8 << (fields % 8)) - 1;
        }
        Self { start, kinds, slots, fields }
    }

    /// Number of fields.
    #[inline]
    pub fn fields(&self) -> usize {
        self.fields
    }

    #[inline]
    fn null_byte(&self, i: usize) -> usize {
        self.start + HEADER + 8 * (i / 64) + (i % 64) / 8
    }

    /// Sets the schema id (for writers that learn the names only after the fields).
    #[inline]
    pub fn set_schema(&self, buf: &mut [u8], schema: u32) {
        buf[self.start + 4..self.start + 8].copy_from_slice(&schema.to_le_bytes());
    }

    #[inline]
    fn put(&self, buf: &mut [u8], i: usize, kind: Kind, slot: [u8; 8]) {
        buf[self.null_byte(i)] &= !(1 << (i % 8));
        buf[self.start + self.kinds + i] = kind as u8;
        let at = self.start + self.slots + SLOT * i;
        buf[at..at + SLOT].copy_from_slice(&slot);
    }

    /// Sets field `i` to `v`.
    #[inline]
    pub fn i64(&self, buf: &mut [u8], i: usize, v: i64) {
        self.put(buf, i, Kind::I64, v.to_le_bytes());
    }

    /// Sets field `i` to `v`.
    #[inline]
    pub fn u64(&self, buf: &mut [u8], i: usize, v: u64) {
        self.put(buf, i, Kind::U64, v.to_le_bytes());
    }

    /// Sets field `i` to `v`.
    #[inline]
    pub fn f64(&self, buf: &mut [u8], i: usize, v: f64) {
        self.put(buf, i, Kind::F64, v.to_le_bytes());
    }

    /// Sets field `i` to `v`.
    #[inline]
    pub fn bool(&self, buf: &mut [u8], i: usize, v: bool) {
        self.put(buf, i, Kind::Bool, u64::from(v).to_le_bytes());
    }

    /// Sets field `i` to `v` of `kind`, appended to the variable region.
    pub fn variable(&self, buf: &mut Vec<u8>, i: usize, kind: Kind, v: &[u8]) {
        let from = buf.len();
        buf.extend_from_slice(v);
        self.close_variable(buf, i, kind, from);
    }

    /// Field `i` is of `kind` and holds the bytes appended to `buf` since it was `from` long
    /// (a nested row or a JSON text written in place).
    pub fn close_variable(&self, buf: &mut [u8], i: usize, kind: Kind, from: usize) {
        let offset = (from - self.start) as u32;
        let len = (buf.len() - from) as u32;
        let mut slot = [0; 8];
        slot[..4].copy_from_slice(&offset.to_le_bytes());
        slot[4..].copy_from_slice(&len.to_le_bytes());
        self.put(buf, i, kind, slot);
    }

    /// Sets field `i` to what field `j` of `from` holds, of the same kind: a row built from
    /// another's fields copies their slots without reading what they mean.
    pub fn copy_field(&self, buf: &mut Vec<u8>, i: usize, from: &RowRef<'_>, j: usize) -> Result<(), RowError> {
        if from.is_null(j)? {
            self.null(buf, i);
            return Ok(());
        }
        match from.kind(j)? {
            Kind::Unset => self.null(buf, i),
            kind if kind.is_variable() => self.variable(buf, i, kind, from.variable(j)?.unwrap_or_default()),
            kind => self.put(buf, i, kind, from.slot(j)),
        }
        Ok(())
    }

    /// Marks field `i` null.
    pub fn null(&self, buf: &mut [u8], i: usize) {
        buf[self.null_byte(i)] |= 1 << (i % 8);
        buf[self.start + self.kinds + i] = Kind::Unset as u8;
    }

    /// The row's length so far.
    pub fn len(&self, buf: &[u8]) -> usize {
        buf.len() - self.start
    }

    /// Whether the row has no bytes yet (never: a row has at least its header).
    pub fn is_empty(&self, buf: &[u8]) -> bool {
        self.len(buf) == 0
    }
}

/// Writes one row of a known field count at the end of a buffer (reused across rows).
#[derive(Debug)]
pub struct RowWriter<'b> {
    buf: &'b mut Vec<u8>,
    frame: RowFrame,
}

impl<'b> RowWriter<'b> {
    /// Starts a row of `fields` fields (at most [`MAX_FIELDS`]) named by schema `schema` at the
    /// end of `buf`; every field starts null until written.
    pub fn new(buf: &'b mut Vec<u8>, fields: usize, schema: u32) -> Self {
        let frame = RowFrame::begin(buf, fields, schema);
        Self { buf, frame }
    }

    /// Sets field `i` to `v`.
    pub fn i64(&mut self, i: usize, v: i64) {
        self.frame.i64(self.buf, i, v);
    }

    /// Sets field `i` to `v`.
    pub fn u64(&mut self, i: usize, v: u64) {
        self.frame.u64(self.buf, i, v);
    }

    /// Sets field `i` to `v`.
    pub fn f64(&mut self, i: usize, v: f64) {
        self.frame.f64(self.buf, i, v);
    }

    /// Sets field `i` to `v`.
    pub fn bool(&mut self, i: usize, v: bool) {
        self.frame.bool(self.buf, i, v);
    }

    /// Sets field `i` to `v`, appended to the variable region.
    pub fn bytes(&mut self, i: usize, v: &[u8]) {
        self.frame.variable(self.buf, i, Kind::Bytes, v);
    }

    /// Sets field `i` to `v`.
    pub fn str(&mut self, i: usize, v: &str) {
        self.frame.variable(self.buf, i, Kind::Str, v.as_bytes());
    }

    /// Sets field `i` to the JSON text `v`.
    pub fn json(&mut self, i: usize, v: &[u8]) {
        self.frame.variable(self.buf, i, Kind::Json, v);
    }

    /// Marks field `i` null.
    pub fn null(&mut self, i: usize) {
        self.frame.null(self.buf, i);
    }

    /// Ends the row; returns its length in bytes.
    pub fn finish(self) -> usize {
        self.frame.len(self.buf)
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
        let mut row = RowWriter::new(buf, fields.len(), 0);
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
        /// Fields copied from one row into another (any of them, in any order, repeated or
        /// not) read back as the fields written; the oracle is the fields as written.
        #[test]
        fn copied_fields_read_back_as_the_fields_they_copy(
            fields in proptest::collection::vec(field(), 1..20),
            picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
        ) {
            let mut source = Vec::new();
            write(&fields, &mut source);
            let from = RowRef::new(&source).expect("whole");
            let picked: Vec<usize> = picks.iter().map(|p| p.index(fields.len())).collect();
            let mut buf = vec![0xAA; 3];
            let frame = RowFrame::begin(&mut buf, picked.len(), 9);
            for (i, &j) in picked.iter().enumerate() {
                frame.copy_field(&mut buf, i, &from, j).expect("in range");
            }
            let row = RowRef::new(&buf[3..]).expect("whole");
            for (i, &j) in picked.iter().enumerate() {
                let got = match &fields[j] {
                    Field::I64(_) => Field::I64(row.i64(i).expect("i64")),
                    Field::U64(_) => Field::U64(row.u64(i).expect("u64")),
                    Field::Bool(_) => Field::Bool(row.bool(i).expect("bool")),
                    Field::Str(_) => Field::Str(row.str(i).expect("str").expect("present").into()),
                    Field::Null => {
                        prop_assert!(row.is_null(i).expect("in range"));
                        Field::Null
                    }
                };
                prop_assert_eq!(&got, &fields[j]);
            }
            prop_assert_eq!(frame.copy_field(&mut buf, 0, &from, fields.len()), Err(RowError::NoField(fields.len())));
        }

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
            let mut row = RowWriter::new(&mut buf, strings.len(), 0);
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
        let mut row = RowWriter::new(&mut buf, 2, 0);
        row.bytes(0, &[0xFF]);
        row.str(1, "é");
        row.finish();
        let read = RowRef::new(&buf).expect("whole");
        assert_eq!(read.utf8().err(), Some(RowError::NotUtf8(2)));
        let mut buf = Vec::new();
        let mut row = RowWriter::new(&mut buf, 1, 0);
        row.str(0, "é");
        row.finish();
        buf[28] = 1; // a length of one byte: half of a two-byte char
        assert_eq!(RowRef::new(&buf).expect("whole").utf8().expect("utf-8").str(0), Err(RowError::BadSpan(0)));
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let mut buf = Vec::new();
        let mut row = RowWriter::new(&mut buf, 3, 0x0102_0304);
        row.i64(0, -2);
        row.str(1, "ab");
        row.finish();
        let expected: &[u8] = &[
            0xB7, 1, 3, 0, 4, 3, 2, 1, // magic, version, field count, schema id
            0b100, 0, 0, 0, 0, 0, 0, 0, // null bits: field 2 was never written
            2, 5, 0, 0, 0, 0, 0, 0, // kinds: i64, string, unset; padding
            0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, // -2
            48, 0, 0, 0, 2, 0, 0, 0, // offset 48, length 2
            0, 0, 0, 0, 0, 0, 0, 0, // field 2
            b'a', b'b',
        ];
        assert_eq!(buf, expected);
        let read = RowRef::new(&buf).expect("whole");
        assert_eq!(read.schema(), 0x0102_0304);
        assert_eq!(read.str(2), Ok(None));
        assert_eq!(read.i64(1), Err(RowError::WrongKind { field: 1, found: Kind::Str, wanted: Kind::I64 }));
        assert!(is_row(&buf) && !is_row(b"{\"a\":1}") && !is_row(b""));
        assert_eq!(RowRef::new(&buf[..47]).err(), Some(RowError::Truncated));
        assert_eq!(RowRef::new(b"{}").err(), Some(RowError::NotARow));
        let mut bad = buf.clone();
        bad[1] = 2;
        assert_eq!(RowRef::new(&bad).err(), Some(RowError::Version(2)));
        let mut bad = buf.clone();
        bad[36] = 9;
        assert_eq!(RowRef::new(&bad).expect("header whole").str(1), Err(RowError::BadSpan(1)));
        let mut bad = buf.clone();
        bad[17] = 42;
        assert_eq!(RowRef::new(&bad).expect("header whole").str(1), Err(RowError::BadKind(1)));
    }
}
