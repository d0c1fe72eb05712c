//! Schemas: the names of a row's fields, declared once per job and referred to by id from
//! every row (see [`crate::row`]).
//!
//! A schema is a record name and its field names in slot order. Its id is a hash of exactly
//! that (FNV-1a, 32 bits, over `name 0xFF field 0xFF field 0xFF …`; never 0, which means "no
//! names"), so every instance, process and restart computes the same id for the same shape
//! without talking to anyone. Kinds are not part of a schema: each row carries its own.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// The names of a row's fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema {
    /// The record's name (a Rust struct's name, a source's event type).
    pub name: String,
    /// Field names, in slot order.
    pub fields: Vec<String>,
}

impl Schema {
    /// A schema from borrowed names.
    pub fn new(name: &str, fields: &[&str]) -> Self {
        Self { name: name.into(), fields: fields.iter().map(|f| String::from(*f)).collect() }
    }

    /// The schema's id: a hash of its name and field names, never 0.
    pub fn id(&self) -> u32 {
        id_of(&self.name, self.fields.iter().map(String::as_str))
    }

    /// The slot of field `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f == name)
    }
}

/// The id [`Schema::id`] gives `name` and `fields`, without building the schema.
pub fn id_of<'a>(name: &str, fields: impl IntoIterator<Item = &'a str>) -> u32 {
    const OFFSET: u32 = 0x811C_9DC5;
    const PRIME: u32 = 0x0100_0193;
    let mut hash = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes.iter().chain(&[0xFF]) {
            hash = (hash ^ u32::from(*b)).wrapping_mul(PRIME);
        }
    };
    eat(name.as_bytes());
    for f in fields {
        eat(f.as_bytes());
    }
    if hash == 0 { 1 } else { hash }
}

/// Where readers of rows find the schemas their ids name.
pub trait Schemas {
    /// The schema with id `id`, if it was declared.
    fn get(&self, id: u32) -> Option<Arc<Schema>>;
}

/// No schemas at all: rows read positionally and render as JSON arrays.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSchemas;

impl Schemas for NoSchemas {
    fn get(&self, _: u32) -> Option<Arc<Schema>> {
        None
    }
}

impl<S: Schemas + ?Sized> Schemas for &S {
    fn get(&self, id: u32) -> Option<Arc<Schema>> {
        (**self).get(id)
    }
}

/// Where one top-level field name sits in rows of one schema and field count.
#[derive(Debug)]
struct FieldSlot {
    schema: u32,
    fields: usize,
    name: String,
    slot: Option<usize>,
}

/// Fields remembered at once: more than a reader asks for by name per record (a filter's
/// field and a key field); the oldest is forgotten first.
const FIELD_SLOTS: usize = 8;

/// Where top-level fields sit in rows, remembered per schema: a filter or a key reads the
/// same few fields of every record, and finding one by name (the schema, then a scan of its
/// names) per record was a tenth of Nexmark q0 in a guest and a lock and a lookup of the
/// host's registry per window result in q5's exchange.
#[derive(Debug, Default)]
pub struct FieldSlots {
    known: Vec<FieldSlot>,
    /// The entry the last lookup found: a reader mostly asks for the same field of rows of the
    /// same schema, record after record.
    last: usize,
}

/// Whether two field names are equal, compared byte by byte in line: names are short, and a
/// call of `memcmp` per lookup was a third of the lookup's cost in a guest.
#[inline]
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

impl FieldSlots {
    /// Nothing remembered yet.
    pub const fn new() -> Self {
        Self { known: Vec::new(), last: 0 }
    }

