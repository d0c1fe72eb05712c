//! Store data and host imports of the keyed-operator world: state, timers and output, each
//! scoped to the keys of the current call and bounded by the sandbox limits.

use std::collections::HashMap;
use std::sync::Arc;

use eddy_core::{
    FiredTimer, KeyGroup, KeyGroupRange, MAX_BATCH_BYTES, RecordBatch, RecordMeta, TimeDomain, TimerService, key_hash,
};
use eddy_state::{HashedKey, ListKeys, StateBackend, StateError, StateId, StateKey, list_for_each, state_id};
use eddy_wire::{Packed, Row, Span, Table, ValueWrite};
use wasmtime_wasi::{WasiCtxView, WasiView};

use crate::bindings::{output, state, timers, types};
use crate::config::SandboxLimits;
use crate::error::{CallErrorKind, HostTrap, Violation};
use crate::sandbox::{HasSandbox, Sandbox};
use crate::slots::KeySlots;

mod json_batch;

/// Longest state or side-output name.
const MAX_NAME_BYTES: usize = 256;

type ImportResult<T> = wasmtime::Result<T>;

fn trap(v: Violation) -> wasmtime::Error {
    wasmtime::Error::new(HostTrap::from(v))
}

fn limit(what: &'static str, limit: usize, actual: usize) -> ImportResult<()> {
    if actual > limit { Err(trap(Violation::Limit { what, limit, actual })) } else { Ok(()) }
}

/// What each `list<u8>` of a whole-state read costs the guest beyond its bytes: the pointer
/// and length the canonical ABI writes for it into guest memory.
const DESCRIPTOR_BYTES: usize = 8;

/// A whole list or map being copied out for the guest, cut off at `limit` bytes so a guest
/// cannot make the host materialize a state of any size in one call. The scan runs to the
/// end (backends cannot stop one early) but copies nothing past the limit, and the error
/// reports the whole size.
struct BoundedRead<T> {
    what: &'static str,
    limit: usize,
    bytes: usize,
    items: Vec<T>,
}

impl<T> BoundedRead<T> {
    fn new(what: &'static str, limit: usize) -> Self {
        Self { what, limit, bytes: 0, items: Vec::new() }
    }

    fn push(&mut self, bytes: usize, item: impl FnOnce() -> T) {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes <= self.limit {
            self.items.push(item());
        }
    }

    fn finish(self) -> ImportResult<Vec<T>> {
        limit(self.what, self.limit, self.bytes)?;
        Ok(self.items)
    }
}

/// Records emitted during one call.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Output {
    /// The main output.
    pub main: RecordBatch,
    /// Side outputs by name, in declaration order (only those declared).
    pub side: Vec<(String, RecordBatch)>,
}

impl Output {
    /// The records of side output `name`, if it was declared.
    pub fn side(&self, name: &str) -> Option<&RecordBatch> {
        self.side.iter().find(|(n, _)| n == name).map(|(_, b)| b)
    }
}

/// The keys of the current call: handle `i` is record (or timer) `i`, hashed once.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    data: Vec<u8>,
    /// (hash, key group, start, len) per handle.
    entries: Vec<Option<(u64, KeyGroup, usize, usize)>>,
    /// What the call is, for error messages about a missing key.
    context: &'static str,
}

impl KeyTable {
    pub(crate) fn clear(&mut self, context: &'static str) {
        self.data.clear();
        self.entries.clear();
        self.context = context;
    }

    fn push(&mut self, key: Option<HashedKey<'_>>) {
        let entry = key.map(|k| {
            let start = self.data.len();
            self.data.extend_from_slice(k.bytes);
            (k.hash, k.group, start, k.bytes.len())
        });
        self.entries.push(entry);
    }

