//! Any `Serialize` struct as a row: fields in declaration order, one slot each, names declared
//! once as a [`Schema`](crate::schema::Schema).
//!
//! Field values map to kinds: integers to `i64`/`u64`, floats to `f64`, `bool`, strings and
//! chars to `string`, byte slices to `bytes`, `None` and `()` to null, a unit enum variant to
//! its name as a `string`, a nested struct to a nested row, and lists, maps and enum variants
//! with data to an embedded JSON text (`json`). Only a struct (an internally tagged enum, which
//! serde writes as a struct, or `Some` of either) can be a row; anything else at the top is
//! [`RowSerError::NotAStruct`] and the caller encodes it another way (the SDK: JSON).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use serde::ser::{self, Serialize};

use crate::row::{Kind, MAX_FIELDS, RowFrame};
use crate::schema::Schema;

/// Why a value did not become a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowSerError {
    /// The value is not a struct.
    NotAStruct,
    /// A struct wrote more fields than it announced, or more than a row holds.
    FieldCount(String),
    /// The value's own `Serialize` failed, or a JSON field could not be written.
    Custom(String),
}

impl fmt::Display for RowSerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowSerError::NotAStruct => write!(f, "only a struct is written as a row"),
            RowSerError::FieldCount(name) => write!(f, "struct `{name}` wrote more fields than it announced"),
            RowSerError::Custom(m) => f.write_str(m),
        }
    }
}

impl core::error::Error for RowSerError {}

impl ser::Error for RowSerError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        RowSerError::Custom(msg.to_string())
    }
}

/// Learns the id of each new schema (the SDK asks the host, which records the names).
pub trait Declare {
    /// Records `schema`; returns its id.
    fn declare(&mut self, schema: &Schema) -> u32;
}

impl<F: FnMut(&Schema) -> u32> Declare for F {
    fn declare(&mut self, schema: &Schema) -> u32 {
        self(schema)
    }
}

/// Reusable state of a row writer: the schema ids of the struct shapes seen so far (by the
/// addresses of their `'static` names, so a known shape costs no hashing of names) and a
/// stack of field names.
#[derive(Debug, Default)]
pub struct RowEncoder {
    known: Vec<(Vec<&'static str>, u32)>,
    names: Vec<&'static str>,
}

impl RowEncoder {
    /// An encoder that knows no schema yet.
    pub const fn new() -> Self {
        Self { known: Vec::new(), names: Vec::new() }
    }

    /// Appends `value` to `out` as a row. On an error `out` is as it was.
    pub fn encode<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
        out: &mut Vec<u8>,
        declare: &mut dyn Declare,
    ) -> Result<(), RowSerError> {
        let len = out.len();
        let names = self.names.len();
        let result = value.serialize(Top { enc: self, buf: out, declare });
        if result.is_err() {
            out.truncate(len);
            self.names.truncate(names);
        }
        result
    }

    /// The schema id of the names on the stack from `base` (struct `name`).
    fn schema_id(&mut self, name: &'static str, base: usize, declare: &mut dyn Declare) -> u32 {
        let fields = &self.names[base..];
        let same = |known: &[&'static str]| {
            known.len() == fields.len() + 1
                && core::ptr::eq(known[0], name)
                && known[1..].iter().zip(fields).all(|(a, b)| core::ptr::eq(*a, *b))
        };
        if let Some((_, id)) = self.known.iter().find(|(k, _)| same(k)) {
            return *id;
        }
        let id = declare.declare(&Schema::new(name, fields));
        let mut key = Vec::with_capacity(fields.len() + 1);
        key.push(name);
        key.extend_from_slice(fields);
        self.known.push((key, id));
        id
    }
}

struct Top<'a> {
    enc: &'a mut RowEncoder,
    buf: &'a mut Vec<u8>,
    declare: &'a mut dyn Declare,
}

macro_rules! not_a_struct {
    ($($method:ident($($arg:ty),*) -> $ret:ty;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ret, RowSerError> {
            Err(RowSerError::NotAStruct)
        })*
    };
}

impl<'a> ser::Serializer for Top<'a> {
    type Ok = ();
    type Error = RowSerError;
    type SerializeSeq = ser::Impossible<(), RowSerError>;
    type SerializeTuple = ser::Impossible<(), RowSerError>;
    type SerializeTupleStruct = ser::Impossible<(), RowSerError>;
    type SerializeTupleVariant = ser::Impossible<(), RowSerError>;
    type SerializeMap = ser::Impossible<(), RowSerError>;
    type SerializeStruct = StructWriter<'a>;
    type SerializeStructVariant = ser::Impossible<(), RowSerError>;

