//! What an operator can do while it handles a call: emit records, use timers, read time.

use std::cell::{Cell, RefCell};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::types::{OutputBatch, OutputRef, Span};
use crate::bindings::{output, timers};
use crate::record::TimeDomain;
use crate::state::{ListState, MapState, ValueState};
use crate::{Error, Result, codec};

/// Output is handed to the host in one crossing per call, or earlier once this much is buffered.
const OUTPUT_FLUSH_BYTES: usize = 1 << 20;

thread_local! {
    static CURRENT_KEY: Cell<Option<u32>> = const { Cell::new(None) };
    static OUTPUT: RefCell<OutputBatch> = const { RefCell::new(OutputBatch { data: Vec::new(), records: Vec::new() }) };
}

pub(crate) fn current_key() -> Result<u32> {
    CURRENT_KEY
        .get()
        .ok_or_else(|| Error::failed("keyed state used outside process/on_timer: there is no current key"))
}

pub(crate) fn set_current_key(handle: Option<u32>) {
    CURRENT_KEY.set(handle);
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

    /// Declares a value state named `name`.
    pub fn value_state<T: Serialize + DeserializeOwned>(&mut self, name: &str) -> ValueState<T> {
        ValueState::declare(name)
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