    /// The slot of top-level field `name` in `row`, `None` if its schema (as `schemas` knows
    /// it, with as many fields as the row) does not name it.
    pub fn slot_of(&mut self, row: &crate::row::RowRef<'_>, name: &str, schemas: &dyn Schemas) -> Option<usize> {
        let (schema, fields) = (row.schema(), row.len());
        let hit = |f: &FieldSlot| f.schema == schema && f.fields == fields && same_name(&f.name, name);
        if let Some(last) = self.known.get(self.last).filter(|f| hit(f)) {
            return last.slot;
        }
        if let Some(at) = self.known.iter().position(hit) {
            self.last = at;
            return self.known[at].slot;
        }
        let slot = schemas.get(schema).filter(|s| s.fields.len() == fields).and_then(|s| s.index_of(name));
        if self.known.len() == FIELD_SLOTS {
            self.known.remove(0);
        }
        self.known.push(FieldSlot { schema, fields, name: name.into(), slot });
        self.last = self.known.len() - 1;
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::RowRef;

    #[test]
    fn ids_are_fnv1a_of_the_names_and_never_zero() {
        // FNV-1a 32 of the bytes "bid" 0xFF "price" 0xFF, computed by hand from the definition
        // (offset basis 0x811C9DC5, prime 0x01000193) in Python:
        // h = 0x811C9DC5; for b in b"bid\xffprice\xff": h = ((h ^ b) * 0x01000193) % 2**32
        assert_eq!(Schema::new("bid", &["price"]).id(), 0xA6CA_FF37);
        assert_ne!(Schema::new("bid", &["price", "auction"]).id(), Schema::new("bid", &["auction", "price"]).id());
        assert_ne!(Schema::new("ab", &["c"]).id(), Schema::new("a", &["bc"]).id(), "names cannot run together");
        assert_eq!(Schema::new("bid", &["price"]).index_of("price"), Some(0));
    }

    /// Two schemas that share some names at other slots, as the registry a guest asks.
    struct Two(Arc<Schema>, Arc<Schema>);

    impl Schemas for Two {
        fn get(&self, id: u32) -> Option<Arc<Schema>> {
            [&self.0, &self.1].into_iter().find(|s| s.id() == id).cloned()
        }
    }

    #[test]
    fn remembered_slots_follow_the_schema_and_the_whole_name_in_any_order() {
        let bid = Arc::new(Schema::new("bid", &["type", "auction", "a_rather_long_field_name_x", "price"]));
        let person = Arc::new(Schema::new("person", &["id", "typo", "type", "a_rather_long_field_name_y"]));
        let schemas = Two(bid.clone(), person.clone());
        let row = |schema: &Schema| {
            let mut buf = Vec::new();
            crate::row::RowWriter::new(&mut buf, schema.fields.len(), schema.id()).finish();
            buf
        };
        let (bid_row, person_row) = (row(&bid), row(&person));
        let (bid_row, person_row) = (RowRef::new(&bid_row).expect("row"), RowRef::new(&person_row).expect("row"));
        // (row, name, slot), read off the schemas above by hand.
        let table: [(&RowRef<'_>, &str, Option<usize>); 10] = [
            (&bid_row, "type", Some(0)),
            (&person_row, "type", Some(2)),
            (&person_row, "typo", Some(1)),
            (&bid_row, "typo", None),
            (&bid_row, "a_rather_long_field_name_x", Some(2)),
            (&person_row, "a_rather_long_field_name_x", None),
            (&person_row, "a_rather_long_field_name_y", Some(3)),
            (&bid_row, "price", Some(3)),
            (&bid_row, "pric", None),
            (&person_row, "", None),
        ];
        let mut slots = FieldSlots::default();
        // Repeated, reversed and interleaved, so hits, the last hit and evictions all answer.
        let orders =
            [table.iter().collect::<Vec<_>>(), table.iter().rev().collect(), table.iter().step_by(3).collect()];
        for (row, name, slot) in orders.iter().flatten().chain(orders.iter().flatten()) {
            for _ in 0..2 {
                assert_eq!(slots.slot_of(row, name, &schemas), *slot, "{name} in schema {}", row.schema());
            }
        }
    }
}
