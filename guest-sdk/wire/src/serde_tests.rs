//! Rows against JSON: `serde_json` is the oracle for what a struct's fields are, so a row
//! written from a value must render as the JSON `serde_json` writes for it and read back as
//! the value, by name.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use crate::de::RowDecoder;
use crate::json::{pointer_to_json, row_to_json};
use crate::row::{RowRef, is_row};
use crate::schema::{Schema, Schemas};
use crate::ser::{RowEncoder, RowSerError};

/// The host's side in miniature: ids computed from the names, names kept for readers.
#[derive(Default)]
struct Registry(RefCell<BTreeMap<u32, Arc<Schema>>>);

impl Registry {
    fn encode<T: Serialize>(&self, enc: &mut RowEncoder, value: &T) -> Result<Vec<u8>, RowSerError> {
        let mut out = Vec::new();
        let mut declare = |s: &Schema| {
            let id = s.id();
            self.0.borrow_mut().insert(id, Arc::new(s.clone()));
            id
        };
        enc.encode(value, &mut out, &mut declare)?;
        Ok(out)
    }
}

impl Schemas for Registry {
    fn get(&self, id: u32) -> Option<Arc<Schema>> {
        self.0.borrow().get(&id).cloned()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Color {
    Red,
    Rgb(u8, u8, u8),
    Named { name: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Inner {
    id: u64,
    label: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Everything {
    small: i8,
    signed: i64,
    unsigned: u64,
    float: f64,
    flag: bool,
    letter: char,
    text: String,
    maybe: Option<i32>,
    inner: Inner,
    list: Vec<u16>,
    map: BTreeMap<String, i64>,
    color: Color,
    unit: (),
}

fn everything() -> impl Strategy<Value = Everything> {
    let color = prop_oneof![
        Just(Color::Red),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(r, g, b)| Color::Rgb(r, g, b)),
        ".{0,8}".prop_map(|name| Color::Named { name }),
    ];
    (
        (any::<i8>(), any::<i64>(), any::<u64>(), -1e300f64..1e300, any::<bool>(), any::<char>()),
        (".{0,30}", proptest::option::of(any::<i32>()), any::<u64>(), proptest::option::of(".{0,5}")),
        (
            proptest::collection::vec(any::<u16>(), 0..5),
            proptest::collection::btree_map(".{0,4}", any::<i64>(), 0..4),
            color,
        ),
    )
        .prop_map(
            |((small, signed, unsigned, float, flag, letter), (text, maybe, id, label), (list, map, color))| {
                Everything {
                    small,
                    signed,
                    unsigned,
                    float,
                    flag,
                    letter,
                    text,
                    maybe,
                    inner: Inner { id, label },
                    list,
                    map,
                    color,
                    unit: (),
                }
            },
        )
}

/// A reader that wants two of the fields, in another order, borrowing the string.
#[derive(Debug, Deserialize, PartialEq)]
struct Some2<'a> {
    unsigned: u64,
    #[serde(borrow)]
    text: &'a str,
}

proptest! {
    #[test]
    fn a_row_renders_as_serde_json_writes_the_value_and_reads_back(value in everything()) {
        let registry = Registry::default();
        let mut enc = RowEncoder::new();
        let row = registry.encode(&mut enc, &value).expect("a struct");
        prop_assert!(is_row(&row));
        let mut json = Vec::new();
        row_to_json(&row, &registry, &mut json).expect("renders");
        prop_assert_eq!(String::from_utf8(json).expect("utf-8"), serde_json::to_string(&value).expect("json"));
        let mut dec = RowDecoder::new();
        prop_assert_eq!(&dec.decode::<Everything>(&row, &registry).expect("reads back"), &value);
        let some: Some2<'_> = dec.decode(&row, &registry).expect("a subset by name");
        prop_assert_eq!(some, Some2 { unsigned: value.unsigned, text: &value.text });
        let as_value: serde_json::Value = dec.decode(&row, &registry).expect("any");
        prop_assert_eq!(as_value, serde_json::to_value(&value).expect("json value"));
        let again = registry.encode(&mut enc, &value).expect("again");
        prop_assert_eq!(&again, &row, "the cached schema gives the same bytes");
    }
}

#[test]
fn only_structs_become_rows_and_a_failed_encode_leaves_the_buffer() {
    let registry = Registry::default();
    let mut enc = RowEncoder::new();
    assert_eq!(registry.encode(&mut enc, &7u64), Err(RowSerError::NotAStruct));
    assert_eq!(registry.encode(&mut enc, &vec![1, 2]), Err(RowSerError::NotAStruct));
    assert_eq!(registry.encode(&mut enc, &Color::Rgb(1, 2, 3)), Err(RowSerError::NotAStruct));
    assert_eq!(registry.encode(&mut enc, &None::<Inner>), Err(RowSerError::NotAStruct));
    let some = registry.encode(&mut enc, &Some(Inner { id: 2, label: None })).expect("Some(struct) is a row");
    assert_eq!(RowDecoder::new().decode::<Option<Inner>>(&some, &registry), Ok(Some(Inner { id: 2, label: None })));
    let mut out = vec![9u8];
    let mut declare = |s: &Schema| s.id();
    assert!(enc.encode(&"text", &mut out, &mut declare).is_err());
    assert_eq!(out, [9]);
}

#[test]
fn a_missing_field_is_named_and_defaults_apply() {
    #[derive(Serialize)]
    struct Small {
        a: u64,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Wants {
        a: u64,
        b: u64,
    }
    #[derive(Debug, Deserialize, PartialEq)]
    struct Defaults {
        a: u64,
        #[serde(default)]
        b: u64,
        c: Option<String>,
    }
    let registry = Registry::default();
    let row = registry.encode(&mut RowEncoder::new(), &Small { a: 3 }).expect("row");
    let mut dec = RowDecoder::new();
    let err = dec.decode::<Wants>(&row, &registry).expect_err("b is missing");
    assert!(err.to_string().contains("missing field `b`"), "{err}");
    assert_eq!(dec.decode::<Defaults>(&row, &registry).expect("defaults"), Defaults { a: 3, b: 0, c: None });
    // A wrong kind says which field and what it holds.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Text {
        a: String,
    }
    let err = dec.decode::<Text>(&row, &registry).expect_err("a is a number");
    assert!(err.to_string().contains("invalid type: integer `3`"), "{err}");
}

#[test]
fn internally_tagged_enums_are_rows_with_the_tag_first() {
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "lowercase")]
    enum Event {
        Bid { auction: u64, price: u64 },
        Person { id: u64 },
    }
    let registry = Registry::default();
    let mut enc = RowEncoder::new();
    let bid = Event::Bid { auction: 4, price: 99 };
    let row = registry.encode(&mut enc, &bid).expect("row");
    let read = RowRef::new(&row).expect("whole");
    assert_eq!(read.str(0), Ok(Some("bid")));
    assert_eq!(read.u64(2), Ok(99));
    assert_eq!(RowDecoder::new().decode::<Event>(&row, &registry).expect("tagged"), bid);
    assert_eq!(pointer_to_json(&row, "/price", &registry), Ok(Some(b"99".to_vec())));
    assert_eq!(pointer_to_json(&row, "/nope", &registry), Ok(None));
    assert_eq!(pointer_to_json(&row, "/type", &registry), Ok(Some(br#""bid""#.to_vec())));
}

#[test]
fn pointers_reach_into_nested_rows_and_json_fields() {
    #[derive(Serialize)]
    struct Outer {
        inner: Inner,
        map: BTreeMap<String, Vec<u8>>,
        #[serde(rename = "a/b")]
        slash: u8,
    }
    let registry = Registry::default();
    let value = Outer {
        inner: Inner { id: 5, label: None },
        map: [(String::from("k"), vec![1, 2])].into_iter().collect(),
        slash: 1,
    };
    let row = registry.encode(&mut RowEncoder::new(), &value).expect("row");
    assert_eq!(pointer_to_json(&row, "/inner/id", &registry), Ok(Some(b"5".to_vec())));
    assert_eq!(pointer_to_json(&row, "/inner/label", &registry), Ok(Some(b"null".to_vec())));
    assert_eq!(pointer_to_json(&row, "/inner", &registry), Ok(Some(br#"{"id":5,"label":null}"#.to_vec())));
    assert_eq!(pointer_to_json(&row, "/map/k/1", &registry), Ok(Some(b"2".to_vec())));
    assert_eq!(pointer_to_json(&row, "/a~1b", &registry), Ok(Some(b"1".to_vec())));
    assert_eq!(pointer_to_json(&row, "/inner/id/deeper", &registry), Ok(None));
}

#[test]
fn a_row_without_known_names_reads_positionally_and_renders_as_an_array() {
    let registry = Registry::default();
    let row = registry.encode(&mut RowEncoder::new(), &Inner { id: 1, label: Some("x".into()) }).expect("row");
    let strangers = crate::schema::NoSchemas;
    let mut json = Vec::new();
    row_to_json(&row, &strangers, &mut json).expect("renders");
    assert_eq!(json, br#"[1,"x"]"#);
    let read: Inner = RowDecoder::new().decode(&row, &strangers).expect("positional");
    assert_eq!(read, Inner { id: 1, label: Some("x".into()) });
}

mod first {
    #[derive(serde::Serialize)]
    pub struct Shape {
        pub a: u64,
        pub b: i64,
    }
}

mod second {
    #[derive(serde::Serialize)]
    pub struct Shape {
        pub a: u64,
        pub c: i64,
    }
}

/// Fields written only when present: one struct, two shapes.
#[derive(Serialize)]
struct Sparse {
    a: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    b: Option<u64>,
    c: first::Shape,
}

/// Announces three fields and writes one.
struct Loose;

impl Serialize for Loose {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Shape", 3)?;
        st.serialize_field("a", &7u64)?;
        st.end()
    }
}

#[test]
fn shapes_alike_in_name_and_count_keep_their_own_names_whatever_the_order() {
    let registry = Registry::default();
    let mut enc = RowEncoder::new();
    let render = |row: &[u8]| {
        let mut json = Vec::new();
        row_to_json(row, &registry, &mut json).expect("renders");
        String::from_utf8(json).expect("utf-8")
    };
    // One encoder throughout, so every shape after the first meets shapes already known.
    for round in 0..3u64 {
        let one = registry.encode(&mut enc, &first::Shape { a: round, b: -1 }).expect("first");
        assert_eq!(render(&one), format!(r#"{{"a":{round},"b":-1}}"#));
        let two = registry.encode(&mut enc, &second::Shape { a: round, c: 2 }).expect("second");
        assert_eq!(render(&two), format!(r#"{{"a":{round},"c":2}}"#));
        let loose = registry.encode(&mut enc, &Loose).expect("loose");
        assert_eq!(render(&loose), r#"{"a":7,"":null,"":null}"#);
        for b in [Some(round), None] {
            let sparse = Sparse { a: round, b, c: first::Shape { a: 1, b: 2 } };
            let row = registry.encode(&mut enc, &sparse).expect("sparse");
            assert_eq!(render(&row), serde_json::to_string(&sparse).expect("json"), "round {round}, b {b:?}");
        }
    }
}
