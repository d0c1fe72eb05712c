//! Replay: one subtask of a journaled step run again, from a checkpoint's state over the
//! input its journal recorded ([`crate::journal`]), with everything the operator did shown in
//! order: each input record, what it emitted, each state read and write (decoded as rows or
//! JSON), timers set and fired, and the guest's log lines.
//!
//! The operator is built the way the job built it (the spec the journal recorded, the same
//! slot, its share of the checkpoint's state) but on the heap backend and with a state backend
//! and timer service that note every call ([`trace`]). A guest without granted clocks,
//! randomness or network is a pure function of its state, its input order and its timers, so
//! the replay emits what the subtask emitted. With other code (`wasm`), the same input goes
//! through another version: a canary for an upgrade.

pub(crate) mod trace;

use std::path::PathBuf;
use std::sync::Arc;

use eddy_checkpoint::inspect::{StateEntry, decode_entry, decode_value, json_or_text};
use eddy_checkpoint::{CheckpointError, CheckpointMetadata, CheckpointStore, RestorePoint};
use eddy_core::{KeyGroupRange, RecordBatch, TimeDomain};
use eddy_plan::{StateBackendKind, StoreLocation};
use eddy_runtime::{CpuShare, Output, Runtime, SandboxLimits};
use eddy_state::{DeclaredState, HashedKey, TtlClock, decode_state_key};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing_subscriber::layer::SubscriberExt;

use self::trace::{Effect, GuestLogs, TimerChange, Trace};
use crate::RunError;
use crate::job::{Slot, StepContext, load_step};
use crate::journal::{self, Frame, JournalHeader, Segment, parse_segment};
use crate::operator::{OperatorError, StreamOperator};

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// The job's checkpoint store (its journal is under `journal/` there).
    pub checkpoints: StoreLocation,
    /// The step.
    pub step: String,
    /// Which subtask of the step's task.
    pub subtask: u32,
    /// Start from this checkpoint's state (its segment must be kept); default: the oldest
    /// segment the journal keeps.
    pub from_checkpoint: Option<u64>,
    /// Show only what concerns this key (its bytes as stored: the key's JSON text).
    pub key: Option<Vec<u8>>,
    /// Replay through this component instead of the code the subtask ran.
    pub wasm: Option<PathBuf>,
    /// Stop after this input record (1 is the first replayed).
    pub until: Option<u64>,
    /// Stop once this many events were shown (a server bounds its answer so).
    pub max_events: Option<usize>,
    /// The sandbox the code runs in (a tenant's, on a server); default: the runtime's.
    pub limits: Option<SandboxLimits>,
    /// The CPU share its calls are charged to (a tenant's, on a server).
    pub cpu_share: Option<Arc<CpuShare>>,
    /// Where the checkpoint's files are fetched to for the replay (default: the system's
    /// temporary directory); removed after.
    pub scratch: Option<PathBuf>,
}

impl ReplayRequest {
    /// Subtask `subtask` of step `step`, whose job checkpoints into `checkpoints`: from the
    /// oldest state its journal reaches back to, every event, on the runtime's sandbox.
    pub fn new(checkpoints: StoreLocation, step: &str, subtask: u32) -> Self {
        Self {
            checkpoints,
            step: step.to_owned(),
            subtask,
            from_checkpoint: None,
            key: None,
            wasm: None,
            until: None,
            max_events: None,
            limits: None,
            cpu_share: None,
            scratch: None,
        }
    }
}