    /// The export whose keys these are ("process", "on-timer", ...).
    pub(crate) fn call(&self) -> &'static str {
        self.context
    }

    /// Each handle's key bytes, `None` for a record without a key.
    fn iter(&self) -> impl Iterator<Item = Option<&[u8]>> {
        self.entries.iter().map(|e| e.map(|(_, _, start, len)| &self.data[start..start + len]))
    }

    fn get(&self, handle: u32) -> ImportResult<HashedKey<'_>> {
        match self.entries.get(handle as usize) {
            Some(Some((hash, group, start, len))) => {
                Ok(HashedKey { bytes: &self.data[*start..*start + *len], hash: *hash, group: *group })
            }
            Some(None) => Err(trap(Violation::NoKey { call: self.context, record: Some(handle) })),
            None if self.entries.is_empty() => Err(trap(Violation::NoKey { call: self.context, record: None })),
            None => Err(trap(Violation::BadKeyHandle { handle, records: self.entries.len() })),
        }
    }
}

#[derive(Debug)]
struct Declared {
    name: String,
    /// [`state_id`] of the name: what state keys carry.
    id: StateId,
    kind: state::StateKind,
}

/// The keyed part of an operator instance's store.
pub(crate) struct Keyed {
    limits: SandboxLimits,
    pub(crate) backend: Box<dyn StateBackend>,
    pub(crate) timers: Box<dyn TimerService>,
    key_groups: KeyGroupRange,
    max_parallelism: u32,
    states: Vec<Declared>,
    /// Value states whose values travel with each batch, ascending ids.
    prefetch: Vec<u32>,
    side_outputs: Vec<String>,
    by_name: HashMap<String, u32>,
    pub(crate) keys: KeyTable,
    key_buf: StateKey,
    /// Item keys of list state, reused across appends.
    list_keys: ListKeys,
    pub(crate) output: Output,
    output_bytes: usize,
    /// The `process` call's batch (the last one's between calls, whose buffers the next one
    /// reuses): shared with the call for as long as it runs, so `json-batch` can read it.
    pub(crate) batch: Arc<CallBatch>,
    /// Whether the guest reads its batch through `json-batch`, which reads the bytes here.
    pub(crate) reads_json_batch: bool,
}

/// A `process` call's batch as the host builds it; the call lends it to the guest. `data`
/// holds the records' bytes only when they must be copied: prefetched state values follow
/// them, or the guest reads the batch through `json-batch`. Otherwise the call lends the
/// input batch's own bytes, one copy fewer per call.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallBatch {
    pub(crate) data: Vec<u8>,
    /// Whether `data` holds the records' bytes (else they are the input batch's).
    pub(crate) holds_records: bool,
    pub(crate) records: Vec<u8>,
    pub(crate) prefetched_states: Vec<u32>,
    pub(crate) prefetched: Vec<u8>,
}

impl CallBatch {
    /// The batch as the guest gets it; `input` is the batch it was built from.
    pub(crate) fn lend<'a>(&'a self, input: &'a RecordBatch) -> types::Batch<'a> {
        types::Batch {
            data: if self.holds_records { &self.data } else { input.parts().0 },
            records: &self.records,
            prefetched_states: &self.prefetched_states,
            prefetched: &self.prefetched,
        }
    }
}

impl Keyed {
    pub(crate) fn new(
        limits: SandboxLimits,
        backend: Box<dyn StateBackend>,
        timers: Box<dyn TimerService>,
        key_groups: KeyGroupRange,
        max_parallelism: u32,
    ) -> Self {
        Self {
            limits,
            backend,
            timers,
            key_groups,
            max_parallelism,
            states: Vec::new(),
            prefetch: Vec::new(),
            side_outputs: Vec::new(),
            by_name: HashMap::new(),
            keys: KeyTable::default(),
            key_buf: StateKey::default(),
            list_keys: ListKeys::default(),
            output: Output::default(),
            output_bytes: 0,
            batch: Arc::default(),
            reads_json_batch: false,
        }
    }

    /// Resets per-call output accounting.
    pub(crate) fn begin_call(&mut self) {
        self.output_bytes = 0;
    }

