//! Runs accepted jobs on the embedded worker: one supervising thread per job starts it with
//! the engine, publishes its live view, restarts it from its newest checkpoint after a failure
//! (as its `restart` strategy allows), and records each change of status in the store.
//!
//! The store is the truth about a job's status; the live view only carries what changes too
//! fast to store (metrics, checkpoints). A server that dies leaves running jobs recorded as
//! running, and [`Supervisor::resume_all`] starts them again at the next start: each resumes
//! from its newest checkpoint, because every service job checkpoints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eddy_core::WATERMARK_MIN;
use eddy_engine::{Job, JobOptions, MetricsSnapshot};
use eddy_plan::{PhysicalPlan, PipelineSpec};
use eddy_runtime::CpuShare;
use serde::Serialize;
use utoipa::ToSchema;

use crate::AppState;
use crate::model::{JobRecord, JobStatus, Savepoint, now_ms};
use crate::placement::{StoreLocation, job_store, place};
use crate::problem::ApiError;
use crate::store::Table;

/// CPU time a tenant may save up and spend at once beyond its share.
const CPU_BURST: Duration = Duration::from_millis(500);

/// Completed checkpoints a live view lists.
const MAX_CHECKPOINTS_SHOWN: usize = 100;

/// How often a running job's live view is refreshed.
const REFRESH: Duration = Duration::from_millis(250);

/// One task of a running job, now.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct TaskView {
    /// The chain's label (its steps).
    pub label: String,
    /// Subtasks.
    pub parallelism: u32,
    /// Records in, summed over subtasks.
    pub records_in: u64,
    /// Records out, summed over subtasks.
    pub records_out: u64,
    /// Records in per second over the last refresh.
    pub records_in_per_sec: f64,
    /// Records out per second over the last refresh.
    pub records_out_per_sec: f64,
    /// Lowest watermark over subtasks (ms), if event time started.
    pub watermark: Option<i64>,
    /// Share of the last refresh its subtasks spent waiting for credit downstream (0–1).
    pub backpressure: f64,
    /// Records too late for their windows.
    pub late_records: u64,
    /// Linear memory its Wasm instances hold, summed over subtasks.
    pub wasm_memory_bytes: u64,
    /// The worker each subtask runs on, by subtask index (empty when the job runs in the
    /// server's own process).
    pub workers: Vec<String>,
}

/// A completed checkpoint.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CheckpointView {
    /// Its id.
    pub id: u64,
    /// Trigger to completion, ms.
    pub duration_ms: f64,
    /// Bytes it references.
    pub full_bytes: u64,
    /// Bytes written for it.
    pub incremental_bytes: u64,
    /// Longest alignment, ms.
    pub alignment_ms: f64,
}

/// What a running job looks like now.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct LiveView {
    /// Since this attempt started, ms.
    pub elapsed_ms: u64,
    /// Records read by the sources.
    pub source_records: u64,
    /// Records that reached the sink.
    pub sink_records: u64,
    /// Per task, in plan order.
    pub tasks: Vec<TaskView>,
    /// The newest completed checkpoints of this attempt (at most 100), oldest first.
    pub checkpoints: Vec<CheckpointView>,
    /// The checkpoint this attempt resumed from.
    pub restored_from: Option<u64>,
}

