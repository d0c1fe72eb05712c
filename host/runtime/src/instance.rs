//! Live instances: one per operator subtask. Each call is guarded by [`CallPolicy`].

use eddy_core::{FiredTimer, RecordBatch, RecordMeta, TimerService, key_hash};
use eddy_state::StateBackend;
use eddy_wire::{Packed, Row};
use wasmtime::Store;

use crate::bindings::aggregate_world::WindowAggregate;
use crate::bindings::aggregate_world::exports::eddy::dataflow::aggregate::AccumulatorUpdate as WitUpdate;
use crate::bindings::operator_world::KeyedOperator;
use crate::bindings::types::{Batch, Span, TimeDomain as WitDomain, TimerBatch, TimerRef};
use crate::call::CallPolicy;
use crate::error::{CallError, CallErrorKind, Violation};
use crate::keyed::{OperatorHost, Output};
use crate::sandbox::{HasSandbox, Sandbox};
use crate::slots::KeySlots;

fn wire_span(s: eddy_core::Span) -> eddy_wire::Span {
    eddy_wire::Span { offset: s.offset, len: s.len }
}

/// The packed row of a host record, tagged with `tag`.
pub(crate) fn row_of(meta: &RecordMeta, tag: u32) -> Row {
    Row { key: meta.key.map(wire_span), value: wire_span(meta.value), timestamp: meta.timestamp, tag }
}

/// Converts a host batch to the WIT shape of an aggregate call: one buffer copy, one packed
/// table, every record its own key slot (the host groups records by key in the updates).
pub(crate) fn to_wit_batch(batch: &RecordBatch) -> Batch {
    let (data, metas) = batch.parts();
    let mut records = Vec::with_capacity(metas.len() * Row::BYTES);
    for (i, meta) in metas.iter().enumerate() {
        row_of(meta, i as u32).write(&mut records);
    }
    Batch { data: data.to_vec(), records, prefetched_states: Vec::new(), prefetched: Vec::new() }
}

fn to_wit_timers(fired: &[FiredTimer]) -> TimerBatch {
    let mut data = Vec::with_capacity(fired.iter().map(|t| t.key.len()).sum());
    let mut slots = KeySlots::with_capacity(fired.len());
    let timers = fired
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let offset = data.len() as u32;
            data.extend_from_slice(&t.key);
            TimerRef {
                key: Span { offset, len: t.key.len() as u32 },
                timestamp: t.timestamp,
                domain: match t.domain {
                    eddy_core::TimeDomain::EventTime => WitDomain::EventTime,
                    eddy_core::TimeDomain::ProcessingTime => WitDomain::ProcessingTime,
                },
                slot: slots.slot(&t.key, key_hash(&t.key), i as u32),
            }
        })
        .collect();
    TimerBatch { data, timers }
}

/// A keyed operator subtask's sandboxed instance.
pub struct OperatorInstance {
    pub(crate) store: Store<OperatorHost>,
    pub(crate) bindings: KeyedOperator,
    pub(crate) policy: CallPolicy,
}

impl std::fmt::Debug for OperatorInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorInstance")
            .field("operator", &self.store.data().sandbox.operator)
            .finish_non_exhaustive()
    }
}

impl OperatorInstance {
    /// Calls `open(config)`; `config` is JSON text (`null` for none).
    pub fn open(&mut self, config: &str) -> Result<(), CallError> {
        let Self { store, bindings, policy } = self;
        store.data_mut().keyed.keys.clear("open");
        policy.call(store, "open", |s| bindings.eddy_dataflow_operator().call_open(s, config))
    }

    /// Processes a batch and returns what the operator emitted.
    pub fn process(&mut self, batch: &RecordBatch) -> Result<Output, CallError> {
        let Self { store, bindings, policy } = self;
        let wit = match store.data_mut().keyed.batch_for_guest(batch) {
            Ok(wit) => wit,
            Err(kind) => {
                let operator = store.data().sandbox.operator.clone();
                return Err(CallError { operator, call: "process", kind, guest_message: None });
            }
        };
        let result =
            Self::guarded(store, policy, "process", |s| bindings.eddy_dataflow_operator().call_process(s, &wit));
        store.data_mut().keyed.keys.clear("process");
        result
    }

    /// Delivers fired timers (all of this subtask's key groups) and returns the output.
    pub fn on_timers(&mut self, fired: &[FiredTimer]) -> Result<Output, CallError> {
        let Self { store, bindings, policy } = self;
        store.data_mut().keyed.load_timer_keys(fired);
        let wit = to_wit_timers(fired);
        let result =
            Self::guarded(store, policy, "on-timer", |s| bindings.eddy_dataflow_operator().call_on_timer(s, &wit));
        store.data_mut().keyed.keys.clear("on-timer");
        result
    }

    /// Calls `close` at the end of a bounded input and returns its output.
    pub fn close(&mut self) -> Result<Output, CallError> {
        let Self { store, bindings, policy } = self;
        store.data_mut().keyed.keys.clear("close");
        Self::guarded(store, policy, "close", |s| bindings.eddy_dataflow_operator().call_close(s))
    }