/// One thing the replay shows, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TraceEvent {
    /// A journal segment begins: the input after checkpoint `after_checkpoint`.
    Segment {
        /// The checkpoint it follows (0: the job's start).
        after_checkpoint: u64,
        /// The code the subtask ran then.
        artifact: String,
    },
    /// An input record (`n`: its place in the replay, from 1).
    Input {
        /// Its place.
        n: u64,
        /// The input channel its batch came over (behind an exchange).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        channel: Option<u32>,
        /// Its key.
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<Value>,
        /// Its event time.
        #[serde(skip_serializing_if = "Option::is_none")]
        timestamp: Option<i64>,
        /// Its value, decoded.
        value: Value,
    },
    /// The input watermark advanced (shown when it made something happen).
    Watermark {
        /// The new watermark.
        watermark: i64,
    },
    /// Processing time advanced (shown when it made something happen).
    ProcessingTime {
        /// The new time, ms since the epoch.
        now_ms: i64,
    },
    /// A state entry was read.
    StateRead {
        /// The entry, decoded (`value` null when absent).
        #[serde(flatten)]
        entry: StateEntry,
        /// Whether it was there.
        found: bool,
    },
    /// A state entry was written.
    StateWrite {
        /// The entry, decoded.
        #[serde(flatten)]
        entry: StateEntry,
    },
    /// A state entry (or every entry of a key's state, `prefix`) was deleted.
    StateDelete {
        /// The entry, decoded (no value).
        #[serde(flatten)]
        entry: StateEntry,
        /// Whether a whole prefix went.
        prefix: bool,
    },
    /// A timer was set, deleted or fired.
    Timer {
        /// `set`, `deleted` or `fired`.
        change: String,
        /// `event_time` or `processing_time`.
        domain: String,
        /// Its key.
        key: Value,
        /// When it fires.
        timestamp: i64,
    },
    /// A record the operator emitted.
    Output {
        /// `main`, or the side output's name.
        output: String,
        /// Its key.
        #[serde(skip_serializing_if = "Option::is_none")]
        key: Option<Value>,
        /// Its event time.
        #[serde(skip_serializing_if = "Option::is_none")]
        timestamp: Option<i64>,
        /// Its value, decoded.
        value: Value,
    },
    /// A line the guest logged.
    Log {
        /// Its level.
        level: String,
        /// The line.
        message: String,
    },
    /// The subtask snapshotted this checkpoint here.
    Barrier {
        /// The checkpoint.
        checkpoint: u64,
    },
    /// End of input: the operator finished.
    Finish,
}

/// How a replay ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum ReplayEnd {
    /// The input ended and the operator finished.
    Finished,
    /// At the record `until` asked for.
    Until {
        /// That record.
        record: u64,
    },
    /// Once `max_events` events were shown.
    EventLimit {
        /// That many.
        events: usize,
    },
    /// Where the journal ends without an end of input: the subtask was still running, was
    /// killed, or its journal stopped.
    JournalEnds {
        /// The checkpoint the last segment follows.
        after_checkpoint: u64,
    },
    /// At a barrier whose next segment is not kept.
    SegmentMissing {
        /// The checkpoint of that barrier.
        checkpoint: u64,
    },
    /// At a barrier after which the subtask ran other code (a live swap).
    CodeChanged {
        /// The checkpoint of that barrier.
        checkpoint: u64,
        /// The code it ran from there.
        artifact: String,
    },
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplaySummary {
    /// The step.
    pub step: String,
    /// The subtask.
    pub subtask: u32,
    /// The checkpoint whose state it started from (0: empty state, the job's start).
    pub from_checkpoint: u64,
    /// The digest of the code it ran.
    pub artifact: String,
    /// Segments read.
    pub segments: usize,
    /// Input records replayed.
    pub records: u64,
    /// Records the operator emitted (every output, whatever `key` showed).
    pub outputs: u64,
    /// The subtask whose key groups hold the key asked for, when the step reads a hash
    /// exchange (another subtask than this one never sees the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_subtask: Option<u32>,
    /// How it ended.
    pub end: ReplayEnd,
}

/// Why a replay could not run; each names what to do.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The request itself is malformed (a step that is not a step's name).
    #[error("{0}")]
    BadQuery(String),
    /// No journal, or no segment where one was asked for.
    #[error("{0}")]
    NoJournal(String),
    /// A segment is damaged or of another format.
    #[error("{0}")]
    Journal(String),
    /// The code to replay is not what was asked for.
    #[error("{0}")]
    Code(String),
    /// The checkpoint to start from could not be read.
    #[error("checkpoint {id} in {dir}: {source}")]
    Checkpoint {
        /// The checkpoint.
        id: u64,
        /// Its directory.
        dir: String,
        /// Why.
        source: CheckpointError,
    },
    /// The operator could not be built again.
    #[error(transparent)]
    Build(#[from] RunError),
    /// The operator failed during the replay, as it may have in the run.
    #[error("the operator failed at input record {record}: {source}")]
    Operator {
        /// The input records replayed when it failed.
        record: u64,
        /// The failure.
        source: Box<OperatorError>,
    },
}

