//! How typed keys, values and state are turned into bytes.
//!
//! Record values, accumulators and state values: a struct is written as a row (Eddy's binary
//! record, `eddy_wire::row`; its field names are declared to the host once per shape),
//! anything else as JSON; either is read back, rows by field name with strings borrowed.
//! Keys (record keys and map-state keys) stay JSON: they are small, hashed and compared as
//! bytes, and must mean the same to every language's SDK.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use eddy_wire::de::RowDecoder;
use eddy_wire::row::{Kind, RowRef, is_row};
use eddy_wire::schema::{FieldSlots, Schema, Schemas};
use eddy_wire::ser::{RowEncoder, RowSerError};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Encodes a value as the bytes Eddy stores and ships.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(value)?)
}

/// Appends the encoding of `value` to `buf`.
pub(crate) fn encode_into<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) -> Result<()> {
    serde_json::to_writer(buf, value)?;
    Ok(())
}

/// Decodes bytes produced by [`encode`] (or by any other SDK).
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    Ok(serde_json::from_slice(bytes)?)
}

/// The host's schemas as this instance has seen them (asked once per id), with the last one
/// looked up in front: a batch's records mostly share their schema, and hashing the id per
/// record showed in profiles.
struct HostSchemas {
    known: RefCell<BTreeMap<u32, Option<Arc<Schema>>>>,
    last: RefCell<Option<(u32, Option<Arc<Schema>>)>>,
}

impl Schemas for HostSchemas {
    fn get(&self, id: u32) -> Option<Arc<Schema>> {
        if let Some((last, schema)) = &*self.last.borrow()
            && *last == id
        {
            return schema.clone();
        }
        let known = self.known.borrow().get(&id).cloned();
        let schema = match known {
            Some(schema) => schema,
            None => {
                let found = host::fields(id).map(|(name, fields)| Arc::new(Schema { name, fields }));
                self.known.borrow_mut().insert(id, found.clone());
                found
            }
        };
        *self.last.borrow_mut() = Some((id, schema.clone()));
        schema
    }
}

struct Rows {
    encoder: RowEncoder,
    decoder: RowDecoder,
    schemas: HostSchemas,
    fields: FieldSlots,
}

impl Rows {
    /// The slot of top-level field `name` in `row`, `None` if its schema does not name it.
    fn slot_of(&mut self, row: &RowRef<'_>, name: &str) -> Option<usize> {
        self.fields.slot_of(row, name, &self.schemas)
    }
}

thread_local! {
    // Made at compile time, so each use (a few per record) is not a check that it was made
    // (a `BTreeMap`, not a `HashMap`, for the same reason: its `new` is `const`).
    static ROWS: RefCell<Rows> = const {
        RefCell::new(Rows {
            encoder: RowEncoder::new(),
            decoder: RowDecoder::new(),
            schemas: HostSchemas { known: RefCell::new(BTreeMap::new()), last: RefCell::new(None) },
            fields: FieldSlots::new(),
        })
    };
}

/// Appends record value `value` to `buf`: a row if it is a struct, else JSON.
pub(crate) fn encode_value_into<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) -> Result<()> {
    let as_row = ROWS.with_borrow_mut(|rows| rows.encoder.encode(value, buf, &mut host::declare));
    match as_row {
        Ok(()) => Ok(()),
        Err(RowSerError::NotAStruct) => encode_into(buf, value),
        Err(e) => Err(Error::bad_record(format!("writing a row: {e}"))),
    }
}

/// Encodes record value `value`: a row if it is a struct, else JSON.
pub fn encode_value<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    encode_value_into(&mut buf, value)?;
    Ok(buf)
}

/// Decodes a record value: a row (by field name) or JSON.
pub fn decode_value<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    if !is_row(bytes) {
        return decode(bytes);
    }
    ROWS.with_borrow_mut(|rows| {
        let Rows { decoder, schemas, .. } = rows;
        decoder.decode(bytes, schemas).map_err(row_error)
    })
}

