//! The window operator: event-time windows (tumbling, sliding, merging sessions) over an
//! aggregate, with allowed lateness and a late-data side output. Flink's event-time windows
//! with the default event-time trigger, on Eddy's state backends.
//!
//! Per (key, window) the operator keeps one accumulator; the aggregate (usually a Wasm
//! component, [`AggregateFn`] for [`AggregateInstance`]) creates, adds to, merges and reads it.
//! A window fires when the watermark reaches its firing time and emits one record
//! `{"start": s, "end": e, "result": R}` with the key and timestamp `end - 1`; it is purged
//! `allowed_lateness_ms` later, and each record arriving in between re-fires it at once
//! (Flink's contract: one result per late record, whatever the batching upstream).
//!
//! Lateness: a record is late (side output, or dropped) when no window it would join is still
//! kept. For tumbling and sliding windows those are the windows containing its timestamp; for
//! a session it is the session it would make: `[t, t + gap)` merged with the key's kept
//! sessions it overlaps or touches (as Flink's merging window assigner judges lateness on the
//! merged window). So a record behind the watermark still joins an open session around it.
//! A record whose window would start or end outside `i64` (a timestamp within one window
//! length of ±2^63 ms) belongs to no window and is late too: one bad timestamp in the input
//! must not fail, and with restarts crash-loop, the job.
//!
//! Batches: the records of a batch up to the first one that fires a window at once (a late
//! but allowed record) are folded with one `add` crossing and that record's re-fires are read
//! with one `results`; the rest of the batch continues the same way. So an on-time batch costs
//! one `add`, and each late-but-allowed record one more: late records are the exception, and
//! a re-fire must hold exactly the records that arrived before it.
//!
//! Firing time: `max_timestamp()` (`end - 1`) for tumbling and sliding windows, but `end` for
//! sessions, because [`SessionWindows`] merges sessions that merely touch: a record at exactly
//! `end` still extends `[start, end)`, so the session is only final once the watermark (the
//! last time known complete) reaches `end`. Firing one millisecond earlier would split a
//! session that a batch computation keeps whole.
//!
//! State (all in the [`StateBackend`] once written back, which every snapshot does first, so a
//! snapshot of the backend is a snapshot of the operator; between snapshots the store keeps
//! updates in a bounded write-back buffer) is laid out as [`eddy_plan::window_state`] says:
//! an accumulator per (key, window) and, for sessions, each key's session set. A session stays
//! in the set until purged, so a record within the allowed lateness can still merge into a
//! fired session. The buffer and why it is held per key: [`store`].

use eddy_core::{RecordBatch, RecordView, WATERMARK_MIN};
use eddy_runtime::{AccumulatorUpdate, AggregateInstance, Component, Items, Output};
use eddy_state::{DeclaredState, StateBackend, StateError, StateKind};

use eddy_checkpoint::OperatorSnapshot;

use crate::operator::{OperatorError, StreamOperator};
use eddy_plan::window::{SessionWindows, Window, WindowKind};

mod local;
mod store;
#[cfg(test)]
mod tests;
mod timers;

pub use local::LocalWindowAggregate;

use store::{KeyEntries, WindowStore};
use timers::Timers;

pub use eddy_plan::window_state::{ACC_STATE, SESSIONS_STATE, encode_window};

/// [`eddy_plan::window_state::decode_window`], its error as damaged state.
pub fn decode_window(bytes: &[u8]) -> Result<Window, StateError> {
    eddy_plan::window_state::decode_window(bytes).map_err(StateError::Corrupt)
}

/// The aggregate a window operator folds records into. Accumulators and results are opaque
/// bytes; the operator only stores them and hands them back.
///
/// `add` and `results` take many windows at once because each call of a Wasm aggregate is a
/// crossing: a batch costs one `add` however many (key, window) groups it touches, and one
/// watermark one `results` however many windows it fires.
pub trait AggregateFn: Send {
    /// A new, empty accumulator; the same bytes every time (the operator asks once).
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError>;
    /// Each update's accumulator with its records of `batch` added, one per update, in order.
    /// An update's records share one key and one window and are in arrival order.
    fn add(&mut self, batch: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError>;
    /// One accumulator holding what `a` and `b` hold (sessions that merged).
    fn merge(&mut self, a: &[u8], b: &[u8]) -> Result<Vec<u8>, OperatorError>;
    /// The windows' results, one per accumulator, in order.
    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError>;
    /// Linear memory the aggregate's instance holds now (0 when not a Wasm instance).
    fn memory_bytes(&mut self) -> u64 {
        0
    }
    /// The row schemas the aggregate declared (its accumulators', if they are rows), for
    /// snapshots.
    fn declared_schemas(&self) -> Vec<eddy_wire::schema::Schema> {
        Vec::new()
    }
    /// Goes on with `component`'s code, opened with `config` (a live swap at a barrier). The
    /// accumulators stay where they are: the new code must read the old one's.
    fn swap_code(&mut self, _component: &Component, _config: &str) -> Result<(), String> {
        Err("this aggregate has no Wasm code to swap".into())
    }
}

impl AggregateFn for AggregateInstance {
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        Ok(AggregateInstance::create_accumulator(self)?)
    }