/// Replays `request`, handing every event to `emit` as it happens.
pub fn replay(
    request: &ReplayRequest,
    runtime: &Runtime,
    emit: &mut dyn FnMut(TraceEvent),
) -> Result<ReplaySummary, ReplayError> {
    // The step names a directory: only a name as specs take them, never a path out of it.
    eddy_plan::check_name("step", &request.step).map_err(|e| ReplayError::BadQuery(e.to_string()))?;
    let store = CheckpointStore::at(&request.checkpoints)
        .map_err(|e| ReplayError::NoJournal(format!("the job's checkpoint store: {e}")))?;
    let no_journal = |why: String| {
        ReplayError::NoJournal(format!(
            "no journal of step `{}` subtask {} in {}: {why}; journal a step with `debug: {{journal: true}}` and run \
             it with `checkpoints` set",
            request.step,
            request.subtask,
            store.describe()
        ))
    };
    let segments = journal::segments(&store, &request.step, request.subtask).map_err(|e| no_journal(e.to_string()))?;
    let Some(oldest) = segments.first().map(|s| s.after) else {
        return Err(no_journal("it holds no segment".into()));
    };
    let from = request.from_checkpoint.unwrap_or(oldest);
    let Some(first) = segments.iter().find(|s| s.after == from) else {
        let kept: Vec<String> = segments.iter().map(|s| s.after.to_string()).collect();
        return Err(ReplayError::NoJournal(format!(
            "the journal keeps no segment after checkpoint {from}; it keeps segments after checkpoints {} (0 is the \
             job's start)",
            kept.join(", ")
        )));
    };
    let segment = read_segment(&store, &first.path)?;
    let header = segment.header.clone();
    let trace = Trace::default();
    let logs = tracing_subscriber::registry().with(GuestLogs(trace.clone()));
    tracing::subscriber::with_default(logs, || {
        let mut replayer = Replayer::build(request, runtime, &store, &header, trace, emit)?;
        replayer.run(segment, &store)
    })
}

/// The segment at `path` in `store`.
fn read_segment(store: &CheckpointStore, path: &str) -> Result<Segment, ReplayError> {
    let bytes = store.get(path).map_err(|e| ReplayError::Journal(e.to_string()))?;
    parse_segment(&bytes, &format!("{}/{path}", store.describe())).map_err(ReplayError::Journal)
}

/// One replay in progress.
struct Replayer<'a> {
    request: &'a ReplayRequest,
    operator: Box<dyn StreamOperator>,
    trace: Trace,
    ttl_clock: TtlClock,
    emit: &'a mut dyn FnMut(TraceEvent),
    /// Events shown so far.
    shown: usize,
    summary: ReplaySummary,
    /// Keeps the restored files until the replay ends.
    _local: tempfile::TempDir,
}

impl<'a> Replayer<'a> {
    fn build(
        request: &'a ReplayRequest,
        runtime: &Runtime,
        store: &CheckpointStore,
        header: &JournalHeader,
        trace: Trace,
        emit: &'a mut dyn FnMut(TraceEvent),
    ) -> Result<Self, ReplayError> {
        let mut spec = header.spec.clone();
        // Entries read the same on every backend; the heap needs no files of its own.
        spec.state.backend = StateBackendKind::Heap;
        let Some(step) = spec.steps.iter().position(|s| s.name == header.step) else {
            return Err(ReplayError::Journal(format!("the journal's spec has no step `{}`", header.step)));
        };
        let mut step_spec = spec.steps[step].clone();
        if let Some(wasm) = &request.wasm {
            step_spec.wasm = wasm.clone();
        }
        let mut component = load_step(runtime, &step_spec)?;
        if let Some(share) = &request.cpu_share {
            component = component.with_cpu_share(share.clone());
        }
        if let Some(limits) = &request.limits {
            component = component.with_limits(limits.clone());
        }
        if request.wasm.is_none() && component.digest() != header.artifact {
            return Err(ReplayError::Code(format!(
                "{} is not the code the subtask ran (it ran {}, the file is {}): give that code with --wasm, or \
                 --wasm this file to replay other code over the same input",
                step_spec.wasm.display(),
                header.artifact,
                component.digest()
            )));
        }
        let scratch = request.scratch.clone().unwrap_or_else(std::env::temp_dir);
        let local = tempfile::tempdir_in(&scratch)
            .map_err(|e| ReplayError::Journal(format!("a temporary directory in {}: {e}", scratch.display())))?;
        let restore = match header.after_checkpoint {
            0 => None,
            id => Some(restore_point(store, id, &header.step, local.path())?),
        };
        let ttl_clock = TtlClock::new(header.processing_time_ms);
        let context = StepContext {
            spec: &spec,
            components: &[],
            ttl_clock: &ttl_clock,
            restore: restore.as_ref(),
            state_dir: local.path(),
            started_ms: header.processing_time_ms,
            journal: false,
            trace: Some(&trace),
        };
        let slot = Slot::from_journal(&header.slot, spec.max_parallelism);
        let operator = context.operator_with(step, &component, slot)?;
        // What `open` and the restore did happened before the checkpoint in the run.
        trace.take();
        let max = spec.max_parallelism;
        let key_subtask =
            request.key.as_deref().filter(|_| header.slot.keyed).map(|key| {
                KeyGroupRange::subtask_of(HashedKey::new(key, max).group, max, header.slot.task_parallelism)
            });
        let summary = ReplaySummary {
            step: header.step.clone(),
            subtask: header.slot.index,
            from_checkpoint: header.after_checkpoint,
            artifact: component.digest().to_owned(),
            segments: 0,
            records: 0,
            outputs: 0,
            key_subtask,
            end: ReplayEnd::JournalEnds { after_checkpoint: header.after_checkpoint },
        };
        Ok(Self { request, operator, trace, ttl_clock, emit, shown: 0, summary, _local: local })
    }

