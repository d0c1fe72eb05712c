//! Nexmark, the first step of most queries: keeps the event types a query reads, drops the
//! rest, and gives each kept event the key the next step partitions by. Values pass through
//! byte for byte (the whole event JSON, `"type"` included) with their event time.
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
//! ```
//!
//! In SQL terms, for `{person: {key: /id}, auction: {key: /seller}}`:
//!
//! ```sql
//! SELECT id AS key, * FROM person UNION ALL SELECT seller AS key, * FROM auction
//! ```
//!
//! Used by q0 (`{bid: {}}`: the pass-through query itself), q3 and q8 (persons by `id`,
//! auctions by `seller`, then `key_by: key` into the join), q5 (bids by `auction`), q7 (bids
//! by the constant `0`: one global window) and q11 (bids by `bidder`). A key is the JSON
//! encoding of the field, so a person's `id` and an auction's `seller` of the same value are
//! the same key bytes and meet in the same subtask. An event of a kept type that lacks the
//! key field is a bad record (the job fails and names it).

use std::collections::BTreeMap;

use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result};
use serde::{Deserialize, de};
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
}

/// A route, checked and ready: how to key one type.
#[derive(Debug)]
enum Keying {
    /// Emit as it came (no key).
    None,
    /// The JSON at this pointer.
    Field(String),
    /// These key bytes.
    Constant(Vec<u8>),
}

/// The operator: event type -> keying.
#[derive(Debug)]
pub struct Select {
    routes: Vec<(String, Keying)>,
    /// The top-level fields the routes' pointers start in (what each event is probed for).
    fields: Vec<String>,
}

const TYPES: [&str; 3] = ["person", "auction", "bid"];

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
            let keying = match route {
                Route { key: Some(_), constant_key: Some(_) } => {
                    return Err(Error::bad_config(format!("`{kind}`: set `key` or `constant_key`, not both")));
                }
                Route { key: Some(p), .. } if !p.starts_with('/') => {
                    return Err(Error::bad_config(format!("`{kind}.key`: `{p}` is not a JSON pointer such as `/id`")));
                }
                Route { key: Some(p), .. } => Keying::Field(p),
                Route { constant_key: Some(v), .. } => Keying::Constant(eddy_sdk::codec::encode(&v)?),
                Route { key: None, constant_key: None } => Keying::None,
            };
            routes.push((kind, keying));
        }
        let mut fields: Vec<String> = routes
            .iter()
            .filter_map(|(_, k)| match k {
                Keying::Field(pointer) => Some(first_segment(pointer)),
                Keying::None | Keying::Constant(_) => None,
            })
            .collect();
        fields.sort();
        fields.dedup();
        Ok(Select { routes, fields })
    }
}

impl Operator for Select {
    type Config = Option<BTreeMap<String, Route>>;

    fn open(config: Self::Config, _ctx: &mut OpenContext) -> Result<Self> {
        Select::new(config.unwrap_or_default())
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let value = record.value_bytes();
        let event = Probe { fields: &self.fields }.read(value)?;
        let Some((kind, keying)) = self.routes.iter().find(|(k, _)| *k == event.kind) else { return Ok(()) };
        let key = match keying {
            Keying::None => None,
            Keying::Constant(bytes) => Some(bytes.clone()),
            Keying::Field(pointer) => {
                let field = event.field(&self.fields, pointer).ok_or_else(|| {
                    Error::bad_record(format!("a `{kind}` event has no field at `{pointer}` to key by"))
                })?;
                Some(eddy_sdk::codec::encode(field)?)
            }
        };
        ctx.emit_raw(None, key.as_deref(), value, record.timestamp())
    }
}

/// The top-level field a JSON pointer starts with (`/a/b` -> `a`), unescaped (RFC 6901).
fn first_segment(pointer: &str) -> String {
    let segment = pointer.trim_start_matches('/').split('/').next().unwrap_or_default();
    segment.replace("~1", "/").replace("~0", "~")
}

/// One pass over an event that decodes only its `type` and the top-level fields some route
/// keys by, skipping the rest unparsed: this step sees every event, and most of an event's
/// bytes (names, URLs, `extra` padding) are never needed here.
struct Probe<'f> {
    fields: &'f [String],
}

/// What a [`Probe`] found.
#[derive(Debug, Default)]
struct Probed {
    kind: String,
    /// `(index into the probe's fields, value)` for each wanted field present.
    found: Vec<(usize, Value)>,
}

impl Probed {
    /// The value at `pointer`, whose first segment is one of `fields`.
    fn field<'v>(&'v self, fields: &[String], pointer: &str) -> Option<&'v Value> {
        let first = first_segment(pointer);
        let index = fields.iter().position(|f| *f == first)?;
        let (_, top) = self.found.iter().find(|(i, _)| *i == index)?;
        let rest = &pointer[1..].find('/').map(|at| &pointer[1 + at..]).unwrap_or("");
        top.pointer(rest)
    }
}

/// Which of a probe's interests a top-level key is.
enum Interest {
    Type,
    Field(usize),
    None,
}

impl Probe<'_> {
    fn read(self, event: &[u8]) -> Result<Probed> {
        let mut de = serde_json::Deserializer::from_slice(event);
        let probed = de::DeserializeSeed::deserialize(self, &mut de)?;
        de.end()?;
        if probed.kind.is_empty() {
            return Err(Error::bad_record("a Nexmark event without a `type`"));
        }
        Ok(probed)
    }
}

impl<'de> de::DeserializeSeed<'de> for Probe<'_> {
    type Value = Probed;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Probed, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> de::Visitor<'de> for Probe<'_> {
    type Value = Probed;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Nexmark event (a JSON object with a `type`)")
    }

    fn visit_map<M: de::MapAccess<'de>>(self, mut map: M) -> std::result::Result<Probed, M::Error> {
        let mut probed = Probed::default();
        while let Some(interest) = map.next_key_seed(KeySeed { fields: self.fields })? {
            match interest {
                Interest::Type => probed.kind = map.next_value()?,
                Interest::Field(i) => probed.found.push((i, map.next_value()?)),
                Interest::None => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        Ok(probed)
    }
}

/// Classifies a key without allocating it.
struct KeySeed<'f> {
    fields: &'f [String],
}

impl<'de> de::DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Interest;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> std::result::Result<Interest, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl de::Visitor<'_> for KeySeed<'_> {
    type Value = Interest;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> std::result::Result<Interest, E> {
        Ok(match key {
            "type" => Interest::Type,
            _ => self.fields.iter().position(|f| f == key).map_or(Interest::None, Interest::Field),
        })
    }
}

eddy_sdk::export_operator!(Select);