    fn add(&mut self, batch: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError> {
        Ok(AggregateInstance::add(self, batch, updates)?)
    }

    fn merge(&mut self, a: &[u8], b: &[u8]) -> Result<Vec<u8>, OperatorError> {
        Ok(AggregateInstance::merge(self, a, b)?)
    }

    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError> {
        Ok(AggregateInstance::results(self, accs)?)
    }

    fn memory_bytes(&mut self) -> u64 {
        AggregateInstance::memory_bytes(self) as u64
    }

    fn declared_schemas(&self) -> Vec<eddy_wire::schema::Schema> {
        AggregateInstance::declared_schemas(self)
    }

    fn swap_code(&mut self, component: &Component, config: &str) -> Result<(), String> {
        let mut next = component.instantiate_aggregate().map_err(|e| e.to_string())?;
        next.open(config).map_err(|e| format!("the new code's `open`: {e}"))?;
        *self = next;
        Ok(())
    }
}

/// What happens to records too late for every window they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LateData {
    /// They go, unchanged, to the side output of this name.
    SideOutput(String),
    /// They are dropped (still counted by [`StreamOperator::late_records`]).
    Drop,
}

/// How a window operator groups records and treats late ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowConfig {
    /// The assigner; must pass [`WindowKind::validate`].
    pub kind: WindowKind,
    /// How long after firing a window still accepts records (and re-fires); negative means 0.
    pub allowed_lateness_ms: i64,
    /// Where records later than that go.
    pub late_data: LateData,
    /// Number of key groups of the job (`1..=MAX_PARALLELISM_LIMIT`), for the state keys.
    pub max_parallelism: u32,
    /// The records are partial accumulators of a two-phase window's first phase
    /// ([`LocalWindowAggregate`]), merged in, instead of records added.
    pub partial_input: bool,
}

/// The records of `batch` from index `from` on, with their indices (without walking the
/// ones before: a batch is resumed after each record that fires a window).
fn records_from(batch: &RecordBatch, from: usize) -> impl Iterator<Item = (usize, RecordView<'_>)> {
    (from..batch.len()).filter_map(|i| Some((i, batch.get(i)?)))
}

/// A result that is due: (firing time, key, window, result bytes).
type Fired = (i64, Vec<u8>, Window, Vec<u8>);

/// A session built during one batch: the stored sessions it swallowed and its new records
/// (inline up to a few: a batch usually gives a key one or two records, and these are built
/// per key per batch).
#[derive(Debug, Default)]
struct PendingSession {
    stored: smallvec::SmallVec<[Window; 2]>,
    records: smallvec::SmallVec<[u32; 4]>,
}

/// One key's sessions while a batch is folded: all of them (stored and new), and the ones the
/// batch built or changed, in window order.
#[derive(Debug)]
struct KeySessions<'b> {
    key: &'b [u8],
    sessions: SessionWindows,
    pending: smallvec::SmallVec<[(Window, PendingSession); 1]>,
}

impl KeySessions<'_> {
    fn take_pending(&mut self, window: &Window) -> Option<PendingSession> {
        let at = self.pending.iter().position(|(w, _)| w == window)?;
        Some(self.pending.remove(at).1)
    }

    fn put_pending(&mut self, window: Window, session: PendingSession) {
        let at = self.pending.partition_point(|(w, _)| *w < window);
        self.pending.insert(at, (window, session));
    }
}

/// The (key, window) groups of one batch, gathered for a single batched `add`: their
/// accumulators and record runs in flat buffers, not a `Vec` each. Groups may share a run:
/// a sliding window's records are those of the panes it covers, the same for most of a key's
/// windows in a batch.
#[derive(Debug, Default)]
struct Updates<'b> {
    windows: Vec<(&'b [u8], Window)>,
    accs: Items,
    records: Vec<u32>,
    runs: Vec<std::ops::Range<usize>>,
    /// Per window, whether it may lack timers (new, or merged): a window already in state
    /// has both, and registering them again costs a key copy and two tree descents.
    needs_timers: Vec<bool>,
}

impl<'b> Updates<'b> {
    /// Appends `records` (ascending) as a run for [`Self::push`].
    fn run(&mut self, records: impl IntoIterator<Item = u32>) -> std::ops::Range<usize> {
        let start = self.records.len();
        self.records.extend(records);
        start..self.records.len()
    }

    fn push(&mut self, key: &'b [u8], window: Window, acc: &[u8], run: std::ops::Range<usize>, needs_timers: bool) {
        self.windows.push((key, window));
        self.accs.push(acc);
        self.runs.push(run);
        self.needs_timers.push(needs_timers);
    }

    fn as_updates(&self) -> Vec<AccumulatorUpdate<'_>> {
        self.accs
            .iter()
            .zip(&self.runs)
            .map(|(acc, run)| AccumulatorUpdate { accumulator: acc, records: &self.records[run.clone()] })
            .collect()
    }
}