/// A top-level field of record values, named by its name (its slot then found among the few
/// this instance remembers, comparing names) or by a [`Field`] (its slot remembered in it,
/// so finding it costs a comparison of the schema id).
pub trait FieldName {
    /// The field's name.
    fn name(&self) -> &str;
    /// The field's slot in `row`, `None` if the row's schema does not name it.
    fn slot_in(&self, row: &RowRef<'_>) -> Option<usize>;
}

impl FieldName for &str {
    fn name(&self) -> &str {
        self
    }
    #[inline]
    fn slot_in(&self, row: &RowRef<'_>) -> Option<usize> {
        ROWS.with_borrow_mut(|rows| rows.slot_of(row, self))
    }
}

impl FieldName for &String {
    fn name(&self) -> &str {
        self
    }
    #[inline]
    fn slot_in(&self, row: &RowRef<'_>) -> Option<usize> {
        self.as_str().slot_in(row)
    }
}

/// A top-level field read record after record (a filter's `type`): its slot is looked up once
/// per schema and remembered here, instead of among the names this instance remembers. Keep
/// it in the operator (made in `open`) and pass `&field` where a field name goes.
///
/// ```
/// use eddy_sdk::codec::Field;
///
/// let kind = Field::new("type");
/// assert_eq!(eddy_sdk::codec::str_field_bytes(br#"{"type":"bid"}"#, &kind).unwrap().as_deref(), Some(&b"bid"[..]));
/// ```
#[derive(Debug)]
pub struct Field {
    name: &'static str,
    /// The last schemas seen (id and field count), each with the field's slot in it: records
    /// of a few schemas interleave (Nexmark's bids, auctions and persons), and remembering
    /// only the last one looked the field up again at every change, a tenth of q0's CPU.
    at: [std::cell::Cell<Option<SlotIn>>; FIELD_SCHEMAS],
    /// Where the next schema seen is remembered (round robin).
    next: std::cell::Cell<usize>,
}

/// Schemas a [`Field`] remembers its slot in.
const FIELD_SCHEMAS: usize = 4;

/// A schema id and field count, and a field's slot in that schema.
type SlotIn = (u32, usize, Option<usize>);

impl Field {
    /// The field named `name`.
    pub const fn new(name: &'static str) -> Self {
        Self { name, at: [const { std::cell::Cell::new(None) }; FIELD_SCHEMAS], next: std::cell::Cell::new(0) }
    }
}

impl FieldName for &Field {
    fn name(&self) -> &str {
        self.name
    }
    #[inline]
    fn slot_in(&self, row: &RowRef<'_>) -> Option<usize> {
        let (schema, fields) = (row.schema(), row.len());
        for at in &self.at {
            if let Some((known, count, slot)) = at.get()
                && known == schema
                && count == fields
            {
                return slot;
            }
        }
        #[cfg(test)]
        tests::FIELD_LOOKUPS.set(tests::FIELD_LOOKUPS.get() + 1);
        // As `FieldSlots` looks it up: a schema of another field count is not this row's.
        let slot = ROWS
            .with_borrow(|rows| rows.schemas.get(schema))
            .filter(|s| s.fields.len() == fields)
            .and_then(|s| s.index_of(self.name));
        let next = self.next.get();
        self.at[next].set(Some((schema, fields, slot)));
        self.next.set((next + 1) % FIELD_SCHEMAS);
        slot
    }
}

/// The top-level string field `field` of record value `bytes`: borrowed from a row in place
/// (nothing else is decoded), parsed out of JSON otherwise; `None` if the value has no such
/// field or it is not a string.
pub fn str_field<'a>(bytes: &'a [u8], field: impl FieldName) -> Result<Option<Cow<'a, str>>> {
    if !is_row(bytes) {
        let value: serde_json::Value = decode(bytes)?;
        return Ok(value.get(field.name()).and_then(|f| f.as_str()).map(|s| Cow::Owned(s.to_owned())));
    }
    match str_slot(bytes, field)? {
        Some((row, i)) => Ok(row.str(i).map_err(row_error)?.map(Cow::Borrowed)),
        None => Ok(None),
    }
}

/// [`str_field`]'s bytes, not checked to be UTF-8: for comparing with known text, which a
/// UTF-8 pass per record (a call of its own in WebAssembly) would only slow down.
pub fn str_field_bytes<'a>(bytes: &'a [u8], field: impl FieldName) -> Result<Option<Cow<'a, [u8]>>> {
    if !is_row(bytes) {
        return Ok(str_field(bytes, field)?.map(|s| Cow::Owned(s.into_owned().into_bytes())));
    }
    match str_slot(bytes, field)? {
        Some((row, i)) => Ok(row.variable(i).map_err(row_error)?.map(Cow::Borrowed)),
        None => Ok(None),
    }
}

/// Row `bytes`, and the slot of its top-level field `field` if that holds a string (null
/// included).
#[inline]
fn str_slot<'a>(bytes: &'a [u8], field: impl FieldName) -> Result<Option<(RowRef<'a>, usize)>> {
    let row = RowRef::new(bytes).map_err(row_error)?;
    let Some(i) = field.slot_in(&row) else { return Ok(None) };
    Ok((row.kind(i).map_err(row_error)? == Kind::Str).then_some((row, i)))
}

