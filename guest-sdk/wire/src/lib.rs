//! # eddy-wire: the packed tables of Eddy's WIT contract
//!
//! `wit/dataflow.wit` passes the per-record parts of a call — a batch's records, the state
//! values prefetched for them, the records a guest emits, the value-state writes it applies —
//! as packed little-endian tables in a `list<u8>`, not as lists of WIT records. The canonical
//! ABI copies a `list<u8>` with one `memcpy` but lowers and lifts a list of records field by
//! field, which cost more per record than the operator's own work in the word-count benchmark.
//!
//! This crate is the one definition of those layouts, used by the host runtime and by the Rust
//! SDK. SDKs in other languages read the same bytes (Python: `struct.unpack_from("<IIIIqII", ...)`).
//!
//! ```
//! use eddy_wire::{Packed, Row, Span, Table};
//!
//! let mut table = Vec::new();
//! Row { key: Some(Span { offset: 0, len: 3 }), value: Span { offset: 3, len: 1 }, timestamp: Some(7), tag: 0 }
//!     .write(&mut table);
//! let rows = Table::<Row>::new(&table).expect("whole rows");
//! assert_eq!(rows.len(), 1);
//! assert_eq!(rows.get(0).and_then(|r| r.timestamp), Some(7));
//! ```

#![no_std]

extern crate alloc;

use alloc::vec::Vec;
use core::fmt;
use core::marker::PhantomData;

#[cfg(feature = "serde")]
pub mod de;
#[cfg(feature = "serde")]
pub mod from_json;
#[cfg(feature = "serde")]
pub mod json;
pub mod row;
pub mod schema;
#[cfg(feature = "serde")]
pub mod ser;
#[cfg(all(test, feature = "serde"))]
mod serde_tests;

/// The `len` of a span that is absent (no key, no value, a cleared state).
pub const ABSENT: u32 = u32::MAX;

/// A byte range in the buffer that travels with a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// Start of the range.
    pub offset: u32,
    /// Length of the range; never [`ABSENT`] (buffers are smaller than 4 GiB − 1).
    pub len: u32,
}

impl Span {
    /// The span from `start` to the end of `data`, if both fit the layout.
    pub fn tail_of(data: &[u8], start: usize) -> Option<Span> {
        let len = data.len().checked_sub(start)?;
        let span = Span { offset: u32::try_from(start).ok()?, len: u32::try_from(len).ok()? };
        (span.len != ABSENT && span.offset.checked_add(span.len).is_some()).then_some(span)
    }

    /// The bytes of `data` the span covers, or `None` when it reaches outside.
    #[inline]
    pub fn slice(self, data: &[u8]) -> Option<&[u8]> {
        let start = self.offset as usize;
        data.get(start..start.checked_add(self.len as usize)?)
    }
}

/// A fixed-size row of a packed table. Implementations mark `write` and `read` `#[inline]`:
/// the host reads and writes a row per record in its call loops, and without LTO a call
/// across crates is not inlined otherwise (`Row::write` and `read` were 3% of q0's CPU as
/// calls).
pub trait Packed: Sized + 'static {
    /// Bytes per row.
    const BYTES: usize;
    /// What a row stands for, for error messages.
    const WHAT: &'static str;
    /// Appends the row's bytes.
    fn write(&self, out: &mut Vec<u8>);
    /// Reads a row from exactly [`Self::BYTES`] bytes.
    fn read(bytes: &[u8]) -> Self;
}

/// A table whose length is not a whole number of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableError {
    /// What the rows stand for.
    pub what: &'static str,
    /// The table's length in bytes.
    pub len: usize,
    /// Bytes per row.
    pub row_bytes: usize,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a table of {} is {} bytes, not a multiple of its {}-byte rows", self.what, self.len, self.row_bytes)
    }
}

/// A read-only view of a packed table.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a, T> {
    bytes: &'a [u8],
    _row: PhantomData<fn() -> T>,
}