    /// Builds the WIT batch for `process`: loads the call's keys (a record of a key group this
    /// subtask does not own is a routing bug upstream and never reaches the guest), numbers
    /// their key slots and appends the prefetched state values, looked up once per distinct
    /// key, to the batch's buffer.
    /// Fills `wit` (the previous call's, so its buffers are reused) with `batch` for the guest.
    pub(crate) fn batch_for_guest(&mut self, batch: &RecordBatch, wit: &mut CallBatch) -> Result<(), CallErrorKind> {
        self.keys.clear("process");
        let (data, metas) = batch.parts();
        let columns = self.prefetch.len();
        let CallBatch { data: out, holds_records, records, prefetched_states, prefetched } = wit;
        out.clear();
        *holds_records = columns > 0 || self.reads_json_batch;
        if *holds_records {
            out.extend_from_slice(data);
        }
        records.clear();
        records.reserve(metas.len() * Row::BYTES);
        prefetched.clear();
        prefetched.reserve(metas.len() * columns * <Option<Span>>::BYTES);
        prefetched_states.clone_from(&self.prefetch);
        let mut slots = KeySlots::with_capacity(metas.len());
        for (i, meta) in metas.iter().enumerate() {
            let index = u32::try_from(i).map_err(|_| CallErrorKind::Internal("batch of over 4G records".into()))?;
            // Only the key is read here: slicing the value too cost q0 2.5% of its CPU.
            let Some(key) = meta.key.map(|k| &data[k.range()]) else {
                self.keys.push(None);
                (0..columns).for_each(|_| None::<Span>.write(prefetched));
                crate::instance::row_of(meta, index).write(records);
                continue;
            };
            let hashed = HashedKey::with_hash(key, key_hash(key), self.max_parallelism);
            if !self.key_groups.contains(hashed.group) {
                return Err(CallErrorKind::Internal(format!(
                    "record {i} has key group {}, outside this subtask's range {}..={}",
                    hashed.group, self.key_groups.start, self.key_groups.end
                )));
            }
            self.keys.push(Some(hashed));
            let slot = slots.slot(key, hashed.hash, index);
            if slot == index {
                for &state in &self.prefetch {
                    let id = self.states[state as usize].id;
                    let start = out.len();
                    let found = self
                        .backend
                        .read_into(self.key_buf.encode(hashed, id, b""), out)
                        .map_err(|e| CallErrorKind::State(e.to_string()))?;
                    let span = match found {
                        true => Some(Span::tail_of(out, start).ok_or_else(|| {
                            CallErrorKind::Internal("batch with prefetched state exceeds 4 GiB".into())
                        })?),
                        false => None,
                    };
                    span.write(prefetched);
                }
            } else {
                // The same key as an earlier record: its values, without another lookup.
                let row = slot as usize * columns * <Option<Span>>::BYTES;
                prefetched.extend_from_within(row..row + columns * <Option<Span>>::BYTES);
            }
            crate::instance::row_of(meta, slot).write(records);
        }
        Ok(())
    }

    pub(crate) fn load_timer_keys(&mut self, fired: &[FiredTimer]) {
        self.keys.clear("on-timer");
        for t in fired {
            let hashed = HashedKey::new(&t.key, self.max_parallelism);
            debug_assert_eq!(hashed.group, t.key_group, "a timer's key group is its key's");
            self.keys.push(Some(hashed));
        }
    }

    /// Runs `f` on the backend with the state key for `state`/`handle` (and a map key),
    /// after checking the declaration and the handle.
    fn with_state_key<R>(
        &mut self,
        state: u32,
        expect: Option<state::StateKind>,
        handle: u32,
        map_key: Option<&[u8]>,
        f: impl FnOnce(&mut dyn StateBackend, &[u8], state::StateKind) -> Result<R, StateError>,
    ) -> ImportResult<R> {
        let Keyed { states, keys, key_buf, backend, .. } = self;
        let declared = states
            .get(state as usize)
            .ok_or_else(|| trap(Violation::BadDeclaration(format!("state id {state} was never declared"))))?;
        if let Some(expect) = expect
            && declared.kind != expect
        {
            return Err(trap(Violation::BadDeclaration(format!(
                "state `{}` is declared as {:?} but used as {:?}",
                declared.name, declared.kind, expect
            ))));
        }
        let key = keys.get(handle)?;
        let state_key = match map_key {
            None => key_buf.encode(key, declared.id, b""),
            Some(m) => key_buf.encode_map_entry(key, declared.id, b"", m),
        };
        f(backend.as_mut(), state_key, declared.kind).map_err(|e| wasmtime::Error::new(HostTrap::from(e)))
    }

