//! Structs read and written as rows by a layout fixed at compile time: `#[derive(Row)]`.
//!
//! [`Record::value`](crate::Record::value) and [`Context::emit_value`](crate::Context::emit_value)
//! go through serde, which asks for each field by name through a visitor: on a four-field
//! struct that is most of what a stateless operator spends per record. A struct that derives
//! [`Row`](crate::Row) is read by [`Record::row`](crate::Record::row) from the slots its field
//! names have in the record's schema (resolved once per schema id, then read at their index)
//! and written by [`Context::emit_row`](crate::Context::emit_row) slot by slot with its schema
//! declared once. The results are those of the serde path: a value that is not a row, a
//! schema without one of the fields or a slot of another kind than the field's type is read
//! by serde instead, and the bytes written are the bytes serde's row encoder writes.
//!
//! A field may be of any type that implements [`Slot`]: the numbers, `bool`, `String` and
//! `Option` of a slot type do; implement it for a type of your own (an enum holding one of
//! several kinds, say: `examples/nexmark/count`'s key) to keep a struct holding it on the fast
//! path. An [`Aggregate`](crate::Aggregate) whose accumulator derives `Row` reads and writes
//! it this way by overriding `read_accumulator` with [`decode`] and `write_accumulator` with
//! [`RowWrite::write_row`].

use std::cell::Cell;
use std::thread::LocalKey;

pub use eddy_wire::row::{Kind, RowFrame, RowRef};
use serde::de::DeserializeOwned;

use crate::codec;

/// A struct read from a row by a layout fixed at compile time. Derive it: `#[derive(Row)]`.
pub trait RowRead: Sized {
    /// `row` read field by field from the slots its schema gives the struct's field names;
    /// `None` when the schema lacks a field or a slot holds another kind than the field's
    /// type takes (the caller then reads the row with serde, which says what is wrong).
    fn read_row(row: &RowRef<'_>) -> Option<Self>;
}

/// A struct written as a row by a layout fixed at compile time. Derive it: `#[derive(Row)]`.
pub trait RowWrite {
    /// Appends `self` to `buf` as a row: the same bytes serde's row encoder writes.
    fn write_row(&self, buf: &mut Vec<u8>);
}

/// A field type `#[derive(Row)]` reads from and writes into one slot of a row.
///
/// Both directions must agree with serde's row codec on every value: `write` writes the
/// bytes serde's row encoder writes for the value's `Serialize`, and `read` returns what the
/// value's `Deserialize` reads from that slot, or `None` when it cannot tell (a kind it does
/// not take), so that the struct is read by serde instead.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a row slot type",
    label = "derive(Row) cannot read or write this field",
    note = "derive(Row) reads and writes integers, floats, `bool`, `String`, `Option` of them and types implementing `eddy_sdk::row::Slot`; read a struct with other fields with `record.value()`"
)]
pub trait Slot: Sized {
    /// Slot `i` of `row`, if it holds a value of this type.
    fn read(row: &RowRef<'_>, i: usize) -> Option<Self>;
    /// Writes `self` into slot `i` of the row `frame` begins in `buf`.
    fn write(&self, frame: &RowFrame, buf: &mut Vec<u8>, i: usize);
}

/// Slot types read and written through the row's accessor `$read` of type `$wide`.
macro_rules! same_kind_slots {
    ($read:ident, $wide:ty: $($t:ty),*) => {$(
        impl Slot for $t {
            #[inline]
            fn read(row: &RowRef<'_>, i: usize) -> Option<Self> {
                <$t>::try_from(row.$read(i).ok()?).ok()
            }
            #[inline]
            fn write(&self, frame: &RowFrame, buf: &mut Vec<u8>, i: usize) {
                frame.$read(buf, i, <$wide>::from(*self));
            }
        }
    )*};
}
same_kind_slots!(u64, u64: u8, u16, u32, u64);
same_kind_slots!(i64, i64: i8, i16, i32, i64);
same_kind_slots!(f64, f64: f64);
same_kind_slots!(bool, bool: bool);

impl Slot for f32 {
    #[inline]
    fn read(row: &RowRef<'_>, i: usize) -> Option<Self> {
        // serde reads an f32 from an f64 with `as`, rounding to nearest.
        row.f64(i).ok().map(|v| v as f32)
    }
    #[inline]
    fn write(&self, frame: &RowFrame, buf: &mut Vec<u8>, i: usize) {
        frame.f64(buf, i, f64::from(*self));
    }
}

impl Slot for String {
    #[inline]
    fn read(row: &RowRef<'_>, i: usize) -> Option<Self> {
        row.str(i).ok().flatten().map(str::to_owned)
    }
    #[inline]
    fn write(&self, frame: &RowFrame, buf: &mut Vec<u8>, i: usize) {
        frame.variable(buf, i, eddy_wire::row::Kind::Str, self.as_bytes());
    }
}

impl<T: Slot> Slot for Option<T> {
    #[inline]
    fn read(row: &RowRef<'_>, i: usize) -> Option<Self> {
        if row.is_null(i).ok()? { Some(None) } else { T::read(row, i).map(Some) }
    }
    #[inline]
    fn write(&self, frame: &RowFrame, buf: &mut Vec<u8>, i: usize) {
        match self {
            Some(v) => v.write(frame, buf, i),
            None => frame.null(buf, i),
        }
    }
}

/// What the code `#[derive(Row)]` generates calls; not part of the API.
#[doc(hidden)]
pub mod support {
    pub use super::{RowFrame, RowRef, Slot};

