//! What a replayed operator did, caught where it happens: a state backend and a timer service
//! that note every call before passing it on, and a log layer that catches the guest's lines.
//! They all append to one [`Trace`], so effects keep the order they happened in.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use eddy_core::{FiredTimer, KeyGroup, TimeDomain, TimerService};
use eddy_state::{BackendSnapshot, StateBackend, StateError};

/// One effect, as raw as it happened (decoded when shown).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// A state entry was read (`None`: absent).
    Read { key: Vec<u8>, value: Option<Vec<u8>> },
    /// A state entry was written.
    Write { key: Vec<u8>, value: Vec<u8> },
    /// A state entry, or every entry under a prefix, was deleted.
    Delete { key: Vec<u8>, prefix: bool },
    /// A timer was set, deleted or fired.
    Timer { what: TimerChange, domain: TimeDomain, key: Vec<u8>, timestamp: i64 },
    /// The guest logged a line.
    Log { level: String, message: String },
}

/// What happened to a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimerChange {
    /// Registered.
    Set,
    /// Deleted before it fired.
    Deleted,
    /// Came due.
    Fired,
}

/// The effects noted since the last [`Trace::take`], shared by the wrappers of one replay.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trace(Arc<Mutex<Vec<Effect>>>);

impl Trace {
    fn note(&self, effect: Effect) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(effect);
    }

    /// The effects so far, in order; the trace starts empty again.
    pub(crate) fn take(&self) -> Vec<Effect> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A state backend that notes reads, writes and deletes.
pub(crate) struct TracingBackend {
    inner: Box<dyn StateBackend>,
    trace: Trace,
}

impl TracingBackend {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Box<dyn StateBackend>, trace: Trace) -> Self {
        Self { inner, trace }
    }
}

impl StateBackend for TracingBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let value = self.inner.get(key)?;
        self.trace.note(Effect::Read { key: key.to_vec(), value: value.clone() });
        Ok(value)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.inner.put(key, value)?;
        self.trace.note(Effect::Write { key: key.to_vec(), value: value.to_vec() });
        Ok(())
    }

    fn put_admitted(
        &mut self,
        key: &[u8],
        value: &[u8],
        admit: &mut dyn FnMut(Option<usize>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        self.inner.put_admitted(key, value, admit)?;
        self.trace.note(Effect::Write { key: key.to_vec(), value: value.to_vec() });
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.inner.delete(key)?;
        self.trace.note(Effect::Delete { key: key.to_vec(), prefix: false });
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        self.inner.scan_prefix(prefix, &mut |k, v| {
            self.trace.note(Effect::Read { key: k.to_vec(), value: Some(v.to_vec()) });
            visit(k, v)
        })
    }

    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        self.inner.scan_from(from, visit)
    }

    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        self.inner.delete_prefix(prefix)?;
        self.trace.note(Effect::Delete { key: prefix.to_vec(), prefix: true });
        Ok(())
    }

    fn approximate_len(&self) -> usize {
        self.inner.approximate_len()
    }

    fn purge_expired(&mut self) -> Result<usize, StateError> {
        self.inner.purge_expired()
    }

    fn snapshot(&mut self, staging: &Path) -> Result<BackendSnapshot, StateError> {
        self.inner.snapshot(staging)
    }

    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self.inner.raw_mut()
    }

    fn usage(&self) -> Option<eddy_state::StateUsage> {
        self.inner.usage()
    }

    fn entry_measure(&self) -> eddy_state::EntryMeasure {
        self.inner.entry_measure()
    }
}

/// A timer service that notes timers set, deleted and fired.
pub(crate) struct TracingTimers {
    inner: Box<dyn TimerService>,
    trace: Trace,
}

impl TracingTimers {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Box<dyn TimerService>, trace: Trace) -> Self {
        Self { inner, trace }
    }

    fn fired(&self, fired: Vec<FiredTimer>) -> Vec<FiredTimer> {
        for t in &fired {
            let (domain, key, timestamp) = (t.domain, t.key.clone(), t.timestamp);
            self.trace.note(Effect::Timer { what: TimerChange::Fired, domain, key, timestamp });
        }
        fired
    }
}

impl TimerService for TracingTimers {
    fn register(&mut self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64) {
        self.inner.register(domain, key_group, key, timestamp);
        self.trace.note(Effect::Timer { what: TimerChange::Set, domain, key: key.to_vec(), timestamp });
    }

    fn delete(&mut self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64) {
        if self.inner.contains(domain, key_group, key, timestamp) {
            self.trace.note(Effect::Timer { what: TimerChange::Deleted, domain, key: key.to_vec(), timestamp });
        }
        self.inner.delete(domain, key_group, key, timestamp);
    }

    fn current_watermark(&self) -> i64 {
        self.inner.current_watermark()
    }

    fn current_processing_time(&self) -> i64 {
        self.inner.current_processing_time()
    }

    fn advance_watermark(&mut self, watermark: i64) -> Vec<FiredTimer> {
        let fired = self.inner.advance_watermark(watermark);
        self.fired(fired)
    }

    fn advance_processing_time(&mut self, now_ms: i64) -> Vec<FiredTimer> {
        let fired = self.inner.advance_processing_time(now_ms);
        self.fired(fired)
    }

    fn contains(&self, domain: TimeDomain, key_group: KeyGroup, key: &[u8], timestamp: i64) -> bool {
        self.inner.contains(domain, key_group, key, timestamp)
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn len_of_key(&self, key_group: KeyGroup, key: &[u8]) -> usize {
        self.inner.len_of_key(key_group, key)
    }

    fn pending(&self) -> Vec<FiredTimer> {
        self.inner.pending()
    }
}

/// Catches the guest's log lines (the runtime writes them as `tracing` events of its sandbox)
/// into the trace, in order with the state and timer effects around them.
pub(crate) struct GuestLogs(pub Trace);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for GuestLogs {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if !event.metadata().target().starts_with("eddy_runtime::sandbox") {
            return;
        }
        let mut message = String::new();
        event.record(&mut MessageField(&mut message));
        let level = event.metadata().level().as_str().to_ascii_lowercase();
        self.0.note(Effect::Log { level, message });
    }
}

struct MessageField<'a>(&'a mut String);

impl tracing::field::Visit for MessageField<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            use std::fmt::Write;
            let _ = write!(self.0, "{value:?}");
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }
}