/// The records of a batch by key and pane, for tumbling and sliding windows: its keys in
/// first-seen order (the order does not matter: what fires is sorted), each found once per
/// record by hashing, with the panes its records fall in kept in order, each with its records
/// in arrival order, chained through one table rather than a `Vec` per pane.
///
/// A pane is one slide of time (a whole window when tumbling); every window holding a record
/// holds the record's whole pane, so a record is filed once, not once per window (five times
/// for q5's 10 s windows sliding every 2 s), and a window's records are its panes'.
#[derive(Debug, Default)]
struct Groups<'b> {
    index: foldhash::HashMap<&'b [u8], u32>,
    /// The key added last and where it is in `keys`: runs of one key (q7's one global key,
    /// a hot auction's bids) skip hashing it again.
    last: Option<(&'b [u8], u32)>,
    keys: Vec<BatchKey<'b>>,
    /// Per member: the record, and the pane's next member ([`Groups::END`]: none).
    members: Vec<(u32, u32)>,
}

/// One key of a batch and its panes (inline up to two: a batch is about one slide long).
#[derive(Debug)]
struct BatchKey<'b> {
    key: &'b [u8],
    panes: smallvec::SmallVec<[Pane; 2]>,
}

/// One pane of a key of a batch (by its start), and the ends of its chain of members.
#[derive(Debug)]
struct Pane {
    start: i64,
    first: u32,
    last: u32,
}

impl<'b> Groups<'b> {
    const END: u32 = u32::MAX;

    fn add(&mut self, key: &'b [u8], pane: i64, record: u32) {
        let at = match self.last {
            Some((last, at)) if last == key => at,
            _ => {
                let keys = &mut self.keys;
                let at = *self.index.entry(key).or_insert_with(|| {
                    keys.push(BatchKey { key, panes: smallvec::SmallVec::new() });
                    keys.len() as u32 - 1
                });
                self.last = Some((key, at));
                at
            }
        };
        let panes = &mut self.keys[at as usize].panes;
        let member = self.members.len() as u32;
        self.members.push((record, Self::END));
        match panes.binary_search_by(|p| p.start.cmp(&pane)) {
            Ok(p) => {
                let pane = &mut panes[p];
                self.members[pane.last as usize].1 = member;
                pane.last = member;
            }
            Err(p) => panes.insert(p, Pane { start: pane, first: member, last: member }),
        }
    }

    /// The records of the pane whose first member is `first`, in arrival order.
    fn records(&self, first: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(first), |&m| Some(self.members[m as usize].1).filter(|&n| n != Self::END))
            .map(|m| self.members[m as usize].0)
    }

    /// Appends the records of `panes` to `updates` as one run in arrival order.
    fn run(&self, panes: &[Pane], updates: &mut Updates<'_>) -> std::ops::Range<usize> {
        let run = updates.run(panes.iter().flat_map(|p| self.records(p.first)));
        if panes.len() > 1 {
            // Each pane's records ascend, and a record is in one pane: sorting merges them.
            updates.records[run.clone()].sort_unstable();
        }
        run
    }
}

/// Where the pane holding `timestamp` starts: a slide of a sliding window, a whole tumbling
/// window. None for sessions, and for a timestamp whose pane would start before `i64::MIN`.
fn pane_start(kind: WindowKind, timestamp: i64) -> Option<i64> {
    let step = match kind {
        WindowKind::Tumbling { size_ms } => size_ms,
        WindowKind::Sliding { slide_ms, .. } => slide_ms,
        WindowKind::Session { .. } => return None,
    };
    timestamp.checked_sub(timestamp.rem_euclid(step))
}

/// Windows due to fire, with their accumulators, for one `results` call.
#[derive(Debug, Default)]
struct Due<'k> {
    windows: Vec<(i64, &'k [u8], Window)>,
    accs: Items,
}

impl<'k> Due<'k> {
    fn push(&mut self, fire_time: i64, key: &'k [u8], window: Window, acc: &[u8]) {
        self.windows.push((fire_time, key, window));
        self.accs.push(acc);
    }
}

/// When `window` of `kind` fires (see the module docs for why sessions fire at `end`).
fn fire_time(kind: WindowKind, window: &Window) -> i64 {
    match kind {
        WindowKind::Session { .. } => window.end,
        WindowKind::Tumbling { .. } | WindowKind::Sliding { .. } => window.max_timestamp(),
    }
}

/// When `window` of `kind` fires, and when its state is purged `lateness` ms later.
fn window_times(kind: WindowKind, lateness: i64, window: &Window) -> (i64, i64) {
    let fire = fire_time(kind, window);
    (fire, fire.saturating_add(lateness))
}

/// Event-time windows of keyed records over an aggregate (see the module docs).
///
/// An error from the aggregate or the state backend can leave a batch or a watermark half
/// applied; the task then fails and restarts from its last checkpoint, as for a guest trap.
pub struct WindowOperator<A: AggregateFn> {
    name: String,
    kind: WindowKind,
    allowed_lateness_ms: i64,
    late_data: LateData,
    aggregate: A,
    /// The aggregate's empty accumulator, asked for once.
    empty_acc: Option<Vec<u8>>,
    store: WindowStore,
    watermark: i64,
    /// `None` until the first call rebuilds it from the backend (which may hold restored state).
    timers: Option<Timers>,
    late_records: u64,
    /// The aggregate's code and config, when it is Wasm (what a live swap needs).
    code: Option<Code>,
    /// See [`WindowConfig::partial_input`].
    partial_input: bool,
}

/// The code a window step's aggregate runs, and the config its `open` got.
#[derive(Debug, Clone)]
struct Code {
    config: String,
    artifact: String,
}

