//! Reading a step's keyed state out of a checkpoint or savepoint, decoded: what `eddy state`
//! prints and `GET /v1/jobs/{id}/state` answers.
//!
//! A checkpoint records per step the states it declared (name and kind) and the row schemas it
//! declared, so entries are named and values read by field name in any process. Values are
//! shown as JSON: JSON text as is, rows as objects, lists as arrays, window accumulators with
//! their window; anything else as hex. Checkpoints from before states were recorded still read,
//! with states named by id (`#1a2b3c4d`) and values decoded as far as their bytes allow.
//!
//! Works on heap and RocksDB snapshots alike (both come through
//! [`RestorePoint::visit_operator`]), at any parallelism the job had: state follows key
//! groups, so a key is found in whichever old subtask held it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use eddy_core::KeyGroupRange;
use eddy_plan::window_state::{decode_window, split_accumulator};
use eddy_state::{DeclaredState, HashedKey, StateError, StateId, StateKind, decode_list, decode_state_key, state_id};
use eddy_wire::schema::{Schema, Schemas};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::metadata::{CheckpointMetadata, StoredSchema, TimerState, completed_ids};
use crate::restore::{RestorePoint, Share};
use crate::store::CheckpointStore;
use crate::{CheckpointError, CheckpointId};

/// Most entries one read returns, whatever the caller asks.
pub const MAX_ENTRIES: usize = 10_000;
/// Most bytes of decoded values one read returns (JSON text), so one huge state cannot make
/// an answer of gigabytes: past it the read stops and says it was truncated.
pub const MAX_VALUE_BYTES: usize = 8 << 20;

/// Why a read found nothing to show.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// No completed checkpoint, or none holding the step or state asked for.
    #[error("{0}")]
    NotFound(String),
    /// The query itself is malformed.
    #[error("{0}")]
    BadQuery(String),
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl From<StateError> for InspectError {
    fn from(e: StateError) -> Self {
        InspectError::Checkpoint(CheckpointError::Corrupt { file: "a state entry".into(), problem: e.to_string() })
    }
}

/// A key as a user types it, as the bytes it is stored under: JSON text, compact (`"alice"`
/// with its quotes, `42`); text that is not JSON is taken as a JSON string (`alice`).
pub fn key_from_text(key: &str) -> Vec<u8> {
    match serde_json::from_str::<Value>(key) {
        Ok(value) => value.to_string().into_bytes(),
        Err(_) => Value::String(key.to_owned()).to_string().into_bytes(),
    }
}

/// Which entries to read.
#[derive(Debug, Clone)]
pub struct StateQuery {
    /// The step (its name in the pipeline).
    pub step: String,
    /// Only this state (its declared name, or `#<id in hex>`).
    pub state: Option<String>,
    /// Only this record key (its bytes as stored: the JSON text of the key).
    pub key: Option<Vec<u8>>,
    /// Most entries to return (at most [`MAX_ENTRIES`]).
    pub limit: usize,
}

/// One decoded entry: one value, one list, one map entry, or one window's accumulator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateEntry {
    /// The record key (JSON; a key that is not JSON as a string of its text).
    pub key: Value,
    /// The key group the key falls in.
    pub key_group: u16,
    /// The state's declared name (`#<id>` if the checkpoint did not record it).
    pub state: String,
    /// How the state is laid out, if recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<StateKind>,
    /// A window accumulator's window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowRange>,
    /// Whether a window accumulator's window has fired (kept for allowed lateness).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fired: Option<bool>,
    /// A map entry's map key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_key: Option<Value>,
    /// The value, decoded.
    pub value: Value,
}

/// A window `[start, end)` in event time (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowRange {
    /// First millisecond inside.
    pub start: i64,
    /// First millisecond after.
    pub end: i64,
}

/// A pending timer of the step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerEntry {
    /// The record key.
    pub key: Value,
    /// `event_time` or `processing_time`.
    pub domain: String,
    /// When it fires (ms).
    pub timestamp: i64,
}

/// What a read found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateDump {
    /// The checkpoint read.
    pub checkpoint: CheckpointId,
    /// The step.
    pub step: String,
    /// The states the step declared, as the checkpoint recorded them.
    pub states: Vec<DeclaredState>,
    /// The entries, in key-group and key order.
    pub entries: Vec<StateEntry>,
    /// The step's pending timers (those of the key asked for, if one was).
    pub timers: Vec<TimerEntry>,
    /// Whether more entries matched than were returned.
    pub truncated: bool,
}