    not_a_struct! {
        serialize_bool(bool) -> ();
        serialize_i8(i8) -> (); serialize_i16(i16) -> (); serialize_i32(i32) -> (); serialize_i64(i64) -> ();
        serialize_u8(u8) -> (); serialize_u16(u16) -> (); serialize_u32(u32) -> (); serialize_u64(u64) -> ();
        serialize_f32(f32) -> (); serialize_f64(f64) -> (); serialize_char(char) -> ();
        serialize_str(&str) -> (); serialize_bytes(&[u8]) -> ();
        serialize_none() -> (); serialize_unit() -> (); serialize_unit_struct(&'static str) -> ();
        serialize_unit_variant(&'static str, u32, &'static str) -> ();
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    /// `Some(struct)` is the struct's row (read back as `Some`); `None` is not a row.
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), RowSerError> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), RowSerError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), RowSerError> {
        Err(RowSerError::NotAStruct)
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<StructWriter<'a>, RowSerError> {
        StructWriter::begin(self.enc, self.buf, self.declare, name, len, None)
    }
}

/// One struct being written as a row; `parent` is the slot of the enclosing row it fills.
struct StructWriter<'a> {
    enc: &'a mut RowEncoder,
    buf: &'a mut Vec<u8>,
    declare: &'a mut dyn Declare,
    frame: RowFrame,
    name: &'static str,
    base: usize,
    next: usize,
    parent: Option<(RowFrame, usize, usize)>,
    /// The known shape (index into `enc.known`) whose names the fields written so far match,
    /// compared by address as each is written. While there is one, the names stay off the
    /// stack: a struct written again costs no push per field and no search at its end.
    known: Option<usize>,
}

impl<'a> StructWriter<'a> {
    fn begin(
        enc: &'a mut RowEncoder,
        buf: &'a mut Vec<u8>,
        declare: &'a mut dyn Declare,
        name: &'static str,
        len: usize,
        parent: Option<(RowFrame, usize, usize)>,
    ) -> Result<Self, RowSerError> {
        if len > MAX_FIELDS {
            return Err(RowSerError::FieldCount(name.into()));
        }
        let frame = RowFrame::begin(buf, len, 0);
        let base = enc.names.len();
        let known = enc.known.iter().rposition(|(k, _)| k.len() == len + 1 && core::ptr::eq(k[0], name));
        Ok(Self { enc, buf, declare, frame, name, base, next: 0, parent, known })
    }

    /// Leaves the known shape: the names it matched so far go onto the stack.
    #[cold]
    fn unknown(&mut self) {
        if let Some(k) = self.known.take() {
            let matched = &self.enc.known[k].0[1..=self.next];
            self.enc.names.extend_from_slice(matched);
        }
    }
}

impl ser::SerializeStruct for StructWriter<'_> {
    type Ok = ();
    type Error = RowSerError;

    #[inline]
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), RowSerError> {
        let i = self.next;
        if i >= self.frame.fields() {
            return Err(RowSerError::FieldCount(self.name.into()));
        }
        match self.known {
            Some(k) if core::ptr::eq(self.enc.known[k].0[i + 1], key) => {}
            _ => {
                self.unknown();
                self.enc.names.push(key);
            }
        }
        self.next += 1;
        value.serialize(Field { enc: self.enc, buf: self.buf, declare: self.declare, frame: self.frame, i })
    }

    fn end(mut self) -> Result<(), RowSerError> {
        let id = match self.known {
            Some(k) if self.next == self.frame.fields() => self.enc.known[k].1,
            _ => {
                self.unknown();
                // Fields announced but never written (a hand-written `Serialize` with a loose
                // count) stay null under an empty name.
                for _ in self.next..self.frame.fields() {
                    self.enc.names.push("");
                }
                let id = self.enc.schema_id(self.name, self.base, self.declare);
                self.enc.names.truncate(self.base);
                id
            }
        };
        self.frame.set_schema(self.buf, id);
        if let Some((parent, i, from)) = self.parent {
            parent.close_variable(self.buf, i, Kind::Row, from);
        }
        Ok(())
    }
}

/// Writes one field's value into slot `i` of `frame`.
struct Field<'a> {
    enc: &'a mut RowEncoder,
    buf: &'a mut Vec<u8>,
    declare: &'a mut dyn Declare,
    frame: RowFrame,
    i: usize,
}

impl<'a> Field<'a> {
    fn begin_json(self, open: &str) -> JsonField<'a> {
        let from = self.buf.len();
        self.buf.extend_from_slice(open.as_bytes());
        JsonField { buf: self.buf, frame: self.frame, i: self.i, from, first: true, close: "" }
    }
}

/// A list, map or enum variant with data, written as JSON text into a `json` slot.
struct JsonField<'a> {
    buf: &'a mut Vec<u8>,
    frame: RowFrame,
    i: usize,
    from: usize,
    first: bool,
    close: &'static str,
}

