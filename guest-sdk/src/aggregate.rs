//! The [`Aggregate`] trait: an aggregate function that Eddy's host-side windows call.

use serde::Serialize;
use serde::de::DeserializeOwned;

use eddy_wire::{Packed, Span, Table, Update};

use crate::bindings::aggregate_world::exports::eddy::dataflow::aggregate::{AccumulatorUpdates, PackedItems};
use crate::bindings::types::{Batch, OperatorError};
use crate::operator::{Slot, decode_config, rows};
use crate::record::Record;
use crate::{Error, Result, codec};

/// An aggregate over the records of one key and one window, like Flink's `AggregateFunction`.
///
/// Laws the host relies on: `merge` is associative and commutative, and `create_accumulator`
/// is its identity, so windows may add records in any grouping and merge sessions freely.
pub trait Aggregate: Sized + 'static {
    /// The step's `config`, decoded from JSON (`()` for none).
    type Config: DeserializeOwned;
    /// Intermediate state of one window, stored by the host between calls: a struct as a row
    /// (Eddy's binary record, so numbers are read in place), anything else as JSON.
    type Accumulator: Serialize + DeserializeOwned;
    /// What the window emits.
    type Output: Serialize;

    /// Builds the aggregate from its configuration.
    fn open(config: Self::Config) -> Result<Self>;

    /// An empty accumulator.
    fn create_accumulator(&self) -> Self::Accumulator;

    /// Adds one record.
    fn add(&self, acc: &mut Self::Accumulator, record: &Record<'_>) -> Result<()>;

    /// Combines two accumulators.
    fn merge(&self, a: Self::Accumulator, b: Self::Accumulator) -> Self::Accumulator;

    /// The window's result.
    fn result(&self, acc: Self::Accumulator) -> Self::Output;

    /// Reads an accumulator from bytes [`Self::write_accumulator`] wrote (in this version or,
    /// from a savepoint, an earlier one). By serde ([`codec::decode_value`]) unless
    /// overridden: an accumulator that derives [`Row`](crate::Row) is read at a fraction of
    /// the cost by its layout, with the same result, by overriding this with
    /// [`row::decode`](crate::row::decode) (a window decodes its accumulators once per batch
    /// that touches them).
    fn read_accumulator(bytes: &[u8]) -> Result<Self::Accumulator> {
        codec::decode_value(bytes)
    }

    /// Appends `acc` as the host stores it. By serde (as [`codec::encode_value`]) unless
    /// overridden; [`RowWrite::write_row`](crate::RowWrite::write_row) writes the same bytes
    /// for an accumulator that derives [`Row`](crate::Row).
    fn write_accumulator(acc: &Self::Accumulator, buf: &mut Vec<u8>) -> Result<()> {
        codec::encode_value_into(buf, acc)
    }
}

fn with_aggregate<T: Aggregate, R>(
    slot: &'static Slot<T>,
    f: impl FnOnce(&T) -> Result<R>,
) -> Result<R, OperatorError> {
    slot.with_borrow(|agg| match agg {
        Some(agg) => f(agg),
        None => Err(Error::failed("aggregate called before a successful open")),
    })
    .map_err(Error::into_wit)
}

#[doc(hidden)]
pub fn open<T: Aggregate>(slot: &'static Slot<T>, config: String) -> Result<(), OperatorError> {
    crate::operator::install_panic_hook();
    let agg = decode_config(&config).and_then(T::open).map_err(Error::into_wit)?;
    slot.set(Some(agg));
    Ok(())
}

/// `acc` as the host stores it.
fn accumulator_bytes<T: Aggregate>(acc: &T::Accumulator) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    T::write_accumulator(acc, &mut buf)?;
    Ok(buf)
}

#[doc(hidden)]
pub fn create_accumulator<T: Aggregate>(slot: &'static Slot<T>) -> Result<Vec<u8>, OperatorError> {
    with_aggregate(slot, |agg| accumulator_bytes::<T>(&agg.create_accumulator()))
}

/// Appends what `write` writes as the next item of `out`.
fn push_item(out: &mut PackedItems, write: impl FnOnce(&mut Vec<u8>) -> Result<()>) -> Result<()> {
    let start = out.data.len();
    write(&mut out.data)?;
    let span = Span::tail_of(&out.data, start).ok_or_else(|| Error::failed("results of one call exceed 4 GiB"))?;
    span.write(&mut out.spans);
    Ok(())
}

