//! What an operator can do while it handles a call: emit records, use timers, read time.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use eddy_wire::{Packed, Row, Span, Table, ValueWrite};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::types::OutputBatch;
use crate::bindings::{output, timers};
use crate::record::{TimeDomain, slice};
use crate::state::{ListState, MapState, ValueState};
use crate::{Error, Result, RowWrite, codec};

/// Output is handed to the host in one crossing per call, or earlier once this much is buffered.
const OUTPUT_FLUSH_BYTES: usize = 1 << 20;

/// The record (or timer) being handled: its key handle, its key slot (the first record or
/// timer of the call with the same key) and its row in the prefetch table (records only).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Current {
    pub(crate) handle: u32,
    pub(crate) slot: u32,
    pub(crate) row: Option<usize>,
}

/// What the current call brought in: its buffer and the prefetched state values.
#[derive(Default)]
struct Scope {
    data: Rc<Vec<u8>>,
    prefetched_states: Vec<u32>,
    prefetched: Vec<u8>,
}

/// Appends a value's encoding to the buffer it is given.
type Encode<'a> = &'a mut dyn FnMut(&mut Vec<u8>) -> Result<()>;

/// A buffered value-state write.
struct Entry {
    state: u32,
    slot: u32,
    /// Into `Writes::data`; `None` clears the state.
    value: Option<Span>,
    /// 1 + the index of the slot's previous write (any state), 0 for none.
    older: u32,
    /// False once a later write of the same state and slot replaced it.
    live: bool,
}

/// Value-state writes of this call, found by key slot (the host numbers a call's distinct
/// keys, so no key bytes are hashed here); applied in one crossing when the call ends, and
/// read back by later records of the same key.
#[derive(Default)]
struct Writes {
    data: Vec<u8>,
    entries: Vec<Entry>,
    /// Per key slot: 1 + the index of its newest entry, 0 for none.
    newest: Vec<u32>,
}

impl Writes {
    fn begin(&mut self, slots: usize) {
        self.data.clear();
        self.entries.clear();
        self.newest.clear();
        self.newest.resize(slots, 0);
    }

    /// Index of the newest write of `state` for `slot`.
    fn position(&self, state: u32, slot: u32) -> Option<usize> {
        let mut at = *self.newest.get(slot as usize)?;
        while let Some(i) = at.checked_sub(1) {
            let entry = self.entries.get(i as usize)?;
            if entry.state == state {
                return Some(i as usize);
            }
            at = entry.older;
        }
        None
    }

    fn find(&self, state: u32, slot: u32) -> Option<&Entry> {
        self.position(state, slot).and_then(|i| self.entries.get(i))
    }

    /// Buffers a write; `encode` appends the value's bytes (`None`: clear the state).
    fn put(&mut self, state: u32, slot: u32, encode: Option<Encode<'_>>) -> Result<()> {
        let slots = self.newest.len();
        let Some(&older) = self.newest.get(slot as usize) else {
            return Err(Error::failed(format!("the host sent key slot {slot} in a call of {slots} keys")));
        };
        let start = self.data.len();
        let value = match encode {
            Some(encode) => {
                if let Err(e) = encode(&mut self.data) {
                    self.data.truncate(start);
                    return Err(e);
                }
                Some(
                    Span::tail_of(&self.data, start)
                        .ok_or_else(|| Error::failed("state writes of one call exceed 4 GiB"))?,
                )
            }
            None => None,
        };
        if let Some(replaced) = self.position(state, slot).and_then(|i| self.entries.get_mut(i)) {
            replaced.live = false;
        }
        self.entries.push(Entry { state, slot, value, older, live: true });
        self.newest[slot as usize] = self.entries.len() as u32;
        Ok(())
    }

    /// The live writes as the packed table of `value-set-many`, in write order.
    fn table(&self) -> Vec<u8> {
        let mut table = Vec::with_capacity(self.entries.len() * ValueWrite::BYTES);
        for e in self.entries.iter().filter(|e| e.live) {
            ValueWrite { state: e.state, key: e.slot, value: e.value }.write(&mut table);
        }
        table
    }
}

/// The state of the call in progress.
#[derive(Default)]
struct Call {
    scope: Scope,
    writes: Writes,
}