    use super::*;

    /// A struct's slots per field in the last schema read, with that schema's id.
    pub type Layout<const N: usize> = Cell<Option<(u32, [u16; N])>>;

    /// The slots of `names` in `row`'s schema: remembered in `cache` for the last schema id
    /// seen, looked up otherwise; `None` if the schema is unknown or lacks a name.
    #[inline]
    pub fn slots<const N: usize>(
        row: &RowRef<'_>,
        cache: &'static LocalKey<Layout<N>>,
        names: &[&str; N],
    ) -> Option<[u16; N]> {
        let id = row.schema();
        match cache.get() {
            Some((known, slots)) if known == id => Some(slots),
            _ => {
                let slots = codec::slots_of(id, names)?;
                cache.set(Some((id, slots)));
                Some(slots)
            }
        }
    }

    /// The id of schema `name` with `fields`, declared to the host the first time.
    #[inline]
    pub fn declared(cache: &'static LocalKey<Cell<Option<u32>>>, name: &str, fields: &[&str]) -> u32 {
        cache.get().unwrap_or_else(|| {
            let id = declare(name, fields);
            cache.set(Some(id));
            id
        })
    }
}

/// The id of the row schema `name` with field names `fields` (declared to the host on first
/// use), for a row written by hand with [`RowFrame`] whose fields are chosen at run time.
pub fn declare(name: &str, fields: &[&str]) -> u32 {
    codec::declare(&eddy_wire::schema::Schema::new(name, fields))
}

/// The schema (name and field names) of rows of schema id `id`, `None` if the host knows
/// none: for code that handles rows of shapes it learns at run time.
pub fn schema(id: u32) -> Option<std::sync::Arc<eddy_wire::schema::Schema>> {
    codec::schema(id)
}

/// Value `bytes` read by `T`'s derived layout if it is a row the layout applies to, else by
/// serde ([`codec::decode_value`]): the same result either way.
pub fn decode<T: RowRead + DeserializeOwned>(bytes: &[u8]) -> crate::Result<T> {
    let fast = if eddy_wire::row::is_row(bytes) { RowRef::new(bytes).ok().and_then(|r| T::read_row(&r)) } else { None };
    match fast {
        Some(v) => Ok(v),
        None => codec::decode_value(bytes),
    }
}

#[cfg(test)]
mod tests {
    use eddy_wire::row::{Kind, RowFrame};
    use eddy_wire::schema::Schema;
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::Row;

    /// Every field type the derive takes.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Row)]
    struct Every {
        a: u8,
        b: u16,
        c: u32,
        d: u64,
        e: i8,
        f: i16,
        g: i32,
        h: i64,
        r#type: String,
        x: f32,
        y: f64,
        ok: bool,
        maybe: Option<u64>,
        note: Option<String>,
    }