    fn put_value(&mut self, state: u32, handle: u32, value: &[u8]) -> ImportResult<()> {
        limit("state value bytes", self.limits.max_value_bytes, value.len())?;
        self.with_state_key(state, Some(state::StateKind::Value), handle, None, |b, k, _| b.put(k, value))
    }

    fn declare(&mut self, name: String, declared_kind: Option<state::StateKind>, prefetch: bool) -> ImportResult<u32> {
        limit("state or side-output name bytes", MAX_NAME_BYTES, name.len())?;
        let qualified = match declared_kind {
            Some(_) => format!("state:{name}"),
            None => format!("output:{name}"),
        };
        if let Some(id) = self.by_name.get(&qualified) {
            if let Some(kind) = declared_kind
                && self.states[*id as usize].kind != kind
            {
                return Err(trap(Violation::BadDeclaration(format!(
                    "state `{name}` declared again with another kind ({:?}, first {:?})",
                    kind, self.states[*id as usize].kind
                ))));
            }
            return Ok(*id);
        }
        limit("declared states and side outputs", self.limits.max_declarations, self.by_name.len() + 1)?;
        let id = match declared_kind {
            Some(kind) => {
                let id = state_id(&name);
                if let Some(other) = self.states.iter().find(|d| d.id == id) {
                    return Err(trap(Violation::BadDeclaration(format!(
                        "states `{name}` and `{}` share the state id {id} (a hash of the name); rename one",
                        other.name
                    ))));
                }
                self.states.push(Declared { name, id, kind });
                let id = self.states.len() as u32 - 1;
                if prefetch && kind == state::StateKind::Value {
                    self.prefetch.push(id);
                }
                id
            }
            None => {
                self.output.side.push((name.clone(), RecordBatch::default()));
                self.side_outputs.push(name);
                self.side_outputs.len() as u32
            }
        };
        self.by_name.insert(qualified, id);
        Ok(id)
    }

    /// The declared states, in declaration order.
    pub(crate) fn declared_states(&self) -> Vec<eddy_state::DeclaredState> {
        let kind = |k: state::StateKind| match k {
            state::StateKind::Value => eddy_state::StateKind::Value,
            state::StateKind::List => eddy_state::StateKind::List,
            state::StateKind::Map => eddy_state::StateKind::Map,
        };
        self.states.iter().map(|d| eddy_state::DeclaredState { name: d.name.clone(), kind: kind(d.kind) }).collect()
    }

    /// Takes the call's output, leaving empty side-output slots in place.
    pub(crate) fn take_output(&mut self) -> Output {
        let side = self.side_outputs.iter().map(|n| (n.clone(), RecordBatch::default())).collect();
        std::mem::replace(&mut self.output, Output { main: RecordBatch::default(), side })
    }

    pub(crate) fn discard_output(&mut self) {
        self.output.main.clear();
        for (_, b) in &mut self.output.side {
            b.clear();
        }
    }
}

/// Store data of an operator instance.
pub(crate) struct OperatorHost {
    pub(crate) sandbox: Sandbox,
    pub(crate) keyed: Keyed,
}

impl HasSandbox for OperatorHost {
    fn sandbox(&mut self) -> &mut Sandbox {
        &mut self.sandbox
    }
}

impl WasiView for OperatorHost {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.sandbox.ctx()
    }
}

impl types::Host for OperatorHost {}

crate::schemas::schemas_host!(OperatorHost);

use state::StateKind::{List, Map, Value};

impl state::Host for OperatorHost {
    fn declare(&mut self, name: String, kind: state::StateKind, prefetch: bool) -> ImportResult<u32> {
        self.keyed.declare(name, Some(kind), prefetch)
    }

