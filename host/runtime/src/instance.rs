//! Live instances: one per operator subtask. Each call is guarded by [`CallPolicy`].

use std::sync::Arc;

use eddy_core::{FiredTimer, RecordBatch, RecordMeta, TimerService, key_hash};
use eddy_state::StateBackend;
use eddy_wire::{Packed, Row, Update};
use wasmtime::Store;

use crate::bindings::aggregate_world::WindowAggregate;
use crate::bindings::aggregate_world::exports::eddy::dataflow::aggregate::{AccumulatorUpdates, PackedItemsResult};
use crate::bindings::operator_world::KeyedOperator;
use crate::bindings::types::{Batch, Span, TimeDomain as WitDomain, TimerBatch, TimerRef};
use crate::call::CallPolicy;
use crate::error::{CallError, CallErrorKind, Violation};
use crate::items::Items;
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

/// The record table of a host batch in the WIT shape of an aggregate call, every record its
/// own key slot (the host groups records by key in the updates); the call lends the batch's
/// bytes as they are.
pub(crate) fn wit_records(batch: &RecordBatch) -> Vec<u8> {
    let (_, metas) = batch.parts();
    let mut records = Vec::with_capacity(metas.len() * Row::BYTES);
    for (i, meta) in metas.iter().enumerate() {
        row_of(meta, i as u32).write(&mut records);
    }
    records
}

/// An `on-timer` call's keys back to back, and its timers.
struct TimerCall {
    data: Vec<u8>,
    timers: Vec<TimerRef>,
}

fn to_wit_timers(fired: &[FiredTimer]) -> TimerCall {
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
    TimerCall { data, timers }
}

/// Key bytes handed to one `on-timer` call, at most (unless one key alone is longer).
pub(crate) const TIMER_KEY_BYTES_PER_CALL: usize = 1 << 20;

/// Consecutive runs of `fired`, each of at most `max_timers` timers (at least one) whose keys
/// add up to at most `max_key_bytes`, except a run of one timer whose key alone is longer.
pub(crate) fn timer_batches(
    fired: &[FiredTimer],
    max_timers: usize,
    max_key_bytes: usize,
) -> impl Iterator<Item = &[FiredTimer]> {
    let max_timers = max_timers.max(1);
    let mut rest = fired;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut key_bytes = 0usize;
        let mut len = 0;
        for t in rest.iter().take(max_timers) {
            key_bytes = key_bytes.saturating_add(t.key.len());
            if len > 0 && key_bytes > max_key_bytes {
                break;
            }
            len += 1;
        }
        let (batch, later) = rest.split_at(len);
        rest = later;
        Some(batch)
    })
}