    fn guarded(
        store: &mut Store<OperatorHost>,
        policy: &mut CallPolicy,
        call: &'static str,
        f: impl FnOnce(&mut Store<OperatorHost>) -> wasmtime::Result<Result<(), crate::bindings::types::OperatorError>>,
    ) -> Result<Output, CallError> {
        store.data_mut().keyed.begin_call();
        match policy.call(store, call, f) {
            Ok(()) => Ok(store.data_mut().keyed.take_output()),
            Err(e) => {
                store.data_mut().keyed.discard_output();
                Err(e)
            }
        }
    }

    /// The subtask's state.
    pub fn state_backend(&self) -> &dyn StateBackend {
        self.store.data().keyed.backend.as_ref()
    }

    /// The subtask's state, for maintenance such as purging expired entries.
    pub fn state_backend_mut(&mut self) -> &mut dyn StateBackend {
        self.store.data_mut().keyed.backend.as_mut()
    }

    /// The subtask's timers, for the engine to advance.
    pub fn timer_service(&mut self) -> &mut dyn TimerService {
        self.store.data_mut().keyed.timers.as_mut()
    }

    /// Whether an earlier trap made this instance unusable.
    pub fn is_poisoned(&self) -> bool {
        self.policy.poisoned
    }

    /// Linear memory the instance holds now.
    pub fn memory_bytes(&mut self) -> usize {
        self.store.data_mut().sandbox().memory_used()
    }
}

/// Store data of an aggregate instance: only the sandbox.
pub(crate) struct AggregateHost {
    pub(crate) sandbox: Sandbox,
}

impl HasSandbox for AggregateHost {
    fn sandbox(&mut self) -> &mut Sandbox {
        &mut self.sandbox
    }
}

impl crate::bindings::types::Host for AggregateHost {}

impl crate::bindings::log::Host for AggregateHost {
    fn log(&mut self, level: crate::bindings::log::Level, message: String) -> wasmtime::Result<()> {
        crate::sandbox::guest_log(&mut self.sandbox, level, message);
        Ok(())
    }
}

impl wasmtime_wasi::WasiView for AggregateHost {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.sandbox.ctx()
    }
}

/// A window aggregate's sandboxed instance. Accumulators are opaque bytes the window operator
/// keeps in its state.
pub struct AggregateInstance {
    pub(crate) store: Store<AggregateHost>,
    pub(crate) bindings: WindowAggregate,
    pub(crate) policy: CallPolicy,
}

impl std::fmt::Debug for AggregateInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregateInstance")
            .field("operator", &self.store.data().sandbox.operator)
            .finish_non_exhaustive()
    }
}

impl AggregateInstance {
    /// Calls `open(config)`.
    pub fn open(&mut self, config: &str) -> Result<(), CallError> {
        let Self { store, bindings, policy } = self;
        policy.call(store, "open", |s| bindings.eddy_dataflow_aggregate().call_open(s, config))
    }

    /// A new empty accumulator.
    pub fn create_accumulator(&mut self) -> Result<Vec<u8>, CallError> {
        let Self { store, bindings, policy } = self;
        policy.call(store, "create-accumulator", |s| bindings.eddy_dataflow_aggregate().call_create_accumulator(s))
    }

    /// Folds `batch` into many accumulators in one crossing; one new accumulator per update.
    pub fn add(&mut self, batch: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Vec<Vec<u8>>, CallError> {
        let Self { store, bindings, policy } = self;
        let wit = to_wit_batch(batch);
        let updates: Vec<WitUpdate> = updates
            .iter()
            .map(|u| WitUpdate { accumulator: u.accumulator.to_vec(), records: u.records.to_vec() })
            .collect();
        let accs = policy.call(store, "add", |s| bindings.eddy_dataflow_aggregate().call_add(s, &wit, &updates))?;
        Self::one_per_input(store, "add", updates.len(), accs)
    }

    /// Merges two accumulators.
    pub fn merge(&mut self, a: &[u8], b: &[u8]) -> Result<Vec<u8>, CallError> {
        let Self { store, bindings, policy } = self;
        policy.call(store, "merge", |s| bindings.eddy_dataflow_aggregate().call_merge(s, a, b))
    }

    /// The window results for `accs`, one per accumulator, in one crossing.
    pub fn results(&mut self, accs: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, CallError> {
        let Self { store, bindings, policy } = self;
        let results =
            policy.call(store, "get-results", |s| bindings.eddy_dataflow_aggregate().call_get_results(s, accs))?;
        Self::one_per_input(store, "get-results", accs.len(), results)
    }

    /// A batched call's answer, checked to hold exactly one item per input.
    fn one_per_input(
        store: &Store<AggregateHost>,
        call: &'static str,
        expected: usize,
        items: Vec<Vec<u8>>,
    ) -> Result<Vec<Vec<u8>>, CallError> {
        if items.len() == expected {
            return Ok(items);
        }
        Err(CallError {
            operator: store.data().sandbox.operator.clone(),
            call,
            kind: CallErrorKind::Violation(Violation::ResultCount { expected, actual: items.len() }),
            guest_message: None,
        })
    }
}

/// The records of a batch that go into one accumulator (see [`AggregateInstance::add`]).
#[derive(Debug, Clone, Copy)]
pub struct AccumulatorUpdate<'a> {
    /// The accumulator before the records.
    pub accumulator: &'a [u8],
    /// Indices into the batch, ascending; one key and one window.
    pub records: &'a [u32],
}