/// `a == b`, eight bytes at a time. Slice equality calls the guest libc's `memcmp`, a byte
/// loop in WASI's libc, and a window's accumulators are often as long as the empty one they
/// are compared with (a row with the same slots): that call was 2% of q5's CPU.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (a_words, b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let (a_tail, b_tail) = (a_words.remainder(), b_words.remainder());
    a_words.zip(b_words).all(|(x, y)| u64::from_ne_bytes(word(x)) == u64::from_ne_bytes(word(y)))
        && a_tail.iter().zip(b_tail).all(|(x, y)| x == y)
}

/// An eight-byte chunk as an array (`chunks_exact(8)` yields only those).
fn word(chunk: &[u8]) -> [u8; 8] {
    let mut w = [0; 8];
    w.copy_from_slice(chunk);
    w
}

#[doc(hidden)]
pub fn add<T: Aggregate>(
    slot: &'static Slot<T>,
    batch: Batch,
    updates: AccumulatorUpdates,
) -> Result<PackedItems, OperatorError> {
    with_aggregate(slot, |agg| {
        let records =
            rows(&batch.records)?.iter().map(|r| Record::from_row(&batch.data, &r)).collect::<Result<Vec<_>>>()?;
        let table = Table::<Update>::new(&updates.updates).map_err(|e| Error::failed(e.to_string()))?;
        let mut out = PackedItems {
            data: Vec::with_capacity(updates.accumulators.len() + 8 * table.len()),
            spans: Vec::with_capacity(table.len() * Span::BYTES),
        };
        // A window's first update carries the empty accumulator's bytes (the host reuses what
        // `create-accumulator` returned): made anew, not decoded.
        let empty = accumulator_bytes::<T>(&agg.create_accumulator())?;
        for (u, update) in table.iter().enumerate() {
            let bad = || Error::failed(format!("the host sent update {u} reaching outside its buffers"));
            let bytes = update.accumulator.slice(&updates.accumulators).ok_or_else(bad)?;
            let mut acc: T::Accumulator =
                if same_bytes(bytes, &empty) { agg.create_accumulator() } else { T::read_accumulator(bytes)? };
            for &i in update.records(&updates.records).ok_or_else(bad)? {
                let Some(record) = records.get(i as usize) else {
                    return Err(Error::failed(format!("the host named record {i} of a batch of {}", records.len())));
                };
                agg.add(&mut acc, record)?;
            }
            push_item(&mut out, |buf| T::write_accumulator(&acc, buf))?;
        }
        Ok(out)
    })
}

#[doc(hidden)]
pub fn merge<T: Aggregate>(slot: &'static Slot<T>, a: Vec<u8>, b: Vec<u8>) -> Result<Vec<u8>, OperatorError> {
    with_aggregate(slot, |agg| accumulator_bytes::<T>(&agg.merge(T::read_accumulator(&a)?, T::read_accumulator(&b)?)))
}

#[doc(hidden)]
pub fn get_results<T: Aggregate>(slot: &'static Slot<T>, accs: PackedItems) -> Result<PackedItems, OperatorError> {
    with_aggregate(slot, |agg| {
        let accs =
            eddy_wire::items(&accs.data, &accs.spans).map_err(|e| Error::failed(format!("the host sent {e}")))?;
        let mut out = PackedItems { data: Vec::new(), spans: Vec::with_capacity(accs.len() * Span::BYTES) };
        for acc in accs {
            let result = agg.result(T::read_accumulator(acc)?);
            push_item(&mut out, |buf| codec::encode_value_into(buf, &result))?;
        }
        Ok(out)
    })
}