impl<'a, T: Packed> Table<'a, T> {
    /// Views `bytes` as rows of `T`; fails unless it holds whole rows.
    pub fn new(bytes: &'a [u8]) -> Result<Self, TableError> {
        if !bytes.len().is_multiple_of(T::BYTES) {
            return Err(TableError { what: T::WHAT, len: bytes.len(), row_bytes: T::BYTES });
        }
        Ok(Self { bytes, _row: PhantomData })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.bytes.len() / T::BYTES
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Row `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<T> {
        let start = index.checked_mul(T::BYTES)?;
        self.bytes.get(start..start + T::BYTES).map(T::read)
    }

    /// Every row, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = T> + 'a {
        self.bytes.chunks_exact(T::BYTES).map(T::read)
    }
}

#[inline]
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

#[inline]
fn i64_at(bytes: &[u8], at: usize) -> i64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    i64::from_le_bytes(word)
}

/// Puts `v` at byte `at` of a packed row being assembled on the stack. Rows are assembled
/// whole and appended in one piece: in a guest each `extend_from_slice` is a capacity check
/// and a store of its own, and a record's row written field by field cost ~160 WebAssembly
/// instructions more (`cargo bench -p eddy-runtime --bench sandbox -- --instructions`). The
/// offsets are constants, so the bounds checks fold away (a builder that tracked its position
/// measured worse than field by field).
#[inline(always)]
fn put<const W: usize>(row: &mut [u8], at: usize, v: [u8; W]) {
    row[at..at + W].copy_from_slice(&v);
}

#[inline(always)]
fn put_opt_span(row: &mut [u8], at: usize, span: Option<Span>) {
    let Span { offset, len } = span.unwrap_or(Span { offset: 0, len: ABSENT });
    put(row, at, offset.to_le_bytes());
    put(row, at + 4, len.to_le_bytes());
}

#[inline]
fn read_opt_span(bytes: &[u8], at: usize) -> Option<Span> {
    let len = u32_at(bytes, at + 4);
    (len != ABSENT).then(|| Span { offset: u32_at(bytes, at), len })
}

/// One record: a row of `batch.records` (input) and of `output-batch.records` (emitted).
///
/// Layout, 32 bytes: key offset `u32`, key length `u32` ([`ABSENT`]: no key), value offset
/// `u32`, value length `u32`, timestamp `i64`, flags `u32` (bit 0: has a timestamp), tag `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Key bytes; absent on a stream that is not keyed.
    pub key: Option<Span>,
    /// Value bytes.
    pub value: Span,
    /// Event time (ms since the Unix epoch).
    pub timestamp: Option<i64>,
    /// In a `process` batch: the record's key slot, the index of the first record of the
    /// batch with the same key. In an aggregate batch: the record's own index. In an output
    /// batch: the output id (0 = main, else from `side-output`).
    pub tag: u32,
}

impl Packed for Row {
    const BYTES: usize = 32;
    const WHAT: &'static str = "records";

    #[inline]
    fn write(&self, out: &mut Vec<u8>) {
        let mut row = [0; Self::BYTES];
        put_opt_span(&mut row, 0, self.key);
        put_opt_span(&mut row, 8, Some(self.value));
        put(&mut row, 16, self.timestamp.unwrap_or(0).to_le_bytes());
        put(&mut row, 24, u32::from(self.timestamp.is_some()).to_le_bytes());
        put(&mut row, 28, self.tag.to_le_bytes());
        out.extend_from_slice(&row);
    }

    #[inline]
    fn read(bytes: &[u8]) -> Self {
        let has_timestamp = u32_at(bytes, 24) & 1 == 1;
        Row {
            key: read_opt_span(bytes, 0),
            // An absent value is malformed; reading it as an out-of-range span makes every
            // slice of it fail instead of inventing an empty value.
            value: Span { offset: u32_at(bytes, 8), len: u32_at(bytes, 12) },
            timestamp: has_timestamp.then(|| i64_at(bytes, 16)),
            tag: u32_at(bytes, 28),
        }
    }
}

/// A cell of `batch.prefetched`: the state value for one record and one prefetched state.
///
/// Layout, 8 bytes: offset `u32`, length `u32` ([`ABSENT`]: the state holds no value).
impl Packed for Option<Span> {
    const BYTES: usize = 8;
    const WHAT: &'static str = "prefetched values";

    #[inline]
    fn write(&self, out: &mut Vec<u8>) {
        let mut row = [0; Self::BYTES];
        put_opt_span(&mut row, 0, *self);
        out.extend_from_slice(&row);
    }

    #[inline]
    fn read(bytes: &[u8]) -> Self {
        read_opt_span(bytes, 0)
    }
}

/// A row of `value-set-many`'s writes.
///
/// Layout, 16 bytes: state id `u32`, key handle `u32`, value offset `u32`, value length `u32`
/// ([`ABSENT`]: clear the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueWrite {
    /// The declared state.
    pub state: u32,
    /// Key handle (a record or timer index of the current call).
    pub key: u32,
    /// The new value; `None` clears the state.
    pub value: Option<Span>,
}

impl Packed for ValueWrite {
    const BYTES: usize = 16;
    const WHAT: &'static str = "value writes";

    #[inline]
    fn write(&self, out: &mut Vec<u8>) {
        let mut row = [0; Self::BYTES];
        put(&mut row, 0, self.state.to_le_bytes());
        put(&mut row, 4, self.key.to_le_bytes());
        put_opt_span(&mut row, 8, self.value);
        out.extend_from_slice(&row);
    }

