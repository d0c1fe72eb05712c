//! A running job on the embedded default: the plan's subtasks as threads in this process,
//! connected by local credit-based channels, with heap state.
//!
//! [`Job::start`] loads every component first (so a bad `.wasm` fails before any thread
//! starts), wires gates and routers, and starts one thread per subtask. The first subtask to
//! fail cancels the job: every channel closes, every thread ends, and [`Job::wait`] reports
//! that first failure with its task and subtask.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::path::PathBuf;
use std::sync::mpsc;

use eddy_core::{
    BoundedOutOfOrderness, HeapTimerService, TimeDomain, TimerService, WATERMARK_MIN, WatermarkInterval,
    WatermarkTracker,
};
use eddy_runtime::{AggregateInstance, CallError, Component, LoadError, Runtime, RuntimeError, Subtask, World};
use eddy_state::{
    BoundedBackend, HeapStateBackend, RocksDbBackend, RocksDbConfig, STATE_WRITE_BACK_BYTES, StateBackend, StateLimits,
    TtlBackend, TtlClock, WriteBackBackend,
};

use eddy_checkpoint::metadata::OperatorState;
use eddy_checkpoint::restore::Share;
use eddy_checkpoint::store::StoreFaults;
use eddy_checkpoint::upload::Uploader;
use eddy_checkpoint::{CheckpointError, CheckpointId, CheckpointMetadata, CheckpointStore, RestorePoint};
use eddy_connectors::{
    Blackhole, FilesSink, FilesSinkState, JsonLinesSink, KafkaSink, KafkaSinkState, LocalDir, OutputDir, PostgresSink,
    PostgresSinkState, PrintSink, Sink, SourceError, StoreDir, UpsertSink, open_source,
};

use crate::checkpoint::{BarrierHandler, BarrierMode, Participant};
use crate::checkpoint_history::{CheckpointHistory, CompletedCheckpoint, SubtaskStateBytes};
use crate::checkpoint_parts::PartThread;
use crate::checkpointing::CheckpointThread;
use crate::journal::{JOURNAL_VERSION, JournalHeader, JournalSlot, JournalWriter, Journaled};
use crate::messages::{CheckpointRole, FaultHook, SavepointRequest, Signals, SinkCommitter, now_ms};
use crate::metrics::{JobMetrics, MetricsSnapshot, SubtaskMetrics};
use crate::operator::StreamOperator;
use crate::replay::trace::{Trace, TracingBackend, TracingTimers};
use crate::router::OutputRouter;
use crate::task::{Checkpointing, Ended, Head, SubtaskRunner, Tail, TaskError};
use crate::wasm_operator::{Reopen, WasmOperator};
use crate::window_operator::{LateData, LocalWindowAggregate, WindowConfig, WindowOperator};
use eddy_plan::{CheckpointMode, PipelineSpec, SinkSpec, StateBackendKind, StepSpec, StoreLocation};
use eddy_plan::{Node, Partitioning, PhysicalPlan};
use eddy_transport::channel::{ChannelConfig, ChannelSender, InputGate, LocalGateShared, local_gate};

mod live_swap;
mod local_state;
mod placement;
mod recover;

pub use live_swap::{PrepareParts, SwapDone, SwapError};
pub use placement::Placement;

use local_state::{LocalStateDir, local_state_dir};
use recover::recover;

/// Why a job could not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A step's component could not be loaded.
    #[error("step `{step}`: {error}")]
    Load {
        /// The step.
        step: String,
        /// Why.
        #[source]
        error: LoadError,
    },
    /// A step's component is the wrong kind for how the step uses it.
    #[error("step `{step}`: {problem}")]
    WrongKind {
        /// The step.
        step: String,
        /// What it is and what the step needs.
        problem: String,
    },
    /// An instance could not be created.
    #[error(transparent)]
    Instantiate(#[from] RuntimeError),
    /// A step's `open` rejected its config or failed.
    #[error("step `{step}` failed to open: {error}")]
    Open {
        /// The step.
        step: String,
        /// Why.
        #[source]
        error: Box<CallError>,
    },
    /// A source could not be opened.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The sink could not be opened.
    #[error("opening sink {path}: {error}")]
    Sink {
        /// The sink's file.
        path: String,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// A subtask failed while running.
    #[error("task `{task}` subtask {subtask}: {error}")]
    Task {
        /// The chain's label.
        task: String,
        /// The subtask.
        subtask: u32,
        /// What failed.
        #[source]
        error: Box<TaskError>,
    },
    /// The job could not be wired or started (a bug in Eddy or an exhausted machine).
    #[error("task {task} subtask {subtask}: {message}")]
    Internal {
        /// The task.
        task: usize,
        /// The subtask.
        subtask: u32,
        /// What went wrong.
        message: String,
    },
    /// Checkpoints could not be read, restored or finally written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint directory holds a job that already ran to the end.
    #[error(
        "pipeline `{job}` already finished (final checkpoint {id} in {dir}); its output is committed. \
         To run it again from the start, delete {dir} (and the sink's output)"
    )]
    AlreadyFinished {
        /// The pipeline.
        job: String,
        /// The final checkpoint.
        id: CheckpointId,
        /// The checkpoint directory.
        dir: String,
    },
    /// Local state could not be set up.
    #[error("state backend of step `{step}`: {problem}")]
    State {
        /// The step.
        step: String,
        /// What failed and where.
        problem: String,
    },
    /// Checkpoints exist but none can be restored, or the sink holds committed output without
    /// a checkpoint saying how far it got: starting from the beginning would emit it again.
    #[error(
        "pipeline `{job}` cannot resume and will not start over: {found}. Starting from the beginning would \
         emit output that is already committed. To start fresh, delete {checkpoints} and the sink's output; \
         to resume, repair or restore the checkpoint files"
    )]
    WillNotStartOver {
        /// The pipeline.
        job: String,
        /// What was found (damaged checkpoints and why, committed output).
        found: String,
        /// The checkpoint location.
        checkpoints: String,
    },
    /// A subtask thread panicked (a bug in Eddy, not in an operator: guests cannot panic the host).
    #[error("task `{task}` subtask {subtask} panicked: {message}")]
    Panicked {
        /// The chain's label.
        task: String,
        /// The subtask.
        subtask: u32,
        /// The panic message.
        message: String,
    },
}

/// Makes the sink of one sink subtask from its index (see [`JobOptions::sink_per_subtask`]).
pub type SinkFactory = Box<dyn FnMut(u32) -> Box<dyn Sink> + Send>;

/// What a source reader just passed into its chain (see [`JobOptions::source_observer`]).
#[derive(Debug, Clone, Copy)]
pub enum SourceEntry<'a> {
    /// A batch it read, before the chain processes it.
    Batch(&'a eddy_core::RecordBatch),
    /// Its input ended (the final watermark follows).
    End,
}