    fn value_set_many(&mut self, data: Vec<u8>, writes: Vec<u8>) -> ImportResult<()> {
        for (index, w) in table::<ValueWrite>(&writes)?.iter().enumerate() {
            match w.value {
                Some(span) => {
                    let value = span_bytes(&data, span, "value write", index)?;
                    self.keyed.put_value(w.state, w.key, value)?;
                }
                None => self.keyed.with_state_key(w.state, Some(Value), w.key, None, |b, k, _| b.delete(k))?,
            }
        }
        Ok(())
    }

    fn value_get(&mut self, state: u32, key: u32) -> ImportResult<Option<Vec<u8>>> {
        self.keyed.with_state_key(state, Some(Value), key, None, |b, k, _| b.get(k))
    }

    fn value_set(&mut self, state: u32, key: u32, value: Vec<u8>) -> ImportResult<()> {
        self.keyed.put_value(state, key, &value)
    }

    fn list_get(&mut self, state: u32, key: u32) -> ImportResult<Vec<Vec<u8>>> {
        let mut read = BoundedRead::new("list-get result bytes", self.keyed.limits.max_state_read_bytes);
        self.keyed.with_state_key(state, Some(List), key, None, |b, k, _| {
            list_for_each(b, k, &mut |item| read.push(item.len() + DESCRIPTOR_BYTES, || item.to_vec()))
        })?;
        read.finish()
    }

    fn list_append(&mut self, state: u32, key: u32, item: Vec<u8>) -> ImportResult<()> {
        limit("state value bytes", self.keyed.limits.max_value_bytes, item.len())?;
        // Taken out for the call: `with_state_key` borrows the rest of `Keyed`.
        let mut list_keys = std::mem::take(&mut self.keyed.list_keys);
        let appended = self.keyed.with_state_key(state, Some(List), key, None, |b, k, _| list_keys.append(b, k, &item));
        self.keyed.list_keys = list_keys;
        appended
    }

    fn list_replace(&mut self, state: u32, key: u32, items: Vec<Vec<u8>>) -> ImportResult<()> {
        let limits = &self.keyed.limits;
        for item in &items {
            limit("state value bytes", limits.max_value_bytes, item.len())?;
        }
        // A list the guest could not read back in one `list-get` is refused when written.
        let bytes = items.iter().map(|i| i.len() + DESCRIPTOR_BYTES).sum();
        limit("list-replace bytes", limits.max_state_read_bytes, bytes)?;
        let mut list_keys = std::mem::take(&mut self.keyed.list_keys);
        let replaced =
            self.keyed.with_state_key(state, Some(List), key, None, |b, k, _| list_keys.replace(b, k, &items));
        self.keyed.list_keys = list_keys;
        replaced
    }

    fn map_get(&mut self, state: u32, key: u32, map_key: Vec<u8>) -> ImportResult<Option<Vec<u8>>> {
        limit("map key bytes", self.keyed.limits.max_key_bytes, map_key.len())?;
        self.keyed.with_state_key(state, Some(Map), key, Some(&map_key), |b, k, _| b.get(k))
    }

    fn map_put(&mut self, state: u32, key: u32, map_key: Vec<u8>, value: Vec<u8>) -> ImportResult<()> {
        limit("map key bytes", self.keyed.limits.max_key_bytes, map_key.len())?;
        limit("state value bytes", self.keyed.limits.max_value_bytes, value.len())?;
        self.keyed.with_state_key(state, Some(Map), key, Some(&map_key), |b, k, _| b.put(k, &value))
    }

    fn map_remove(&mut self, state: u32, key: u32, map_key: Vec<u8>) -> ImportResult<()> {
        limit("map key bytes", self.keyed.limits.max_key_bytes, map_key.len())?;
        self.keyed.with_state_key(state, Some(Map), key, Some(&map_key), |b, k, _| b.delete(k))
    }