/// A row that cannot be read, as the operator's error.
fn row_error(e: impl std::fmt::Display) -> Error {
    Error::bad_record(format!("reading a row: {e}"))
}

/// The JSON text of the part of record value `bytes` that JSON pointer `pointer` (such as
/// `/bidder`) names, `None` if there is no such part: read in place from a row, parsed from
/// JSON.
pub fn pointer_json(bytes: &[u8], pointer: &str) -> Result<Option<Vec<u8>>> {
    if is_row(bytes) {
        // A top-level field (a key such as `/auction`): its slot as remembered.
        if let Some(name) = pointer.strip_prefix('/').filter(|name| !name.contains(['/', '~'])) {
            let row = RowRef::new(bytes).map_err(row_error)?;
            let found = ROWS.with_borrow_mut(|rows| {
                let i = rows.slot_of(&row, name)?;
                let mut out = Vec::new();
                Some(eddy_wire::json::field_to_json(&row, i, &rows.schemas, &mut out).map(|()| out))
            });
            if let Some(found) = found {
                return found.map(Some).map_err(row_error);
            }
        }
        let found = ROWS.with_borrow(|rows| eddy_wire::json::pointer_to_json(bytes, pointer, &rows.schemas));
        return found.map_err(row_error);
    }
    let value: serde_json::Value = decode(bytes)?;
    value.pointer(pointer).map(encode).transpose()
}

/// Appends the JSON text of top-level field `field` of record value `bytes` to `out`, and
/// says whether there is one (nothing appended if not): what [`pointer_json`] gives for
/// `/<name>`, read in place from a row by the field's remembered slot, without an allocation
/// per record (a step that keys every record by a field, such as `nexmark-select`).
pub fn field_json_into(bytes: &[u8], field: impl FieldName, out: &mut Vec<u8>) -> Result<bool> {
    if !is_row(bytes) {
        let value: serde_json::Value = decode(bytes)?;
        let Some(found) = value.get(field.name()) else { return Ok(false) };
        encode_into(out, found)?;
        return Ok(true);
    }
    let row = RowRef::new(bytes).map_err(row_error)?;
    let Some(i) = field.slot_in(&row) else { return Ok(false) };
    ROWS.with_borrow(|rows| eddy_wire::json::field_to_json(&row, i, &rows.schemas, out)).map_err(row_error)?;
    Ok(true)
}

/// The slots of `names` in schema `id`, if the host knows the schema and it names each one.
pub(crate) fn slots_of<const N: usize>(id: u32, names: &[&str; N]) -> Option<[u16; N]> {
    let schema = ROWS.with_borrow(|rows| rows.schemas.get(id))?;
    let mut slots = [0; N];
    for (slot, name) in slots.iter_mut().zip(names) {
        *slot = u16::try_from(schema.index_of(name)?).ok()?;
    }
    Some(slots)
}

/// The schema with id `id`, `None` if the host knows none.
pub(crate) fn schema(id: u32) -> Option<Arc<Schema>> {
    ROWS.with_borrow(|rows| rows.schemas.get(id))
}

/// Declares `schema` to the host; returns its id.
pub(crate) fn declare(schema: &Schema) -> u32 {
    host::declare(schema)
}

/// The `schemas` import, or (off wasm, for native tests) the same ids computed locally.
mod host {
    use eddy_wire::schema::Schema;

    #[cfg(target_arch = "wasm32")]
    pub(super) fn declare(schema: &Schema) -> u32 {
        crate::bindings::operator_world::eddy::dataflow::schemas::declare_schema(&schema.name, &schema.fields)
    }

    #[cfg(target_arch = "wasm32")]
    pub(super) fn fields(id: u32) -> Option<(String, Vec<String>)> {
        crate::bindings::operator_world::eddy::dataflow::schemas::schema_fields(id)
    }