/// Told, on the reader's own thread, of every batch a source reader passes into its chain, by
/// the source's position in the spec and the reader's subtask index.
pub type SourceObserver = Arc<dyn Fn(usize, u32, SourceEntry<'_>) + Send + Sync>;

/// Knobs of the local execution (defaults suit a laptop and CI).
pub struct JobOptions {
    /// Channel capacity (credits) and sender queue.
    pub channel: ChannelConfig,
    /// A channel buffer ships once it holds this many bytes.
    pub buffer_bytes: usize,
    /// Period of processing-time timers, idleness checks and buffer timeouts.
    pub tick: Duration,
    /// Overrides the spec's sink with this one instance, at parallelism 1 whatever the spec's
    /// sink kind (tests, embedding applications).
    pub sink: Option<Box<dyn Sink>>,
    /// Overrides the spec's sink with one sink per sink subtask, made by this function from the
    /// subtask's index; the spec's sink kind decides how many there are
    /// ([`eddy_plan::SinkSpec::follows_input_parallelism`]). `sink` wins if both are set.
    pub sink_per_subtask: Option<SinkFactory>,
    /// Restore from the newest valid checkpoint in this savepoint (or checkpoint) location, a
    /// directory or a bucket, instead of the spec's checkpoints (resuming from a savepoint).
    pub restore_from: Option<StoreLocation>,
    /// When the flag is raised (a signal handler, say), [`Job::run`] stops the job with a
    /// savepoint in the directory.
    pub stop_with_savepoint: Option<(Arc<AtomicBool>, PathBuf)>,
    /// Tests: called at named points of the checkpoint protocol (to crash inside a checkpoint).
    pub fault_hook: Option<FaultHook>,
    /// Tests: consulted before every read and write of the checkpoint store (slow, failing and
    /// unreadable stores).
    pub store_faults: Option<StoreFaults>,
    /// Charges every guest call to this CPU share (a tenant's), throttling the job's operators
    /// to it.
    pub cpu_share: Option<Arc<eddy_runtime::CpuShare>>,
    /// Sandbox limits for every operator instance instead of the runtime's defaults (a
    /// tenant's memory quota per instance, say).
    pub sandbox_limits: Option<eddy_runtime::SandboxLimits>,
    /// Runs only the subtasks placed in this process, the others being reached through the
    /// placement's channels (a job on a cluster); none: every subtask runs here.
    pub placement: Option<Arc<dyn Placement>>,
    /// With a placement and `checkpoints:`, this part's end of the checkpoint protocol: one
    /// part is the master, the others follow it.
    pub checkpoint_role: Option<CheckpointRole>,
    /// Benchmarks: sees every batch as its source reader passes it on, to time the moment
    /// input entered the job (latency is measured from it).
    pub source_observer: Option<SourceObserver>,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            channel: ChannelConfig::default(),
            buffer_bytes: 32 * 1024,
            tick: Duration::from_millis(10),
            sink: None,
            sink_per_subtask: None,
            restore_from: None,
            stop_with_savepoint: None,
            fault_hook: None,
            store_faults: None,
            cpu_share: None,
            sandbox_limits: None,
            placement: None,
            checkpoint_role: None,
            source_observer: None,
        }
    }
}

impl std::fmt::Debug for JobOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobOptions")
            .field("channel", &self.channel)
            .field("buffer_bytes", &self.buffer_bytes)
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

/// What a finished job did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Final metrics.
    pub metrics: MetricsSnapshot,
    /// Whether it ran to the end of its input (false: cancelled).
    pub finished: bool,
    /// The checkpoint the (last) run restored from.
    pub restored_from: Option<CheckpointId>,
    /// The newest checkpoints the (last) run completed (at most [`crate::HISTORY_KEPT`]).
    pub checkpoints: Vec<CompletedCheckpoint>,
    /// How many checkpoints the (last) run completed.
    pub checkpoints_completed: u64,
    /// Restarts after failures.
    pub restarts: u32,
    /// The savepoint the run stopped with.
    pub savepoint: Option<(CheckpointId, PathBuf)>,
}

/// Shared by every subtask thread: the first failure cancels the job.
struct Control {
    cancel: Arc<AtomicBool>,
    gates: Mutex<Vec<Arc<LocalGateShared>>>,
    placement: Option<Arc<dyn Placement>>,
}

impl Control {
    fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        let gates = self.gates.lock().map(|g| g.clone()).unwrap_or_default();
        for gate in gates {
            gate.close();
        }
        if let Some(p) = &self.placement {
            p.cancel();
        }
    }
}

/// (task, subtask, thread).
type SubtaskThread = (usize, u32, JoinHandle<Result<Ended, TaskError>>);

/// A started job.
pub struct Job {
    plan: PhysicalPlan,
    metrics: Arc<JobMetrics>,
    control: Arc<Control>,
    threads: Vec<SubtaskThread>,
    checkpoints: Option<JoinHandle<Result<(), CheckpointError>>>,
    signals: Arc<Signals>,
    history: Arc<Mutex<CheckpointHistory>>,
    restored_from: Option<CheckpointId>,
    /// Its Wasm operator steps, with the code each runs (a live swap replaces it).
    swappable: Mutex<Vec<live_swap::SwappableStep>>,
    /// Whether parts of it run on other workers (a live swap reaches this process only).
    spread: bool,
    max_parallelism: u32,
    /// This run's local state (RocksDB, snapshot staging), removed when the job is dropped.
    _local_state: Option<LocalStateDir>,
    /// Where the other parts are, held while the job lives: their links are registered with
    /// it and forgotten when it goes.
    _placement: Option<Arc<dyn Placement>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("plan", &self.plan.name).field("threads", &self.threads.len()).finish()
    }
}

/// Readies the spec's sink for a run of `job` that restored `restored` (its id and every sink
/// subtask's transaction state), once, before any subtask opens its sink: what the restored
/// checkpoint pre-committed is committed, everything else left pre-committed is discarded.
fn recover_spec_sink(
    spec: &SinkSpec,
    job: &str,
    files_out: Option<&Arc<dyn OutputDir>>,
    restored: Option<(CheckpointId, Vec<&serde_json::Value>)>,
) -> Result<(), RunError> {
    let states = || restored.as_ref().map(|(_, states)| states.clone()).unwrap_or_default();
    match spec {
        SinkSpec::Postgres(p) => {
            let states = states().into_iter().map(sink_state::<PostgresSinkState>).collect::<Result<Vec<_>, _>>();
            return states
                .and_then(|states| PostgresSink::recover(p, job, &states))
                .map_err(|error| RunError::Sink { path: format!("postgres table `{}`", p.table), error });
        }
        SinkSpec::Kafka(k) if k.delivery == eddy_plan::KafkaDelivery::ExactlyOnce => {
            let states = states().into_iter().map(sink_state::<KafkaSinkState>).collect::<Result<Vec<_>, _>>();
            return states
                .and_then(|states| KafkaSink::recover(k, job, &states))
                .map_err(|error| RunError::Sink { path: format!("kafka topic `{}`", k.topic), error });
        }
        _ => {}
    }
    let Some(out) = files_out else { return Ok(()) };
    let sink_error = |error| RunError::Sink { path: out.describe(), error };
    let restored = match restored {
        Some((id, states)) => Some((
            id,
            states.into_iter().map(sink_state::<FilesSinkState>).collect::<Result<Vec<_>, _>>().map_err(sink_error)?,
        )),
        None => None,
    };
    FilesSink::recover(out.as_ref(), restored.as_ref().map(|(id, states)| (*id, &states[..]))).map_err(sink_error)
}

/// Where a files sink's output lives: its directory or its bucket. `None`: another sink. A run
/// opens it once and shares it (a bucket's client is not free).
pub fn files_output(spec: &SinkSpec) -> Result<Option<Arc<dyn OutputDir>>, RunError> {
    let SinkSpec::Files { dir, s3 } = spec else { return Ok(None) };
    let out: Arc<dyn OutputDir> = match (dir, s3) {
        (Some(dir), None) => Arc::new(LocalDir::new(dir)),
        (None, Some(s3)) => Arc::new(StoreDir::new(CheckpointStore::s3(s3).map_err(|e| RunError::Sink {
            path: format!("s3://{}/{}", s3.bucket, s3.prefix),
            error: std::io::Error::other(e.to_string()),
        })?)),
        _ => {
            return Err(RunError::Sink {
                path: "sink".into(),
                error: std::io::Error::other("a files sink needs exactly one of `dir` and `s3`"),
            });
        }
    };
    Ok(Some(out))
}

/// Subtask `subtask`'s sink of the spec (the run's sink was recovered already; a files sink
/// writes to `files_out`, [`files_output`] of the spec); `run` names this run's files.
fn open_spec_sink(
    spec: &SinkSpec,
    job: &str,
    files_out: Option<&Arc<dyn OutputDir>>,
    run: &str,
    subtask: u32,
    checkpointing: bool,
) -> Result<Box<dyn Sink>, RunError> {
    Ok(match spec {
        SinkSpec::Print => Box::new(PrintSink(std::io::stdout())),
        SinkSpec::Blackhole => Box::new(Blackhole),
        SinkSpec::File { path } => {
            let file = File::create(path)
                .map_err(|source| RunError::Sink { path: path.display().to_string(), error: source })?;
            Box::new(JsonLinesSink(BufWriter::new(file)))
        }
        SinkSpec::Files { .. } => match files_out {
            Some(out) => Box::new(FilesSink::open(out.clone(), run, subtask, checkpointing)),
            None => {
                return Err(RunError::Sink { path: "sink".into(), error: std::io::Error::other("no output place") });
            }
        },
        SinkSpec::Upsert { dir } => {
            Box::new(UpsertSink::open(dir).map_err(|error| RunError::Sink { path: dir.display().to_string(), error })?)
        }
        SinkSpec::Kafka(k) => Box::new(
            KafkaSink::open(k, job, subtask)
                .map_err(|error| RunError::Sink { path: format!("kafka topic `{}`", k.topic), error })?,
        ),
        SinkSpec::Postgres(p) => Box::new(
            PostgresSink::open(p, job, subtask, checkpointing)
                .map_err(|error| RunError::Sink { path: format!("postgres table `{}`", p.table), error })?,
        ),
    })
}