    #[inline]
    fn read(bytes: &[u8]) -> Self {
        ValueWrite { state: u32_at(bytes, 0), key: u32_at(bytes, 4), value: read_opt_span(bytes, 8) }
    }
}

/// An item of a `packed-items` (`spans`): where one byte string lies in `data`.
///
/// Layout, 8 bytes: offset `u32`, length `u32`.
impl Packed for Span {
    const BYTES: usize = 8;
    const WHAT: &'static str = "items";

    #[inline]
    fn write(&self, out: &mut Vec<u8>) {
        let mut row = [0; Self::BYTES];
        put_opt_span(&mut row, 0, Some(*self));
        out.extend_from_slice(&row);
    }

    #[inline]
    fn read(bytes: &[u8]) -> Self {
        Span { offset: u32_at(bytes, 0), len: u32_at(bytes, 4) }
    }
}

/// Appends `bytes` as the next item of a `packed-items` (`data` and `spans`); `None`, with
/// nothing appended, if `data` would pass 4 GiB.
pub fn push_item(data: &mut Vec<u8>, spans: &mut Vec<u8>, bytes: &[u8]) -> Option<()> {
    let end = data.len().checked_add(bytes.len())?;
    if end >= ABSENT as usize {
        return None;
    }
    Span { offset: data.len() as u32, len: bytes.len() as u32 }.write(spans);
    data.extend_from_slice(bytes);
    Some(())
}

/// What is wrong with a `packed-items`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemsError {
    /// `spans` is not whole rows.
    Table(TableError),
    /// The item at this index reaches outside `data`.
    Outside(usize),
}

impl fmt::Display for ItemsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ItemsError::Table(e) => e.fmt(f),
            ItemsError::Outside(i) => write!(f, "item {i} reaches outside its buffer"),
        }
    }
}

/// The items of a `packed-items`, each checked to lie within `data`.
pub fn items<'a>(data: &'a [u8], spans: &'a [u8]) -> Result<Vec<&'a [u8]>, ItemsError> {
    let table = Table::<Span>::new(spans).map_err(ItemsError::Table)?;
    table.iter().enumerate().map(|(i, s)| s.slice(data).ok_or(ItemsError::Outside(i))).collect()
}

/// A row of `accumulator-updates.updates`: one accumulator and its run of record indices.
///
/// Layout, 16 bytes: accumulator offset `u32`, accumulator length `u32` (into
/// `accumulators`), first record `u32`, record count `u32` (into `records`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Update {
    /// The accumulator before the records.
    pub accumulator: Span,
    /// Index of the update's first record index in `records`.
    pub first: u32,
    /// How many record indices are the update's.
    pub count: u32,
}

impl Update {
    /// The update's record indices within `records`, or `None` when the run reaches outside.
    pub fn records(self, records: &[u32]) -> Option<&[u32]> {
        let start = self.first as usize;
        records.get(start..start.checked_add(self.count as usize)?)
    }
}

impl Packed for Update {
    const BYTES: usize = 16;
    const WHAT: &'static str = "accumulator updates";

    #[inline]
    fn write(&self, out: &mut Vec<u8>) {
        let mut row = [0; Self::BYTES];
        put_opt_span(&mut row, 0, Some(self.accumulator));
        put(&mut row, 8, self.first.to_le_bytes());
        put(&mut row, 12, self.count.to_le_bytes());
        out.extend_from_slice(&row);
    }

    #[inline]
    fn read(bytes: &[u8]) -> Self {
        Update { accumulator: Span::read(&bytes[..8]), first: u32_at(bytes, 8), count: u32_at(bytes, 12) }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use alloc::vec;
    use proptest::prelude::*;

    use super::*;

    fn span() -> impl Strategy<Value = Span> {
        (any::<u32>(), 0..ABSENT).prop_map(|(offset, len)| Span { offset, len })
    }

    fn row() -> impl Strategy<Value = Row> {
        (proptest::option::of(span()), span(), proptest::option::of(any::<i64>()), any::<u32>())
            .prop_map(|(key, value, timestamp, tag)| Row { key, value, timestamp, tag })
    }

    fn write() -> impl Strategy<Value = ValueWrite> {
        (any::<u32>(), any::<u32>(), proptest::option::of(span())).prop_map(|(state, key, value)| ValueWrite {
            state,
            key,
            value,
        })
    }

    fn round_trip<T: Packed + Clone + PartialEq + fmt::Debug>(rows: &[T]) {
        let mut bytes = Vec::new();
        for r in rows {
            r.write(&mut bytes);
        }
        assert_eq!(bytes.len(), rows.len() * T::BYTES);
        let table = Table::<T>::new(&bytes).expect("whole rows");
        assert_eq!(table.iter().collect::<Vec<_>>(), rows);
        assert_eq!(table.get(rows.len()), None);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(table.get(i).as_ref(), Some(r));
        }
    }