    #[cfg(not(target_arch = "wasm32"))]
    thread_local! {
        static DECLARED: std::cell::RefCell<std::collections::HashMap<u32, Schema>> = Default::default();
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn declare(schema: &Schema) -> u32 {
        let id = schema.id();
        DECLARED.with_borrow_mut(|d| d.insert(id, schema.clone()));
        id
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn fields(id: u32) -> Option<(String, Vec<String>)> {
        DECLARED.with_borrow(|d| d.get(&id).map(|s| (s.name.clone(), s.fields.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Times a [`Field`] looked its slot up in a schema.
        pub(super) static FIELD_LOOKUPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn a_field_remembers_its_slot_in_a_few_schemas_that_interleave() {
        // Five schemas, `kind` at another slot in each; the first three alternate like
        // Nexmark's bids, auctions and persons.
        let names = ["a", "b", "c", "d"];
        let rows: Vec<Vec<u8>> = (0..5)
            .map(|n| {
                let mut fields: Vec<String> = names[..n.min(4)].iter().map(|s| s.to_string()).collect();
                fields.push("kind".into());
                let id = host::declare(&Schema { name: format!("S{n}"), fields: fields.clone() });
                let mut buf = Vec::new();
                let mut row = eddy_wire::row::RowWriter::new(&mut buf, fields.len(), id);
                (0..n.min(4)).for_each(|i| row.u64(i, n as u64));
                row.str(n.min(4), &format!("k{n}"));
                row.finish();
                buf
            })
            .collect();
        let kind = Field::new("kind");
        let read = |i: usize| str_field(&rows[i], &kind).expect("row").map(|s| s.into_owned());
        FIELD_LOOKUPS.set(0);
        for round in 0..10 {
            for i in [0, 0, 1, 0, 2, 0] {
                assert_eq!(read(i).as_deref(), Some(format!("k{i}").as_str()), "round {round}");
            }
        }
        assert_eq!(FIELD_LOOKUPS.get(), 3, "each of the three schemas looked up once");
        // More schemas than it remembers: still the right slot every time.
        for round in 0..3 {
            for i in 0..5 {
                assert_eq!(read(i).as_deref(), Some(format!("k{i}").as_str()), "round {round}");
            }
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Bid<'a> {
        auction: u64,
        channel: &'a str,
    }

    #[test]
    fn structs_travel_as_rows_and_everything_else_as_json() {
        let row = encode_value(&Bid { auction: 3, channel: "web" }).expect("row");
        assert!(is_row(&row));
        assert_eq!(decode_value::<Bid<'_>>(&row).expect("by name"), Bid { auction: 3, channel: "web" });
        assert_eq!(encode_value(&7u32).expect("json"), b"7");
        assert_eq!(encode_value("w").expect("json"), br#""w""#);
        assert_eq!(
            decode_value::<Bid<'_>>(br#"{"channel":"x","auction":1}"#).expect("json"),
            Bid { auction: 1, channel: "x" }
        );
        assert_eq!(pointer_json(&row, "/channel").expect("row"), Some(br#""web""#.to_vec()));
        assert_eq!(pointer_json(br#"{"a":{"b":[1,2]}}"#, "/a/b/1").expect("json"), Some(b"2".to_vec()));
        assert_eq!(pointer_json(&row, "/nope").expect("row"), None);
    }

    #[test]
    fn a_pointer_reads_what_the_row_pointer_reader_reads_with_fields_remembered_or_not() {
        #[derive(Serialize)]
        struct Inner {
            id: u64,
        }
        #[derive(Serialize)]
        struct Outer<'a> {
            #[serde(rename = "a/b")]
            slash: u64,
            name: &'a str,
            inner: Inner,
            tags: Vec<u32>,
            none: Option<u64>,
        }
        let row = encode_value(&Outer { slash: 1, name: "x", inner: Inner { id: 9 }, tags: vec![4, 5], none: None })
            .expect("row");
        let pointers = ["/name", "/inner", "/inner/id", "/tags", "/tags/1", "/none", "/a~1b", "/nope", "/0", ""];
        // Twice, and more pointers than fields remembered, so hits and misses both run.
        for _ in 0..2 {
            for pointer in pointers {
                let expected = ROWS.with_borrow(|rows| eddy_wire::json::pointer_to_json(&row, pointer, &rows.schemas));
                assert_eq!(pointer_json(&row, pointer).expect("row"), expected.expect("row"), "{pointer}");
            }
        }
        assert_eq!(pointer_json(&row, "/name").expect("row"), Some(br#""x""#.to_vec()));
        assert_eq!(pointer_json(&row, "/inner/id").expect("row"), Some(b"9".to_vec()));
        assert_eq!(pointer_json(&row, "/none").expect("row"), Some(b"null".to_vec()));
    }

    #[test]
    fn a_fields_json_is_appended_as_a_pointer_to_it_reads_it() {
        let row = encode_value(&Bid { auction: 3, channel: "web" }).expect("row");
        let json = br#"{"channel":"x","auction":12,"nested":{"a":[1]}}"#;
        let (auction, nested, nope) = (Field::new("auction"), Field::new("nested"), Field::new("nope"));
        let mut out = b"kept:".to_vec();
        // Twice, so the remembered slot is used as well as found.
        for _ in 0..2 {
            for (value, field, expected) in [
                (row.as_slice(), &auction, Some(&b"3"[..])),
                (&row, &nope, None),
                (json, &auction, Some(b"12")),
                (json, &nested, Some(br#"{"a":[1]}"#)),
                (json, &nope, None),
            ] {
                out.truncate(5);
                let found = field_json_into(value, field, &mut out).expect("read");
                assert_eq!(found.then(|| &out[5..]), expected, "{}", field.name);
                assert_eq!(&out[..5], b"kept:", "appended after what was there");
                let pointer = format!("/{}", field.name);
                assert_eq!(pointer_json(value, &pointer).expect("read").as_deref(), expected, "{pointer}");
            }
        }
        assert!(field_json_into(b"{not json", &auction, &mut out).is_err());
    }

    #[test]
    fn a_string_field_is_borrowed_from_a_row_and_parsed_from_json() {
        let row = encode_value(&Bid { auction: 3, channel: "web" }).expect("row");
        assert!(matches!(str_field(&row, "channel").expect("row"), Some(Cow::Borrowed("web"))));
        // Not a string, or no such field.
        assert_eq!(str_field(&row, "auction").expect("row"), None);
        assert_eq!(str_field(&row, "price").expect("row"), None);
        let json = br#"{"type":"bid","n":1}"#;
        assert_eq!(str_field(json, "type").expect("json").as_deref(), Some("bid"));
        assert_eq!(str_field(json, "n").expect("json"), None);
        assert!(str_field(b"{not json", "type").is_err());
    }

    #[test]
    fn a_string_fields_bytes_are_read_as_its_text_and_the_slot_cache_follows_the_schema() {
        #[derive(Serialize)]
        struct Other<'a> {
            channel: &'a str,
            auction: u64,
        }
        #[derive(Serialize)]
        struct Optional<'a> {
            auction: u64,
            channel: Option<&'a str>,
        }
        let bid = encode_value(&Bid { auction: 3, channel: "web" }).expect("row");
        // The same field name at another slot of another schema, read right after: a cache
        // keyed by the name alone would read slot 1 of this row (a number).
        let other = encode_value(&Other { channel: "app", auction: 4 }).expect("row");
        let null = encode_value(&Optional { auction: 5, channel: None }).expect("row");
        // By name, and by handles that remember one schema's slot (the same three rows in
        // alternation, so each handle's memory is replaced every time).
        let (channel, auction, price) = (Field::new("channel"), Field::new("auction"), Field::new("price"));
        for _ in 0..2 {
            assert_eq!(str_field_bytes(&bid, "channel").expect("row").as_deref(), Some(&b"web"[..]));
            assert_eq!(str_field_bytes(&other, "channel").expect("row").as_deref(), Some(&b"app"[..]));
            assert_eq!(str_field(&other, "channel").expect("row").as_deref(), Some("app"));
            assert_eq!(str_field_bytes(&null, "channel").expect("row"), None);
            assert_eq!(str_field_bytes(&bid, "auction").expect("row"), None);
            assert_eq!(str_field_bytes(&bid, "price").expect("row"), None);
            assert_eq!(str_field_bytes(&bid, &channel).expect("row").as_deref(), Some(&b"web"[..]));
            assert_eq!(str_field_bytes(&other, &channel).expect("row").as_deref(), Some(&b"app"[..]));
            assert_eq!(str_field(&other, &channel).expect("row").as_deref(), Some("app"));
            assert_eq!(str_field_bytes(&null, &channel).expect("row"), None);
            assert_eq!(str_field_bytes(&bid, &auction).expect("row"), None);
            assert_eq!(str_field_bytes(&other, &price).expect("row"), None);
        }
        assert_eq!(str_field_bytes(br#"{"channel":"x"}"#, &channel).expect("json").as_deref(), Some(&b"x"[..]));
        let owned = String::from("channel");
        assert_eq!(str_field(&other, &owned).expect("row").as_deref(), Some("app"), "an owned name too");
        assert_eq!(str_field_bytes(br#"{"type":"bid"}"#, "type").expect("json").as_deref(), Some(&b"bid"[..]));
        assert_eq!(str_field_bytes(br#"{"type":1}"#, "type").expect("json"), None);
        // Not UTF-8: the bytes are still compared, the text refused.
        let id = host::declare(&Schema { name: "Raw".into(), fields: vec!["x".into()] });
        let mut raw = Vec::new();
        let frame = eddy_wire::row::RowFrame::begin(&mut raw, 1, id);
        frame.variable(&mut raw, 0, Kind::Str, &[0xFF, b'x']);
        assert_eq!(str_field_bytes(&raw, "x").expect("bytes").as_deref(), Some(&[0xFF, b'x'][..]));
        assert!(str_field(&raw, "x").is_err());
    }
}