thread_local! {
    static CALL: RefCell<Call> = RefCell::new(Call::default());
    static OUTPUT: RefCell<OutputBatch> = const { RefCell::new(OutputBatch { data: Vec::new(), records: Vec::new() }) };
    /// The record or timer being handled, set once per record: a `Cell` of its own, so the
    /// set is a store rather than a borrow of `CALL` (40 WebAssembly instructions a record).
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

/// Starts a call: `data` is the call's buffer (batch or timers), `keys` its records or timers.
pub(crate) fn begin_scope(data: Rc<Vec<u8>>, prefetched_states: Vec<u32>, prefetched: Vec<u8>, keys: usize) {
    CALL.with_borrow_mut(|call| {
        call.scope = Scope { data, prefetched_states, prefetched };
        call.writes.begin(keys);
    });
    set_current(None);
}

pub(crate) fn set_current(current: Option<Current>) {
    CURRENT.set(current);
}

fn current() -> Result<Current> {
    CURRENT.get().ok_or_else(no_key)
}

pub(crate) fn current_key() -> Result<u32> {
    current().map(|c| c.handle)
}

fn no_key() -> Error {
    Error::failed(
        "keyed state needs the current record's key: there is none in open/close (use state in process or \
         on_timer) nor for a record without a key (add key_by before this step)",
    )
}

/// Reads value state `state` for the current key and hands the bytes to `f`: this call's own
/// writes first, then the prefetched value, else one crossing to the host.
pub(crate) fn with_value<R>(state: u32, f: impl FnOnce(Option<&[u8]>) -> Result<R>) -> Result<R> {
    // `f` only decodes bytes and cannot reach CALL, so it runs under the borrow.
    CALL.with_borrow(|Call { scope, writes }| {
        let current = current()?;
        if let Some(entry) = writes.find(state, current.slot) {
            return match entry.value {
                Some(span) => f(Some(slice(&writes.data, span)?)),
                None => f(None),
            };
        }
        let column = scope.prefetched_states.iter().position(|&s| s == state);
        if let (Some(row), Some(column)) = (current.row, column) {
            let cells = Table::<Option<Span>>::new(&scope.prefetched).map_err(|e| Error::failed(e.to_string()))?;
            let span = cells.get(row * scope.prefetched_states.len() + column).flatten();
            return f(span.map(|s| slice(&scope.data, s)).transpose()?);
        }
        f(crate::bindings::state::value_get(state, current.handle).as_deref())
    })
}

/// Buffers a write of value state `state` for the current key; `encode` appends the bytes.
pub(crate) fn value_set(state: u32, mut encode: impl FnMut(&mut Vec<u8>) -> Result<()>) -> Result<()> {
    let slot = current()?.slot;
    CALL.with_borrow_mut(|call| call.writes.put(state, slot, Some(&mut encode)))
}

/// Buffers a clear of value state `state` for the current key.
pub(crate) fn value_clear(state: u32) -> Result<()> {
    let slot = current()?.slot;
    CALL.with_borrow_mut(|call| call.writes.put(state, slot, None))
}

/// Hands this call's value-state writes to the host in one crossing.
pub(crate) fn flush_state() {
    CALL.with_borrow_mut(|Call { writes: w, .. }| {
        if !w.entries.is_empty() {
            crate::bindings::state::value_set_many(&w.data, &w.table());
        }
        w.begin(0);
    });
}

/// Forgets this call's buffered state writes: a failed call's writes must not land.
pub(crate) fn discard_state() {
    CALL.with_borrow_mut(|call| call.writes.begin(0));
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
    Span::tail_of(data, offset).ok_or_else(|| Error::failed("output of one call exceeds 4 GiB"))
}

fn encoded<T: Serialize + ?Sized>(data: &mut Vec<u8>, value: &T) -> Result<Span> {
    let offset = data.len();
    codec::encode_into(data, value)?;
    span_at(data, offset)
}

fn encoded_value<T: Serialize + ?Sized>(data: &mut Vec<u8>, value: &T) -> Result<Span> {
    let offset = data.len();
    codec::encode_value_into(data, value)?;
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
        Row { key, value, timestamp, tag: output }.write(&mut out.records);
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
        push_output(0, self.timestamp, |d| Ok((Some(encoded(d, key)?), encoded_value(d, value)?)))
    }

    /// Emits a record without a key to the main output, with the current timestamp.
    pub fn emit_value<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<()> {
        push_output(0, self.timestamp, |d| Ok((None, encoded_value(d, value)?)))
    }

    /// Emits `value`, a struct that derives [`Row`](crate::Row), without a key to the main
    /// output, with the current timestamp: the bytes [`Self::emit_value`] writes, written
    /// slot by slot with the schema declared once.
    pub fn emit_row<V: RowWrite>(&mut self, value: &V) -> Result<()> {
        push_output(0, self.timestamp, |d| {
            let offset = d.len();
            value.write_row(d);
            Ok((None, span_at(d, offset)?))
        })
    }

    /// Emits a keyed record to a side output, with the current timestamp.
    pub fn emit_to<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        side: SideOutput,
        key: &K,
        value: &V,
    ) -> Result<()> {
        push_output(side.0, self.timestamp, |d| Ok((Some(encoded(d, key)?), encoded_value(d, value)?)))
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// (state, slot) -> (when last written, the value written; `None` = cleared)
    type Oracle = HashMap<(u32, u32), (usize, Option<Vec<u8>>)>;

    #[derive(Debug, Clone)]
    enum Op {
        Set(u32, u32, Vec<u8>),
        Clear(u32, u32),
    }

    fn op(slots: u32) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..3, 0..slots, proptest::collection::vec(any::<u8>(), 0..4)).prop_map(|(s, k, v)| Op::Set(s, k, v)),
            (0u32..3, 0..slots).prop_map(|(s, k)| Op::Clear(s, k)),
        ]
    }

    proptest! {
        /// Oracle: a map from (state, slot) to the last value written. Reads see the newest
        /// write, and the table sent to the host holds exactly the newest write of each
        /// (state, slot), in the order those writes were made.
        #[test]
        fn the_write_buffer_behaves_like_a_map_of_newest_writes(ops in proptest::collection::vec(op(5), 0..40)) {
            let mut writes = Writes::default();
            writes.begin(5);
            let mut oracle = Oracle::new();
            for (i, op) in ops.iter().enumerate() {
                let (state, slot, value) = match op {
                    Op::Set(s, k, v) => (*s, *k, Some(v.clone())),
                    Op::Clear(s, k) => (*s, *k, None),
                };
                let mut encode = |buf: &mut Vec<u8>| -> Result<()> {
                    buf.extend_from_slice(value.as_deref().unwrap_or_default());
                    Ok(())
                };
                let encode: Option<Encode<'_>> = if value.is_some() { Some(&mut encode) } else { None };
                writes.put(state, slot, encode).expect("slot in range");
                oracle.insert((state, slot), (i, value.clone()));
                for state in 0..3 {
                    for slot in 0..5 {
                        let seen = writes.find(state, slot).map(|e| e.value.map(|s| s.slice(&writes.data).expect("in buffer").to_vec()));
                        prop_assert_eq!(seen, oracle.get(&(state, slot)).map(|(_, v)| v.clone()));
                    }
                }
            }
            let table = writes.table();
            let sent: Vec<(u32, u32, Option<Vec<u8>>)> = Table::<ValueWrite>::new(&table)
                .expect("whole rows")
                .iter()
                .map(|w| (w.state, w.key, w.value.map(|s| s.slice(&writes.data).expect("in buffer").to_vec())))
                .collect();
            let mut expected: Vec<_> = oracle.into_iter().collect();
            expected.sort_by_key(|(_, (at, _))| *at);
            let expected: Vec<_> = expected.into_iter().map(|((s, k), (_, v))| (s, k, v)).collect();
            prop_assert_eq!(sent, expected);
        }
    }

    #[test]
    fn a_slot_outside_the_call_is_an_error_and_a_failed_encoding_leaves_nothing() {
        let mut writes = Writes::default();
        writes.begin(2);
        let err = writes.put(0, 2, None).expect_err("slot 2 of 2");
        assert!(err.to_string().contains("key slot 2"), "{err}");
        let mut failing = |buf: &mut Vec<u8>| -> Result<()> {
            buf.extend_from_slice(b"partial");
            Err(Error::failed("cannot encode"))
        };
        assert!(writes.put(0, 1, Some(&mut failing)).is_err());
        assert!(writes.data.is_empty());
        assert!(writes.find(0, 1).is_none());
        assert!(writes.table().is_empty());
    }
}