    fn map_entries(&mut self, state: u32, key: u32) -> ImportResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut read = BoundedRead::new("map-entries result bytes", self.keyed.limits.max_state_read_bytes);
        self.keyed.with_state_key(state, Some(Map), key, None, |b, prefix, _| {
            b.scan_prefix(prefix, &mut |k, v| {
                let map_key = &k[prefix.len()..];
                read.push(map_key.len() + v.len() + 2 * DESCRIPTOR_BYTES, || (map_key.to_vec(), v.to_vec()));
            })
        })?;
        read.finish()
    }

    fn clear(&mut self, state: u32, key: u32) -> ImportResult<()> {
        // Lists and maps are an entry per item under the state's key (see `eddy_state::ListKeys`).
        self.keyed.with_state_key(state, None, key, None, |b, k, kind| match kind {
            Map | List => b.delete_prefix(k),
            Value => b.delete(k),
        })
    }
}

fn domain(d: types::TimeDomain) -> TimeDomain {
    match d {
        types::TimeDomain::EventTime => TimeDomain::EventTime,
        types::TimeDomain::ProcessingTime => TimeDomain::ProcessingTime,
    }
}

impl timers::Host for OperatorHost {
    fn register_timer(&mut self, key: u32, d: types::TimeDomain, timestamp: i64) -> ImportResult<()> {
        let k = &mut self.keyed;
        let HashedKey { bytes: key, group, .. } = k.keys.get(key)?;
        let (d, limits) = (domain(d), &k.limits);
        let (held, held_by_key) = (k.timers.len(), k.timers.len_of_key(group, key));
        // At a limit, registering a timer that exists already is still allowed (it adds nothing).
        let at_limit = held >= limits.max_timers || held_by_key >= limits.max_timers_per_key;
        if at_limit && !k.timers.contains(d, group, key, timestamp) {
            limit("registered timers", limits.max_timers, held + 1)?;
            limit("registered timers of one key", limits.max_timers_per_key, held_by_key + 1)?;
        }
        k.timers.register(d, group, key, timestamp);
        Ok(())
    }

    fn delete_timer(&mut self, key: u32, d: types::TimeDomain, timestamp: i64) -> ImportResult<()> {
        let k = &mut self.keyed;
        let HashedKey { bytes: key, group, .. } = k.keys.get(key)?;
        k.timers.delete(domain(d), group, key, timestamp);
        Ok(())
    }

    fn current_watermark(&mut self) -> ImportResult<i64> {
        Ok(self.keyed.timers.current_watermark())
    }

    fn current_processing_time(&mut self) -> ImportResult<i64> {
        Ok(self.keyed.timers.current_processing_time())
    }
}

/// A guest's packed table, or a trap naming what is malformed.
fn table<T: Packed>(bytes: &[u8]) -> ImportResult<Table<'_, T>> {
    Table::new(bytes).map_err(|e| trap(Violation::MalformedTable(e)))
}

fn span_bytes<'a>(data: &'a [u8], span: Span, what: &'static str, index: usize) -> ImportResult<&'a [u8]> {
    span.slice(data).ok_or_else(|| trap(Violation::BadSpan { what, index }))
}

impl output::Host for OperatorHost {
    fn side_output(&mut self, name: String) -> ImportResult<u32> {
        self.keyed.declare(name, None, false)
    }

