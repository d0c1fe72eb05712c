//! Nexmark, the first step of most queries: keeps the event types a query reads, drops the
//! rest, and gives each kept event the key the next step partitions by. Values pass through
//! byte for byte (the whole event, `"type"` included: a row from the `nexmark` source, JSON
//! from a file) with their event time. The key field is read in place, not decoded with the
//! rest of the event.
//!
//! The step's `config` maps an event type (`person`, `auction`, `bid`) to how events of that
//! type are keyed; types not named are dropped:
//!
//! ```yaml
//! config:
//!   person: {key: /id}          # key = the JSON of the field at this JSON pointer
//!   auction: {key: /seller}
//!   bid: {constant_key: 0}      # key = this JSON value for every event (one group)
//!   # bid: {}                   # no key: keep the event as it is
//!   # bid: {key: /auction, value: none}  # the key alone: an empty value
//! ```
//!
//! `value: none` passes on the key and event time with an empty value, for a next step that
//! reads no field (q5 and q11 count bids per key): each record then carries a few bytes instead
//! of a whole bid through the exchange, the window step's input and the aggregate's crossing
//! (`SELECT auction FROM bid`, the projection a SQL planner pushes to the source).
//!
//! `where` keeps only the events whose top-level fields hold one of the values listed for
//! them (every field named must match; an event without the field is dropped, as SQL drops a
//! row whose condition is NULL):
//!
//! ```yaml
//!   person: {key: /id, where: {state: [OR, ID, CA]}}
//!   auction: {key: /seller, where: {category: [10]}}
//! ```
//!
//! Values compare as JSON text, the field rendered as the key is: `10` matches a field holding
//! the integer 10, not the float 10.0. q3 filters its inputs so before they meet in the join
//! (`WHERE category = 10 AND state IN (...)`, the predicates a SQL planner pushes below a
//! join, and what the native baseline and Beam's Nexmark Query3 do): most events no longer
//! cross the exchange nor reach the join's state.
//!
//! In SQL terms, for `{person: {key: /id}, auction: {key: /seller}}`:
//!
//! ```sql
//! SELECT id AS key, * FROM person UNION ALL SELECT seller AS key, * FROM auction
//! ```
//!
//! Used by q0 (`{bid: {}}`: the pass-through query itself), q3 and q8 (persons by `id`,
//! auctions by `seller`, then `key_by: key` into the join), q5 (bids by `auction`, value
//! none), q7 (bids by the constant `0`: one global window) and q11 (bids by `bidder`, value
//! none). A key is the JSON
//! encoding of the field, so a person's `id` and an auction's `seller` of the same value are
//! the same key bytes and meet in the same subtask. An event of a kept type that lacks the
//! key field is a bad record (the job fails and names it).

use std::collections::BTreeMap;

use eddy_sdk::codec::{Field, FieldName};
use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result};
use serde::Deserialize;
use serde_json::Value;

/// How the events of one type are keyed (the config's value per type).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// JSON pointer to the field whose JSON becomes the key.
    #[serde(default)]
    pub key: Option<String>,
    /// A JSON value used as the key of every event of the type.
    #[serde(default)]
    pub constant_key: Option<Value>,
    /// What of the event the step passes on: all of it (the default) or nothing but its key
    /// and event time, for a next step that reads no field (a count by key).
    #[serde(default)]
    pub value: Keep,
    /// Per top-level field, the values an event must hold there to be kept (any of them).
    #[serde(default, rename = "where")]
    pub conditions: BTreeMap<String, Vec<Value>>,
}

/// What a route passes on of an event's value.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// The whole event, byte for byte.
    #[default]
    Whole,
    /// An empty value: the key (and event time) alone.
    None,
}

/// A route, checked and ready: how to key one type.
#[derive(Debug)]
enum Keying {
    /// Emit as it came (no key).
    None,
    /// The JSON of this top-level field (a pointer such as `/auction`), its slot remembered.
    TopField(Field),
    /// The JSON at this pointer.
    Pointer(String),
    /// These key bytes.
    Constant(Vec<u8>),
}

impl Keying {
    /// Keys by the JSON at `pointer`: by a remembered slot when it names a top-level field.
    fn at(pointer: String) -> Self {
        match pointer.strip_prefix('/').filter(|name| !name.contains(['/', '~'])) {
            Some(name) => Keying::TopField(top_field(name)),
            None => Keying::Pointer(pointer),
        }
    }
}

