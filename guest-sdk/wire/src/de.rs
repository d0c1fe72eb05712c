//! Rows into any `Deserialize` type, by field name: a struct's fields are found in the row
//! through its schema (so a reader may declare fewer fields, in any order, as with JSON), and
//! strings and bytes are borrowed from the row.
//!
//! A struct whose every field is in the row is read as a sequence in the struct's order (the
//! field-to-slot map is computed once per schema and struct, then cached); otherwise as a map
//! of the fields present, so serde reports a missing field by name or fills a default. A row
//! whose schema is unknown reads positionally. Other targets see a row as a map of its named
//! fields (`serde_json::Value`, internally tagged enums) and each slot as its kind says.

use alloc::rc::Rc;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use serde::de::value::{BorrowedStrDeserializer, StrDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

use crate::row::{Kind, RowError, RowRef};
use crate::schema::{Schema, Schemas};

/// Why a row did not become the type asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowDeError(String);

impl fmt::Display for RowDeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for RowDeError {}

impl de::Error for RowDeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        RowDeError(msg.to_string())
    }
}

impl From<RowError> for RowDeError {
    fn from(e: RowError) -> Self {
        RowDeError(e.to_string())
    }
}

fn json_error(e: serde_json::Error) -> RowDeError {
    RowDeError(e.to_string())
}

/// Cached field-to-slot maps, one per (schema, target struct) pair seen.
#[derive(Debug, Default)]
pub struct RowDecoder {
    maps: Vec<FieldMap>,
}

#[derive(Debug)]
struct FieldMap {
    schema: u32,
    /// The address of the `'static` field list serde's derive passes: it identifies the
    /// target struct and is only compared.
    fields: usize,
    count: usize,
    /// How the struct is read: every field found (slots in the struct's order), or only some.
    read: StructRead,
}

#[derive(Debug, Clone)]
enum StructRead {
    // `Rc`, not `Arc`: a decoder serves one thread, and an atomic count per record cost more
    // than the slots read.
    Complete(Rc<[usize]>),
    Partial(Rc<[(&'static str, usize)]>),
}

impl RowDecoder {
    /// A decoder with no maps yet.
    pub const fn new() -> Self {
        Self { maps: Vec::new() }
    }

    /// Decodes the row in `bytes` as a `T`.
    pub fn decode<'de, T: de::Deserialize<'de>>(
        &mut self,
        bytes: &'de [u8],
        schemas: &dyn Schemas,
    ) -> Result<T, RowDeError> {
        let row = RowRef::new(bytes)?;
        T::deserialize(RowDe { row, ctx: Ctx { maps: self, schemas } })
    }

    /// How to read struct `fields` from rows of schema `id`; `None` if that schema is unknown.
    fn read_of(&mut self, id: u32, fields: &'static [&'static str], schemas: &dyn Schemas) -> Option<StructRead> {
        let key = fields.as_ptr() as usize;
        let hit = |m: &FieldMap| m.schema == id && m.fields == key && m.count == fields.len();
        // Most calls repeat the last shape or one just before it: look there first.
        if let Some(m) = self.maps.iter().rev().find(|m| hit(m)) {
            return Some(m.read.clone());
        }
        let schema = schemas.get(id)?;
        let found: Vec<(&'static str, Option<usize>)> = fields.iter().map(|f| (*f, schema.index_of(f))).collect();
        let read = if found.iter().all(|(_, slot)| slot.is_some()) {
            StructRead::Complete(found.iter().filter_map(|(_, slot)| *slot).collect())
        } else {
            StructRead::Partial(found.iter().filter_map(|(f, slot)| slot.map(|s| (*f, s))).collect())
        };
        self.maps.push(FieldMap { schema: id, fields: key, count: fields.len(), read: read.clone() });
        Some(read)
    }
}

struct Ctx<'s> {
    maps: &'s mut RowDecoder,
    schemas: &'s dyn Schemas,
}

impl Ctx<'_> {
    fn reborrow(&mut self) -> Ctx<'_> {
        Ctx { maps: self.maps, schemas: self.schemas }
    }
}

/// A whole row.
struct RowDe<'de, 's> {
    row: RowRef<'de>,
    ctx: Ctx<'s>,
}