fn sink_state<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> std::io::Result<T> {
    serde_json::from_value(value.clone())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("sink state in checkpoint: {e}")))
}

/// Commits what a checkpoint's sink state lists (the final checkpoint's last files or
/// transactions), outside the sink subtask, which is gone by then.
fn sink_committer(spec: &SinkSpec, job: &str, files_out: Option<&Arc<dyn OutputDir>>) -> SinkCommitter {
    match spec {
        SinkSpec::Postgres(p) => {
            let p = p.clone();
            return Box::new(move |value| PostgresSink::commit(&p, &sink_state(value)?));
        }
        SinkSpec::Kafka(k) => {
            let (k, job) = (k.clone(), job.to_owned());
            return Box::new(move |value| eddy_connectors::sink::commit_kafka_state(&k, &job, &sink_state(value)?));
        }
        _ => {}
    }
    match files_out.cloned() {
        Some(out) => {
            Box::new(move |value| FilesSink::commit(out.as_ref(), &sink_state::<FilesSinkState>(value)?.pending))
        }
        None => Box::new(|_| Ok(())),
    }
}

/// The steps whose state `meta` says goes on with other code than `running` (step name and
/// the digest it loaded), as (step, recorded digest, running digest), once per step.
fn other_code<'a>(meta: &'a CheckpointMetadata, running: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str, &'a str)> {
    let mut found: Vec<(&str, &str, &str)> = Vec::new();
    for op in meta.subtasks.iter().flat_map(|s| &s.operators) {
        let Some(recorded) = op.artifact.as_deref() else { continue };
        let Some(&(step, digest)) = running.iter().find(|(name, _)| *name == op.step) else { continue };
        if recorded != digest && !found.iter().any(|(s, _, _)| *s == step) {
            found.push((step, recorded, digest));
        }
    }
    found
}

/// The steps whose state (entries or timers) the checkpoint holds but the spec has no step of,
/// each once: state follows step names, so a restore leaves theirs out.
fn left_out<'a>(meta: &'a CheckpointMetadata, steps: &[&str]) -> Vec<&'a str> {
    let mut found: Vec<&str> = Vec::new();
    for op in meta.subtasks.iter().flat_map(|s| &s.operators) {
        let step = op.step.as_str();
        // A RocksDB step's files are never empty; its recorded count says whether it held any.
        let counted_none =
            op.usage.as_ref().is_some_and(|u| u.entries == 0) && op.timers.is_empty() && op.timer_files.is_empty();
        if !op.is_empty() && !counted_none && !steps.contains(&step) && !found.contains(&step) {
            found.push(step);
        }
    }
    found
}

pub(crate) fn load_step(runtime: &Runtime, step: &StepSpec) -> Result<Component, RunError> {
    let component = runtime
        .load_file(&step.name, Path::new(&step.wasm))
        .map_err(|source| RunError::Load { step: step.name.clone(), error: source })?;
    let wrong = |problem: &str| Err(RunError::WrongKind { step: step.name.clone(), problem: problem.into() });
    match (component.world(), step.window.is_some()) {
        (World::KeyedOperator, true) => {
            wrong("has a `window`, so `wasm` must be a window aggregate, but it is a keyed operator")
        }
        (World::WindowAggregate, false) => {
            wrong("`wasm` is a window aggregate; add a `window` to the step (or use a keyed operator)")
        }
        _ => Ok(component),
    }
}

/// The first window step whose records in flight (an unaligned checkpoint's) are partial
/// accumulators while the step now reads records, or the other way round (its `two_phase`
/// changed): neither kind can be read as the other. `two_phase` lists the spec's two-phase
/// steps.
fn misread_in_flight<'a>(meta: &'a CheckpointMetadata, two_phase: &[&str]) -> Option<&'a OperatorState> {
    let entries = meta.subtasks.iter().filter(|s| !s.in_flight.is_empty()).filter_map(|s| s.operators.first());
    entries.into_iter().find(|op| op.partial_input != two_phase.contains(&op.step.as_str()))
}

/// Everything needed to build one subtask's operators.
pub(crate) struct StepContext<'a> {
    pub spec: &'a PipelineSpec,
    pub components: &'a [Component],
    pub ttl_clock: &'a TtlClock,
    pub restore: Option<&'a RestorePoint>,
    /// Where this run's local state lives (RocksDB databases, snapshot staging).
    pub state_dir: &'a Path,
    /// Processing time the operators' timer clocks start at.
    pub started_ms: i64,
    /// Whether journaled steps write their input (into the checkpoint store; a replay does not).
    pub journal: bool,
    /// A replay's trace: state and timers note what the operator does.
    pub trace: Option<&'a Trace>,
}

/// Where one operator of one subtask sits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    task: usize,
    /// Which subtask of its task this is. Not `subtask.index`: a step that is not right behind
    /// a hash exchange runs as a single subtask over every key group, whatever its index.
    index: u32,
    position: usize,
    task_parallelism: u32,
    subtask: Subtask,
    share: Share,
}

impl Slot {
    /// Operator `position` of subtask `index` of a task at `task_parallelism`; `keyed` when the
    /// task reads a hash exchange.
    pub(crate) fn new(task: usize, index: u32, position: usize, task_parallelism: u32, keyed: bool, max: u32) -> Self {
        let task_subtask = Subtask { index, parallelism: task_parallelism, max_parallelism: max };
        let share = if keyed {
            Share::KeyGroups(task_subtask.key_groups())
        } else {
            Share::Subtask { index, parallelism: task_parallelism }
        };
        // Only the step right behind a hash exchange sees just its key groups; steps chained
        // after it may re-key freely, so they accept any key.
        let subtask = if position == 0 && keyed { task_subtask } else { Subtask::single(max) };
        Self { task, index, position, task_parallelism, subtask, share }
    }

    /// The slot as a journal records it.
    fn journaled(&self) -> JournalSlot {
        JournalSlot {
            task: self.task,
            index: self.index,
            position: self.position,
            task_parallelism: self.task_parallelism,
            keyed: matches!(self.share, Share::KeyGroups(_)),
        }
    }

    /// The slot a journal recorded.
    pub(crate) fn from_journal(j: &JournalSlot, max_parallelism: u32) -> Self {
        Self::new(j.task, j.index, j.position, j.task_parallelism, j.keyed, max_parallelism)
    }
}