/// Exports a type implementing [`Aggregate`] as this component's aggregate function.
///
/// ```ignore
/// eddy_sdk::export_aggregate!(PurchaseTotals);
/// ```
#[macro_export]
macro_rules! export_aggregate {
    ($agg:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __EDDY_AGGREGATE: ::core::cell::RefCell<::core::option::Option<$agg>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }
            struct __EddyAggregateExport;
            impl $crate::__private::AggregateGuest for __EddyAggregateExport {
                fn open(config: ::std::string::String) -> ::core::result::Result<(), $crate::__private::OperatorError> {
                    $crate::__private::aggregate::open::<$agg>(&__EDDY_AGGREGATE, config)
                }
                fn create_accumulator() -> ::core::result::Result<::std::vec::Vec<u8>, $crate::__private::OperatorError> {
                    $crate::__private::aggregate::create_accumulator::<$agg>(&__EDDY_AGGREGATE)
                }
                fn add(
                    records: $crate::__private::Batch,
                    updates: $crate::__private::AccumulatorUpdates,
                ) -> ::core::result::Result<$crate::__private::PackedItems, $crate::__private::OperatorError> {
                    $crate::__private::aggregate::add::<$agg>(&__EDDY_AGGREGATE, records, updates)
                }
                fn merge(
                    a: ::std::vec::Vec<u8>,
                    b: ::std::vec::Vec<u8>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::__private::OperatorError> {
                    $crate::__private::aggregate::merge::<$agg>(&__EDDY_AGGREGATE, a, b)
                }
                fn get_results(
                    accumulators: $crate::__private::PackedItems,
                ) -> ::core::result::Result<$crate::__private::PackedItems, $crate::__private::OperatorError> {
                    $crate::__private::aggregate::get_results::<$agg>(&__EDDY_AGGREGATE, accumulators)
                }
            }
            $crate::__private::aggregate_world::__export_window_aggregate!(__EddyAggregateExport with_types_in $crate::__private::aggregate_world);
        };
    };
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use eddy_wire::Row;
    use serde::{Deserialize, Deserializer};

    use super::*;

    proptest::proptest! {
        /// Word-wise equality is slice equality: any lengths (tails of 0 to 7 bytes), and
        /// slices differing in one byte anywhere (in a word or in the tail).
        #[test]
        fn same_bytes_is_slice_equality(a in proptest::collection::vec(0u8..3, 0..40), at in 0usize..40, to in 0u8..3) {
            let mut b = a.clone();
            if let Some(byte) = b.get_mut(at) {
                *byte = to;
            }
            proptest::prop_assert_eq!(same_bytes(&a, &b), a == b);
            proptest::prop_assert!(same_bytes(&a, &a.clone()));
            proptest::prop_assert_eq!(same_bytes(&a, &b[..b.len().saturating_sub(1)]), a.is_empty());
        }
    }

    thread_local! {
        static DECODED: Cell<usize> = const { Cell::new(0) };
        static COUNTING: RefCell<Option<Counting>> = const { RefCell::new(None) };
    }

    /// A count that notes every time it is decoded.
    #[derive(Serialize)]
    #[serde(transparent)]
    struct Count(u64);

    impl<'de> Deserialize<'de> for Count {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            DECODED.set(DECODED.get() + 1);
            u64::deserialize(d).map(Count)
        }
    }

    struct Counting;

    impl Aggregate for Counting {
        type Config = ();
        type Accumulator = Count;
        type Output = u64;
        fn open(_: ()) -> Result<Self> {
            Ok(Counting)
        }
        fn create_accumulator(&self) -> Count {
            Count(0)
        }
        fn add(&self, acc: &mut Count, _: &Record<'_>) -> Result<()> {
            acc.0 += 1;
            Ok(())
        }
        fn merge(&self, a: Count, b: Count) -> Count {
            Count(a.0 + b.0)
        }
        fn result(&self, acc: Count) -> u64 {
            acc.0
        }
    }

    fn packed<T: Packed>(items: &[T]) -> Vec<u8> {
        let mut out = Vec::new();
        items.iter().for_each(|i| i.write(&mut out));
        out
    }

    #[test]
    fn a_new_windows_empty_accumulator_is_made_not_decoded() {
        COUNTING.set(Some(Counting));
        let row = |tag| Row { key: None, value: Span { offset: 0, len: 0 }, timestamp: None, tag };
        let batch = Batch {
            data: Vec::new(),
            records: packed(&[row(0), row(1), row(2)]),
            prefetched_states: Vec::new(),
            prefetched: Vec::new(),
        };
        // The empty accumulator ("0", as `create-accumulator` encodes it) with two records,
        // then a count of 5 with one.
        let updates = AccumulatorUpdates {
            accumulators: b"05".to_vec(),
            updates: packed(&[
                Update { accumulator: Span { offset: 0, len: 1 }, first: 0, count: 2 },
                Update { accumulator: Span { offset: 1, len: 1 }, first: 2, count: 1 },
            ]),
            records: vec![0, 1, 2],
        };
        DECODED.set(0);
        let out = add(&COUNTING, batch, updates).expect("add");
        let items = eddy_wire::items(&out.data, &out.spans).expect("items");
        assert_eq!(items, [b"2".as_slice(), b"6"]);
        assert_eq!(DECODED.get(), 1, "only the non-empty accumulator is decoded");
    }
}