    /// Every row is resolved and checked, and what copying them all would cost is charged,
    /// before anything is copied: rows may all point at one span of the buffer, so the host
    /// may be asked to copy far more than the guest sent.
    fn emit(&mut self, records: types::OutputBatch) -> ImportResult<()> {
        let k = &mut self.keyed;
        let types::OutputBatch { data, records: rows } = records;
        let table = table::<Row>(&rows)?;
        let Resolved { metas, copied, all_main } = resolve_rows(&table, &data, &k.limits, k.output.side.len())?;
        k.output_bytes = k.output_bytes.saturating_add(copied);
        // Within a batch's span range too, so the copies below cannot be refused.
        let allowed = k.limits.max_output_bytes_per_call.min(MAX_BATCH_BYTES);
        limit("output bytes in one call", allowed, k.output_bytes)?;
        // The usual case, a call's whole output in one `emit` to the main output, keeps the
        // lifted buffer as the output batch instead of copying it record by record, unless
        // most of it is bytes no record refers to.
        let adoptable = k.output.main.is_empty()
            && all_main
            && data.len() <= copied.saturating_mul(2).saturating_add(ADOPT_SLACK_BYTES)
            && data.len() <= MAX_BATCH_BYTES;
        if adoptable {
            // Every span was checked above, and the size: a refusal here is a host bug.
            k.output.main = RecordBatch::adopt(data, metas)
                .map_err(|_| wasmtime::Error::msg("host bug: a checked output buffer was not adoptable"))?;
            return Ok(());
        }
        for (i, r) in table.iter().enumerate() {
            let key = r.key.map(|s| span_bytes(&data, s, "emitted record", i)).transpose()?;
            let value = span_bytes(&data, r.value, "emitted record", i)?;
            let target = match r.tag {
                0 => &mut k.output.main,
                n => match k.output.side.get_mut(n as usize - 1) {
                    Some((_, batch)) => batch,
                    None => return Err(undeclared_output(n)),
                },
            };
            target.try_push(key, value, r.timestamp).map_err(|full| {
                trap(Violation::Limit {
                    what: "output bytes in one call",
                    limit: MAX_BATCH_BYTES,
                    actual: full.held.saturating_add(full.adding),
                })
            })?;
        }
        Ok(())
    }
}

/// Bytes an adopted output buffer may hold beyond twice what its records refer to.
const ADOPT_SLACK_BYTES: usize = 4096;

fn core_span(s: Span) -> eddy_core::Span {
    eddy_core::Span { offset: s.offset, len: s.len }
}

/// What the host holds per emitted record beyond its bytes.
const EMITTED_ROW_BYTES: usize = std::mem::size_of::<RecordMeta>();

/// An output batch's rows, checked.
struct Resolved {
    /// Where each record lies in the buffer.
    metas: Vec<RecordMeta>,
    /// What copying every record into the call's output costs the host.
    copied: usize,
    /// Whether every record goes to the main output.
    all_main: bool,
}

fn undeclared_output(id: u32) -> wasmtime::Error {
    trap(Violation::BadDeclaration(format!("side output id {id} was never declared")))
}