/// Appends `more` to `output`; side outputs match by name (both list every declared one).
fn append_output(output: &mut Output, more: Output) -> Result<(), eddy_core::BatchFull> {
    output.main.try_extend(&more.main)?;
    for (name, batch) in more.side {
        match output.side.iter_mut().find(|(n, _)| *n == name) {
            Some((_, held)) => held.try_extend(&batch)?,
            None => output.side.push((name, batch)),
        }
    }
    Ok(())
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

/// Most batch buffer bytes an instance keeps between calls for reuse.
const RETAINED_BATCH_BYTES: usize = 4 << 20;

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
        let keyed = &mut store.data_mut().keyed;
        // The previous call's buffers, refilled: no allocation per call once they are big
        // enough. Between calls nothing else holds the batch, so it is never copied here.
        let mut wit = std::mem::take(&mut keyed.batch);
        let filled = keyed.batch_for_guest(batch, Arc::make_mut(&mut wit));
        keyed.batch = Arc::clone(&wit);
        if let Err(kind) = filled {
            let operator = store.data().sandbox.operator.clone();
            return Err(CallError { operator, call: "process", kind, guest_message: None });
        }
        // The call and the store share the batch while it runs (`json-batch` reads it).
        let result = Self::guarded(store, policy, "process", |s| {
            bindings.eddy_dataflow_operator().call_process(s, wit.lend(batch))
        });
        drop(wit);
        let keyed = &mut store.data_mut().keyed;
        keyed.keys.clear("process");
        // A rare huge batch should not pin its memory for the life of the instance.
        if keyed.batch.data.capacity() > RETAINED_BATCH_BYTES {
            keyed.batch = Arc::default();
        }
        result
    }

    /// Delivers fired timers (all of this subtask's key groups) and returns the output. They
    /// go to the guest in order, in as many `on-timer` calls as the limits need: at most
    /// `max_timers_per_call` timers and [`TIMER_KEY_BYTES_PER_CALL`] of keys in each (but at
    /// least one timer), so no number of timers due at once overflows guest memory. Each call
    /// has its own deadline and output limit; the output of all of them is returned together.
    pub fn on_timers(&mut self, fired: &[FiredTimer]) -> Result<Output, CallError> {
        let max_timers = self.policy.limits.max_timers_per_call;
        let mut output: Option<Output> = None;
        for batch in timer_batches(fired, max_timers, TIMER_KEY_BYTES_PER_CALL) {
            let more = self.on_timer_batch(batch)?;
            match &mut output {
                None => output = Some(more),
                Some(output) => append_output(output, more).map_err(|full| CallError {
                    operator: self.store.data().sandbox.operator.clone(),
                    call: "on-timer",
                    kind: CallErrorKind::Violation(Violation::Limit {
                        what: "output bytes of the timers due at once",
                        limit: eddy_core::MAX_BATCH_BYTES,
                        actual: full.held.saturating_add(full.adding),
                    }),
                    guest_message: None,
                })?,
            }
        }
        Ok(output.unwrap_or_default())
    }

    fn on_timer_batch(&mut self, fired: &[FiredTimer]) -> Result<Output, CallError> {
        let Self { store, bindings, policy } = self;
        store.data_mut().keyed.load_timer_keys(fired);
        let wit = to_wit_timers(fired);
        let result = Self::guarded(store, policy, "on-timer", |s| {
            bindings.eddy_dataflow_operator().call_on_timer(s, TimerBatch { data: &wit.data, timers: &wit.timers })
        });
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

    /// The states the guest declared, in declaration order.
    pub fn declared_states(&self) -> Vec<eddy_state::DeclaredState> {
        self.store.data().keyed.declared_states()
    }

    /// The schemas the guest declared (its first [`crate::MAX_NOTED_SCHEMAS`]).
    pub fn declared_schemas(&self) -> Vec<eddy_wire::schema::Schema> {
        self.store.data().sandbox.declared_schemas()
    }

    /// Ends this instance and hands back its state and timers, so new code can be
    /// instantiated over them (a live swap) without copying an entry.
    pub fn into_keyed_state(self) -> (Box<dyn StateBackend>, Box<dyn TimerService>) {
        let keyed = self.store.into_data().keyed;
        (keyed.backend, keyed.timers)
    }

    /// The subtask's timers, for the engine to advance.
    pub fn timer_service(&mut self) -> &mut dyn TimerService {
        self.store.data_mut().keyed.timers.as_mut()
    }

    /// The fuel (about one unit per WebAssembly instruction) the last call used, when the
    /// limits meter fuel: a count of the guest's work that, unlike a time, does not move with
    /// the machine's load.
    pub fn last_call_fuel(&self) -> Option<u64> {
        let armed = self.policy.limits.fuel_per_call?;
        self.store.get_fuel().ok().map(|left| armed.saturating_sub(left))
    }

    /// Whether an earlier trap made this instance unusable.
    pub fn is_poisoned(&self) -> bool {
        self.policy.poisoned
    }

    /// What became of the guest's log lines so far.
    pub fn log_stats(&self) -> crate::LogStats {
        self.store.data().sandbox.log.stats
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

crate::schemas::schemas_host!(AggregateHost);

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

    /// The schemas the guest declared (its first [`crate::MAX_NOTED_SCHEMAS`]): those of its
    /// accumulators, if they are rows.
    pub fn declared_schemas(&self) -> Vec<eddy_wire::schema::Schema> {
        self.store.data().sandbox.declared_schemas()
    }

    /// A new empty accumulator.
    pub fn create_accumulator(&mut self) -> Result<Vec<u8>, CallError> {
        let Self { store, bindings, policy } = self;
        policy.call(store, "create-accumulator", |s| bindings.eddy_dataflow_aggregate().call_create_accumulator(s))
    }

    /// Folds `batch` into many accumulators in one crossing; one new accumulator per update.
    pub fn add(&mut self, batch: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, CallError> {
        let Self { store, bindings, policy } = self;
        let records = wit_records(batch);
        let wit = Batch { data: batch.parts().0, records: &records, prefetched_states: &[], prefetched: &[] };
        let packed = pack_updates(updates);
        let accs = policy.call(store, "add", |s| bindings.eddy_dataflow_aggregate().call_add(s, wit, packed.lend()))?;
        Self::one_per_input(store, "add", updates.len(), accs)
    }

    /// Merges two accumulators.
    pub fn merge(&mut self, a: &[u8], b: &[u8]) -> Result<Vec<u8>, CallError> {
        let Self { store, bindings, policy } = self;
        policy.call(store, "merge", |s| bindings.eddy_dataflow_aggregate().call_merge(s, a, b))
    }

    /// The window results for `accs`, one per accumulator, in one crossing.
    pub fn results(&mut self, accs: &Items) -> Result<Items, CallError> {
        let Self { store, bindings, policy } = self;
        let spans = accs.wit_spans();
        let results = policy.call(store, "get-results", |s| {
            bindings.eddy_dataflow_aggregate().call_get_results(s, accs.lend(&spans))
        })?;
        Self::one_per_input(store, "get-results", accs.len(), results)
    }

    /// A batched call's answer, checked to be well formed and to hold exactly one item per input.
    fn one_per_input(
        store: &Store<AggregateHost>,
        call: &'static str,
        expected: usize,
        items: PackedItemsResult,
    ) -> Result<Items, CallError> {
        let error =
            |kind| CallError { operator: store.data().sandbox.operator.clone(), call, kind, guest_message: None };
        let items = Items::from_wit(items).map_err(|v| error(CallErrorKind::Violation(v)))?;
        if items.len() == expected {
            return Ok(items);
        }
        Err(error(CallErrorKind::Violation(Violation::ResultCount { expected, actual: items.len() })))
    }

    /// Linear memory the instance holds now.
    pub fn memory_bytes(&mut self) -> usize {
        self.store.data_mut().sandbox().memory_used()
    }
}

/// An `add` call's updates, packed as `accumulator-updates` (which the call lends).
struct PackedUpdates {
    accumulators: Vec<u8>,
    updates: Vec<u8>,
    records: Vec<u32>,
}

impl PackedUpdates {
    fn lend(&self) -> AccumulatorUpdates<'_> {
        AccumulatorUpdates { accumulators: &self.accumulators, updates: &self.updates, records: &self.records }
    }
}

/// The WIT shape of `updates`: three buffers however many updates there are.
fn pack_updates(updates: &[AccumulatorUpdate<'_>]) -> PackedUpdates {
    let mut packed = PackedUpdates {
        accumulators: Vec::with_capacity(updates.iter().map(|u| u.accumulator.len()).sum()),
        updates: Vec::with_capacity(updates.len() * Update::BYTES),
        records: Vec::with_capacity(updates.iter().map(|u| u.records.len()).sum()),
    };
    // The run the update before used, by address: neighbouring sliding windows of a key
    // share theirs, and cross once.
    let mut last: Option<(*const u32, usize, u32)> = None;
    for u in updates {
        // Accumulators and record runs of one batch's groups stay far below 4 GiB.
        let accumulator = eddy_wire::Span { offset: packed.accumulators.len() as u32, len: u.accumulator.len() as u32 };
        packed.accumulators.extend_from_slice(u.accumulator);
        let run = (u.records.as_ptr(), u.records.len());
        let first = match last {
            Some((ptr, len, first)) if (ptr, len) == run => first,
            _ => {
                let first = packed.records.len() as u32;
                packed.records.extend_from_slice(u.records);
                last = Some((run.0, run.1, first));
                first
            }
        };
        Update { accumulator, first, count: u.records.len() as u32 }.write(&mut packed.updates);
    }
    packed
}

/// The records of a batch that go into one accumulator (see [`AggregateInstance::add`]).
#[derive(Debug, Clone, Copy)]
pub struct AccumulatorUpdate<'a> {
    /// The accumulator before the records.
    pub accumulator: &'a [u8],
    /// Indices into the batch, ascending; one key and one window. Updates may share a run
    /// (the same slice: it crosses once).
    pub records: &'a [u32],
}

#[cfg(test)]
mod tests {
    use eddy_core::TimeDomain;

    use super::*;

    /// What each update of a packed `add` reads back: its accumulator and its records.
    fn unpacked(packed: &PackedUpdates) -> Vec<(Vec<u8>, Vec<u32>)> {
        let table = eddy_wire::Table::<Update>::new(&packed.updates).expect("whole updates");
        table
            .iter()
            .map(|u| {
                let acc = u.accumulator.slice(&packed.accumulators).expect("accumulator inside");
                (acc.to_vec(), u.records(&packed.records).expect("records inside").to_vec())
            })
            .collect()
    }

    /// A run shared by neighbouring updates (the same slice) crosses once; an equal run
    /// elsewhere, or one update apart, crosses again; every update reads back what it was given.
    #[test]
    fn a_run_shared_by_neighbouring_updates_is_packed_once() {
        let (shared, equal, other) = (vec![1u32, 4, 7], vec![1u32, 4, 7], vec![2u32]);
        let updates = [
            AccumulatorUpdate { accumulator: b"a", records: &shared },
            AccumulatorUpdate { accumulator: b"bb", records: &shared },
            AccumulatorUpdate { accumulator: b"", records: &shared[..2] },
            AccumulatorUpdate { accumulator: b"c", records: &equal },
            AccumulatorUpdate { accumulator: b"d", records: &other },
            AccumulatorUpdate { accumulator: b"e", records: &shared },
        ];
        let packed = pack_updates(&updates);
        let expected: Vec<(Vec<u8>, Vec<u32>)> =
            updates.iter().map(|u| (u.accumulator.to_vec(), u.records.to_vec())).collect();
        assert_eq!(unpacked(&packed), expected);
        assert_eq!(packed.records, [1, 4, 7, 1, 4, 1, 4, 7, 2, 1, 4, 7], "only the second update's run is reused");
    }

    fn timers(key_lens: &[usize]) -> Vec<FiredTimer> {
        key_lens
            .iter()
            .enumerate()
            .map(|(i, &len)| FiredTimer {
                timestamp: i as i64,
                key_group: 0,
                key: vec![b'k'; len],
                domain: TimeDomain::EventTime,
            })
            .collect()
    }

    /// The batch sizes `timer_batches` cuts `key_lens` into.
    fn sizes(key_lens: &[usize], max_timers: usize, max_key_bytes: usize) -> Vec<usize> {
        let fired = timers(key_lens);
        let batches: Vec<&[FiredTimer]> = timer_batches(&fired, max_timers, max_key_bytes).collect();
        let rejoined: Vec<FiredTimer> = batches.iter().flat_map(|b| b.iter().cloned()).collect();
        assert_eq!(rejoined, fired, "every timer once, in order");
        batches.iter().map(|b| b.len()).collect()
    }

    #[test]
    fn due_timers_are_cut_into_batches_by_count_and_key_bytes() {
        // (key lengths, max timers, max key bytes, batch sizes), worked out by hand.
        let cases: [(&[usize], usize, usize, &[usize]); 8] = [
            (&[], 3, 100, &[]),
            (&[1, 1, 1, 1, 1, 1, 1], 3, 100, &[3, 3, 1]),
            (&[1, 1, 1], 3, 100, &[3]),
            (&[4, 4, 4, 4], 10, 8, &[2, 2]),
            (&[4, 4, 4, 4], 10, 9, &[2, 2]),
            (&[4, 4, 4, 4], 10, 12, &[3, 1]),
            (&[20, 1, 30, 1], 10, 8, &[1, 1, 1, 1]),
            (&[1, 1], 0, 100, &[1, 1]),
        ];
        for (key_lens, max_timers, max_key_bytes, expected) in cases {
            assert_eq!(
                sizes(key_lens, max_timers, max_key_bytes),
                expected,
                "{key_lens:?} by {max_timers}, {max_key_bytes}"
            );
        }
    }
}
