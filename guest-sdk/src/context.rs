//! What an operator can do while it handles a call: emit records, use timers, read time.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::state::ValueWrite;
use crate::bindings::types::{OutputBatch, OutputRef, Span};
use crate::bindings::{output, timers};
use crate::record::{TimeDomain, slice};
use crate::state::{ListState, MapState, ValueState};
use crate::{Error, Result, codec};

/// Output is handed to the host in one crossing per call, or earlier once this much is buffered.
const OUTPUT_FLUSH_BYTES: usize = 1 << 20;

/// The record (or timer) being handled: its key handle, where its key bytes are in the call's
/// buffer, and its row in the prefetch table (records only).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Current {
    pub(crate) handle: u32,
    pub(crate) key: Span,
    pub(crate) row: Option<usize>,
}

/// What the current call brought in: its buffer and the prefetched state values.
#[derive(Default)]
struct Scope {
    data: Rc<Vec<u8>>,
    prefetched_states: Vec<u32>,
    prefetched: Vec<Option<Span>>,
    current: Option<Current>,
}

/// A value-state write not yet handed to the host: (key handle, value or `None` = cleared).
type Pending = (u32, Option<Vec<u8>>);
/// Pending writes by state id, then by key bytes.
type Writes = HashMap<u32, HashMap<Vec<u8>, Pending, FxBuild>, FxBuild>;

thread_local! {
    static SCOPE: RefCell<Scope> = RefCell::new(Scope::default());
    /// Value-state writes of this call, by state id and key bytes; applied in one crossing
    /// when the call ends, so later records of the same key read them back from here.
    static WRITES: RefCell<Writes> = RefCell::new(HashMap::default());
    static OUTPUT: RefCell<OutputBatch> = const { RefCell::new(OutputBatch { data: Vec::new(), records: Vec::new() }) };
}

/// A fast, non-cryptographic hasher for the write buffer (keys come from the host, and the
/// map lives for one call, so flooding is not a concern).
#[derive(Default, Clone, Copy)]
pub(crate) struct FxBuild;

impl BuildHasher for FxBuild {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher(0)
    }
}

pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        // The multiply in `write` leaves low bits depending only on low input bits, and keys
        // often differ only in their middle bytes; hashbrown indexes buckets by low bits, so
        // finish with a full avalanche (murmur3's fmix64).
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
}

/// Starts a call: `data` is the call's buffer (batch or timers).
pub(crate) fn begin_scope(data: Rc<Vec<u8>>, prefetched_states: Vec<u32>, prefetched: Vec<Option<Span>>) {
    SCOPE.set(Scope { data, prefetched_states, prefetched, current: None });
}

pub(crate) fn set_current(current: Option<Current>) {
    SCOPE.with_borrow_mut(|s| s.current = current);
}

pub(crate) fn current_key() -> Result<u32> {
    SCOPE.with_borrow(|s| s.current.map(|c| c.handle)).ok_or_else(no_key)
}

fn no_key() -> Error {
    Error::failed("keyed state used outside process/on_timer, or on a record without a key")
}

fn key_bytes(scope: &Scope, current: Current) -> Result<&[u8]> {
    slice(&scope.data, current.key)
}

/// Reads value state `state` for the current key and hands the bytes to `f`: this call's own
/// writes first, then the prefetched value, else one crossing to the host.
pub(crate) fn with_value<R>(state: u32, f: impl FnOnce(Option<&[u8]>) -> Result<R>) -> Result<R> {
    SCOPE.with_borrow(|scope| {
        let current = scope.current.ok_or_else(no_key)?;
        let key = key_bytes(scope, current)?;
        let mut f = Some(f);
        // `f` only decodes bytes; it cannot reach WRITES, so calling it under the borrow is safe.
        let pending = WRITES.with_borrow(|w| {
            let (_, value) = w.get(&state)?.get(key)?;
            f.take().map(|f| f(value.as_deref()))
        });
        if let Some(result) = pending {
            return result;
        }
        let Some(f) = f else { return Err(Error::failed("state read consumed twice")) };
        let column = scope.prefetched_states.iter().position(|&s| s == state);
        if let (Some(row), Some(column)) = (current.row, column) {
            let span = scope.prefetched.get(row * scope.prefetched_states.len() + column).copied().flatten();
            return f(span.map(|s| slice(&scope.data, s)).transpose()?);
        }
        f(crate::bindings::state::value_get(state, current.handle).as_deref())
    })
}

/// Buffers a write (or, with `None`, a clear) of value state `state` for the current key.
pub(crate) fn value_put(state: u32, value: Option<Vec<u8>>) -> Result<()> {
    SCOPE.with_borrow(|scope| {
        let current = scope.current.ok_or_else(no_key)?;
        let key = key_bytes(scope, current)?.to_vec();
        WRITES.with_borrow_mut(|w| w.entry(state).or_default().insert(key, (current.handle, value)));
        Ok(())
    })
}

/// Hands this call's value-state writes to the host in one crossing.
pub(crate) fn flush_state() {
    let writes: Vec<ValueWrite> = WRITES.with_borrow_mut(|w| {
        w.iter_mut()
            .flat_map(|(&state, m)| m.drain().map(move |(_, (key, value))| ValueWrite { state, key, value }))
            .collect()
    });
    if !writes.is_empty() {
        crate::bindings::state::value_set_many(&writes);
    }
}

/// Forgets this call's buffered state writes: a failed call's writes must not land.
pub(crate) fn discard_state() {
    WRITES.with_borrow_mut(HashMap::clear);
}