impl<A: AggregateFn> std::fmt::Debug for WindowOperator<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowOperator")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("allowed_lateness_ms", &self.allowed_lateness_ms)
            .field("late_data", &self.late_data)
            .field("watermark", &self.watermark)
            .field("late_records", &self.late_records)
            .finish_non_exhaustive()
    }
}

impl<A: AggregateFn> WindowOperator<A> {
    /// A window operator named `name` over `aggregate`, keeping its state in `state`. The
    /// backend may hold state of an earlier run of this operator: its windows are picked up
    /// (and fire) as if they had never stopped.
    pub fn new(name: impl Into<String>, config: WindowConfig, aggregate: A, state: Box<dyn StateBackend>) -> Self {
        debug_assert!(config.kind.validate().is_ok(), "unvalidated window config {:?}", config.kind);
        let name = name.into();
        Self {
            store: WindowStore::new(state, name.clone(), config.max_parallelism),
            name,
            kind: config.kind,
            allowed_lateness_ms: config.allowed_lateness_ms.max(0),
            late_data: config.late_data,
            aggregate,
            empty_acc: None,
            watermark: WATERMARK_MIN,
            timers: None,
            late_records: 0,
            code: None,
            partial_input: config.partial_input,
        }
    }

    /// Names the aggregate's code (`artifact`, a digest) and the config it was opened with:
    /// snapshots record the artifact, and a live swap opens new code with the config.
    pub fn with_code(mut self, config: String, artifact: String) -> Self {
        self.code = Some(Code { config, artifact });
        self
    }

    /// The state backend, with everything the operator holds written to it (for tests).
    pub fn state(&mut self) -> Result<&dyn StateBackend, OperatorError> {
        self.store.write_back()?;
        Ok(self.store.backend.as_ref())
    }

    /// Gives the state backend back, everything written to it, to hand it to a restarted
    /// operator (what a snapshot and a restore do).
    pub fn into_state(mut self) -> Result<Box<dyn StateBackend>, OperatorError> {
        self.store.write_back()?;
        Ok(self.store.backend)
    }

    /// A write-back buffer of `bytes` instead of [`eddy_state::WINDOW_CACHE_BYTES`] (tests
    /// drive the write-backs that running past the budget causes).
    pub fn with_write_back_budget(mut self, bytes: usize) -> Self {
        self.store.set_budget(bytes);
        self
    }

    /// The aggregate.
    pub fn aggregate(&self) -> &A {
        &self.aggregate
    }

    /// The watermark the operator last saw.
    pub fn current_watermark(&self) -> i64 {
        self.watermark
    }