/// The rows of an output batch, each checked against its buffer, the size limits and the
/// declared side outputs (`side_outputs` of them), in one pass.
fn resolve_rows(
    table: &Table<'_, Row>,
    data: &[u8],
    limits: &SandboxLimits,
    side_outputs: usize,
) -> ImportResult<Resolved> {
    let mut resolved = Resolved { metas: Vec::with_capacity(table.len()), copied: 0, all_main: true };
    for (i, r) in table.iter().enumerate() {
        let key = r.key.map(|s| span_bytes(data, s, "emitted record", i)).transpose()?.map_or(0, <[u8]>::len);
        let value = span_bytes(data, r.value, "emitted record", i)?.len();
        limit("emitted key bytes", limits.max_key_bytes, key)?;
        limit("emitted value bytes", limits.max_value_bytes, value)?;
        if r.tag as usize > side_outputs {
            return Err(undeclared_output(r.tag));
        }
        resolved.copied = resolved.copied.saturating_add(key + value + EMITTED_ROW_BYTES);
        resolved.all_main &= r.tag == 0;
        resolved.metas.push(RecordMeta {
            key: r.key.map(core_span),
            value: core_span(r.value),
            timestamp: r.timestamp,
        });
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use eddy_core::HeapTimerService;
    use eddy_state::HeapStateBackend;

    use super::*;

    fn keyed() -> Keyed {
        Keyed::new(
            SandboxLimits::default(),
            Box::new(HeapStateBackend::default()),
            Box::new(HeapTimerService::default()),
            KeyGroupRange::all(128),
            128,
        )
    }

    /// Two names whose state ids collide, found by search (about 80 000 names on average).
    fn colliding_names() -> (String, String) {
        let mut seen = HashMap::new();
        for i in 0u64.. {
            let name = format!("state-{i}");
            if let Some(first) = seen.insert(state_id(&name), name.clone()) {
                return (first, name);
            }
        }
        unreachable!()
    }

    #[test]
    fn a_call_lends_the_input_batchs_bytes_unless_it_must_hold_a_copy() {
        let mut input = RecordBatch::default();
        input.try_push(Some(b"\"k\""), b"v1", Some(1)).expect("fits");
        input.try_push(None, b"v2", None).expect("fits");
        let lent_bytes = |k: &mut Keyed| {
            let mut call = CallBatch::default();
            k.batch_for_guest(&input, &mut call).expect("batch");
            let lent = call.lend(&input);
            let same = std::ptr::eq(lent.data.as_ptr(), input.parts().0.as_ptr());
            (same, lent.data.to_vec(), lent.records.len())
        };
        let mut k = keyed();
        let (same, bytes, rows) = lent_bytes(&mut k);
        assert!(same, "no prefetch and no json-batch: the input's own bytes");
        assert_eq!((bytes.as_slice(), rows), (input.parts().0, 2 * Row::BYTES));
        // A JSON guest reads the call's bytes through `json-batch`, from the host's copy.
        k.reads_json_batch = true;
        let (same, bytes, _) = lent_bytes(&mut k);
        assert!(!same && bytes == input.parts().0, "a copy of the input's bytes");
        // Prefetched values follow the records' bytes, so those are copied too.
        let mut k = keyed();
        k.declare("s".into(), Some(state::StateKind::Value), true).expect("declare");
        let (same, bytes, _) = lent_bytes(&mut k);
        assert!(!same && bytes.starts_with(input.parts().0), "the input's bytes, then prefetched values");
    }

    #[test]
    fn emitted_rows_resolve_to_where_they_lie_what_copying_costs_and_where_they_go() {
        let data = b"k1value-one";
        let rows = [
            Row {
                key: Some(Span { offset: 0, len: 2 }),
                value: Span { offset: 2, len: 9 },
                timestamp: Some(5),
                tag: 0,
            },
            Row { key: None, value: Span { offset: 2, len: 5 }, timestamp: None, tag: 1 },
        ];
        let mut packed = Vec::new();
        rows.iter().for_each(|r| r.write(&mut packed));
        let rows = table::<Row>(&packed).expect("table");
        let limits = SandboxLimits::default();
        let span = |offset, len| eddy_core::Span { offset, len };
        let resolved = resolve_rows(&rows, data, &limits, 1).expect("resolved");
        assert_eq!(
            resolved.metas,
            [
                RecordMeta { key: Some(span(0, 2)), value: span(2, 9), timestamp: Some(5) },
                RecordMeta { key: None, value: span(2, 5), timestamp: None },
            ]
        );
        assert_eq!(resolved.copied, 2 + 9 + 5 + 2 * std::mem::size_of::<RecordMeta>());
        assert!(!resolved.all_main, "the second row goes to side output 1");
        let main_only = table::<Row>(&packed[..Row::BYTES]).expect("table");
        assert!(resolve_rows(&main_only, data, &limits, 0).expect("resolved").all_main);
        let refused = |data: &[u8], sides| resolve_rows(&rows, data, &limits, sides).err().map(|e| e.to_string());
        assert!(refused(data, 0).is_some_and(|e| e.contains("never declared")), "side output 1 undeclared");
        assert!(refused(&data[..10], 1).is_some(), "a value past the end of the buffer");
    }

    #[test]
    fn two_state_names_sharing_an_id_are_refused_naming_both() {
        let (a, b) = colliding_names();
        let mut k = keyed();
        let id = k.declare(a.clone(), Some(state::StateKind::Value), false).expect("first");
        assert_eq!(k.declare(a.clone(), Some(state::StateKind::Value), false).expect("again"), id);
        let err = k.declare(b.clone(), Some(state::StateKind::Map), false).expect_err("collision").to_string();
        assert!(err.contains(&a) && err.contains(&b) && err.contains("rename"), "{err}");
        // Distinct ids are fine.
        k.declare("other".into(), Some(state::StateKind::Value), false).expect("distinct");
    }
}