    fn every() -> impl Strategy<Value = Every> {
        (
            (any::<u8>(), any::<u16>(), any::<u32>(), any::<u64>(), any::<i8>(), any::<i16>(), any::<i32>()),
            (any::<i64>(), ".{0,12}", any::<f32>(), any::<f64>(), any::<bool>()),
            (any::<Option<u64>>(), proptest::option::of(".{0,8}")),
        )
            .prop_map(|((a, b, c, d, e, f, g), (h, r#type, x, y, ok), (maybe, note))| Every {
                a,
                b,
                c,
                d,
                e,
                f,
                g,
                h,
                r#type,
                x,
                y,
                ok,
                maybe,
                note,
            })
    }

    /// What the serde path reads, the oracle: `Ok` compared by its JSON (NaN never equals
    /// itself), errors only as errors.
    fn serde_read<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> Option<String> {
        codec::decode_value::<T>(bytes).ok().map(|v| serde_json::to_string(&v).unwrap_or_default())
    }

    fn derived_read<T: RowRead + DeserializeOwned + Serialize>(bytes: &[u8]) -> Option<String> {
        decode::<T>(bytes).ok().map(|v| serde_json::to_string(&v).unwrap_or_default())
    }

    proptest! {
        #[test]
        fn derived_rows_are_the_bytes_serde_writes_and_read_back_as_serde_reads_them(value in every()) {
            let mut derived = Vec::new();
            value.write_row(&mut derived);
            let serde = codec::encode_value(&value).expect("serde writes it");
            prop_assert_eq!(&derived, &serde);
            let fast = RowRef::new(&derived).ok().and_then(|r| Every::read_row(&r));
            prop_assert!(fast.is_some(), "its own rows take the fast path");
            prop_assert_eq!(derived_read::<Every>(&derived), serde_read::<Every>(&derived));
        }

        /// Rows of other shapes (fields in another order, extra fields, a field of another
        /// kind, an integer out of a narrow type's range, a null where a value is needed), and
        /// the same as JSON: the derived reader's result is serde's, `Ok` or not. Each field
        /// mostly holds its own kind, so that most rows are one mismatch or none away from
        /// the fast path.
        #[test]
        fn any_other_shape_reads_as_serde_reads_it(
            order in Just((0..6usize).collect::<Vec<_>>()).prop_shuffle(),
            own in (
                (0u64..300).prop_map(Slot::U),
                any::<u64>().prop_map(Slot::U),
                any::<i64>().prop_map(Slot::I),
                "[a-z]{0,4}".prop_map(Slot::S),
                prop_oneof![any::<u64>().prop_map(Slot::U), Just(Slot::Null)],
                slot(),
            ),
            other in proptest::collection::vec(proptest::option::weighted(0.2, slot()), 6),
        ) {
            let own = [own.0, own.1, own.2, own.3, own.4, own.5];
            let slots: Vec<Slot> =
                order.iter().map(|&i| other[i].clone().unwrap_or_else(|| own[i].clone())).collect();
            let names = ["a", "d", "h", "type", "maybe", "extra"];
            let fields: Vec<&str> = order.iter().map(|&i| names[i]).collect();
            let id = codec::declare(&Schema::new("Narrow", &fields));
            let mut row = Vec::new();
            let frame = RowFrame::begin(&mut row, fields.len(), id);
            for (i, s) in slots.iter().enumerate() {
                match s {
                    Slot::U(v) => frame.u64(&mut row, i, *v),
                    Slot::I(v) => frame.i64(&mut row, i, *v),
                    Slot::F(v) => frame.f64(&mut row, i, *v),
                    Slot::S(v) => frame.variable(&mut row, i, Kind::Str, v.as_bytes()),
                    Slot::Null => frame.null(&mut row, i),
                }
            }
            prop_assert_eq!(derived_read::<Narrow>(&row), serde_read::<Narrow>(&row));
            let json = crate::codec::pointer_json(&row, "").expect("the row as JSON").unwrap_or_default();
            prop_assert_eq!(derived_read::<Narrow>(&json), serde_read::<Narrow>(&json));
        }
    }

    /// A struct some of whose fields the rows above lack, or hold in another kind.
    #[derive(Debug, PartialEq, Serialize, Deserialize, Row)]
    struct Narrow {
        a: u8,
        d: u64,
        h: i64,
        r#type: String,
        maybe: Option<u64>,
    }

    #[derive(Debug, Clone)]
    enum Slot {
        U(u64),
        I(i64),
        F(f64),
        S(String),
        Null,
    }

    fn slot() -> impl Strategy<Value = Slot> {
        prop_oneof![
            (0u64..300).prop_map(Slot::U),
            any::<u64>().prop_map(Slot::U),
            (-3i64..300).prop_map(Slot::I),
            any::<f64>().prop_map(Slot::F),
            "[a-z]{0,4}".prop_map(Slot::S),
            Just(Slot::Null),
        ]
    }

    /// Two schemas naming the same fields in opposite orders, read in alternation: a layout
    /// remembered without its schema id reads the other's slots.
    #[test]
    fn the_remembered_layout_follows_the_schema_id() {
        #[derive(Debug, PartialEq, Serialize, Deserialize, Row)]
        struct Pair {
            left: u64,
            right: String,
        }
        #[derive(Serialize)]
        struct Forward<'a> {
            left: u64,
            right: &'a str,
        }
        #[derive(Serialize)]
        struct Backward<'a> {
            right: &'a str,
            left: u64,
        }
        let forward = codec::encode_value(&Forward { left: 1, right: "one" }).expect("row");
        let backward = codec::encode_value(&Backward { right: "two", left: 2 }).expect("row");
        for _ in 0..3 {
            let read = |bytes: &[u8]| RowRef::new(bytes).ok().and_then(|r| Pair::read_row(&r));
            assert_eq!(read(&forward), Some(Pair { left: 1, right: "one".into() }));
            assert_eq!(read(&backward), Some(Pair { left: 2, right: "two".into() }));
        }
    }
}