impl StepContext<'_> {
    fn state_error(step: &StepSpec, problem: impl std::fmt::Display) -> RunError {
        RunError::State { step: step.name.clone(), problem: problem.to_string() }
    }

    /// A fresh backend for the step, filled with its share of the restored state; the
    /// restored timers go to `timers`.
    fn backend(
        &self,
        s: &StepSpec,
        slot: Slot,
        timers: &mut dyn TimerService,
    ) -> Result<Box<dyn StateBackend>, RunError> {
        // A restart at the same parallelism opens its checkpointed database instead of
        // re-putting every entry: the restore then costs the fetch, not a rewrite of the state.
        let own = match self.spec.state.backend {
            StateBackendKind::Rocksdb => self.restore.and_then(|p| p.own_database(&s.name, slot.share)),
            StateBackendKind::Heap => None,
        };
        let storage: Box<dyn StateBackend> = match self.spec.state.backend {
            StateBackendKind::Heap => Box::new(HeapStateBackend::default()),
            StateBackendKind::Rocksdb => {
                let dir = self.state_dir.join(format!("t{}-s{}-op{}", slot.task, slot.index, slot.position));
                let config = RocksDbConfig {
                    block_cache_bytes: self.spec.state.block_cache_mb << 20,
                    write_buffer_bytes: self.spec.state.write_buffer_mb << 20,
                    max_write_buffers: 2,
                };
                let db = match &own {
                    Some(checkpoint) => RocksDbBackend::open_checkpoint(&checkpoint.path, &dir, config),
                    None => RocksDbBackend::open(&dir, config),
                };
                let db: Box<dyn StateBackend> = Box::new(db.map_err(|e| Self::state_error(s, e))?);
                // A window step buffers its own writes, per key (its `store`).
                match s.window {
                    Some(_) => db,
                    None => Box::new(
                        WriteBackBackend::new(db, STATE_WRITE_BACK_BYTES).map_err(|e| Self::state_error(s, e))?,
                    ),
                }
            }
        };
        // Under TTL and the restore below, so purges and restored entries count too.
        let state = &self.spec.state;
        let limits = StateLimits { max_bytes: state.max_bytes_for(s), max_entries: state.max_entries_for(s) };
        let how_to_raise = format!(
            "if step `{}` needs that much, raise its `state_max_bytes` / `state_max_entries` (or \
             `state.max_bytes_per_subtask` / `state.max_entries_per_subtask` for every step)",
            s.name
        );
        // An opened checkpoint carries its count: scanning 1 GB would double a failover.
        let known = own.as_ref().and_then(|o| o.usage);
        let mut backend: Box<dyn StateBackend> = Box::new(
            BoundedBackend::with_usage(storage, limits, how_to_raise, known).map_err(|e| Self::state_error(s, e))?,
        );
        if let Some(point) = self.restore {
            let mut restored_timers = Vec::new();
            let mut timer = |t: &eddy_checkpoint::metadata::TimerState| restored_timers.push(t.clone());
            let restored = match own {
                Some(_) => point.restore_timers(&s.name, slot.share, &mut timer),
                None => point.restore_operator(&s.name, slot.share, backend.raw_mut(), &mut timer),
            };
            restored.map_err(RunError::Checkpoint)?;
            for t in restored_timers {
                let domain = if t.event_time { TimeDomain::EventTime } else { TimeDomain::ProcessingTime };
                timers.register(domain, t.key_group, &t.key, t.timestamp);
            }
        }
        Ok(backend)
    }

    /// Step `step`'s operator for `slot`, journaled if the step asks for it.
    fn operator(&self, step: usize, slot: Slot) -> Result<Box<dyn StreamOperator>, RunError> {
        let component = &self.components[step];
        let operator = self.operator_with(step, component, slot)?;
        let Some(checkpoints) = self.spec.checkpoints.as_ref().filter(|_| self.journal && self.spec.journals(step))
        else {
            return Ok(operator);
        };
        let s = &self.spec.steps[step];
        let header = JournalHeader {
            version: JOURNAL_VERSION,
            step: s.name.clone(),
            slot: slot.journaled(),
            after_checkpoint: self.restore.map_or(0, |p| p.id()),
            artifact: component.digest().to_owned(),
            processing_time_ms: self.started_ms,
            // What a replay builds the operator from; no sources or sink, so no connection's
            // settings or secrets are written to disk with the records.
            spec: PipelineSpec { sources: Vec::new(), sink: SinkSpec::Blackhole, ..self.spec.clone() },
        };
        let failed = |e: String| Self::state_error(s, format!("starting its input journal: {e}"));
        let store = CheckpointStore::open(checkpoints).map_err(|e| failed(e.to_string()))?;
        let limit = (self.spec.journal_max_bytes(step), self.spec.journal_compression(step));
        let at = store.describe().to_owned();
        let writer = JournalWriter::open(store, self.state_dir, header, limit.0, limit.1)
            .map_err(|e| failed(format!("in {at}: {e}")))?;
        Ok(Box::new(Journaled::new(operator, writer)))
    }

    /// The first phase of two-phase window step `step`, which each subtask of a chain in front
    /// of it runs at its end ([`eddy_plan::TaskPlan::first_phase`]), with its aggregate opened.
    fn local_phase(&self, step: usize) -> Result<Box<LocalWindowAggregate<AggregateInstance>>, RunError> {
        let s = &self.spec.steps[step];
        let wrong = |problem: String| RunError::WrongKind { step: s.name.clone(), problem };
        let window = s.window.as_ref().ok_or_else(|| wrong("a first phase needs a window step".into()))?;
        let kind = window.kind().map_err(|(_, problem)| wrong(problem))?;
        let key_by = s.key_by.clone().ok_or_else(|| wrong("a window step needs `key_by`".into()))?;
        let mut aggregate = self.components[step].instantiate_aggregate()?;
        aggregate
            .open(&s.config.to_string())
            .map_err(|source| RunError::Open { step: s.name.clone(), error: Box::new(source) })?;
        Ok(Box::new(LocalWindowAggregate::new(s.name.clone(), kind, key_by, aggregate)))
    }

    /// Step `step`'s operator for `slot`, running `component`.
    pub(crate) fn operator_with(
        &self,
        step: usize,
        component: &Component,
        slot: Slot,
    ) -> Result<Box<dyn StreamOperator>, RunError> {
        let s = &self.spec.steps[step];
        let mut timers = HeapTimerService::starting_at(self.started_ms);
        let mut backend = self.backend(s, slot, &mut timers)?;
        if let Some(trace) = self.trace {
            backend = Box::new(TracingBackend::new(backend, trace.clone()));
        }
        if let Some(window) = &s.window {
            let kind = window.kind().map_err(|(_, problem)| RunError::WrongKind { step: s.name.clone(), problem })?;
            let mut aggregate = component.instantiate_aggregate()?;
            aggregate
                .open(&s.config.to_string())
                .map_err(|source| RunError::Open { step: s.name.clone(), error: Box::new(source) })?;
            let config = WindowConfig {
                kind,
                allowed_lateness_ms: window.allowed_lateness_ms,
                late_data: if window.drop_late {
                    LateData::Drop
                } else {
                    LateData::SideOutput(window.late_output.clone())
                },
                max_parallelism: self.spec.max_parallelism,
                partial_input: window.two_phase,
            };
            let operator = WindowOperator::new(s.name.clone(), config, aggregate, backend)
                .with_code(s.config.to_string(), component.digest().to_owned());
            return Ok(Box::new(operator));
        }
        let backend = match s.state_ttl_ms {
            Some(ttl) => Box::new(TtlBackend::new(backend, ttl, self.ttl_clock.clone())),
            None => backend,
        };
        let timers: Box<dyn TimerService> = match self.trace {
            Some(trace) => Box::new(TracingTimers::new(Box::new(timers), trace.clone())),
            None => Box::new(timers),
        };
        let mut instance = component.instantiate_operator(slot.subtask, backend, timers)?;
        instance
            .open(&s.config.to_string())
            .map_err(|source| RunError::Open { step: s.name.clone(), error: Box::new(source) })?;
        let reopen =
            Reopen { subtask: slot.subtask, config: s.config.to_string(), artifact: component.digest().to_owned() };
        Ok(Box::new(WasmOperator::new(s.name.clone(), instance, s.state_ttl_ms.is_some(), reopen)))
    }
}