    fn run(&mut self, first: Segment, store: &CheckpointStore) -> Result<ReplaySummary, ReplayError> {
        let mut segment = first;
        let ran = segment.header.artifact.clone();
        loop {
            self.summary.segments += 1;
            let after = segment.header.after_checkpoint;
            self.summary.end = ReplayEnd::JournalEnds { after_checkpoint: after };
            self.show(TraceEvent::Segment { after_checkpoint: after, artifact: segment.header.artifact.clone() });
            let mut next = None;
            for frame in segment.frames {
                let step = match self.request.max_events {
                    Some(events) if self.shown >= events => Step::Stop(ReplayEnd::EventLimit { events }),
                    _ => self.frame(frame)?,
                };
                match step {
                    Step::Go => {}
                    Step::Stop(end) => {
                        self.summary.end = end;
                        return Ok(self.summary.clone());
                    }
                    Step::Next(id) => {
                        next = Some(id);
                        break;
                    }
                }
            }
            let Some(id) = next else { return Ok(self.summary.clone()) };
            let path = journal::segment_path(&self.request.step, self.request.subtask, id);
            if !store.exists(&path).map_err(|e| ReplayError::Journal(e.to_string()))? {
                self.summary.end = ReplayEnd::SegmentMissing { checkpoint: id };
                return Ok(self.summary.clone());
            }
            segment = read_segment(store, &path)?;
            if segment.header.artifact != ran && self.request.wasm.is_none() {
                let artifact = segment.header.artifact;
                self.summary.end = ReplayEnd::CodeChanged { checkpoint: id, artifact };
                return Ok(self.summary.clone());
            }
        }
    }

    fn frame(&mut self, frame: Frame) -> Result<Step, ReplayError> {
        match frame {
            Frame::Batch { channel, batch } => self.batch(batch, channel),
            Frame::Watermark(watermark) => {
                let out = self.operator.on_watermark(watermark);
                self.effects(Some(TraceEvent::Watermark { watermark }), out)?;
                Ok(Step::Go)
            }
            Frame::ProcessingTime(now_ms) => {
                self.ttl_clock.set(now_ms);
                let out = self.operator.on_processing_time(now_ms);
                self.effects(Some(TraceEvent::ProcessingTime { now_ms }), out)?;
                Ok(Step::Go)
            }
            Frame::Barrier(checkpoint) => {
                self.show(TraceEvent::Barrier { checkpoint });
                Ok(Step::Next(checkpoint))
            }
            Frame::Finish => {
                self.show(TraceEvent::Finish);
                let out = self.operator.finish();
                self.effects(None, out)?;
                Ok(Step::Stop(ReplayEnd::Finished))
            }
            Frame::Header(_) => Err(ReplayError::Journal("a segment holds a second header".into())),
        }
    }

    fn batch(&mut self, mut batch: RecordBatch, channel: Option<u32>) -> Result<Step, ReplayError> {
        let done = self.summary.records;
        let mut stop = None;
        if let Some(until) = self.request.until {
            let left = until.saturating_sub(done) as usize;
            if batch.len() >= left {
                let mut cut = RecordBatch::with_capacity(left, batch.byte_len());
                batch.iter().take(left).for_each(|r| cut.push_view(&r));
                batch = cut;
                stop = Some(ReplayEnd::Until { record: until });
            }
        }
        for (i, r) in batch.iter().enumerate() {
            if self.shows(r.key) {
                self.show(TraceEvent::Input {
                    n: done + i as u64 + 1,
                    channel,
                    key: r.key.map(json_or_text),
                    timestamp: r.timestamp,
                    value: decode_value(r.value, eddy_runtime::schemas()),
                });
            }
        }
        self.summary.records += batch.len() as u64;
        let out = if batch.is_empty() { Ok(Output::default()) } else { self.operator.process(&batch) };
        self.effects(None, out)?;
        Ok(stop.map_or(Step::Go, Step::Stop))
    }