/// A top-level field read record after record. Leaked once per route and instance: a
/// `Field`'s name is `'static`.
fn top_field(name: &str) -> Field {
    Field::new(Box::leak(name.to_owned().into_boxed_str()))
}

/// One kept type, checked and ready.
#[derive(Debug)]
struct Kept {
    /// The type's name, and the name as a [`type_code`].
    kind: String,
    code: u64,
    keying: Keying,
    /// What of the value passes on.
    keep: Keep,
    /// Fields, each with the JSON texts one of which it must hold.
    conditions: Vec<(Field, Vec<Vec<u8>>)>,
}

impl Kept {
    fn new(kind: String, route: Route) -> Result<Self> {
        let Route { key, constant_key, value: keep, conditions } = route;
        let keying = match (key, constant_key) {
            (Some(_), Some(_)) => {
                return Err(Error::bad_config(format!("`{kind}`: set `key` or `constant_key`, not both")));
            }
            (Some(p), None) if !p.starts_with('/') => {
                return Err(Error::bad_config(format!("`{kind}.key`: `{p}` is not a JSON pointer such as `/id`")));
            }
            (Some(p), None) => Keying::at(p),
            (None, Some(v)) => Keying::Constant(eddy_sdk::codec::encode(&v)?),
            (None, None) => Keying::None,
        };
        let mut checked = Vec::new();
        for (field, values) in conditions {
            if field.is_empty() || field.contains('/') {
                return Err(Error::bad_config(format!(
                    "`{kind}.where`: `{field}` is not the name of a top-level field (such as `category`)"
                )));
            }
            if values.is_empty() {
                return Err(Error::bad_config(format!(
                    "`{kind}.where.{field}` lists no value: name those to keep (e.g. `[10]`)"
                )));
            }
            let texts = values.iter().map(eddy_sdk::codec::encode).collect::<Result<_>>()?;
            checked.push((top_field(&field), texts));
        }
        let code = type_code(kind.as_bytes());
        Ok(Kept { kind, code, keying, keep, conditions: checked })
    }