impl Job {
    /// Plans `spec`, loads its components and starts every subtask.
    pub fn start(spec: &PipelineSpec, runtime: &Runtime, mut options: JobOptions) -> Result<Job, RunError> {
        // The caller's span (the service's job, with its tenant) goes with every thread, so
        // each log line, guest logs included, names the job and the task.
        let job_span = tracing::Span::current();
        // A sink given in the options is one instance: the plan runs it at parallelism 1.
        let sink_given = options.sink.is_some();
        let plan = if sink_given { PhysicalPlan::with_sink_at_one(spec) } else { PhysicalPlan::new(spec) };
        let sink_task = plan.tasks.iter().position(|t| t.has_sink()).unwrap_or(plan.tasks.len() - 1);
        let source_tasks = plan.tasks.iter().filter(|t| t.source().is_some()).map(|t| t.id).collect();
        let labels = (0..plan.tasks.len()).map(|t| plan.task_label(t)).collect();
        let mut metrics = JobMetrics::new(labels, source_tasks, sink_task);
        // Only this part's subtasks count in its snapshot: another part reports its own, and
        // the coordinator adds them up (`MetricsSnapshot::absorb`).
        let runs_here =
            |task: usize, subtask: u32| options.placement.as_ref().is_none_or(|p| p.is_local(task, subtask));
        let subtask_metrics: Vec<Vec<Arc<SubtaskMetrics>>> = plan
            .tasks
            .iter()
            .map(|t| {
                (0..t.parallelism)
                    .map(|i| {
                        if runs_here(t.id, i) {
                            metrics.register(t.id, i)
                        } else {
                            Arc::new(SubtaskMetrics::new(t.id, i))
                        }
                    })
                    .collect()
            })
            .collect();
        let metrics = Arc::new(metrics);
        let control = Arc::new(Control {
            cancel: Arc::new(AtomicBool::new(false)),
            gates: Mutex::new(Vec::new()),
            placement: options.placement.clone(),
        });

        let placement = options.placement.as_deref();
        let checkpoint_role = options.checkpoint_role.take();
        if placement.is_some() && spec.checkpoints.is_some() && checkpoint_role.is_none() {
            return Err(RunError::Checkpoint(CheckpointError::Incompatible(
                "a part of a spread job with `checkpoints:` needs its role in the checkpoint protocol".into(),
            )));
        }
        let is_local = |task: usize, subtask: u32| placement.is_none_or(|p| p.is_local(task, subtask));
        let runner = |task: usize, subtask: u32| placement.map(|p| p.runner(task, subtask)).unwrap_or_default();
        if let Some(p) = placement {
            let control = control.clone();
            let job = spec.name.clone();
            p.on_input_failed(Box::new(move |reason| {
                tracing::error!(job = %job, reason, "an input from another part broke: cancelling this part");
                control.cancel();
            }));
        }
        // Wire the exchanges: one gate per downstream subtask; `senders[task][subtask]` lists
        // the upstream subtask's senders in downstream-subtask order.
        let mut gates: Vec<Vec<Option<Box<dyn InputGate>>>> =
            plan.tasks.iter().map(|t| (0..t.parallelism).map(|_| None).collect()).collect();
        let mut senders: Vec<Vec<Vec<Box<dyn ChannelSender>>>> =
            plan.tasks.iter().map(|t| (0..t.parallelism).map(|_| Vec::new()).collect()).collect();
        for task in &plan.tasks {
            let inputs: Vec<_> = plan.inputs(task.id).cloned().collect();
            if inputs.is_empty() {
                continue;
            }
            for down in 0..task.parallelism {
                // (upstream task, upstream subtask) of each channel of this gate, in order.
                let feeders: Vec<(usize, u32)> = inputs
                    .iter()
                    .flat_map(|e| {
                        let up = plan.tasks[e.from].parallelism;
                        let forward = e.partitioning == Partitioning::Forward;
                        (0..up).filter(move |u| !forward || *u == down).map(move |u| (e.from, u))
                    })
                    .collect();
                if !is_local(task.id, down) {
                    // The gate is in another process: local feeders send to it there.
                    for (channel, &(t, u)) in feeders.iter().enumerate() {
                        if is_local(t, u) {
                            let remote = placement.map(|p| p.open_output(task.id, down, channel as u32));
                            let sender = remote.unwrap_or_else(|| Err("no placement".into())).map_err(|e| {
                                internal(task.id, down, &format!("cannot reach its input {channel}: {e}"))
                            })?;
                            senders[t][u as usize].push(sender);
                        }
                    }
                    continue;
                }
                let blocked = feeders.iter().map(|&(t, u)| subtask_metrics[t][u as usize].blocked_ns.clone()).collect();
                let (shared, gate, channel_senders) = local_gate(feeders.len(), options.channel, blocked);
                control.gates.lock().map_err(|_| poisoned())?.push(shared);
                gates[task.id][down as usize] = Some(Box::new(gate));
                for (channel, (&(t, u), sender)) in feeders.iter().zip(channel_senders).enumerate() {
                    match placement {
                        Some(p) if !is_local(t, u) => {
                            p.register_input(task.id, down, channel as u32, (t, u), Box::new(sender))
                        }
                        _ => senders[t][u as usize].push(Box::new(sender)),
                    }
                }
            }
        }

        // Loaded (and compiled, on a worker's first run of an artifact) only now: a part's
        // inputs are registered above, so the streams its upstream parts open meanwhile wait
        // for nothing but this, instead of running out the registration timeout while the
        // components compile (seen under load as a broken input and a restarted job).
        let components = spec
            .steps
            .iter()
            .map(|s| {
                let mut component = load_step(runtime, s)?;
                if let Some(share) = &options.cpu_share {
                    component = component.with_cpu_share(share.clone());
                }
                if let Some(limits) = &options.sandbox_limits {
                    component = component.with_limits(limits.clone());
                }
                Ok(component)
            })
            .collect::<Result<Vec<_>, RunError>>()?;

        // The master part of a spread job (or the job itself) recovers the store and the sink
        // for every part; the other parts only read what to restore.
        let lead = !matches!(checkpoint_role, Some(CheckpointRole::Part(_)));
        let needs_local_dir = spec.checkpoints.is_some() || spec.state.backend == StateBackendKind::Rocksdb;
        let local_state = if needs_local_dir { Some(local_state_dir(spec)?) } else { None };
        let state_dir =
            local_state.as_ref().map_or_else(|| Path::new(".").to_path_buf(), |d| d.dir.path().to_path_buf());
        let files_out = files_output(&spec.sink)?;
        let recovery = recover(
            spec,
            options.restore_from.as_ref(),
            options.store_faults.take(),
            lead,
            &state_dir,
            files_out.as_ref(),
        )?;
        let restore = recovery.as_ref().and_then(|r| r.point.as_ref());
        let ttl_clock = TtlClock::new(now_ms());
        let steps = StepContext {
            spec,
            components: &components,
            ttl_clock: &ttl_clock,
            restore,
            state_dir: &state_dir,
            started_ms: now_ms(),
            journal: true,
            trace: None,
        };
        let checkpointing = spec.checkpoints.is_some();
        let barrier_mode = match &spec.checkpoints {
            Some(c) if c.mode == CheckpointMode::Unaligned => BarrierMode::Unaligned,
            Some(c) => BarrierMode::Aligned { timeout_ms: c.aligned_timeout_ms },
            None => BarrierMode::Aligned { timeout_ms: None },
        };
        // The spec's sink is opened per subtask, after one recovery of its output.
        let mut given_sink = options.sink.take();
        let mut sink_factory = options.sink_per_subtask.take();
        if !sink_given && sink_factory.is_none() && lead {
            recover_spec_sink(&spec.sink, &spec.name, files_out.as_ref(), restore.map(|p| (p.id(), p.sink_states())))?;
        }
        let run_name = FilesSink::run_name();
        let signals = Arc::new(Signals::default());
        if let Some(point) = restore {
            let digests: Vec<(&str, &str)> =
                spec.steps.iter().zip(&components).map(|(s, c)| (s.name.as_str(), c.digest())).collect();
            for (step, recorded, running) in other_code(point.metadata(), &digests) {
                tracing::warn!(
                    job = %spec.name,
                    step,
                    checkpoint = point.id(),
                    recorded,
                    running,
                    "the checkpoint's state of this step went on with other code than the spec gives: a \
                     restart-mode upgrade does this on purpose; after a live swap, point the step at the swapped \
                     artifact"
                );
            }
            let names: Vec<&str> = digests.iter().map(|(name, _)| *name).collect();
            for step in left_out(point.metadata(), &names) {
                tracing::warn!(
                    job = %spec.name,
                    step,
                    checkpoint = point.id(),
                    "the checkpoint holds state of a step this spec has no step of, so that state is left out: \
                     give the step its old name to keep it"
                );
            }
            // Sources continue from the restored positions, so barriers continue after its id.
            signals.trigger.store(point.id(), Ordering::SeqCst);
            signals.completed.store(point.id(), Ordering::SeqCst);
        }
        // Records in flight at an unaligned checkpoint are replayed into the chain they were
        // going to; that chain must still read an exchange.
        let entry_step = |task: &eddy_plan::TaskPlan| task.steps().next().map(|i| spec.steps[i].name.as_str());
        if let Some(point) = restore {
            let readers: Vec<Option<&str>> =
                plan.tasks.iter().filter(|t| plan.inputs(t.id).next().is_some()).map(entry_step).collect();
            if let Some(lost) = point.in_flight_entries().into_iter().find(|e| !readers.contains(e)) {
                let into = lost.map_or_else(|| "the sink".to_string(), |step| format!("step `{step}`"));
                return Err(RunError::Checkpoint(CheckpointError::Incompatible(format!(
                    "unaligned checkpoint {} holds records in flight into {into}, which no longer reads an exchange \
                     (the plan chains it differently now); restore at the old parallelism, or from an aligned \
                     checkpoint or savepoint",
                    point.id()
                ))));
            }
            let two_phase: Vec<&str> = spec.steps.iter().filter(|s| s.two_phase()).map(|s| s.name.as_str()).collect();
            if let Some(op) = misread_in_flight(point.metadata(), &two_phase) {
                let (was, is) = if op.partial_input {
                    ("partial accumulators", "records")
                } else {
                    ("records", "partial accumulators")
                };
                return Err(RunError::Checkpoint(CheckpointError::Incompatible(format!(
                    "unaligned checkpoint {} holds {was} in flight into step `{}`, which now reads {is} (a window's \
                     `two_phase` changed); restore with the old `two_phase`, or from an aligned checkpoint or savepoint",
                    point.id(),
                    op.step
                ))));
            }
        }
        // Bounded: a checkpoint thread that falls behind slows the snapshots, not the memory.
        let (reports, reports_rx) = mpsc::sync_channel(2 * plan.subtasks() as usize + 4);
        let mut runners = Vec::new();
        for task in &plan.tasks {
            let first_step_keyed = task.keyed;
            for index in (0..task.parallelism).filter(|&i| is_local(task.id, i)) {
                let operators = task
                    .steps()
                    .enumerate()
                    .map(|(position, step)| {
                        let slot = Slot::new(
                            task.id,
                            index,
                            position,
                            task.parallelism,
                            first_step_keyed,
                            spec.max_parallelism,
                        );
                        steps.operator(step, slot)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let source_name = task.source().map(|i| spec.sources[i].name().to_owned());
                let head = match task.source() {
                    Some(source) => Head::Source {
                        source: {
                            let start = match restore {
                                Some(point) => {
                                    point.source_position(spec.sources[source].name(), index, task.parallelism)?
                                }
                                None => None,
                            };
                            open_source(&spec.sources[source], index, task.parallelism, start.as_ref())?
                        },
                        watermarks: BoundedOutOfOrderness::new(spec.watermarks.out_of_orderness_ms),
                        interval: WatermarkInterval::new(spec.watermarks.interval_ms),
                        batch_size: spec.batch_size,
                        buffer: eddy_core::RecordBatch::with_capacity(spec.batch_size, spec.batch_size * 64),
                        observer: options.source_observer.clone().map(|o| (source, index, o)),
                    },
                    None => {
                        let Some(gate) = gates[task.id][index as usize].take() else {
                            return Err(internal(task.id, index, "a task without source has no input gate"));
                        };
                        let channels = gate.channels();
                        Head::Input {
                            gate,
                            tracker: WatermarkTracker::new(channels, spec.watermarks.idleness_ms, now_ms()),
                            ended: vec![false; channels],
                        }
                    }
                };
                let replay = match (restore, &head) {
                    (Some(point), Head::Input { .. }) => {
                        let share =
                            Slot::new(task.id, index, 0, task.parallelism, first_step_keyed, spec.max_parallelism)
                                .share;
                        point.in_flight(entry_step(task), share)?
                    }
                    _ => Vec::new(),
                };
                let input_channels = match &head {
                    Head::Input { gate, .. } => Some(gate.channels()),
                    Head::Source { .. } => None,
                };
                let local_phase = task.first_phase.map(|step| steps.local_phase(step)).transpose()?;
                let tail = match plan.output(task.id) {
                    Some(edge) => {
                        let next_step = plan.tasks[edge.to].nodes.first().map_or("sink".to_string(), |n| match n {
                            Node::Step(i) => spec.steps[*i].name.clone(),
                            _ => plan.label(*n).to_string(),
                        });
                        Tail::Exchange(Box::new(OutputRouter::new(
                            edge.partitioning.clone(),
                            std::mem::take(&mut senders[task.id][index as usize]),
                            spec.max_parallelism,
                            options.buffer_bytes,
                            spec.buffer_timeout_ms,
                            next_step,
                        )))
                    }
                    None if sink_given => match given_sink.take() {
                        Some(sink) => Tail::Sink(sink),
                        None => return Err(internal(task.id, index, "a given sink runs at parallelism 1")),
                    },
                    None => Tail::Sink(match &mut sink_factory {
                        Some(make) => make(index),
                        None => {
                            open_spec_sink(&spec.sink, &spec.name, files_out.as_ref(), &run_name, index, checkpointing)?
                        }
                    }),
                };
                runners.push((
                    task.id,
                    index,
                    SubtaskRunner {
                        head,
                        operators,
                        local_phase,
                        tail,
                        metrics: subtask_metrics[task.id][index as usize].clone(),
                        cancel: control.cancel.clone(),
                        ttl_clock: ttl_clock.clone(),
                        tick: options.tick,
                        watermark: WATERMARK_MIN,
                        replay,
                        checkpointing: checkpointing.then(|| Checkpointing {
                            // Numbered alike in every part of a spread job.
                            participant: plan.tasks[..task.id].iter().map(|t| t.parallelism as usize).sum::<usize>()
                                + index as usize,
                            task: task.id,
                            subtask: index,
                            parallelism: task.parallelism,
                            keyed: task.keyed,
                            source_name: source_name.clone(),
                            steps: task.steps().map(|i| spec.steps[i].name.clone()).collect(),
                            signals: signals.clone(),
                            reports: reports.clone(),
                            staging_root: state_dir.clone(),
                            last_checkpoint: signals.trigger.load(Ordering::SeqCst),
                            last_completed: signals.completed.load(Ordering::SeqCst),
                            barriers: input_channels.map(|n| BarrierHandler::new(n, barrier_mode)),
                            held: None,
                            faults: options.fault_hook.clone(),
                        }),
                    },
                ));
            }
        }
        drop(reports);
        let history = Arc::new(Mutex::new(CheckpointHistory::default()));
        let restored_from = restore.map(|p| p.id());
        let checkpoint_thread = match (recovery, &spec.checkpoints) {
            (Some(recovery), Some(checkpoints)) => {
                let first_id = recovery.next_id;
                let retained = recovery.retained;
                let thread: Box<dyn FnOnce() -> Result<(), CheckpointError> + Send> = match checkpoint_role {
                    Some(CheckpointRole::Part(link)) => {
                        let part = PartThread {
                            job: spec.name.clone(),
                            store: recovery.store,
                            uploader: Uploader::knowing(retained.iter().flat_map(|m| m.files()), first_id),
                            signals: signals.clone(),
                            reports: reports_rx,
                            link,
                            cancel: control.cancel.clone(),
                        };
                        Box::new(move || part.run())
                    }
                    role => {
                        let master = CheckpointThread {
                            job: spec.name.clone(),
                            max_parallelism: spec.max_parallelism,
                            spec: checkpoints.clone(),
                            store: recovery.store,
                            journaled: (0..spec.steps.len()).any(|i| spec.journals(i)),
                            two_phase: spec.steps.iter().filter(|s| s.two_phase()).map(|s| s.name.clone()).collect(),
                            participants: plan
                                .tasks
                                .iter()
                                .flat_map(|t| {
                                    (0..t.parallelism).map(move |subtask| Participant {
                                        task: t.id,
                                        subtask,
                                        part: (!is_local(t.id, subtask)).then(|| runner(t.id, subtask)),
                                    })
                                })
                                .collect(),
                            first_id,
                            retained,
                            signals: signals.clone(),
                            reports: reports_rx,
                            cancel: control.cancel.clone(),
                            history: history.clone(),
                            commit_sink: sink_committer(&spec.sink, &spec.name, files_out.as_ref()),
                            faults: options.fault_hook.clone(),
                            remote: match role {
                                Some(CheckpointRole::Master(link)) => Some(link),
                                _ => None,
                            },
                        };
                        Box::new(move || master.run())
                    }
                };
                let thread_control = control.clone();
                let span = tracing::info_span!(parent: &job_span, "checkpoints");
                let spawned = std::thread::Builder::new().name("eddy-checkpoints".into()).spawn(move || {
                    let _span = span.entered();
                    let result =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(thread)).unwrap_or_else(|panic| {
                            Err(CheckpointError::Storage {
                                what: "checkpoint thread".into(),
                                problem: format!("panicked: {}", panic_message(panic.as_ref())),
                            })
                        });
                    if result.is_err() {
                        thread_control.cancel();
                    }
                    result
                });
                Some(spawned.map_err(|e| internal(0, 0, &format!("cannot start the checkpoint thread: {e}")))?)
            }
            _ => None,
        };

        let mut threads = Vec::new();
        for (task, index, runner) in runners {
            let thread_control = control.clone();
            let name = format!("eddy-t{task}-{index}");
            let span = tracing::info_span!(parent: &job_span, "task", task = %plan.task_label(task), subtask = index);
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let _span = span.entered();
                eddy_core::batch_thread::enter();
                // A panic must fail the job like an error does: a subtask that vanished without
                // cancelling would leave its neighbours blocked on its channels for good.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runner.run()))
                    .unwrap_or_else(|panic| Err(TaskError::Panicked(panic_message(panic.as_ref()))));
                if result.is_err() {
                    thread_control.cancel();
                }
                result
            });
            match spawned {
                Ok(handle) => threads.push((task, index, handle)),
                Err(e) => {
                    control.cancel();
                    return Err(internal(task, index, &format!("cannot start a thread: {e}")));
                }
            }
        }
        tracing::info!(
            job = %spec.name,
            tasks = plan.tasks.len(),
            subtasks = plan.subtasks(),
            restored_from = ?restored_from,
            "job started"
        );
        let swappable = spec
            .steps
            .iter()
            .zip(components)
            .filter(|(s, c)| {
                let world = if s.window.is_some() { World::WindowAggregate } else { World::KeyedOperator };
                c.world() == world
            })
            .map(|(s, c)| live_swap::SwappableStep {
                name: s.name.clone(),
                config: s.config.to_string(),
                component: Arc::new(c),
                two_phase: s.two_phase(),
            })
            .collect();
        Ok(Job {
            plan,
            metrics,
            control,
            threads,
            checkpoints: checkpoint_thread,
            signals,
            history,
            restored_from,
            swappable: Mutex::new(swappable),
            spread: options.placement.is_some(),
            max_parallelism: spec.max_parallelism,
            _local_state: local_state,
            _placement: options.placement.clone(),
        })
    }

    /// The checkpoint this run restored from.
    pub fn restored_from(&self) -> Option<CheckpointId> {
        self.restored_from
    }

    /// The newest checkpoints completed in this run (at most [`crate::HISTORY_KEPT`]), oldest first.
    pub fn completed_checkpoints(&self) -> Vec<CompletedCheckpoint> {
        self.history.lock().map(|h| h.newest()).unwrap_or_default()
    }

    /// How many checkpoints this run completed.
    pub fn checkpoints_completed(&self) -> u64 {
        self.history.lock().map(|h| h.completed()).unwrap_or_default()
    }

    /// Each subtask's share of the newest completed checkpoint (empty before the first).
    pub fn state_sizes(&self) -> Vec<SubtaskStateBytes> {
        self.history.lock().map(|h| h.sizes()).unwrap_or_default()
    }

    /// The physical plan being run.
    pub fn plan(&self) -> &PhysicalPlan {
        &self.plan
    }

    /// Current metrics.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Subtasks per task, in plan order (for per-subtask averages such as backpressure).
    pub fn parallelisms(&self) -> Vec<u32> {
        self.plan.tasks.iter().map(|t| t.parallelism).collect()
    }

    /// Whether every subtask has ended, and the checkpoint thread with them (the job master of
    /// a spread job may run no subtask at all).
    pub fn is_done(&self) -> bool {
        self.threads.iter().all(|(_, _, h)| h.is_finished())
            && (!self.threads.is_empty() || self.checkpoints.as_ref().is_none_or(JoinHandle::is_finished))
    }

    /// Stops every subtask without flushing windows (bounded inputs end by themselves).
    pub fn cancel(&self) {
        self.control.cancel();
    }

    /// Takes a checkpoint now and copies it, self-contained, to `to` (a savepoint); returns its
    /// id. Needs checkpoints configured; waits at most `timeout`.
    pub fn savepoint(&self, to: &StoreLocation, timeout: Duration) -> Result<CheckpointId, RunError> {
        let incompatible = |problem: &str| RunError::Checkpoint(CheckpointError::Incompatible(problem.into()));
        if self.checkpoints.is_none() {
            return Err(incompatible("a savepoint needs `checkpoints:` in the pipeline"));
        }
        let request = SavepointRequest { to: to.clone(), checkpoint: None, outcome: None };
        *self.signals.savepoint.lock().map_err(|_| poisoned())? = Some(request);
        let deadline = Instant::now() + timeout;
        loop {
            let outcome = {
                let mut request = self.signals.savepoint.lock().map_err(|_| poisoned())?;
                let outcome = request.as_mut().and_then(|r| r.outcome.take());
                if outcome.is_some() {
                    *request = None;
                }
                outcome
            };
            if let Some(outcome) = outcome {
                return outcome.map_err(|e| incompatible(&e));
            }
            if self.is_done() {
                return Err(incompatible("the job ended before the savepoint was taken"));
            }
            if Instant::now() >= deadline {
                return Err(incompatible(&format!("no savepoint within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Takes a savepoint to `to`, then stops the job; returns the savepoint's checkpoint id and
    /// the run's summary.
    pub fn stop_with_savepoint(
        self,
        to: &StoreLocation,
        timeout: Duration,
    ) -> Result<(CheckpointId, RunSummary), RunError> {
        let id = self.savepoint(to, timeout);
        self.cancel();
        let summary = self.wait()?;
        Ok((id?, summary))
    }

    /// Waits for every subtask; the first failure (not the cancellations it caused) is the error.
    pub fn wait(self) -> Result<RunSummary, RunError> {
        let mut first_error: Option<RunError> = None;
        let mut finished = true;
        for (task, subtask, handle) in self.threads {
            let label = self.plan.task_label(task);
            let outcome = match handle.join() {
                Ok(Ok(Ended::Finished)) => None,
                Ok(Ok(Ended::Cancelled)) => {
                    finished = false;
                    None
                }
                Ok(Err(TaskError::Panicked(message))) => Some(RunError::Panicked { task: label, subtask, message }),
                Ok(Err(source)) => Some(RunError::Task { task: label, subtask, error: Box::new(source) }),
                Err(panic) => Some(RunError::Panicked { task: label, subtask, message: panic_message(panic.as_ref()) }),
            };
            if let Some(e) = outcome {
                finished = false;
                // A closed channel is the echo of another subtask's failure, not the cause.
                if first_error.is_none() || (!is_disconnect(&e) && first_error.as_ref().is_some_and(is_disconnect)) {
                    first_error = Some(e);
                }
            }
        }
        if first_error.is_some() {
            // The checkpoint thread stops on the cancellation the failure caused.
            self.control.cancel();
        }
        let checkpoint_result = match self.checkpoints {
            Some(handle) => handle.join().unwrap_or_else(|_| {
                Err(CheckpointError::Storage { what: "checkpoint thread".into(), problem: "panicked".into() })
            }),
            None => Ok(()),
        };
        match (first_error, checkpoint_result) {
            (Some(e), _) => Err(e),
            (None, Err(e)) => Err(RunError::Checkpoint(e)),
            (None, Ok(())) => {
                let (checkpoints, checkpoints_completed) =
                    self.history.lock().map(|h| (h.newest(), h.completed())).unwrap_or_default();
                Ok(RunSummary {
                    metrics: self.metrics.snapshot(),
                    finished,
                    restored_from: self.restored_from,
                    checkpoints,
                    checkpoints_completed,
                    restarts: 0,
                    savepoint: None,
                })
            }
        }
    }

    /// Starts `spec` and runs it to the end, calling `progress` about every `every`.
    pub fn run(
        spec: &PipelineSpec,
        runtime: &Runtime,
        options: JobOptions,
        every: Duration,
        mut progress: impl FnMut(&Job, &MetricsSnapshot),
    ) -> Result<RunSummary, RunError> {
        let stop = options.stop_with_savepoint.clone();
        let job = Job::start(spec, runtime, options)?;
        let mut last = Instant::now();
        while !job.is_done() {
            std::thread::sleep(Duration::from_millis(20));
            if let Some((flag, dir)) = &stop
                && flag.load(Ordering::SeqCst)
            {
                let to = StoreLocation::Dir(dir.clone());
                let (id, summary) = job.stop_with_savepoint(&to, Duration::from_secs(600))?;
                return Ok(RunSummary { savepoint: Some((id, dir.clone())), ..summary });
            }
            if last.elapsed() >= every {
                last = Instant::now();
                progress(&job, &job.metrics());
            }
        }
        job.wait()
    }

    /// [`Job::run`], restarting from the latest checkpoint after a task failure as the spec's
    /// `restart` strategy allows (only with checkpoints: without them a restart would repeat
    /// output). `options` makes the options of each attempt; `on_restart` hears of each restart.
    pub fn run_with_restarts(
        spec: &PipelineSpec,
        runtime: &Runtime,
        mut options: impl FnMut() -> JobOptions,
        every: Duration,
        mut progress: impl FnMut(&Job, &MetricsSnapshot),
        mut on_restart: impl FnMut(&RunError, u32, Duration),
    ) -> Result<RunSummary, RunError> {
        let mut restarts = 0;
        loop {
            match Job::run(spec, runtime, options(), every, &mut progress) {
                Err(e @ (RunError::Task { .. } | RunError::Panicked { .. })) if spec.checkpoints.is_some() => {
                    let Some(delay) = spec.restart.delay_before(restarts + 1) else { return Err(e) };
                    restarts += 1;
                    on_restart(&e, restarts, delay);
                    std::thread::sleep(delay);
                }
                Ok(summary) => return Ok(RunSummary { restarts, ..summary }),
                Err(e) => return Err(e),
            }
        }
    }
}

/// The message a panic carried, if it was a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn is_disconnect(e: &RunError) -> bool {
    matches!(e, RunError::Task { error, .. } if matches!(**error, TaskError::Route(crate::router::RouteError::Disconnected(_))))
}

fn poisoned() -> RunError {
    internal(0, 0, "job control lock poisoned")
}

fn internal(task: usize, subtask: u32, message: &str) -> RunError {
    RunError::Internal { task, subtask, message: message.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint's metadata with two subtasks of one task, each holding `operators`.
    fn two_subtasks(operators: serde_json::Value) -> CheckpointMetadata {
        let subtask = |i: u32| {
            serde_json::json!({"task": 1, "subtask": i, "parallelism": 2, "keyed": true, "source": null, "sink": null,
                "operators": operators})
        };
        serde_json::from_value(serde_json::json!({
            "version": eddy_checkpoint::metadata::FORMAT_VERSION, "job": "j", "id": 4, "completed_ms": 0,
            "finished": false, "subtasks": [subtask(0), subtask(1)],
            "stats": {"alignment_ms": 0.0, "sync_ms": 0.0, "async_ms": 0.0, "total_ms": 0.0, "full_bytes": 0,
                "incremental_bytes": 0}
        }))
        .expect("metadata")
    }

    /// Two subtasks of `count` recorded `v2` (a live swap), `sum` recorded what runs, `old`
    /// recorded nothing (a checkpoint from before artifacts were recorded).
    #[test]
    fn a_restore_names_each_step_whose_recorded_code_differs_once() {
        let op = |step: &str, artifact: Option<&str>| serde_json::json!({"step": step, "state": {"entries": []}, "artifact": artifact});
        let meta = two_subtasks(serde_json::json!([op("count", Some("v2")), op("sum", Some("s1")), op("old", None)]));
        let running = [("count", "v1"), ("sum", "s1"), ("old", "o1")];
        assert_eq!(other_code(&meta, &running), vec![("count", "v2", "v1")]);
    }

    /// Steps renamed or removed since the checkpoint: those that held entries or timers are
    /// named once each; one that held nothing (a stateless step's empty file) is not.
    #[test]
    fn a_restore_names_each_step_whose_state_no_step_of_the_spec_takes_once() {
        let file = |bytes: u64| serde_json::json!({"path": "f", "bytes": bytes, "crc32": 0});
        let empty = eddy_checkpoint::format::EMPTY_FILE_BYTES;
        let op = |step: &str, bytes: u64, timers: bool| {
            let timer = serde_json::json!({"event_time": true, "timestamp": 9, "key_group": 0, "key": [1]});
            serde_json::json!({"step": step, "state": {"entries": [file(bytes)]},
                "timers": if timers { vec![timer] } else { vec![] }})
        };
        let rocksdb = |step: &str, entries: u64| {
            serde_json::json!({"step": step, "state": {"rocksdb": [["CURRENT", file(16)]]},
                "usage": {"bytes": entries * 10, "entries": entries}})
        };
        let meta = two_subtasks(serde_json::json!([
            op("kept", 90, false),
            op("renamed", 90, false),
            op("stateless", empty, false),
            op("timed", empty, true),
            rocksdb("rocks-stateless", 0),
            rocksdb("rocks-renamed", 3)
        ]));
        assert_eq!(left_out(&meta, &["kept", "new-name"]), vec!["renamed", "timed", "rocks-renamed"]);
        let all = ["kept", "renamed", "stateless", "timed", "rocks-stateless", "rocks-renamed"];
        assert_eq!(left_out(&meta, &all), Vec::<&str>::new());
    }

    /// Records in flight into a window step read back only as what the step reads now.
    #[test]
    fn records_in_flight_into_a_window_whose_two_phase_changed_are_refused() {
        let op = |step: &str, partial_input: bool| serde_json::json!({"step": step, "state": {"entries": []}, "partial_input": partial_input});
        let mut meta = two_subtasks(serde_json::json!([op("highest", true), op("row", false)]));
        let step = |found: Option<&OperatorState>| found.map(|o| o.step.clone());
        // Nothing in flight: whatever the setting.
        assert_eq!(step(misread_in_flight(&meta, &[])), None);
        meta.subtasks[1].in_flight =
            vec![serde_json::from_value(serde_json::json!({"path": "f", "bytes": 9, "crc32": 0})).expect("file")];
        assert_eq!(step(misread_in_flight(&meta, &["highest"])), None, "still two-phase");
        assert_eq!(step(misread_in_flight(&meta, &[])), Some("highest".into()), "two-phase turned off");
        let meta = {
            let mut m = two_subtasks(serde_json::json!([op("highest", false)]));
            m.subtasks[0].in_flight = meta.subtasks[1].in_flight.clone();
            m
        };
        assert_eq!(step(misread_in_flight(&meta, &["highest"])), Some("highest".into()), "two-phase turned on");
        assert_eq!(step(misread_in_flight(&meta, &["other"])), None, "records into a one-phase step");
        // Written before two-phase windows: no flag, so records.
        let mut old = two_subtasks(serde_json::json!([{"step": "highest", "state": {"entries": []}}]));
        old.subtasks[0].in_flight = meta.subtasks[0].in_flight.clone();
        assert_eq!(step(misread_in_flight(&old, &["highest"])), Some("highest".into()));
        assert_eq!(step(misread_in_flight(&old, &[])), None);
    }
}