    fn empty_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        if let Some(acc) = &self.empty_acc {
            return Ok(acc.clone());
        }
        let acc = self.aggregate.create_accumulator()?;
        self.empty_acc = Some(acc.clone());
        Ok(acc)
    }

    fn fire_time(&self, window: &Window) -> i64 {
        fire_time(self.kind, window)
    }

    /// When `window`'s state is purged; from then on it takes no records.
    fn cleanup_time(&self, window: &Window) -> i64 {
        window_times(self.kind, self.allowed_lateness_ms, window).1
    }

    fn past_cleanup(&self, window: &Window) -> bool {
        self.cleanup_time(window) <= self.watermark
    }

    fn bad_record(&self, problem: String) -> OperatorError {
        OperatorError::BadRecord { operator: self.name.clone(), problem }
    }

    fn empty_output(&self) -> Output {
        let side = match &self.late_data {
            LateData::SideOutput(name) => vec![(name.clone(), RecordBatch::default())],
            LateData::Drop => Vec::new(),
        };
        Output { main: RecordBatch::default(), side }
    }

    fn emit_late(&mut self, out: &mut Output, record: &RecordView<'_>) {
        self.late_records += 1;
        if let Some((_, batch)) = out.side.first_mut() {
            batch.push_view(record);
        }
    }

    /// The timer index, rebuilt from the backend on first use.
    fn timers(&mut self) -> Result<&mut Timers, OperatorError> {
        if self.timers.is_none() {
            let mut timers = Timers::new(self.kind, self.allowed_lateness_ms);
            for (key, window, fired) in self.store.windows()? {
                timers.insert(self.fire_time(&window), self.cleanup_time(&window), &key, window, fired);
            }
            self.timers = Some(timers);
        }
        Ok(self.timers.get_or_insert_with(|| Timers::new(self.kind, self.allowed_lateness_ms)))
    }

    /// Checks every record before any state changes, so a bad batch leaves no partial effect.
    fn validate(&self, batch: &RecordBatch) -> Result<(), OperatorError> {
        for (i, r) in batch.iter().enumerate() {
            if r.key.is_none() {
                return Err(self.bad_record(format!(
                    "record {i} of the batch has no key; a window needs keyed records: add `key_by` to the step"
                )));
            }
            if r.timestamp.is_none() {
                return Err(self.bad_record(format!(
                    "record {i} of the batch has no event timestamp; a window needs event time: add `timestamp` \
                     (a JSON pointer such as `/ts`) to the source"
                )));
            }
        }
        Ok(())
    }

    /// Folds the batch into every gathered group in one `add`, then stores each new
    /// accumulator with its timers. A window whose firing time the watermark already passed
    /// (a late-but-allowed record, or a window first seen then) fires now.
    fn apply(&mut self, batch: &RecordBatch, updates: Updates<'_>) -> Result<Vec<Fired>, OperatorError> {
        if updates.windows.is_empty() {
            return Ok(Vec::new());
        }
        let accs = self.aggregate.add(batch, &updates.as_updates())?;
        if accs.len() != updates.windows.len() {
            return Err(self.miscounted("accumulators", accs.len(), updates.windows.len()));
        }
        self.store_accs(&updates.windows, &accs, &updates.needs_timers)
    }

    /// Stores each window's new accumulator (`accs`, one per window) with its timers where
    /// it may lack them; a window whose firing time the watermark already passed fires now.
    fn store_accs(
        &mut self,
        windows: &[(&[u8], Window)],
        accs: &Items,
        needs_timers: &[bool],
    ) -> Result<Vec<Fired>, OperatorError> {
        self.timers()?;
        let Self { store, timers, kind, allowed_lateness_ms, watermark, .. } = self;
        let timers = timers.get_or_insert_with(|| Timers::new(*kind, *allowed_lateness_ms));
        let mut due = Due::default();
        let mut accs = accs.iter().zip(needs_timers.iter().copied());
        // Updates come key by key: each key is found once.
        for run in windows.chunk_by(|a, b| a.0 == b.0) {
            let key = run[0].0;
            let mut entries = store.key(key);
            for (&(_, window), (acc, needs_timers)) in run.iter().zip(accs.by_ref()) {
                let (fire_time, cleanup_time) = window_times(*kind, *allowed_lateness_ms, &window);
                let fires_now = fire_time <= *watermark;
                entries.put_acc(&window, fires_now, acc);
                if fires_now {
                    due.push(fire_time, key, window, acc);
                }
                if needs_timers {
                    timers.insert(fire_time, cleanup_time, key, window, fires_now);
                }
            }
        }
        self.fire(due)
    }

    /// An aggregate that answered a batched call with another number of items than asked (the
    /// Wasm runtime refuses that itself; this guards every other [`AggregateFn`]).
    fn miscounted(&self, what: &str, got: usize, asked: usize) -> OperatorError {
        OperatorError::BadRecord {
            operator: self.name.clone(),
            problem: format!("the aggregate returned {got} {what} for {asked} windows"),
        }
    }

    /// The results of `due` windows, from one `results` call, one per window in order.
    fn results(&mut self, due: &Due<'_>) -> Result<Items, OperatorError> {
        if due.windows.is_empty() {
            return Ok(Items::default());
        }
        let results = self.aggregate.results(&due.accs)?;
        if results.len() != due.windows.len() {
            return Err(self.miscounted("results", results.len(), due.windows.len()));
        }
        Ok(results)
    }

    /// The results of `due` windows, to be sorted among others before they are emitted.
    fn fire(&mut self, due: Due<'_>) -> Result<Vec<Fired>, OperatorError> {
        let results = self.results(&due)?;
        let fired = due.windows.into_iter().zip(results.iter());
        Ok(fired.map(|((t, k, w), result)| (t, k.to_vec(), w, result.to_vec())).collect())
    }

    /// The windows holding the pane starting at `pane` (each holds it whole) that still take
    /// records, in window order, into `windows`.
    fn live_windows(&self, pane: i64, windows: &mut Vec<Window>) {
        self.kind.assign_into(pane, windows);
        windows.retain(|w| !self.past_cleanup(w));
    }

    /// Folds the records of `batch` from `from` on into their windows, up to and including
    /// the first one that fires a window at once. Returns what fired and where to go on.
    fn process_fixed(
        &mut self,
        batch: &RecordBatch,
        from: usize,
        out: &mut Output,
    ) -> Result<(Vec<Fired>, usize), OperatorError> {
        let mut groups = Groups::default();
        let mut next = batch.len();
        let mut live = Vec::new();
        // Whether the last pane seen has windows still taking records, and whether one of
        // them fires at once: the same for every record of the pane, and a batch spans few.
        let mut last_pane: Option<(i64, bool, bool)> = None;
        for (i, r) in records_from(batch, from) {
            let (Some(key), Some(t)) = (r.key, r.timestamp) else { continue };
            let Some(pane) = pane_start(self.kind, t) else {
                self.emit_late(out, &r);
                continue;
            };
            let (taken, fires_now) = match last_pane {
                Some((p, taken, fires_now)) if p == pane => (taken, fires_now),
                _ => {
                    self.live_windows(pane, &mut live);
                    let fires_now = live.iter().any(|w| self.fire_time(w) <= self.watermark);
                    last_pane = Some((pane, !live.is_empty(), fires_now));
                    (!live.is_empty(), fires_now)
                }
            };
            if !taken {
                self.emit_late(out, &r);
                continue;
            }
            groups.add(key, pane, i as u32);
            if fires_now {
                next = i + 1;
                break;
            }
        }
        let mut updates = Updates::default();
        let empty = self.empty_accumulator()?;
        let mut windows = Vec::new();
        // `live` holds the windows of this pane (most keys of a batch have the same one pane).
        let mut live_of = None;
        for BatchKey { key, panes } in &groups.keys {
            windows.clear();
            for pane in panes {
                if live_of != Some(pane.start) {
                    self.live_windows(pane.start, &mut live);
                    live_of = Some(pane.start);
                }
                windows.extend_from_slice(&live);
            }
            if panes.len() > 1 {
                windows.sort_unstable();
                windows.dedup();
            }
            let mut entries = self.store.key(key);
            // Neighbouring windows mostly cover the same panes, so they share one run.
            let mut shared: Option<(std::ops::Range<usize>, std::ops::Range<usize>)> = None;
            for &window in &windows {
                let covered =
                    panes.partition_point(|p| p.start < window.start)..panes.partition_point(|p| p.start < window.end);
                let run = match &shared {
                    Some((covers, run)) if *covers == covered => run.clone(),
                    _ => {
                        let run = groups.run(&panes[covered.clone()], &mut updates);
                        shared = Some((covered, run.clone()));
                        run
                    }
                };
                match entries.acc(&window)? {
                    Some((_, acc)) => updates.push(key, window, acc, run, false),
                    None => updates.push(key, window, &empty, run, true),
                }
            }
        }
        Ok((self.apply(batch, updates)?, next))
    }

    /// [`Self::process_fixed`] for a two-phase window: each record is a partial accumulator
    /// of one key and pane (timestamped with the pane's start), merged into every window
    /// holding the pane that still takes records; a window without state takes the partial as
    /// it is (it was folded from the empty accumulator). One `merge` crossing per partial and
    /// window already holding one: a batch of the first phase gives a key a partial or two.
    fn process_partials(&mut self, batch: &RecordBatch, out: &mut Output) -> Result<Vec<Fired>, OperatorError> {
        let mut at: foldhash::HashMap<(&[u8], Window), usize> = foldhash::HashMap::default();
        let mut windows: Vec<(&[u8], Window)> = Vec::new();
        let mut merged: Vec<Vec<u8>> = Vec::new();
        let mut needs_timers = Vec::new();
        let mut live = Vec::new();
        for (_, r) in records_from(batch, 0) {
            let (Some(key), Some(t)) = (r.key, r.timestamp) else { continue };
            match pane_start(self.kind, t) {
                Some(pane) => self.live_windows(pane, &mut live),
                None => live.clear(),
            }
            if live.is_empty() {
                self.emit_late(out, &r);
                continue;
            }
            let Self { store, aggregate, .. } = self;
            let mut entries = store.key(key);
            for &window in &live {
                if let Some(&i) = at.get(&(key, window)) {
                    merged[i] = aggregate.merge(&merged[i], r.value)?;
                    continue;
                }
                let (acc, new) = match entries.acc(&window)? {
                    Some((_, stored)) => (aggregate.merge(stored, r.value)?, false),
                    None => (r.value.to_vec(), true),
                };
                at.insert((key, window), windows.len());
                windows.push((key, window));
                merged.push(acc);
                needs_timers.push(new);
            }
        }
        let accs: Items = merged.iter().map(Vec::as_slice).collect();
        self.store_accs(&windows, &accs, &needs_timers)
    }

    /// [`Self::process_fixed`] for sessions: each record is merged with its key's sessions
    /// (stored, and built from earlier records of the batch), and is late only if the merged
    /// session is past its cleanup.
    fn process_sessions(
        &mut self,
        batch: &RecordBatch,
        from: usize,
        out: &mut Output,
    ) -> Result<(Vec<Fired>, usize), OperatorError> {
        // Keys in first-seen order, each found by hashing (as `Groups`): what fires is sorted.
        let mut index: foldhash::HashMap<&[u8], u32> = foldhash::HashMap::default();
        let mut keys: Vec<KeySessions<'_>> = Vec::new();
        let mut next = batch.len();
        let mut assigned = Vec::new();
        for (i, r) in records_from(batch, from) {
            let (Some(key), Some(t)) = (r.key, r.timestamp) else { continue };
            self.kind.assign_into(t, &mut assigned);
            let Some(&window) = assigned.first() else {
                self.emit_late(out, &r);
                continue;
            };
            let at = match index.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => *e.get(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let mut sessions = SessionWindows::default();
                    for w in self.store.sessions(key)? {
                        sessions.add(w);
                    }
                    keys.push(KeySessions { key, sessions, pending: smallvec::SmallVec::new() });
                    *e.insert(keys.len() as u32 - 1)
                }
            };
            let sessions = &mut keys[at as usize];
            if self.past_cleanup(&sessions.sessions.cover(window)) {
                self.emit_late(out, &r);
                continue;
            }
            let merge = sessions.sessions.add(window);
            // Most records extend one session this batch already holds: it grows where it
            // lies (its cover overlaps no other session, so the order stands), instead of
            // being taken out and put back, two moves of it and its neighbours per record.
            if let [only] = merge.absorbed.as_slice()
                && let Some((grown, session)) = sessions.pending.iter_mut().find(|(w, _)| w == only)
            {
                *grown = merge.result;
                session.records.push(i as u32);
            } else {
                let mut session = PendingSession::default();
                for absorbed in merge.absorbed {
                    match sessions.take_pending(&absorbed) {
                        // The first pending one absorbed is taken whole: no new lists per record.
                        Some(p) if session.stored.is_empty() && session.records.is_empty() => session = p,
                        Some(p) => {
                            session.stored.extend(p.stored);
                            session.records.extend(p.records);
                        }
                        // Not touched in this batch yet: a stored session with an accumulator.
                        None => session.stored.push(absorbed),
                    }
                }
                session.records.push(i as u32);
                sessions.put_pending(merge.result, session);
            }
            if self.fire_time(&merge.result) <= self.watermark {
                next = i + 1;
                break;
            }
        }
        let empty = self.empty_accumulator()?;
        let mut updates = Updates::default();
        // Absorbed sessions the backend may hold, deleted there once every key is done: each
        // key is found once for its merges and its session list.
        let mut stored_gone: Vec<(&[u8], Window)> = Vec::new();
        let Self { store, aggregate, .. } = self;
        for KeySessions { key, sessions, pending } in keys {
            let mut entries = store.key(key);
            for (window, mut session) in pending {
                let (acc, timed) = merge_stored(&mut entries, aggregate, &window, &session.stored, &empty, |part| {
                    stored_gone.push((key, part));
                })?;
                // Merged pending sessions interleave; `add` wants arrival order.
                session.records.sort_unstable();
                let run = updates.run(session.records.iter().copied());
                updates.push(key, window, &acc, run, !timed);
            }
            entries.put_sessions(sessions.sessions());
        }
        for (key, part) in stored_gone {
            self.store.delete_stored_acc(key, &part)?;
        }
        Ok((self.apply(batch, updates)?, next))
    }

    /// Appends one window result to `out`; a result that would take the output past what one
    /// batch can address (results come from the guest) fails the step instead of the host.
    fn result_record(&self, out: &mut Output, key: &[u8], window: &Window, result: &[u8]) -> Result<(), OperatorError> {
        if eddy_wire::row::is_row(result) {
            let write = |data: &mut Vec<u8>| {
                eddy_connectors::values::write_window_row(data, window.start, window.end, result);
            };
            return out.main.try_push_written(Some(key), Some(window.max_timestamp()), write).map_err(|full| {
                OperatorError::BadRecord {
                    operator: self.name.clone(),
                    problem: format!("window results of one call are too large: {full}"),
                }
            });
        }
        let mut value = format!("{{\"start\":{},\"end\":{},\"result\":", window.start, window.end).into_bytes();
        if serde_json::from_slice::<serde::de::IgnoredAny>(result).is_ok() {
            value.extend_from_slice(result.trim_ascii());
        } else {
            // Not JSON: embed it as a string so the output stays one JSON value.
            let text = serde_json::Value::String(String::from_utf8_lossy(result).into_owned());
            value.extend_from_slice(text.to_string().as_bytes());
        }
        value.push(b'}');
        out.main.try_push(Some(key), &value, Some(window.max_timestamp())).map_err(|full| OperatorError::BadRecord {
            operator: self.name.clone(),
            problem: format!("window results of one call are too large: {full}"),
        })
    }

    fn emit_results(&self, out: &mut Output, mut fired: Vec<Fired>) -> Result<(), OperatorError> {
        fired.sort_by(|a, b| (a.0, &a.1, a.2).cmp(&(b.0, &b.1, b.2)));
        for (_, key, window, result) in fired {
            self.result_record(out, &key, &window, &result)?;
        }
        Ok(())
    }
}