impl LiveView {
    fn of(job: &Job, now: &MetricsSnapshot, before: &MetricsSnapshot, assignment: &[Vec<String>]) -> Self {
        let secs = now.elapsed.saturating_sub(before.elapsed).as_secs_f64().max(1e-3);
        let parallelisms = job.parallelisms();
        let backpressure = now.task_backpressure_since(before, &parallelisms);
        let tasks = now
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let prev = before.tasks.get(i).cloned().unwrap_or_default();
                let parallelism = parallelisms.get(i).copied().unwrap_or(1);
                TaskView {
                    label: t.label.clone(),
                    parallelism,
                    records_in: t.records_in,
                    records_out: t.records_out,
                    records_in_per_sec: t.records_in.saturating_sub(prev.records_in) as f64 / secs,
                    records_out_per_sec: t.records_out.saturating_sub(prev.records_out) as f64 / secs,
                    watermark: (t.watermark > WATERMARK_MIN && t.watermark < i64::MAX).then_some(t.watermark),
                    backpressure: backpressure.get(i).copied().unwrap_or(0.0),
                    late_records: t.late_records,
                    wasm_memory_bytes: t.wasm_memory_bytes,
                    workers: assignment.get(i).cloned().unwrap_or_default(),
                }
            })
            .collect();
        let completed = job.completed_checkpoints();
        // The newest few: a long-running job completes thousands, and the view is polled.
        let checkpoints = completed[completed.len().saturating_sub(MAX_CHECKPOINTS_SHOWN)..]
            .iter()
            .map(|c| CheckpointView {
                id: c.id,
                duration_ms: c.stats.total_ms,
                full_bytes: c.stats.full_bytes,
                incremental_bytes: c.stats.incremental_bytes,
                alignment_ms: c.stats.alignment_ms,
            })
            .collect();
        LiveView {
            elapsed_ms: now.elapsed.as_millis() as u64,
            source_records: now.source_records,
            sink_records: now.sink_records,
            tasks,
            checkpoints,
            restored_from: job.restored_from(),
        }
    }
}

/// A job the supervisor runs.
#[derive(Debug)]
pub struct Live {
    slots: AtomicU32,
    cancel: AtomicBool,
    view: Mutex<Option<LiveView>>,
    requests: Mutex<std::collections::VecDeque<Request>>,
}