impl<'de> RowDe<'de, '_> {
    fn schema(&self) -> Option<Arc<Schema>> {
        match self.row.schema() {
            0 => None,
            id => self.ctx.schemas.get(id),
        }
    }

    fn positional<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, RowDeError> {
        let order = Order::Range(self.row.len());
        visitor.visit_seq(Slots { row: self.row, ctx: self.ctx.reborrow(), order, at: 0 })
    }
}

impl<'de> Deserializer<'de> for RowDe<'de, '_> {
    type Error = RowDeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        match self.schema() {
            Some(schema) => {
                let names = Names::Schema(schema);
                visitor.visit_map(Named { row: self.row, ctx: self.ctx, names, at: 0 })
            }
            None => self.positional(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RowDeError> {
        let read = match self.row.schema() {
            0 => None,
            id => self.ctx.maps.read_of(id, fields, self.ctx.schemas),
        };
        let Self { row, ctx } = self;
        match read {
            None => Self { row, ctx }.positional(visitor),
            Some(StructRead::Complete(slots)) => {
                visitor.visit_seq(Slots { row, ctx, order: Order::List(slots), at: 0 })
            }
            Some(StructRead::Partial(named)) => {
                visitor.visit_map(Named { row, ctx, names: Names::Fields(named), at: 0 })
            }
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        self.positional(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, RowDeError> {
        self.positional(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, RowDeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct tuple_struct map enum identifier
    }
}

/// Which slots a sequence visits, in order.
enum Order {
    /// `0..n`.
    Range(usize),
    /// These.
    List(Rc<[usize]>),
}

impl Order {
    fn get(&self, at: usize) -> Option<usize> {
        match self {
            Order::Range(n) => (at < *n).then_some(at),
            Order::List(slots) => slots.get(at).copied(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Order::Range(n) => *n,
            Order::List(slots) => slots.len(),
        }
    }
}

/// Slots read in a given order (a struct whose fields are all in the row, or a row without
/// names read positionally).
struct Slots<'de, 's> {
    row: RowRef<'de>,
    ctx: Ctx<'s>,
    order: Order,
    at: usize,
}

impl<'de> de::SeqAccess<'de> for Slots<'de, '_> {
    type Error = RowDeError;

    #[inline]
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, RowDeError> {
        let Some(i) = self.order.get(self.at) else { return Ok(None) };
        self.at += 1;
        seed.deserialize(FieldDe { row: self.row, i, ctx: self.ctx.reborrow() }).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.order.len() - self.at)
    }
}

/// Which named slots a map visits.
enum Names {
    /// Every field of the row, by its schema.
    Schema(Arc<Schema>),
    /// The fields of a struct that the row has (name, slot).
    Fields(Rc<[(&'static str, usize)]>),
}

impl Names {
    fn get(&self, at: usize) -> Option<(&str, usize)> {
        match self {
            Names::Schema(schema) => schema.fields.get(at).map(|f| (f.as_str(), at)),
            Names::Fields(fields) => fields.get(at).copied(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Names::Schema(schema) => schema.fields.len(),
            Names::Fields(fields) => fields.len(),
        }
    }
}

/// Named slots (a struct missing fields, or any reader of a named row).
struct Named<'de, 's> {
    row: RowRef<'de>,
    ctx: Ctx<'s>,
    names: Names,
    at: usize,
}

impl<'de> de::MapAccess<'de> for Named<'de, '_> {
    type Error = RowDeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, RowDeError> {
        let Some((name, _)) = self.names.get(self.at) else { return Ok(None) };
        seed.deserialize(StrDeserializer::<RowDeError>::new(name)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, RowDeError> {
        let (_, i) = self.names.get(self.at).ok_or_else(|| RowDeError("a map value without its key".into()))?;
        self.at += 1;
        seed.deserialize(FieldDe { row: self.row, i, ctx: self.ctx.reborrow() })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.names.len() - self.at)
    }
}

/// One slot.
struct FieldDe<'de, 's> {
    row: RowRef<'de>,
    i: usize,
    ctx: Ctx<'s>,
}

impl<'de> FieldDe<'de, '_> {
    #[inline]
    fn null(&self) -> Result<bool, RowDeError> {
        Ok(self.row.is_null(self.i)?)
    }

    /// The bytes of this (non-null, variable) field.
    #[inline]
    fn variable(&self) -> Result<&'de [u8], RowDeError> {
        Ok(self.row.span(self.i)?)
    }
}

impl<'de, 's> FieldDe<'de, 's> {
    fn into_row(self) -> Result<RowDe<'de, 's>, RowDeError> {
        let bytes = self.variable()?;
        Ok(RowDe { row: RowRef::new(bytes)?, ctx: self.ctx })
    }
}

/// A typed read whose slot holds the kind asked for takes the short way; anything else (null,
/// another kind to convert, a bad row) goes through `deserialize_any`, kept out of line so the
/// short way inlines into the struct's visitor: the whole match per field was a call of its
/// own per field and showed as a tenth of a map operator's CPU.
macro_rules! fixed_fast_path {
    ($($method:ident: $kind:ident => $visit:ident($convert:expr);)*) => {
        $(#[inline]
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
            match self.row.present(self.i, Kind::$kind) {
                Ok(slot) => visitor.$visit($convert(slot)),
                Err(_) => self.any_out_of_line(visitor),
            }
        })*
    };
}

impl<'de> FieldDe<'de, '_> {
    #[inline(never)]
    fn any_out_of_line<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        self.deserialize_any(visitor)
    }
}

impl<'de> Deserializer<'de> for FieldDe<'de, '_> {
    type Error = RowDeError;

    fixed_fast_path! {
        deserialize_i64: I64 => visit_i64(i64::from_le_bytes);
        deserialize_u64: U64 => visit_u64(u64::from_le_bytes);
        deserialize_f64: F64 => visit_f64(f64::from_le_bytes);
        deserialize_bool: Bool => visit_bool(|s: [u8; 8]| s[0] != 0);
    }

    #[inline]
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        if self.null()? {
            return visitor.visit_unit();
        }
        let i = self.i;
        // Field `i` exists and is not null: the fixed kinds read their slot directly.
        match self.row.kind(i)? {
            Kind::Unset => visitor.visit_unit(),
            Kind::Bool => visitor.visit_bool(self.row.slot(i)[0] != 0),
            Kind::I64 => visitor.visit_i64(i64::from_le_bytes(self.row.slot(i))),
            Kind::U64 => visitor.visit_u64(u64::from_le_bytes(self.row.slot(i))),
            Kind::F64 => visitor.visit_f64(f64::from_le_bytes(self.row.slot(i))),
            Kind::Str => {
                let text = core::str::from_utf8(self.variable()?).map_err(|_| RowError::NotUtf8(i))?;
                visitor.visit_borrowed_str(text)
            }
            Kind::Bytes => visitor.visit_borrowed_bytes(self.variable()?),
            Kind::Row => self.into_row()?.deserialize_any(visitor),
            Kind::Json => {
                serde_json::Deserializer::from_slice(self.variable()?).deserialize_any(visitor).map_err(json_error)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        if self.null()? { visitor.visit_none() } else { visitor.visit_some(self) }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RowDeError> {
        match self.row.kind(self.i)? {
            Kind::Row if !self.null()? => self.into_row()?.deserialize_struct(name, fields, visitor),
            Kind::Json if !self.null()? => serde_json::Deserializer::from_slice(self.variable()?)
                .deserialize_struct(name, fields, visitor)
                .map_err(json_error),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RowDeError> {
        match self.row.kind(self.i)? {
            Kind::Str if !self.null()? => {
                let variant = self.row.str(self.i)?.unwrap_or_default();
                visitor.visit_enum(BorrowedStrDeserializer::<RowDeError>::new(variant))
            }
            Kind::Json if !self.null()? => serde_json::Deserializer::from_slice(self.variable()?)
                .deserialize_enum(name, variants, visitor)
                .map_err(json_error),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, RowDeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowDeError> {
        if self.null()? { visitor.visit_unit() } else { self.deserialize_any(visitor) }
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u32 u128 f32 char str string bytes byte_buf
        unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}