/// Sends buffered output to the host. Called at the end of every call.
pub(crate) fn flush_output() {
    OUTPUT.with_borrow_mut(|out| {
        if !out.records.is_empty() {
            output::emit(out);
            out.records.clear();
            out.data.clear();
        }
    });
}

/// Forgets buffered output: a failed call's output must not escape.
pub(crate) fn discard_output() {
    OUTPUT.with_borrow_mut(|out| {
        out.records.clear();
        out.data.clear();
    });
}

fn span_at(data: &[u8], offset: usize) -> Result<Span> {
    let too_big = || Error::failed("output of one call exceeds 4 GiB");
    let len = data.len() - offset;
    Ok(Span { offset: u32::try_from(offset).map_err(|_| too_big())?, len: u32::try_from(len).map_err(|_| too_big())? })
}

fn encoded<T: Serialize + ?Sized>(data: &mut Vec<u8>, value: &T) -> Result<Span> {
    let offset = data.len();
    codec::encode_into(data, value)?;
    span_at(data, offset)
}

fn raw(data: &mut Vec<u8>, bytes: &[u8]) -> Result<Span> {
    let offset = data.len();
    data.extend_from_slice(bytes);
    span_at(data, offset)
}

/// Appends one record to the output buffer; `write` puts its key and value bytes in `data`.
fn push_output(
    output: u32,
    timestamp: Option<i64>,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(Option<Span>, Span)>,
) -> Result<()> {
    let full = OUTPUT.with_borrow_mut(|out| -> Result<bool> {
        let (key, value) = write(&mut out.data)?;
        out.records.push(OutputRef { output, key, value, timestamp });
        Ok(out.data.len() >= OUTPUT_FLUSH_BYTES)
    })?;
    if full {
        flush_output();
    }
    Ok(())
}

/// A named side output, declared in `open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SideOutput(u32);

/// Declares states and side outputs; handed to `open`.
#[derive(Debug)]
pub struct OpenContext {
    _private: (),
}

impl OpenContext {
    pub(crate) fn new() -> Self {
        Self { _private: () }
    }

    /// Declares a value state named `name`, read for most records: its values for a batch's
    /// keys come with the batch (no crossing per read).
    pub fn value_state<T: Serialize + DeserializeOwned>(&mut self, name: &str) -> ValueState<T> {
        ValueState::declare(name, true)
    }

    /// Declares a value state read only now and then: read on demand, not prefetched.
    pub fn rare_value_state<T: Serialize + DeserializeOwned>(&mut self, name: &str) -> ValueState<T> {
        ValueState::declare(name, false)
    }

    /// Declares a list state named `name`.
    pub fn list_state<T: Serialize + DeserializeOwned>(&mut self, name: &str) -> ListState<T> {
        ListState::declare(name)
    }

    /// Declares a map state named `name`.
    pub fn map_state<K, V>(&mut self, name: &str) -> MapState<K, V>
    where
        K: Serialize + DeserializeOwned,
        V: Serialize + DeserializeOwned,
    {
        MapState::declare(name)
    }

    /// Declares a named side output.
    pub fn side_output(&mut self, name: &str) -> SideOutput {
        SideOutput(output::side_output(name))
    }
}

/// Handed to `process`, `on_timer` and `close`.
#[derive(Debug)]
pub struct Context {
    timestamp: Option<i64>,
}

impl Context {
    pub(crate) fn new(timestamp: Option<i64>) -> Self {
        Self { timestamp }
    }

    /// Timestamp of the record or timer being handled; emitted records inherit it.
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// Emits a keyed record to the main output, with the current timestamp.
    pub fn emit<K: Serialize + ?Sized, V: Serialize + ?Sized>(&mut self, key: &K, value: &V) -> Result<()> {
        push_output(0, self.timestamp, |d| Ok((Some(encoded(d, key)?), encoded(d, value)?)))
    }

    /// Emits a record without a key to the main output, with the current timestamp.
    pub fn emit_value<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<()> {
        push_output(0, self.timestamp, |d| Ok((None, encoded(d, value)?)))
    }

    /// Emits a keyed record to a side output, with the current timestamp.
    pub fn emit_to<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        side: SideOutput,
        key: &K,
        value: &V,
    ) -> Result<()> {
        push_output(side.0, self.timestamp, |d| Ok((Some(encoded(d, key)?), encoded(d, value)?)))
    }

    /// Emits raw bytes to `side` (or the main output) with an explicit timestamp.
    pub fn emit_raw(
        &mut self,
        side: Option<SideOutput>,
        key: Option<&[u8]>,
        value: &[u8],
        timestamp: Option<i64>,
    ) -> Result<()> {
        let output = side.map_or(0, |s| s.0);
        push_output(output, timestamp, |d| Ok((key.map(|k| raw(d, k)).transpose()?, raw(d, value)?)))
    }

    /// Registers a timer for the current key; it fires once even if registered twice.
    pub fn register_timer(&mut self, domain: TimeDomain, timestamp: i64) -> Result<()> {
        timers::register_timer(current_key()?, domain.to_wit(), timestamp);
        Ok(())
    }

    /// Deletes a timer of the current key, if it exists.
    pub fn delete_timer(&mut self, domain: TimeDomain, timestamp: i64) -> Result<()> {
        timers::delete_timer(current_key()?, domain.to_wit(), timestamp);
        Ok(())
    }

    /// The operator's current event-time watermark (ms); `i64::MIN` before the first.
    pub fn current_watermark(&self) -> i64 {
        timers::current_watermark()
    }

    /// The host's processing time (ms since the Unix epoch).
    pub fn current_processing_time(&self) -> i64 {
        timers::current_processing_time()
    }
}