    proptest! {
        #[test]
        fn rows_round_trip(rows in proptest::collection::vec(row(), 0..20)) {
            round_trip(&rows);
        }

        #[test]
        fn prefetched_cells_round_trip(cells in proptest::collection::vec(proptest::option::of(span()), 0..20)) {
            round_trip(&cells);
        }

        #[test]
        fn value_writes_round_trip(writes in proptest::collection::vec(write(), 0..20)) {
            round_trip(&writes);
        }

        #[test]
        fn updates_round_trip(updates in proptest::collection::vec((span(), any::<u32>(), any::<u32>()), 0..20)) {
            let updates: Vec<Update> =
                updates.into_iter().map(|(accumulator, first, count)| Update { accumulator, first, count }).collect();
            round_trip(&updates);
        }

        /// Oracle: the byte strings pushed, in order.
        #[test]
        fn pushed_items_read_back(strings in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..9), 0..12)) {
            let (mut data, mut spans) = (Vec::new(), Vec::new());
            for s in &strings {
                push_item(&mut data, &mut spans, s).expect("small");
            }
            let read = items(&data, &spans).expect("well formed");
            prop_assert_eq!(read, strings.iter().map(Vec::as_slice).collect::<Vec<_>>());
        }

        #[test]
        fn a_partial_row_is_refused(rows in 0usize..4, extra in 1usize..32) {
            let bytes = vec![0u8; rows * Row::BYTES + extra];
            let err = Table::<Row>::new(&bytes).expect_err("partial row");
            prop_assert_eq!(err, TableError { what: "records", len: bytes.len(), row_bytes: 32 });
        }
    }

    #[test]
    fn items_outside_their_buffer_or_partial_spans_are_refused() {
        let mut spans = Vec::new();
        Span { offset: 0, len: 2 }.write(&mut spans);
        Span { offset: 4, len: 2 }.write(&mut spans);
        assert_eq!(items(b"hello", &spans), Err(ItemsError::Outside(1)));
        assert_eq!(items(b"hello!", &spans), Ok(vec![&b"he"[..], &b"o!"[..]]));
        assert!(matches!(items(b"hello", &spans[..5]), Err(ItemsError::Table(_))));
        let update = Update { accumulator: Span::default(), first: 2, count: 2 };
        assert_eq!(update.records(&[1, 2, 3, 4]), Some(&[3, 4][..]));
        assert_eq!(update.records(&[1, 2, 3]), None);
    }

    #[test]
    fn rows_are_laid_out_as_the_wit_contract_says() {
        // The layouts of `eddy.wit`, byte by byte: every field little-endian, an absent span
        // as offset 0 and length 0xFFFF_FFFF.
        let mut out = vec![0xEE];
        Row { key: None, value: Span { offset: 0x0102, len: 3 }, timestamp: Some(-2), tag: 7 }.write(&mut out);
        #[rustfmt::skip]
        let expected = [
            0xEE,
            0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x02, 0x01, 0, 0, 3, 0, 0, 0,
            0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 1, 0, 0, 0, 7, 0, 0, 0,
        ];
        assert_eq!(out, expected);
        let mut out = Vec::new();
        Row { key: Some(Span { offset: 5, len: 0 }), value: Span::default(), timestamp: None, tag: 0 }.write(&mut out);
        assert_eq!(
            out,
            [5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let mut out = Vec::new();
        ValueWrite { state: 1, key: 2, value: None }.write(&mut out);
        None::<Span>.write(&mut out);
        Update { accumulator: Span { offset: 9, len: 8 }, first: 4, count: 1 }.write(&mut out);
        #[rustfmt::skip]
        let expected = [
            1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF,
            0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF,
            9, 0, 0, 0, 8, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0,
        ];
        assert_eq!(out, expected);
    }

    #[test]
    fn spans_slice_only_inside_their_buffer() {
        let data = b"hello";
        assert_eq!(Span { offset: 1, len: 3 }.slice(data), Some(&b"ell"[..]));
        assert_eq!(Span { offset: 4, len: 2 }.slice(data), None);
        assert_eq!(Span { offset: u32::MAX, len: u32::MAX - 1 }.slice(data), None);
        assert_eq!(Span::tail_of(data, 2), Some(Span { offset: 2, len: 3 }));
        assert_eq!(Span::tail_of(data, 6), None);
    }
}