    /// Hands `event` on, unless `max_events` were shown already (the replay then stops after
    /// the frame at hand).
    fn show(&mut self, event: TraceEvent) {
        if self.request.max_events.is_some_and(|max| self.shown >= max) {
            return;
        }
        self.shown += 1;
        (self.emit)(event);
    }

    /// Whether an event of `key` is shown.
    fn shows(&self, key: Option<&[u8]>) -> bool {
        self.request.key.as_deref().is_none_or(|wanted| key == Some(wanted))
    }

    /// Shows what one call did: `cause` first (a watermark or tick, only if something
    /// followed), then the effects in order, then the records emitted.
    fn effects(&mut self, cause: Option<TraceEvent>, out: Result<Output, OperatorError>) -> Result<(), ReplayError> {
        let effects = self.trace.take();
        let out =
            out.map_err(|source| ReplayError::Operator { record: self.summary.records, source: Box::new(source) })?;
        // Most calls (ticks, watermarks that fire nothing) have no effect to name.
        let states = if effects.is_empty() { Vec::new() } else { self.operator.declared_states() };
        let mut shown = Vec::new();
        let mut logs = Vec::new();
        for effect in effects {
            match self.event_of(effect, &states) {
                Some((Some(key), event)) if self.shows(Some(&key)) => shown.push(event),
                Some((None, event)) => logs.push(event),
                _ => {}
            }
        }
        for (name, batch) in std::iter::once(("main", &out.main)).chain(out.side.iter().map(|(n, b)| (n.as_str(), b))) {
            self.summary.outputs += batch.len() as u64;
            for r in batch.iter().filter(|r| self.shows(r.key)) {
                shown.push(TraceEvent::Output {
                    output: name.to_owned(),
                    key: r.key.map(json_or_text),
                    timestamp: r.timestamp,
                    value: decode_value(r.value, eddy_runtime::schemas()),
                });
            }
        }
        // A guest's lines belong to no key: shown with the call, unless a key was asked for
        // and the call did nothing for it.
        if self.request.key.is_some() && shown.is_empty() {
            return Ok(());
        }
        if shown.is_empty() && logs.is_empty() {
            return Ok(());
        }
        for event in cause.into_iter().chain(logs).chain(shown) {
            self.show(event);
        }
        Ok(())
    }

    /// An effect as an event, with the key it concerns (`None`: a log line).
    fn event_of(&self, effect: Effect, states: &[DeclaredState]) -> Option<(Option<Vec<u8>>, TraceEvent)> {
        let entry = |key: &[u8], value: Option<&[u8]>| {
            let decoded = decode_entry(key, value, states, eddy_runtime::schemas()).ok()?;
            let record_key = decode_state_key(key).ok()?.key.to_vec();
            Some((record_key, decoded))
        };
        Some(match effect {
            Effect::Read { key, value } => {
                let (k, entry) = entry(&key, value.as_deref())?;
                (Some(k), TraceEvent::StateRead { entry, found: value.is_some() })
            }
            Effect::Write { key, value } => {
                let (k, entry) = entry(&key, Some(&value))?;
                (Some(k), TraceEvent::StateWrite { entry })
            }
            Effect::Delete { key, prefix } => {
                let (k, entry) = entry(&key, None)?;
                (Some(k), TraceEvent::StateDelete { entry, prefix })
            }
            Effect::Timer { what, domain, key, timestamp } => {
                let change = match what {
                    TimerChange::Set => "set",
                    TimerChange::Deleted => "deleted",
                    TimerChange::Fired => "fired",
                };
                let domain = match domain {
                    TimeDomain::EventTime => "event_time",
                    TimeDomain::ProcessingTime => "processing_time",
                };
                let shown = json_or_text(&key);
                let (change, domain) = (change.to_owned(), domain.to_owned());
                (Some(key), TraceEvent::Timer { change, domain, key: shown, timestamp })
            }
            Effect::Log { level, message } => (None, TraceEvent::Log { level, message }),
        })
    }
}

/// What the replay does after a frame.
enum Step {
    Go,
    Stop(ReplayEnd),
    /// A barrier: on with the segment after this checkpoint.
    Next(u64),
}

/// The step's files of checkpoint `id` in the request's directory, fetched into `local`.
fn restore_point(
    store: &CheckpointStore,
    id: u64,
    step: &str,
    local: &std::path::Path,
) -> Result<RestorePoint, ReplayError> {
    let failed = |source: CheckpointError| ReplayError::Checkpoint { id, dir: store.describe().to_owned(), source };
    let meta = CheckpointMetadata::read(store, id).map_err(failed)?;
    RestorePoint::fetch_step(store, meta, local, step).map_err(failed)
}