impl JsonField<'_> {
    fn separate(&mut self) {
        if !self.first {
            self.buf.push(b',');
        }
        self.first = false;
    }

    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RowSerError> {
        serde_json::to_writer(&mut *self.buf, value).map_err(|e| RowSerError::Custom(e.to_string()))
    }

    fn key(&mut self, key: &str) -> Result<(), RowSerError> {
        self.separate();
        self.value(key)?;
        self.buf.push(b':');
        Ok(())
    }

    fn finish(self, close: &str) -> Result<(), RowSerError> {
        self.buf.extend_from_slice(close.as_bytes());
        self.buf.extend_from_slice(self.close.as_bytes());
        self.frame.close_variable(self.buf, self.i, Kind::Json, self.from);
        Ok(())
    }
}

/// The four sequence-like serde traits, all written as a JSON array.
macro_rules! json_array {
    ($($trait:ident :: $method:ident),*) => {
        $(impl ser::$trait for JsonField<'_> {
            type Ok = ();
            type Error = RowSerError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RowSerError> {
                self.separate();
                self.value(value)
            }
            fn end(self) -> Result<(), RowSerError> {
                self.finish("]")
            }
        })*
    };
}

json_array!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for JsonField<'_> {
    type Ok = ();
    type Error = RowSerError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), RowSerError> {
        // JSON object keys are strings: numbers and other scalars become their text, as
        // serde_json writes them.
        let key = serde_json::to_value(key).map_err(|e| RowSerError::Custom(e.to_string()))?;
        match key {
            serde_json::Value::String(s) => self.key(&s),
            other => self.key(&other.to_string()),
        }
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RowSerError> {
        self.value(value)
    }
    fn end(self) -> Result<(), RowSerError> {
        self.finish("}")
    }
}

impl ser::SerializeStructVariant for JsonField<'_> {
    type Ok = ();
    type Error = RowSerError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), RowSerError> {
        self.key(key)?;
        self.value(value)
    }
    fn end(self) -> Result<(), RowSerError> {
        self.finish("}")
    }
}

impl<'a> ser::Serializer for Field<'a> {
    type Ok = ();
    type Error = RowSerError;
    type SerializeSeq = JsonField<'a>;
    type SerializeTuple = JsonField<'a>;
    type SerializeTupleStruct = JsonField<'a>;
    type SerializeTupleVariant = JsonField<'a>;
    type SerializeMap = JsonField<'a>;
    type SerializeStruct = StructWriter<'a>;
    type SerializeStructVariant = JsonField<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), RowSerError> {
        self.frame.bool(self.buf, self.i, v);
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), RowSerError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), RowSerError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), RowSerError> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), RowSerError> {
        self.frame.i64(self.buf, self.i, v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), RowSerError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), RowSerError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), RowSerError> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), RowSerError> {
        self.frame.u64(self.buf, self.i, v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), RowSerError> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), RowSerError> {
        self.frame.f64(self.buf, self.i, v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), RowSerError> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), RowSerError> {
        self.frame.variable(self.buf, self.i, Kind::Str, v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), RowSerError> {
        self.frame.variable(self.buf, self.i, Kind::Bytes, v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), RowSerError> {
        self.frame.null(self.buf, self.i);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), RowSerError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), RowSerError> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), RowSerError> {
        self.serialize_none()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), RowSerError> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), RowSerError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), RowSerError> {
        let mut json = self.begin_json("{");
        json.key(variant)?;
        json.value(value)?;
        json.finish("}")
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<JsonField<'a>, RowSerError> {
        Ok(self.begin_json("["))
    }
    fn serialize_tuple(self, _: usize) -> Result<JsonField<'a>, RowSerError> {
        Ok(self.begin_json("["))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<JsonField<'a>, RowSerError> {
        Ok(self.begin_json("["))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<JsonField<'a>, RowSerError> {
        let mut json = self.begin_json("{");
        json.key(variant)?;
        json.buf.push(b'[');
        json.close = "}";
        json.first = true;
        Ok(json)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<JsonField<'a>, RowSerError> {
        Ok(self.begin_json("{"))
    }
    fn serialize_struct(self, name: &'static str, len: usize) -> Result<StructWriter<'a>, RowSerError> {
        let from = self.buf.len();
        StructWriter::begin(self.enc, self.buf, self.declare, name, len, Some((self.frame, self.i, from)))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<JsonField<'a>, RowSerError> {
        let mut json = self.begin_json("{");
        json.key(variant)?;
        json.buf.push(b'{');
        json.close = "}";
        json.first = true;
        Ok(json)
    }
}