impl Live {
    /// Queues a control request for the job's thread, which answers on `reply`.
    pub fn request(&self, control: Control) -> tokio::sync::oneshot::Receiver<Result<Savepoint, ApiError>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        lock(&self.requests).push_back(Request { control, reply });
        answer
    }

    /// Whether a client asked to cancel the job.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// The newest live view, if an attempt runs.
    pub fn view(&self) -> Option<LiveView> {
        lock(&self.view).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The jobs this server runs and the slots they hold.
#[derive(Debug)]
pub struct Supervisor {
    slots: u32,
    /// The cluster whose workers run the jobs (a coordinator without slots of its own).
    workers: Option<eddy_cluster::ControlPlane>,
    live: Mutex<HashMap<String, Arc<Live>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
    admission: Mutex<()>,
    /// Each tenant's CPU share, with the quota it was made for.
    shares: Mutex<HashMap<String, (u32, Arc<CpuShare>)>>,
}

/// Slots the running jobs hold.
fn held(live: &HashMap<String, Arc<Live>>) -> u32 {
    live.values().map(|l| l.slots.load(Ordering::SeqCst)).sum()
}

/// Slots a job holds: one subtask of every task shares a slot (as in Flink), so the widest task.
pub fn slots_of(spec: &PipelineSpec) -> u32 {
    PhysicalPlan::new(spec).tasks.iter().map(|t| t.parallelism).max().unwrap_or(1)
}

impl Supervisor {
    /// A supervisor with `slots` slots, or one that runs jobs on the live `workers`.
    pub fn new(slots: u32, workers: Option<eddy_cluster::ControlPlane>) -> Self {
        Self {
            slots,
            workers,
            live: Mutex::default(),
            threads: Mutex::default(),
            stopping: AtomicBool::new(false),
            admission: Mutex::default(),
            shares: Mutex::default(),
        }
    }

    /// Held while a request checks a tenant's quotas and takes what it checked, so two
    /// requests cannot both take the last of a quota.
    pub fn admission(&self) -> MutexGuard<'_, ()> {
        lock(&self.admission)
    }

    /// The tenant's CPU share at `millicores` (a new one when the quota changed).
    pub fn cpu_share(&self, tenant: &str, millicores: u32) -> Arc<CpuShare> {
        let mut shares = lock(&self.shares);
        match shares.get(tenant) {
            Some((m, share)) if *m == millicores => share.clone(),
            _ => {
                let share = Arc::new(CpuShare::new(f64::from(millicores) / 1000.0, CPU_BURST));
                shares.insert(tenant.to_string(), (millicores, share.clone()));
                share
            }
        }
    }

    /// Total slots: its own, or those of the live workers.
    pub fn slots(&self) -> u32 {
        match &self.workers {
            Some(control) => control.workers().iter().map(|w| w.slots).sum(),
            None => self.slots,
        }
    }

    /// Whether the server is stopping (its jobs stop and resume at the next start).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Slots held by running jobs.
    pub fn used_slots(&self) -> u32 {
        held(&lock(&self.live))
    }

    /// The live handle of a running job.
    pub fn live(&self, job: &str) -> Option<Arc<Live>> {
        lock(&self.live).get(job).cloned()
    }

    /// Stores `record` and starts it, if its slots are free; atomically, so two submissions
    /// cannot both take the last slot.
    pub fn admit(&self, state: &Arc<AppState>, record: JobRecord) -> Result<(), ApiError> {
        let total = self.slots();
        let mut live = lock(&self.live);
        let used = held(&live);
        let free = total.saturating_sub(used);
        if record.slots > free {
            let next = if self.workers.is_some() { "start more workers" } else { "wait for a job to end" };
            return Err(ApiError::conflict(format!(
                "the job needs {} slot(s) and {free} of {total} are free: {next}, or lower its parallelism",
                record.slots
            ))
            .at("parallelism"));
        }
        state.store.write(|txn| txn.put(Table::Jobs, &record.id, &record))?;
        self.spawn(state, &mut live, record);
        Ok(())
    }

    /// Reserves the slots a running job needs at a new parallelism, or refuses with 409.
    pub fn reserve(&self, job: &str, slots: u32) -> Result<(), ApiError> {
        let total = self.slots();
        let live = lock(&self.live);
        let Some(own) = live.get(job) else { return Err(ApiError::conflict(format!("job {job} is not running"))) };
        let used = held(&live);
        let free = total.saturating_sub(used) + own.slots.load(Ordering::SeqCst);
        if slots > free {
            return Err(ApiError::conflict(format!(
                "at that parallelism the job needs {slots} slot(s) and {free} of {total} are free to it"
            ))
            .at("parallelism"));
        }
        own.slots.store(slots, Ordering::SeqCst);
        Ok(())
    }

    /// Starts every job the store records as not yet ended (after a restart of the server).
    pub fn resume_all(&self, state: &Arc<AppState>) -> Result<usize, ApiError> {
        let jobs: Vec<JobRecord> = state.store.list(Table::Jobs, "")?;
        let mut live = lock(&self.live);
        let mut resumed = 0;
        for record in jobs.into_iter().filter(|j| !j.status.is_terminal()) {
            tracing::info!(tenant = %record.tenant, job = %record.id, "resuming job after a server start");
            self.spawn(state, &mut live, record);
            resumed += 1;
        }
        Ok(resumed)
    }

    fn spawn(&self, state: &Arc<AppState>, live: &mut HashMap<String, Arc<Live>>, record: JobRecord) {
        let handle = Arc::new(Live {
            slots: AtomicU32::new(record.slots),
            cancel: AtomicBool::new(false),
            view: Mutex::new(None),
            requests: Mutex::default(),
        });
        live.insert(record.id.clone(), handle.clone());
        let state = state.clone();
        let name = format!("job-{}", record.id);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            supervise(&state, &record.id, &handle);
            lock(&state.supervisor.live).remove(&record.id);
            // Requests that came after the last attempt ended get an answer, not silence.
            for request in lock(&handle.requests).drain(..) {
                let _ = request.reply.send(Err(ApiError::conflict(format!(
                    "job {} ended before the {} was taken",
                    record.id,
                    request.control.reason()
                ))));
            }
        });
        match thread {
            Ok(t) => lock(&self.threads).push(t),
            Err(e) => tracing::error!(error = %e, "cannot start a job thread"),
        }
    }

    /// Asks a running job to cancel; false if it does not run.
    pub fn cancel(&self, job: &str) -> bool {
        match self.live(job) {
            Some(l) => {
                l.cancel.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Stops every job without changing its recorded status, so the next start resumes it.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Writes a change to the job's record.
fn update(state: &AppState, id: &str, change: impl FnOnce(&mut JobRecord)) {
    let result = state.store.write(|txn| -> Result<(), crate::store::StoreError> {
        let Some(mut record) = txn.get::<JobRecord>(Table::Jobs, id)? else { return Ok(()) };
        change(&mut record);
        record.updated_ms = now_ms();
        txn.put(Table::Jobs, id, &record)
    });
    if let Err(e) = result {
        tracing::error!(job = %id, error = %e, "cannot record the job's status");
    }
}

/// What a client asks of a running job.
#[derive(Debug)]
pub enum Control {
    /// Take a savepoint and keep running.
    Savepoint,
    /// Take a savepoint and stop.
    Stop,
    /// Take a savepoint and restart with every step at this parallelism.
    Rescale(u32),
    /// Take a savepoint and restart with this step running this artifact digest.
    Upgrade {
        /// The step's name.
        step: String,
        /// The artifact's digest.
        digest: String,
    },
}

impl Control {
    fn reason(&self) -> &'static str {
        match self {
            Control::Savepoint => "requested",
            Control::Stop => "stop",
            Control::Rescale(_) => "rescale",
            Control::Upgrade { .. } => "upgrade",
        }
    }
}

/// A control request and where its answer goes.
#[derive(Debug)]
pub struct Request {
    /// What to do.
    pub control: Control,
    /// The savepoint taken, or why not.
    pub reply: tokio::sync::oneshot::Sender<Result<Savepoint, ApiError>>,
}

/// How one attempt ended.
pub(crate) enum Outcome {
    Finished,
    Canceled,
    Failed(String),
    /// Stopped with a savepoint, to stay stopped (`None`, or `Stop`) or restart with a change;
    /// the client's answer waits until the record says so.
    Savepointed(Option<(Control, Reply, Savepoint)>),
}

/// Where a control request's answer goes.
type Reply = tokio::sync::oneshot::Sender<Result<Savepoint, ApiError>>;

/// How long a savepoint may take before the request fails.
const SAVEPOINT_TIMEOUT: Duration = Duration::from_secs(300);

/// Takes a savepoint of `job` into a new directory of the job's and records it.
fn take_savepoint(state: &AppState, record: &JobRecord, job: &Job, reason: &str) -> Result<Savepoint, ApiError> {
    let at_ms = now_ms();
    let path = format!("savepoints/{at_ms}-{reason}");
    let to = job_store(state, &record.tenant, &record.id).join(&path);
    let id = job.savepoint(&to, SAVEPOINT_TIMEOUT).map_err(|e| ApiError::conflict(format!("no savepoint: {e}")))?;
    let savepoint = Savepoint { id, path, at_ms, reason: reason.to_string() };
    update(state, &record.id, |r| r.savepoints.push(savepoint.clone()));
    tracing::info!(savepoint = id, reason, "savepoint taken");
    Ok(savepoint)
}

/// Ends `job` after a savepoint; the savepoint becomes where the next generation starts.
fn stop_with_savepoint(state: &AppState, record: &JobRecord, job: Job, reason: &str) -> Result<Savepoint, ApiError> {
    let taken = take_savepoint(state, record, &job, reason);
    job.cancel();
    let _ = job.wait();
    let savepoint = taken?;
    update(state, &record.id, |r| {
        r.generation += 1;
        r.restore_from = Some(savepoint.path.clone());
    });
    Ok(savepoint)
}

/// Runs one attempt until it ends, publishing its live view and serving control requests: on
/// the live workers when the supervisor has them, else in this process.
fn attempt(state: &AppState, record: &JobRecord, spec: &PipelineSpec, digests: &[String], live: &Live) -> Outcome {
    let quotas = match crate::quotas::of(state, &record.tenant) {
        Ok(q) => q,
        Err(e) => return Outcome::Failed(format!("cannot read the tenant's quotas: {}", e.detail)),
    };
    let restore_from = restore_point(state, record, spec);
    if let Some(control) = &state.supervisor.workers {
        let context = crate::spread::Attempt { record, spec, digests, quotas: &quotas, restore_from };
        return crate::spread::attempt(state, control, &context, live);
    }
    let limits = state.runtime.config().limits.clone().with_memory_at_most(quotas.instance_memory_bytes);
    let options = JobOptions {
        cpu_share: Some(state.supervisor.cpu_share(&record.tenant, quotas.cpu_millicores)),
        sandbox_limits: Some(limits),
        restore_from,
        ..JobOptions::default()
    };
    let job = match Job::start(spec, &state.runtime, options) {
        Ok(job) => job,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    watch(state, record, live, job, &[], Vec::new, || None)
}

/// Watches a started attempt until it ends: serves control requests, publishes the live view
/// (naming each subtask's worker from `assignment`, and adding the metrics of the `parts` in
/// other processes to the job's own), and fails it when `lost` names a reason.
pub(crate) fn watch(
    state: &AppState,
    record: &JobRecord,
    live: &Live,
    job: Job,
    assignment: &[Vec<String>],
    parts: impl Fn() -> Vec<MetricsSnapshot>,
    mut lost: impl FnMut() -> Option<String>,
) -> Outcome {
    let metrics = || {
        let mut all = job.metrics();
        for part in parts() {
            all.absorb(&part);
        }
        all
    };
    let mut before = metrics();
    let mut last = Instant::now();
    while !job.is_done() {
        std::thread::sleep(Duration::from_millis(20));
        if live.cancel.load(Ordering::SeqCst) {
            job.cancel();
            let _ = job.wait();
            return Outcome::Canceled;
        }
        if state.supervisor.stopping.load(Ordering::SeqCst) {
            // Resumed from this savepoint at the next start; from the newest checkpoint if it fails.
            if let Err(e) = stop_with_savepoint(state, record, job, "shutdown") {
                tracing::warn!(error = %e.detail, "no savepoint at shutdown; the job resumes from its newest checkpoint");
            }
            return Outcome::Savepointed(None);
        }
        let request = lock(&live.requests).pop_front();
        if let Some(Request { control, reply }) = request {
            if matches!(control, Control::Savepoint) {
                let _ = reply.send(take_savepoint(state, record, &job, control.reason()));
                continue;
            }
            return match stop_with_savepoint(state, record, job, control.reason()) {
                Ok(savepoint) => Outcome::Savepointed(Some((control, reply, savepoint))),
                Err(e) => {
                    // The cancel stopped the job anyway: it restarts from its newest checkpoint.
                    let message = format!("{} failed: {}", control.reason(), e.detail);
                    let _ = reply.send(Err(e));
                    Outcome::Failed(message)
                }
            };
        }
        if let Some(reason) = lost() {
            job.cancel();
            let _ = job.wait();
            return Outcome::Failed(reason);
        }
        if last.elapsed() >= REFRESH {
            last = Instant::now();
            let now = metrics();
            *lock(&live.view) = Some(LiveView::of(&job, &now, &before, assignment));
            before = now;
        }
    }
    match job.wait() {
        Ok(summary) if summary.finished => Outcome::Finished,
        Ok(_) => Outcome::Canceled,
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// The savepoint to start from: the generation's own newest checkpoint wins once it has one.
fn restore_point(state: &AppState, record: &JobRecord, spec: &PipelineSpec) -> Option<StoreLocation> {
    let savepoint = record.restore_from.as_ref()?;
    let has_checkpoint = spec
        .checkpoints
        .as_ref()
        .and_then(|c| eddy_engine::checkpoint::CheckpointStore::open(c).ok())
        .and_then(|store| eddy_engine::checkpoint::metadata::completed_ids(&store).ok())
        .is_some_and(|ids| !ids.is_empty());
    (!has_checkpoint).then(|| job_store(state, &record.tenant, &record.id).join(savepoint))
}

/// Applies a change that restarts the job, to its record.
fn apply(state: &AppState, id: &str, control: &Control) {
    update(state, id, |r| match control {
        Control::Rescale(p) => r.overrides.parallelism = Some(*p),
        Control::Upgrade { step, digest } => {
            r.overrides.artifacts.insert(step.clone(), digest.clone());
        }
        Control::Savepoint | Control::Stop => {}
    });
    update(state, id, |r| {
        if let Ok((spec, digests)) = place(state, r) {
            r.slots = slots_of(&spec);
            r.plan = PhysicalPlan::new(&spec).to_string();
            r.state_bytes = crate::quotas::state_bytes_of(&spec);
            if let Ok(memory) = crate::quotas::memory_of(state, &r.tenant, &spec) {
                r.memory_bytes = memory;
            }
            r.artifacts = digests;
        }
    });
}

/// The job's life on this server: attempts and restarts until it ends or the server stops.
fn supervise(state: &AppState, id: &str, live: &Live) {
    loop {
        let record = match state.store.get::<JobRecord>(Table::Jobs, id) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => return tracing::error!(job = %id, error = %e, "cannot read the job"),
        };
        let span = tracing::info_span!("job", tenant = %record.tenant, job = %record.id, name = %record.name);
        let _entered = span.enter();
        let (spec, digests) = match place(state, &record) {
            Ok(placed) => placed,
            Err(e) => {
                tracing::warn!(error = %e.detail, "the job's spec no longer places");
                return update(state, id, |r| {
                    r.push_failure(e.detail.clone());
                    r.status = JobStatus::Failed;
                });
            }
        };
        update(state, id, |r| r.status = JobStatus::Running);
        tracing::info!(generation = record.generation, "job running");
        let outcome = attempt(state, &record, &spec, &digests, live);
        *lock(&live.view) = None;
        match outcome {
            Outcome::Finished => {
                tracing::info!("job finished");
                return update(state, id, |r| r.status = JobStatus::Finished);
            }
            Outcome::Canceled => {
                tracing::info!("job canceled");
                return update(state, id, |r| r.status = JobStatus::Canceled);
            }
            Outcome::Savepointed(None) => return,
            Outcome::Savepointed(Some((Control::Stop, reply, savepoint))) => {
                tracing::info!("job stopped with a savepoint");
                update(state, id, |r| r.status = JobStatus::Stopped);
                let _ = reply.send(Ok(savepoint));
                return;
            }
            Outcome::Savepointed(Some((change, reply, savepoint))) => {
                tracing::info!(change = ?change, "job restarts from its savepoint with a change");
                apply(state, id, &change);
                let _ = reply.send(Ok(savepoint));
            }
            Outcome::Failed(message) => {
                tracing::warn!(error = %message, "job failed");
                let delay = spec.restart.delay_before(record.restarts + 1);
                update(state, id, |r| {
                    r.push_failure(message.clone());
                    r.status = if delay.is_some() { JobStatus::Restarting } else { JobStatus::Failed };
                    if delay.is_some() {
                        r.restarts += 1;
                    }
                });
                let Some(delay) = delay else { return };
                if !wait_or_stop(state, id, live, delay) {
                    return;
                }
            }
        }
    }
}

/// Waits out a restart delay; false if the job was cancelled or the server stops meanwhile.
fn wait_or_stop(state: &AppState, id: &str, live: &Live, delay: Duration) -> bool {
    let until = Instant::now() + delay;
    while Instant::now() < until {
        if live.cancel.load(Ordering::SeqCst) {
            update(state, id, |r| r.status = JobStatus::Canceled);
            return false;
        }
        if state.supervisor.stopping.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