/// The accumulator of session `window` from the stored sessions it absorbed (`empty` if
/// none), whose state gives way to it (`gone` gets those the backend may hold); and whether
/// one of them has not fired, so that its timers, pending, come due for `window` (see
/// `timers`).
fn merge_stored<A: AggregateFn>(
    entries: &mut KeyEntries<'_>,
    aggregate: &mut A,
    window: &Window,
    stored: &[Window],
    empty: &[u8],
    mut gone: impl FnMut(Window),
) -> Result<(Vec<u8>, bool), OperatorError> {
    let mut acc: Option<Vec<u8>> = None;
    let mut timed = false;
    for part in stored {
        let Some((fired, part_acc)) = entries.acc(part)?.map(|(fired, acc)| (fired, acc.to_vec())) else {
            return Err(entries.corrupt(format!(
                "session [{}, {}) is in the session set but has no accumulator",
                part.start, part.end
            )));
        };
        timed |= !fired;
        acc = Some(match acc {
            None => part_acc,
            Some(a) => aggregate.merge(&a, &part_acc)?,
        });
        if part != window && entries.remove_acc(part) {
            gone(*part);
        }
    }
    Ok((acc.unwrap_or_else(|| empty.to_vec()), timed))
}

impl<A: AggregateFn + 'static> StreamOperator for WindowOperator<A> {
    fn name(&self) -> &str {
        &self.name
    }

    fn process(&mut self, batch: &RecordBatch) -> Result<Output, OperatorError> {
        self.validate(batch)?;
        self.timers()?;
        let mut out = self.empty_output();
        let mut from = 0;
        while from < batch.len() {
            let (fired, next) = match self.kind {
                WindowKind::Session { .. } => self.process_sessions(batch, from, &mut out)?,
                WindowKind::Tumbling { .. } | WindowKind::Sliding { .. } if self.partial_input => {
                    (self.process_partials(batch, &mut out)?, batch.len())
                }
                WindowKind::Tumbling { .. } | WindowKind::Sliding { .. } => {
                    self.process_fixed(batch, from, &mut out)?
                }
            };
            self.emit_results(&mut out, fired)?;
            self.store.keep_within_budget()?;
            from = next;
        }
        Ok(out)
    }

    fn on_watermark(&mut self, watermark: i64) -> Result<Output, OperatorError> {
        let mut out = self.empty_output();
        if watermark <= self.watermark {
            return Ok(out);
        }
        self.watermark = watermark;
        self.timers()?;
        let Self { store, timers, kind, allowed_lateness_ms, .. } = self;
        let (kind, lateness) = (*kind, *allowed_lateness_ms);
        let timers = timers.get_or_insert_with(|| Timers::new(kind, lateness)).take_due(
            watermark,
            |key, window| {
                let sessions = store.sessions(key)?;
                Ok::<_, OperatorError>(sessions.into_iter().find(|s| s.start <= window.start && window.end <= s.end))
            },
            |session| window_times(kind, lateness, session),
        )?;
        // Already in (firing time, key) order.
        let mut due = Due::default();
        for (time, key, window) in timers.fire.iter() {
            let keep = self.cleanup_time(&window) > watermark;
            let mut entries = self.store.key(key);
            let Some((fired, acc)) = entries.acc(&window)? else {
                return Err(self.store.corrupt(format!(
                    "window [{}, {}) has a pending firing but no accumulator",
                    window.start, window.end
                )));
            };
            if fired {
                // Only in a queue shared with cleanups (see `Timers`): purged below, not fired again.
                continue;
            }
            due.accs.push(acc);
            if keep && let Some(acc) = due.accs.last() {
                // Kept for the allowed lateness; the flag stops a restored operator re-firing it.
                entries.put_acc(&window, true, acc);
            }
            due.windows.push((time, key, window));
        }
        // Already in emission order: emitted straight from the results.
        let results = self.results(&due)?;
        for ((_, key, window), result) in due.windows.iter().zip(results.iter()) {
            self.result_record(&mut out, key, window, result)?;
        }
        // A purged session also leaves its key's session list: gathered per key (borrowed from
        // the due timers, sorted), so each list is read and written once.
        let mut purged_sessions: Vec<(&[u8], Window)> = Vec::new();
        for (_, key, window) in timers.cleanup().iter() {
            self.store.delete_acc(key, &window)?;
            if matches!(self.kind, WindowKind::Session { .. }) {
                purged_sessions.push((key, window));
            }
        }
        purged_sessions.sort_unstable();
        for purged in purged_sessions.chunk_by(|a, b| a.0 == b.0) {
            let key = purged[0].0;
            let mut sessions = self.store.sessions(key)?;
            sessions.retain(|s| !purged.iter().any(|(_, p)| p == s));
            self.store.put_sessions(key, &sessions)?;
        }
        self.store.keep_within_budget()?;
        Ok(out)
    }

    /// Nothing: windows here run on event time only.
    fn on_processing_time(&mut self, _now_ms: i64) -> Result<Output, OperatorError> {
        Ok(self.empty_output())
    }

    /// Emits nothing: the engine's final watermark (`i64::MAX`) already fired every window.
    fn finish(&mut self) -> Result<Output, OperatorError> {
        Ok(self.empty_output())
    }

    fn late_records(&self) -> u64 {
        self.late_records
    }

    fn wasm_memory_bytes(&mut self) -> u64 {
        self.aggregate.memory_bytes()
    }

    /// State only, written back first: the timers are rebuilt from it on restore (see
    /// [`Timers`]).
    fn snapshot(&mut self, staging: &std::path::Path) -> Result<OperatorSnapshot, OperatorError> {
        // The barrier: what the buffer holds goes into the backend before its picture is taken.
        self.store.write_back()?;
        let usage = self.store.backend.usage();
        let state = self.store.backend.snapshot(staging).map_err(|e| self.store.error(e))?;
        let (states, schemas) = (self.declared_states(), self.aggregate.declared_schemas());
        let artifact = self.code.as_ref().map(|c| c.artifact.clone());
        Ok(OperatorSnapshot {
            timers: Vec::new(),
            state,
            usage,
            states,
            schemas,
            artifact,
            partial_input: self.partial_input,
        })
    }

    fn artifact(&self) -> Option<&str> {
        self.code.as_ref().map(|c| c.artifact.as_str())
    }

    /// The new code folds into the same accumulators from here on, and fires the windows they
    /// belong to; its empty accumulator is asked for again.
    fn swap_code(mut self: Box<Self>, component: &Component) -> Result<Box<dyn StreamOperator>, OperatorError> {
        let name = self.name.clone();
        let failed = |problem: String| OperatorError::Swap { operator: name.clone(), problem };
        let Some(code) = self.code.clone() else {
            return Err(failed("this window's aggregate is no Wasm component".into()));
        };
        self.aggregate.swap_code(component, &code.config).map_err(failed)?;
        self.empty_acc = None;
        self.code = Some(Code { artifact: component.digest().to_owned(), ..code });
        tracing::info!(operator = %self.name, artifact = component.digest(), "swapped to new code");
        Ok(self)
    }

    fn declared_states(&self) -> Vec<DeclaredState> {
        let mut states = vec![DeclaredState { name: ACC_STATE.into(), kind: StateKind::WindowAccumulator }];
        if matches!(self.kind, WindowKind::Session { .. }) {
            states.push(DeclaredState { name: SESSIONS_STATE.into(), kind: StateKind::WindowSessions });
        }
        states
    }
}