    /// Whether an event's `value` meets every condition (`scratch` takes each field's JSON).
    fn holds(&self, value: &[u8], scratch: &mut Vec<u8>) -> Result<bool> {
        for (field, accepted) in &self.conditions {
            scratch.clear();
            if !eddy_sdk::codec::field_json_into(value, field, &mut *scratch)? || !accepted.contains(scratch) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The operator: event type -> keying.
#[derive(Debug)]
pub struct Select {
    routes: Vec<Kept>,
    /// The events' `type`, its slot remembered per schema.
    kind: Field,
    /// The current record's key, when read from a field (reused: no allocation per record).
    key: Vec<u8>,
}

const TYPES: [&str; 3] = ["person", "auction", "bid"];

/// An event type's name as a number, so finding its route compares numbers: a byte slice
/// comparison is a call in WebAssembly, a few percent of a pass-through query's CPU. Names of
/// up to 7 bytes map one to one (the length is in the top byte); a longer one (not a Nexmark
/// type, so never a route's) maps to `u64::MAX`, which no route has.
fn type_code(name: &[u8]) -> u64 {
    if name.len() > 7 {
        return u64::MAX;
    }
    name.iter().enumerate().fold((name.len() as u64) << 56, |code, (i, &b)| code | u64::from(b) << (8 * i))
}

impl Select {
    /// Checks a config (event type -> route).
    pub fn new(config: BTreeMap<String, Route>) -> Result<Self> {
        if config.is_empty() {
            return Err(Error::bad_config(
                "nexmark-select keeps nothing: name at least one of person, auction, bid (e.g. `{bid: {key: /auction}}`)",
            ));
        }
        let mut routes = Vec::new();
        for (kind, route) in config {
            if !TYPES.contains(&kind.as_str()) {
                return Err(Error::bad_config(format!("`{kind}` is not a Nexmark event type (person, auction, bid)")));
            }
            routes.push(Kept::new(kind, route)?);
        }
        Ok(Select { routes, kind: Field::new("type"), key: Vec::new() })
    }
}

impl Operator for Select {
    type Config = Option<BTreeMap<String, Route>>;

    fn open(config: Self::Config, _ctx: &mut OpenContext) -> Result<Self> {
        Select::new(config.unwrap_or_default())
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let Select { routes, kind, key } = self;
        // Only `type` decides, so only `type` is read (in place, from a row).
        let event_type =
            record.value_str_bytes(&*kind)?.ok_or_else(|| Error::bad_record("an event without a `type`"))?;
        let code = type_code(&event_type);
        let Some(route) = routes.iter().find(|r| r.code == code) else {
            return Ok(());
        };
        if !route.holds(record.value_bytes(), key)? {
            return Ok(());
        }
        let Kept { kind, keying, keep, .. } = route;
        let missing =
            |pointer: &str| Error::bad_record(format!("a `{kind}` event has no field at `{pointer}` to key by"));
        let key = match keying {
            Keying::None => None,
            Keying::Constant(bytes) => Some(bytes.as_slice()),
            Keying::TopField(field) => {
                key.clear();
                if !eddy_sdk::codec::field_json_into(record.value_bytes(), field, key)? {
                    return Err(missing(&format!("/{}", field.name())));
                }
                Some(key.as_slice())
            }
            Keying::Pointer(pointer) => {
                *key = record.value_at(pointer)?.ok_or_else(|| missing(pointer))?;
                Some(key.as_slice())
            }
        };
        let value = match keep {
            Keep::Whole => record.value_bytes(),
            Keep::None => &[],
        };
        ctx.emit_raw(None, key, value, record.timestamp())
    }
}

eddy_sdk::export_operator!(Select);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{Keep, Kept, Route, type_code};

    fn kept(kind: &str, route: &str) -> eddy_sdk::Result<Kept> {
        Kept::new(kind.into(), serde_json::from_str(route).expect("a route"))
    }

    /// An event is kept when each field named holds one of its values, compared as JSON text.
    #[test]
    fn where_keeps_the_events_whose_fields_hold_a_listed_value() {
        let route = kept("person", r#"{"key": "/id", "where": {"state": ["OR", "CA"], "id": [1, 2]}}"#).expect("valid");
        let mut scratch = Vec::new();
        let cases: [(&str, bool); 7] = [
            (r#"{"id": 1, "state": "OR"}"#, true),
            (r#"{"id": 2, "state": "CA", "name": "x"}"#, true),
            (r#"{"id": 1, "state": "WA"}"#, false),
            (r#"{"id": 3, "state": "OR"}"#, false),
            (r#"{"id": 1.0, "state": "OR"}"#, false),
            (r#"{"id": "1", "state": "OR"}"#, false),
            (r#"{"state": "OR"}"#, false),
        ];
        for (event, expected) in cases {
            assert_eq!(route.holds(event.as_bytes(), &mut scratch).expect("JSON"), expected, "{event}");
        }
        let everything = kept("bid", r#"{"key": "/auction"}"#).expect("valid");
        assert!(everything.holds(br#"{"auction": 1}"#, &mut scratch).expect("JSON"));
    }

    #[test]
    fn a_condition_on_no_top_level_field_or_no_value_is_refused_naming_it() {
        for (route, names) in [
            (r#"{"where": {"a/b": [1]}}"#, ["auction.where", "a/b"]),
            (r#"{"where": {"": [1]}}"#, ["auction.where", "top-level"]),
            (r#"{"where": {"category": []}}"#, ["auction.where.category", "no value"]),
        ] {
            let error = kept("auction", route).expect_err(route).to_string();
            assert!(names.iter().all(|n| error.contains(n)), "{error}");
        }
    }

    #[test]
    fn a_route_passes_on_the_whole_value_unless_told_none() {
        let routes: BTreeMap<String, Route> =
            serde_json::from_str(r#"{"bid": {"key": "/auction", "value": "none"}, "person": {}}"#).expect("routes");
        assert_eq!(routes["bid"].value, Keep::None);
        assert_eq!(routes["person"].value, Keep::Whole);
        let wrong = serde_json::from_str::<BTreeMap<String, Route>>(r#"{"bid": {"value": "half"}}"#);
        let error = wrong.expect_err("an unknown value mode").to_string();
        assert!(error.contains("half") && error.contains("none"), "{error}");
    }

    #[test]
    fn type_codes_tell_apart_exactly_the_names_that_differ() {
        let names: [&[u8]; 9] = [b"bid", b"auction", b"person", b"", b"bi", b"bid\0", b"\0bid", b"auctio", b"Bid"];
        for a in names {
            for b in names {
                assert_eq!(type_code(a) == type_code(b), a == b, "{a:?} {b:?}");
            }
            assert_ne!(type_code(a), u64::MAX);
        }
        assert_eq!(type_code(b"auctions"), u64::MAX, "longer than any route's name");
    }
}