/// Reads step `query.step` of checkpoint `id` in `store` (the newest intact one if `None`),
/// fetching only that step's files into a temporary directory under `local`.
pub fn read_state(
    store: &CheckpointStore,
    id: Option<CheckpointId>,
    query: &StateQuery,
    local: &Path,
) -> Result<StateDump, InspectError> {
    let meta = match id {
        Some(id) => CheckpointMetadata::read_verified(store, id)?,
        None => newest(store)?,
    };
    if !meta.subtasks.iter().any(|s| s.operators.iter().any(|o| o.step == query.step)) {
        let mut steps: Vec<&str> =
            meta.subtasks.iter().flat_map(|s| s.operators.iter().map(|o| o.step.as_str())).collect();
        steps.sort_unstable();
        steps.dedup();
        return Err(InspectError::NotFound(format!(
            "checkpoint {} holds no state of step `{}`; steps with state: {}",
            meta.id,
            query.step,
            if steps.is_empty() { "none".to_owned() } else { steps.join(", ") }
        )));
    }
    let point = RestorePoint::fetch_step(store, meta, local, &query.step)?;
    read_fetched(&point, query)
}

/// The newest checkpoint whose metadata passes its checks.
fn newest(store: &CheckpointStore) -> Result<CheckpointMetadata, InspectError> {
    let mut damaged = Vec::new();
    for id in completed_ids(store)? {
        match CheckpointMetadata::read_verified(store, id) {
            Ok(meta) => return Ok(meta),
            Err(e @ CheckpointError::Corrupt { .. }) => damaged.push(format!("checkpoint {id}: {e}")),
            Err(e) => return Err(e.into()),
        }
    }
    Err(InspectError::NotFound(if damaged.is_empty() {
        format!("no completed checkpoint in {}", store.describe())
    } else {
        format!("no intact checkpoint in {} ({})", store.describe(), damaged.join("; "))
    }))
}

/// Reads a fetched checkpoint.
pub fn read_fetched(point: &RestorePoint, query: &StateQuery) -> Result<StateDump, InspectError> {
    let meta = point.metadata();
    let ops = meta.subtasks.iter().flat_map(|s| &s.operators).filter(|o| o.step == query.step);
    let mut states: Vec<DeclaredState> = Vec::new();
    let mut schemas = StoredSchemas::default();
    for op in ops {
        for d in &op.states {
            if !states.contains(d) {
                states.push(d.clone());
            }
        }
        schemas.add(&op.schemas);
    }
    let wanted_state = match &query.state {
        None => None,
        Some(name) => Some(state_of(name, &states)?),
    };
    let max = meta.max_parallelism.unwrap_or(u32::from(u16::MAX) + 1);
    let range = match &query.key {
        Some(key) => {
            let group = HashedKey::new(key, max).group;
            KeyGroupRange { start: group, end: group }
        }
        None => KeyGroupRange::all(max),
    };
    let mut reader = Reader {
        states: states.iter().map(|d| (state_id(&d.name), d)).collect(),
        schemas,
        wanted_state,
        key: query.key.as_deref(),
        limit: query.limit.min(MAX_ENTRIES),
        entries: Vec::new(),
        value_bytes: 0,
        open_list: None,
        truncated: false,
    };
    let mut timers = Vec::new();
    point.visit_operator(
        &query.step,
        Share::KeyGroups(range),
        &mut |k, v| reader.entry(k, v),
        &mut |t: &TimerState| {
            if query.key.as_deref().is_none_or(|key| key == t.key.as_slice()) && timers.len() < MAX_ENTRIES {
                timers.push(TimerEntry {
                    key: json_or_text(&t.key),
                    domain: if t.event_time { "event_time" } else { "processing_time" }.to_owned(),
                    timestamp: t.timestamp,
                });
            }
        },
    )?;
    reader.close_list();
    timers.sort_by_key(|t| t.timestamp);
    let (entries, truncated) = (reader.entries, reader.truncated);
    Ok(StateDump { checkpoint: meta.id, step: query.step.clone(), states, entries, timers, truncated })
}

/// The id of state `name`: a declared name, or `#<hex id>`.
fn state_of(name: &str, declared: &[DeclaredState]) -> Result<StateId, InspectError> {
    if let Some(hex) = name.strip_prefix('#') {
        return StateId::from_str_radix(hex, 16)
            .map_err(|_| InspectError::BadQuery(format!("`{name}` is not `#` and a state id in hex")));
    }
    if declared.is_empty() || declared.iter().any(|d| d.name == name) {
        // A checkpoint that recorded no names: the id is still the name's hash.
        return Ok(state_id(name));
    }
    let names: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
    Err(InspectError::NotFound(format!("the step declares no state `{name}`; it declares {}", names.join(", "))))
}

/// Schemas a checkpoint recorded, by id.
#[derive(Default)]
struct StoredSchemas(HashMap<u32, Arc<Schema>>);

impl StoredSchemas {
    fn add(&mut self, stored: &[StoredSchema]) {
        for s in stored {
            let schema = Schema { name: s.name.clone(), fields: s.fields.clone() };
            self.0.insert(schema.id(), Arc::new(schema));
        }
    }
}

impl Schemas for StoredSchemas {
    fn get(&self, id: u32) -> Option<Arc<Schema>> {
        self.0.get(&id).cloned()
    }
}

/// A list being collected from its header and items.
struct OpenList {
    prefix: Vec<u8>,
    entry: StateEntry,
}

struct Reader<'a> {
    states: HashMap<StateId, &'a DeclaredState>,
    schemas: StoredSchemas,
    wanted_state: Option<StateId>,
    key: Option<&'a [u8]>,
    limit: usize,
    entries: Vec<StateEntry>,
    value_bytes: usize,
    open_list: Option<OpenList>,
    truncated: bool,
}

impl Reader<'_> {
    fn entry(&mut self, raw_key: &[u8], value: &[u8]) -> Result<(), StateError> {
        let k = decode_state_key(raw_key)?;
        if self.wanted_state.is_some_and(|s| s != k.state) || self.key.is_some_and(|key| key != k.key) {
            return Ok(());
        }
        let declared = self.states.get(&k.state).copied();
        let kind = declared.map(|d| d.kind);
        if kind == Some(StateKind::List) {
            // Items follow their header, so they gather into one entry.
            let prefix = &raw_key[..raw_key.len() - k.map_key.len()];
            let items = list_items(&k, value, &self.schemas)?;
            if let Some(open) = &mut self.open_list
                && open.prefix == prefix
            {
                if let Value::Array(held) = &mut open.entry.value {
                    held.extend(items);
                }
                return Ok(());
            }
            self.close_list();
            let entry = base(&k, declared, Value::Array(items));
            self.open_list = Some(OpenList { prefix: prefix.to_vec(), entry });
            return Ok(());
        }
        self.close_list();
        let entry = decode_one(&k, declared, value, &self.schemas)?;
        self.push(entry);
        Ok(())
    }

    fn close_list(&mut self) {
        if let Some(open) = self.open_list.take() {
            self.push(open.entry);
        }
    }

    fn push(&mut self, entry: StateEntry) {
        if self.truncated || self.entries.len() >= self.limit || self.value_bytes >= MAX_VALUE_BYTES {
            self.truncated = true;
            return;
        }
        self.value_bytes += entry.value.to_string().len();
        self.entries.push(entry);
    }
}

/// Decodes one stored entry on its own, as a state trace shows it: a value, one map entry,
/// one list item (or a list's header, as an empty array), a window's accumulator with its
/// window, or a session list; `value: None` (an entry read but absent) names the entry only.
/// `states` names the entry's state; rows read by `schemas`.
pub fn decode_entry(
    raw_key: &[u8],
    value: Option<&[u8]>,
    states: &[DeclaredState],
    schemas: &dyn Schemas,
) -> Result<StateEntry, StateError> {
    let k = decode_state_key(raw_key)?;
    let declared = states.iter().find(|d| state_id(&d.name) == k.state);
    let Some(value) = value else {
        let mut entry = base(&k, declared, Value::Null);
        if !k.map_key.is_empty() {
            entry.map_key = Some(json_or_text(k.map_key));
        }
        if declared.is_some_and(|d| d.kind == StateKind::WindowAccumulator)
            && let Ok(w) = decode_window(k.namespace)
        {
            entry.window = Some(WindowRange { start: w.start, end: w.end });
        }
        return Ok(entry);
    };
    if declared.is_some_and(|d| d.kind == StateKind::List) {
        return Ok(base(&k, declared, Value::Array(list_items(&k, value, schemas)?)));
    }
    decode_one(&k, declared, value, schemas)
}

/// The items one entry of a list holds: its header (at the list's key) none, an item (at the
/// key and an 8-byte index) one, a list in the older single-value layout all of them.
fn list_items(
    k: &eddy_state::DecodedStateKey<'_>,
    value: &[u8],
    schemas: &dyn Schemas,
) -> Result<Vec<Value>, StateError> {
    Ok(if !k.map_key.is_empty() {
        vec![decode_value(value, schemas)]
    } else if value.starts_with(&[0xFF; 4]) {
        Vec::new()
    } else {
        decode_list(value)?.iter().map(|i| decode_value(i, schemas)).collect()
    })
}

/// An entry of any kind but a list.
fn decode_one(
    k: &eddy_state::DecodedStateKey<'_>,
    declared: Option<&DeclaredState>,
    value: &[u8],
    schemas: &dyn Schemas,
) -> Result<StateEntry, StateError> {
    let mut entry = base(k, declared, Value::Null);
    match declared.map(|d| d.kind) {
        Some(StateKind::Map) => {
            entry.map_key = Some(json_or_text(k.map_key));
            entry.value = decode_value(value, schemas);
        }
        Some(StateKind::WindowAccumulator) => {
            let window = decode_window(k.namespace).map_err(StateError::Corrupt)?;
            let (fired, acc) = split_accumulator(value).map_err(StateError::Corrupt)?;
            entry.window = Some(WindowRange { start: window.start, end: window.end });
            entry.fired = Some(fired);
            entry.value = decode_value(acc, schemas);
        }
        Some(StateKind::WindowSessions) => {
            let windows = decode_list(value)?
                .iter()
                .map(|w| {
                    decode_window(w)
                        .map(|w| serde_json::json!({"start": w.start, "end": w.end}))
                        .map_err(StateError::Corrupt)
                })
                .collect::<Result<Vec<_>, _>>()?;
            entry.value = Value::Array(windows);
        }
        Some(StateKind::Value) | Some(StateKind::List) | None => {
            if !k.map_key.is_empty() {
                entry.map_key = Some(hex(k.map_key));
            }
            entry.value = decode_value(value, schemas);
        }
    }
    Ok(entry)
}

/// The fields every entry has, from its key.
fn base(k: &eddy_state::DecodedStateKey<'_>, declared: Option<&DeclaredState>, value: Value) -> StateEntry {
    StateEntry {
        key: json_or_text(k.key),
        key_group: k.key_group,
        state: declared.map_or_else(|| format!("#{:08x}", k.state), |d| d.name.clone()),
        kind: declared.map(|d| d.kind),
        window: None,
        fired: None,
        map_key: None,
        value,
    }
}

/// A stored value as JSON: a row by its schema, JSON text as is, else hex.
pub fn decode_value(bytes: &[u8], schemas: &dyn Schemas) -> Value {
    if eddy_wire::row::is_row(bytes) {
        let mut out = Vec::new();
        if eddy_wire::json::row_to_json(bytes, schemas, &mut out).is_ok()
            && let Ok(v) = serde_json::from_slice(&out)
        {
            return v;
        }
        return hex(bytes);
    }
    serde_json::from_slice(bytes).unwrap_or_else(|_| hex(bytes))
}

/// Bytes that are JSON as that JSON, else as their text (keys are JSON in every SDK, but a
/// host source may key by raw text).
pub fn json_or_text(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// Bytes that are neither JSON nor a row: `{"hex": "..."}`.
fn hex(bytes: &[u8]) -> Value {
    let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    serde_json::json!({ "hex": text })
}

#[cfg(test)]
mod tests {
    use super::key_from_text;

    #[test]
    fn a_key_is_json_as_stored_and_plain_text_is_a_string() {
        assert_eq!(key_from_text("alice"), br#""alice""#);
        assert_eq!(key_from_text(r#""alice""#), br#""alice""#);
        assert_eq!(key_from_text("42"), b"42");
        assert_eq!(key_from_text(r#"{ "a" : 1 }"#), br#"{"a":1}"#);
        assert_eq!(key_from_text("not json {"), br#""not json {""#);
    }
}
