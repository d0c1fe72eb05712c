//! Runs accepted jobs on the embedded worker or the cluster's workers: one supervising thread
//! per job starts it with the engine, publishes its live view, restarts it from its newest
//! checkpoint after a failure (as [`RestartPolicy`] decides), and records each change of
//! status in the store.
//!
//! The store is the truth about a job's status; the live view only carries what changes too
//! fast to store (metrics, checkpoints). A server that dies leaves running jobs recorded as
//! running, and [`Supervisor::resume_all`] starts them again at the next start: each resumes
//! from its newest checkpoint, because every service job checkpoints. A job the server died
//! under twice in a row is held instead ([`crate::model::MAX_CRASH_RESUMES`]).
//!
//! Admission takes a job's [`Demand`] under one lock: its tenant's quotas, the slots free, and
//! the server's memory budget, so two submissions cannot both take the last of either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eddy_core::WATERMARK_MIN;
use eddy_engine::{FailureDetail, Job, JobOptions, MetricsSnapshot, SubtaskSnapshot, SwapError};
use eddy_plan::{PhysicalPlan, PipelineSpec};
use eddy_runtime::CpuShare;
use serde::Serialize;
use utoipa::ToSchema;

use crate::AppState;
use crate::model::{JobRecord, JobStatus, LiveSwap, MAX_CRASH_RESUMES, Savepoint, now_ms};
use crate::placement::{StoreLocation, job_store, place, redact};
use crate::problem::ApiError;
use crate::quotas::Demand;
use crate::restarts::{Cause, Counters, Failed, RestartPolicy, Verdict};
use crate::store::Table;
use crate::timeline::{TIMELINE_STEP, Timeline, TimelinePoint};

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
    /// CPU seconds its subtasks' threads have used, summed.
    pub cpu_seconds: f64,
    /// The worker each subtask runs on, by subtask index (empty when the job runs in the
    /// server's own process).
    pub workers: Vec<String>,
    /// How records reach it from the tasks before it (`hash(/user) from task 1`), empty for
    /// a source's task.
    pub inputs: Vec<String>,
    /// Each subtask, by index.
    pub subtasks: Vec<SubtaskView>,
}

/// One subtask of a running job, now.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct SubtaskView {
    /// Its index.
    pub index: u32,
    /// The worker it runs on (absent in the server's own process).
    pub worker: Option<String>,
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Records in per second over the last refresh.
    pub records_in_per_sec: f64,
    /// Its watermark (ms), if event time started.
    pub watermark: Option<i64>,
    /// Share of the last refresh it spent waiting for credit downstream (0–1).
    pub backpressure: f64,
    /// Records too late for their windows.
    pub late_records: u64,
    /// Linear memory its Wasm instances hold.
    pub wasm_memory_bytes: u64,
    /// CPU seconds its thread has used.
    pub cpu_seconds: f64,
    /// Bytes of its keyed state and timers in the attempt's newest completed checkpoint
    /// (absent before the first).
    pub state_bytes: Option<u64>,
}

/// A watermark worth showing: set, and not the end of input.
fn shown_watermark(watermark: i64) -> Option<i64> {
    (watermark > WATERMARK_MIN && watermark < i64::MAX).then_some(watermark)
}

impl SubtaskView {
    /// Subtask `now` against its reading `before`, `secs` earlier; `workers` by subtask index.
    /// `state_bytes`: its share of the newest completed checkpoint.
    fn of(
        now: &SubtaskSnapshot,
        before: Option<&SubtaskSnapshot>,
        secs: f64,
        workers: &[String],
        state_bytes: Option<u64>,
    ) -> Self {
        let before = before.cloned().unwrap_or_default();
        let blocked = now.blocked_ns.saturating_sub(before.blocked_ns) as f64 / 1e9;
        SubtaskView {
            index: now.index,
            worker: workers.get(now.index as usize).cloned(),
            records_in: now.records_in,
            records_out: now.records_out,
            records_in_per_sec: now.records_in.saturating_sub(before.records_in) as f64 / secs,
            watermark: shown_watermark(now.watermark),
            backpressure: (blocked / secs).min(1.0),
            late_records: now.late_records,
            wasm_memory_bytes: now.wasm_memory_bytes,
            cpu_seconds: now.cpu_ns as f64 / 1e9,
            state_bytes,
        }
    }
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
    /// Bytes of records in flight it stored (unaligned checkpoints).
    pub in_flight_bytes: u64,
    /// Whether some subtask took its part unaligned.
    pub unaligned: bool,
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
    /// The job's last minutes, a point a second, oldest first (across its attempts on this
    /// server).
    pub timeline: Vec<TimelinePoint>,
}

impl LiveView {
    fn of(job: &Job, now: &MetricsSnapshot, before: &MetricsSnapshot, assignment: &[Vec<String>]) -> Self {
        let secs = now.elapsed.saturating_sub(before.elapsed).as_secs_f64().max(1e-3);
        let parallelisms = job.parallelisms();
        let plan = job.plan();
        let backpressure = now.task_backpressure_since(before, &parallelisms);
        let sizes: HashMap<(usize, u32), u64> =
            job.state_sizes().into_iter().map(|z| ((z.task, z.subtask), z.state_bytes)).collect();
        let tasks = now
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let prev = before.tasks.get(i).cloned().unwrap_or_default();
                let parallelism = parallelisms.get(i).copied().unwrap_or(1);
                let workers = assignment.get(i).cloned().unwrap_or_default();
                let subtasks = t
                    .subtasks
                    .iter()
                    .filter(|s| s.index < parallelism)
                    .map(|s| {
                        let earlier = prev.subtasks.iter().find(|p| p.index == s.index);
                        let size = sizes.get(&(i, s.index)).copied();
                        SubtaskView::of(s, earlier, secs, &workers, size)
                    })
                    .collect();
                let inputs = plan
                    .edges
                    .iter()
                    .filter(|e| e.to == i)
                    .map(|e| format!("{} from task {}", e.partitioning, e.from + 1))
                    .collect();
                TaskView {
                    label: t.label.clone(),
                    parallelism,
                    records_in: t.records_in,
                    records_out: t.records_out,
                    records_in_per_sec: t.records_in.saturating_sub(prev.records_in) as f64 / secs,
                    records_out_per_sec: t.records_out.saturating_sub(prev.records_out) as f64 / secs,
                    watermark: shown_watermark(t.watermark),
                    backpressure: backpressure.get(i).copied().unwrap_or(0.0),
                    late_records: t.late_records,
                    wasm_memory_bytes: t.wasm_memory_bytes,
                    cpu_seconds: t.cpu_ns as f64 / 1e9,
                    workers,
                    inputs,
                    subtasks,
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
                in_flight_bytes: c.stats.in_flight_bytes,
                unaligned: c.stats.unaligned,
            })
            .collect();
        LiveView {
            elapsed_ms: now.elapsed.as_millis() as u64,
            source_records: now.source_records,
            sink_records: now.sink_records,
            tasks,
            checkpoints,
            restored_from: job.restored_from(),
            // Kept by the job's [`Live`] across attempts; `Live::view` adds it.
            timeline: Vec::new(),
        }
    }
}

/// A job the supervisor runs.
#[derive(Debug)]
pub struct Live {
    /// What it holds: slots and memory (changes at a rescale or upgrade).
    demand: Mutex<Demand>,
    cancel: AtomicBool,
    /// Set when the service ends the job itself (a quota passed while it ran): why.
    refused: Mutex<Option<String>>,
    view: Mutex<Option<LiveView>>,
    timeline: Mutex<Timeline>,
    requests: Mutex<std::collections::VecDeque<Request>>,
    /// Live upgrades asked for: (step, artifact digest, where the answer goes).
    swaps: Mutex<std::collections::VecDeque<(String, String, SwapReply)>>,
}

/// Where a live upgrade's answer goes.
type SwapReply = tokio::sync::oneshot::Sender<Result<LiveSwap, ApiError>>;

impl Live {
    /// Queues a control request for the job's thread, which answers on `reply`.
    pub fn request(&self, control: Control) -> tokio::sync::oneshot::Receiver<Result<Savepoint, ApiError>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        lock(&self.requests).push_back(Request { control, reply });
        answer
    }

    /// Queues a live upgrade of `step` to artifact `digest` for the job's thread; one waits
    /// at most (a swap holds the job's thread until its checkpoint completes), so a tenant
    /// cannot pile requests up.
    pub fn swap(
        &self,
        step: String,
        digest: String,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<LiveSwap, ApiError>>, ApiError> {
        let mut swaps = lock(&self.swaps);
        if !swaps.is_empty() {
            return Err(ApiError::conflict("a live upgrade of this job is already waiting; try again when it is done"));
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        swaps.push_back((step, digest, reply));
        Ok(answer)
    }

    /// Whether a client asked to cancel the job.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// The newest live view with the job's timeline, if an attempt runs.
    pub fn view(&self) -> Option<LiveView> {
        let mut view = lock(&self.view).clone()?;
        view.timeline = lock(&self.timeline).points();
        Some(view)
    }

    /// Ends the job as failed, for `reason`, without a restart.
    pub fn refuse(&self, reason: String) {
        *lock(&self.refused) = Some(reason);
    }

    fn refusal(&self) -> Option<String> {
        lock(&self.refused).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The jobs this server runs and what they hold.
#[derive(Debug)]
pub struct Supervisor {
    slots: u32,
    /// The cluster whose workers run the jobs (a coordinator without slots of its own).
    workers: Option<eddy_cluster::ControlPlane>,
    /// The memory every running job together may make the server hold.
    memory_budget: u64,
    /// Running jobs by store key (`<tenant>/<job>`).
    live: Mutex<HashMap<String, Arc<Live>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
    admission: Mutex<()>,
    /// Each tenant's CPU share, with the quota it was made for.
    shares: Mutex<HashMap<String, (u32, Arc<CpuShare>)>>,
    /// Bytes each job's store holds, as last listed (see [`crate::janitor`]).
    stored: Mutex<HashMap<String, u64>>,
}

/// What the running jobs hold, summed.
fn held(live: &HashMap<String, Arc<Live>>, except: Option<&str>) -> Demand {
    let mut total = Demand::default();
    for (_, l) in live.iter().filter(|(key, _)| Some(key.as_str()) != except) {
        let d = *lock(&l.demand);
        total.slots = total.slots.saturating_add(d.slots);
        total.memory_bytes = total.memory_bytes.saturating_add(d.memory_bytes);
    }
    total
}

/// Slots a job holds: one subtask of every task shares a slot (as in Flink), so the widest task.
pub fn slots_of(spec: &PipelineSpec) -> u32 {
    PhysicalPlan::new(spec).tasks.iter().map(|t| t.parallelism).max().unwrap_or(1)
}

/// How long a job must run in one server run before a crash of the server no longer counts
/// against it: a job that crashes the server does so sooner, or not at all.
const STABLE_RUN: Duration = Duration::from_secs(600);

impl Supervisor {
    /// A supervisor with `slots` slots, or one that runs jobs on the live `workers`, whose
    /// jobs together may take `memory_budget` bytes.
    pub fn new(slots: u32, workers: Option<eddy_cluster::ControlPlane>, memory_budget: u64) -> Self {
        Self {
            slots,
            workers,
            memory_budget,
            live: Mutex::default(),
            threads: Mutex::default(),
            stopping: AtomicBool::new(false),
            admission: Mutex::default(),
            shares: Mutex::default(),
            stored: Mutex::default(),
        }
    }

    /// The memory every running job together may take.
    pub fn memory_budget(&self) -> u64 {
        self.memory_budget
    }

    fn admission(&self) -> MutexGuard<'_, ()> {
        lock(&self.admission)
    }

    /// Runs `f` holding the admission lock, so that what it checks against quotas and what it
    /// takes are one step (uploads of artifacts and files take it too).
    pub fn admitting<T>(&self, f: impl FnOnce() -> T) -> T {
        let _admission = self.admission();
        f()
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
    pub fn slots(&self) -> u64 {
        match &self.workers {
            Some(control) => control.workers().iter().map(|w| u64::from(w.slots)).sum(),
            None => u64::from(self.slots),
        }
    }

    /// Whether the server is stopping (its jobs stop and resume at the next start).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Slots held by running jobs.
    pub fn used_slots(&self) -> u32 {
        held(&lock(&self.live), None).slots
    }

    /// The live handle of a running job, by store key.
    pub fn live(&self, key: &str) -> Option<Arc<Live>> {
        lock(&self.live).get(key).cloned()
    }

    /// Bytes the store of job `key` held when last listed.
    pub fn stored_bytes(&self, key: &str) -> u64 {
        lock(&self.stored).get(key).copied().unwrap_or(0)
    }

    /// Records what each job's store holds now.
    pub fn set_stored_bytes(&self, stored: HashMap<String, u64>) {
        *lock(&self.stored) = stored;
    }

    /// Refuses `demand` beyond the slots free and the server's memory budget, not counting
    /// what job `except` holds now.
    fn check_room(
        &self,
        live: &HashMap<String, Arc<Live>>,
        demand: Demand,
        except: Option<&str>,
    ) -> Result<(), ApiError> {
        let used = held(live, except);
        let total = self.slots();
        let free = total.saturating_sub(u64::from(used.slots));
        if u64::from(demand.slots) > free {
            let next = if self.workers.is_some() { "start more workers" } else { "wait for a job to end" };
            return Err(ApiError::conflict(format!(
                "the job needs {} slot(s) and {free} of {total} are free: {next}, or lower its parallelism",
                demand.slots
            ))
            .at("parallelism"));
        }
        let free = self.memory_budget.saturating_sub(used.memory_bytes);
        if demand.memory_bytes > free {
            return Err(ApiError::conflict(format!(
                "the job may take {} bytes of memory (instances, heap state, RocksDB caches) and {free} of the \
                 server's {} are free: wait for a job to end, or lower its parallelism or state limits",
                demand.memory_bytes, self.memory_budget
            ))
            .at("server.memory_budget_bytes"));
        }
        Ok(())
    }

    /// Admits `record` (spec `text`) with `demand` against its tenant's quotas, the slots and
    /// the server's memory, stores it and starts it: one step under the admission lock.
    /// Blocking.
    pub fn admit(&self, state: &Arc<AppState>, record: JobRecord, text: &str, demand: Demand) -> Result<(), ApiError> {
        let _admission = self.admission();
        crate::quotas::admit(state, &record.tenant, demand, false)?;
        let mut live = lock(&self.live);
        self.check_room(&live, demand, None)?;
        let key = record.key();
        state.store.write(|txn| -> Result<(), ApiError> {
            txn.put(Table::Jobs, &key, &record)?;
            Ok(txn.put(Table::JobSpecs, &key, &text)?)
        })?;
        self.spawn(state, &mut live, record, demand);
        Ok(())
    }

    /// Reserves what a running job `before` takes at `demand` (a rescale), or refuses with
    /// the quota or the room it lacks. Blocking.
    pub fn reserve(&self, state: &AppState, before: &JobRecord, demand: Demand) -> Result<(), ApiError> {
        let _admission = self.admission();
        crate::quotas::admit(state, &before.tenant, crate::quotas::growth(before, demand), true)?;
        let key = before.key();
        let live = lock(&self.live);
        let Some(own) = live.get(&key) else {
            return Err(ApiError::conflict(format!("job {} is not running", before.id)));
        };
        self.check_room(&live, demand, Some(&key))?;
        *lock(&own.demand) = demand;
        Ok(())
    }

    /// Starts a held job again on its owner's word. Blocking.
    pub fn resume_held(&self, state: &Arc<AppState>, record: JobRecord) -> Result<(), ApiError> {
        let _admission = self.admission();
        let demand = Demand { slots: record.slots, state_bytes: record.state_bytes, memory_bytes: record.memory_bytes };
        crate::quotas::admit(state, &record.tenant, demand, true)?;
        let mut live = lock(&self.live);
        self.check_room(&live, demand, None)?;
        let key = record.key();
        update(state, &key, |r| {
            r.status = JobStatus::Created;
            r.crash_resumes = 0;
        });
        self.spawn(state, &mut live, record, demand);
        Ok(())
    }

    /// Starts every job the store records as active (after a start of the server). After a
    /// crash (`crashed`: the previous run did not stop cleanly) each counts one more crash
    /// resume, and one at [`MAX_CRASH_RESUMES`] is held instead. Returns (resumed, held).
    pub fn resume_all(&self, state: &Arc<AppState>, crashed: bool) -> Result<(usize, usize), ApiError> {
        let jobs: Vec<JobRecord> = state.store.list(Table::Jobs, "")?;
        let mut live = lock(&self.live);
        let (mut resumed, mut held_back) = (0, 0);
        for mut record in jobs.into_iter().filter(|j| j.status.is_active()) {
            let key = record.key();
            if crashed {
                record.crash_resumes += 1;
                if record.crash_resumes >= MAX_CRASH_RESUMES {
                    tracing::warn!(tenant = %record.tenant, job = %record.id, "the server died twice in a row while this job ran: held for its owner");
                    update(state, &key, |r| {
                        r.crash_resumes = record.crash_resumes;
                        r.status = JobStatus::Held;
                        let message = format!(
                            "held: the server stopped without shutting down {MAX_CRASH_RESUMES} times in a row while \
                             this job ran; check its state and memory, then resume it (POST /v1/jobs/{}/resume) or \
                             cancel it",
                            r.id
                        );
                        r.push_failure(message, FailureDetail::default());
                    });
                    held_back += 1;
                    continue;
                }
                update(state, &key, |r| r.crash_resumes = record.crash_resumes);
            }
            tracing::info!(tenant = %record.tenant, job = %record.id, "resuming job after a server start");
            let demand =
                Demand { slots: record.slots, state_bytes: record.state_bytes, memory_bytes: record.memory_bytes };
            self.spawn(state, &mut live, record, demand);
            resumed += 1;
        }
        Ok((resumed, held_back))
    }

    fn spawn(&self, state: &Arc<AppState>, live: &mut HashMap<String, Arc<Live>>, record: JobRecord, demand: Demand) {
        let handle = Arc::new(Live {
            demand: Mutex::new(demand),
            cancel: AtomicBool::new(false),
            refused: Mutex::new(None),
            view: Mutex::new(None),
            timeline: Mutex::default(),
            requests: Mutex::default(),
            swaps: Mutex::default(),
        });
        let key = record.key();
        live.insert(key.clone(), handle.clone());
        let state = state.clone();
        let name = format!("job-{}", record.id);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            supervise(&state, &key, &handle);
            lock(&state.supervisor.live).remove(&key);
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
            Ok(t) => {
                let mut threads = lock(&self.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(t);
            }
            Err(e) => tracing::error!(error = %e, "cannot start a job thread"),
        }
    }

    /// Asks a running job to cancel; false if it does not run.
    pub fn cancel(&self, key: &str) -> bool {
        match self.live(key) {
            Some(l) => {
                l.cancel.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Stops every job without changing its recorded status, so the next start resumes it; a
    /// clean stop, so no job counts it as a crash.
    pub fn shutdown(&self, state: &AppState) {
        self.stopping.store(true, Ordering::SeqCst);
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        let jobs: Vec<JobRecord> = state.store.list(Table::Jobs, "").unwrap_or_default();
        for job in jobs.into_iter().filter(|j| j.status.is_active() && j.crash_resumes > 0) {
            update(state, &job.key(), |r| r.crash_resumes = 0);
        }
    }
}

/// Writes a change to the record of job `key`.
fn update(state: &AppState, key: &str, change: impl FnOnce(&mut JobRecord)) {
    let result = state.store.write(|txn| -> Result<(), crate::store::StoreError> {
        let Some(mut record) = txn.get::<JobRecord>(Table::Jobs, key)? else { return Ok(()) };
        change(&mut record);
        record.updated_ms = now_ms();
        txn.put(Table::Jobs, key, &record)
    });
    if let Err(e) = result {
        tracing::error!(job = %key, error = %e, "cannot record the job's status");
    }
}

/// Records that job `key` ended with `status`.
pub fn end(state: &AppState, key: &str, status: JobStatus) {
    update(state, key, |r| {
        r.status = status;
        r.ended_ms = Some(now_ms());
    });
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
    /// It failed; whether it completed a checkpoint first.
    Failed {
        message: String,
        /// The engine's failure taken apart (default when the failure is not the engine's).
        detail: FailureDetail,
        cause: Cause,
        checkpointed: bool,
    },
    /// The service ended it (a quota it passed while running): no restart.
    Refused(String),
    /// Stopped with a savepoint, to stay stopped (`None`, or `Stop`) or restart with a change;
    /// the client's answer waits until the record says so.
    Savepointed(Option<(Control, Reply, Savepoint)>),
}

impl Outcome {
    /// A failure of the job's own (its operators, spec or data).
    pub(crate) fn job_failed(message: String, checkpointed: bool) -> Self {
        Outcome::Failed { message, detail: FailureDetail::default(), cause: Cause::Job, checkpointed }
    }

    /// The engine failed the job (its operators, spec or data): the message and its causes.
    pub(crate) fn run_failed(e: &eddy_engine::RunError, checkpointed: bool) -> Self {
        Outcome::Failed { message: e.to_string(), detail: FailureDetail::of(e), cause: Cause::Job, checkpointed }
    }

    /// The cluster failed the attempt, not the job, before it checkpointed.
    pub(crate) fn infrastructure(message: String) -> Self {
        Outcome::Failed { message, detail: FailureDetail::default(), cause: Cause::Infrastructure, checkpointed: false }
    }

    /// How a start that failed ends the attempt: a job that had already finished (killed
    /// after its final checkpoint, before its status was written) is finished, not failed.
    pub(crate) fn of_start(e: &eddy_engine::RunError) -> Self {
        match e {
            eddy_engine::RunError::AlreadyFinished { .. } => Outcome::Finished,
            e => Outcome::run_failed(e, false),
        }
    }
}

/// Why an attempt is lost: the message, whose doing it was, and the failure taken apart.
pub(crate) type Loss = (String, Cause, FailureDetail);

/// Where a control request's answer goes.
type Reply = tokio::sync::oneshot::Sender<Result<Savepoint, ApiError>>;

/// How long a savepoint may take before the request fails.
const SAVEPOINT_TIMEOUT: Duration = Duration::from_secs(300);

/// Takes a savepoint of `job` into a new directory of the job's and records it.
fn take_savepoint(state: &AppState, record: &JobRecord, job: &Job, reason: &str) -> Result<Savepoint, ApiError> {
    let at_ms = now_ms();
    let path = format!("savepoints/{at_ms}-{reason}");
    let to = job_store(state, &record.tenant, &record.id).join(&path);
    let id = job
        .savepoint(&to, SAVEPOINT_TIMEOUT)
        .map_err(|e| ApiError::conflict(format!("no savepoint: {}", redact(state, &record.tenant, &e.to_string()))))?;
    let savepoint = Savepoint { id, path, at_ms, reason: reason.to_string() };
    update(state, &record.key(), |r| r.savepoints.push(savepoint.clone()));
    tracing::info!(savepoint = id, reason, "savepoint taken");
    Ok(savepoint)
}

/// Swaps `step` of the running `job` to artifact `digest` at its next checkpoint (first
/// made ready in its other `parts`, if it is spread over workers) and, once that completed,
/// records the new artifact as the step's (a restart runs it from then on).
fn swap_live(
    state: &AppState,
    record: &JobRecord,
    job: &Job,
    (step, digest): (&str, &str),
    parts: &mut dyn OtherParts,
) -> Result<LiveSwap, ApiError> {
    let component = state
        .runtime
        .load_file(step, &crate::artifacts::wasm_path(state, digest))
        .map_err(|e| ApiError::unprocessable(format!("artifact {digest}: {e}")).at("wasm"))?;
    let key = record.key();
    update(state, &key, |r| r.live_upgrade = Some((step.to_owned(), digest.to_owned())));
    let done = if parts.spread() {
        job.swap_live_spread(step, component, SAVEPOINT_TIMEOUT, &mut |step, _| parts.prepare_swap(step, digest))
    } else {
        job.swap_live(step, component, SAVEPOINT_TIMEOUT)
    };
    let done = done.map_err(|e| {
        let detail = redact(state, &record.tenant, &e.to_string());
        match e {
            SwapError::Refused(_) | SwapError::Open(_) => {
                update(state, &key, |r| r.live_upgrade = None);
                ApiError::unprocessable(detail).at("wasm")
            }
            // Still asked for: the next attempt swaps at its first checkpoint.
            SwapError::NotCompleted(_) => ApiError::conflict(detail),
        }
    })?;
    apply(state, &key, &Control::Upgrade { step: step.to_owned(), digest: digest.to_owned() });
    update(state, &key, |r| r.live_upgrade = None);
    tracing::info!(step, artifact = digest, checkpoint = done.checkpoint, "live upgrade completed");
    Ok(LiveSwap {
        mode: "live".into(),
        step: step.to_owned(),
        artifact: digest.to_owned(),
        checkpoint: done.checkpoint,
        subtasks: done.subtasks,
        longest_swap_ms: done.longest_swap_ms,
        total_ms: done.total_ms,
    })
}

/// A live upgrade whose checkpoint completed, but whose new artifact the record does not
/// name yet (the server died in between): the generation's newest checkpoint names the code
/// its state goes on with, so the next attempt must run that code, not the record's. Only the
/// upgrade the record asked for is adopted: workers write parts of the metadata, and none may
/// choose a step's code.
fn adopt_swapped_code(state: &AppState, record: &JobRecord, spec: &PipelineSpec, digests: &[String]) -> bool {
    let Some((asked_step, asked_digest)) = &record.live_upgrade else { return false };
    let Some(store) = spec.checkpoints.as_ref().and_then(|c| eddy_checkpoint::CheckpointStore::open(c).ok()) else {
        return false;
    };
    let Some(newest) = eddy_checkpoint::metadata::completed_ids(&store).ok().and_then(|ids| ids.first().copied())
    else {
        return false;
    };
    let Ok(meta) = eddy_checkpoint::metadata::CheckpointMetadata::read(&store, newest) else { return false };
    let mut adopted = false;
    for (step, digest) in spec.steps.iter().zip(digests) {
        let recorded = meta
            .subtasks
            .iter()
            .flat_map(|s| &s.operators)
            .find(|o| o.step == step.name)
            .and_then(|o| o.artifact.as_ref())
            .map(|hex| format!("sha256:{hex}"));
        if let Some(recorded) = recorded.filter(|r| r != digest && r == asked_digest && step.name == *asked_step)
            && crate::artifacts::resolve(state, &record.tenant, &recorded).ok().flatten().is_some()
        {
            tracing::warn!(step = %step.name, artifact = %recorded, checkpoint = newest, "adopting the code of a completed live upgrade");
            apply(state, &record.key(), &Control::Upgrade { step: step.name.clone(), digest: recorded });
            adopted = true;
        }
    }
    adopted
}

/// Ends `job` after a savepoint; the savepoint becomes where the next generation starts.
fn stop_with_savepoint(state: &AppState, record: &JobRecord, job: Job, reason: &str) -> Result<Savepoint, ApiError> {
    let taken = take_savepoint(state, record, &job, reason);
    job.cancel();
    let _ = job.wait();
    let savepoint = taken?;
    update(state, &record.key(), |r| {
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
        Err(e) => return Outcome::job_failed(format!("cannot read the tenant's quotas: {}", e.detail), false),
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
        Err(e) => return Outcome::of_start(&e),
    };
    watch(state, record, live, job, &mut NoParts)
}

/// An attempt's parts in other processes, as [`watch`] serves them.
pub(crate) trait OtherParts {
    /// Whether there are any (the job is spread over workers).
    fn spread(&self) -> bool;
    /// The worker that runs each subtask, by task.
    fn assignment(&self) -> &[Vec<String>];
    /// Each part's metrics now.
    fn metrics(&self) -> Vec<MetricsSnapshot>;
    /// Why the attempt is lost, and whose doing that was, if it is.
    fn lost(&mut self) -> Option<Loss>;
    /// Gets artifact `digest` ready to take over `step` in every part (a live swap), or says
    /// why it is not.
    fn prepare_swap(&mut self, step: &str, digest: &str) -> Result<(), String>;
}

/// A job that runs in this process alone.
struct NoParts;

impl OtherParts for NoParts {
    fn spread(&self) -> bool {
        false
    }
    fn assignment(&self) -> &[Vec<String>] {
        &[]
    }
    fn metrics(&self) -> Vec<MetricsSnapshot> {
        Vec::new()
    }
    fn lost(&mut self) -> Option<Loss> {
        None
    }
    fn prepare_swap(&mut self, _: &str, _: &str) -> Result<(), String> {
        Ok(())
    }
}

/// Watches a started attempt until it ends: serves control requests, publishes the live view
/// (naming each subtask's worker, and adding the metrics of its `parts` in other processes to
/// the job's own), and fails it when `parts` says it is lost.
pub(crate) fn watch(
    state: &AppState,
    record: &JobRecord,
    live: &Live,
    job: Job,
    parts: &mut dyn OtherParts,
) -> Outcome {
    let metrics = |parts: &dyn OtherParts| {
        let mut all = job.metrics();
        for part in parts.metrics() {
            all.absorb(&part);
        }
        all
    };
    if let Some((step, digest)) = record.live_upgrade.clone() {
        tracing::info!(step, artifact = digest, "a live upgrade the last attempt did not complete is asked again");
        drop(live.swap(step, digest));
    }
    let started = Instant::now();
    let mut before = metrics(parts);
    let mut last = Instant::now();
    let (mut timeline_before, mut timeline_last) = (before.clone(), Instant::now());
    let (mut checkpointed, mut stable) = (false, record.crash_resumes == 0);
    let key = record.key();
    while !job.is_done() {
        std::thread::sleep(Duration::from_millis(20));
        if live.cancel.load(Ordering::SeqCst) {
            job.cancel();
            let _ = job.wait();
            return Outcome::Canceled;
        }
        if let Some(reason) = live.refusal() {
            job.cancel();
            let _ = job.wait();
            return Outcome::Refused(reason);
        }
        if state.supervisor.stopping.load(Ordering::SeqCst) {
            // Resumed from this savepoint at the next start; from the newest checkpoint if it fails.
            if let Err(e) = stop_with_savepoint(state, record, job, "shutdown") {
                tracing::warn!(error = %e.detail, "no savepoint at shutdown; the job resumes from its newest checkpoint");
            }
            return Outcome::Savepointed(None);
        }
        let swap = lock(&live.swaps).pop_front();
        if let Some((step, digest, reply)) = swap {
            let _ = reply.send(swap_live(state, record, &job, (&step, &digest), parts));
            continue;
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
                    Outcome::job_failed(message, checkpointed)
                }
            };
        }
        if let Some((reason, cause, detail)) = parts.lost() {
            job.cancel();
            let _ = job.wait();
            return Outcome::Failed { message: reason, detail, cause, checkpointed };
        }
        if last.elapsed() >= REFRESH {
            last = Instant::now();
            let now = metrics(parts);
            let view = LiveView::of(&job, &now, &before, parts.assignment());
            if !checkpointed && !view.checkpoints.is_empty() {
                checkpointed = true;
                progressed(state, record);
            }
            *lock(&live.view) = Some(view);
            if timeline_last.elapsed() >= TIMELINE_STEP {
                timeline_last = Instant::now();
                let point = TimelinePoint::between(now_ms(), &now, &timeline_before, &job.parallelisms());
                lock(&live.timeline).push(point);
                timeline_before = now.clone();
            }
            before = now;
        }
        if !stable && started.elapsed() >= STABLE_RUN {
            stable = true;
            update(state, &key, |r| r.crash_resumes = 0);
        }
    }
    match job.wait() {
        Ok(summary) if summary.finished => Outcome::Finished,
        Ok(_) => Outcome::Canceled,
        Err(e) => Outcome::run_failed(&e, checkpointed),
    }
}

/// The attempt completed its first checkpoint: a run of fast failures before it is over (in
/// the record, so a server restart keeps that), and the generations before the current one,
/// superseded now, are collected.
fn progressed(state: &AppState, record: &JobRecord) {
    update(state, &record.key(), |r| r.fast_failures = 0);
    if record.generation > 0 {
        crate::janitor::collect_old_generations(state, record);
    }
}

/// The savepoint to start from: the generation's own newest checkpoint wins once it has one.
fn restore_point(state: &AppState, record: &JobRecord, spec: &PipelineSpec) -> Option<StoreLocation> {
    let savepoint = record.restore_from.as_ref()?;
    let has_checkpoint = spec
        .checkpoints
        .as_ref()
        .and_then(|c| eddy_checkpoint::CheckpointStore::open(c).ok())
        .and_then(|store| eddy_checkpoint::metadata::completed_ids(&store).ok())
        .is_some_and(|ids| !ids.is_empty());
    (!has_checkpoint).then(|| job_store(state, &record.tenant, &record.id).join(savepoint))
}

/// Applies a change that restarts the job, to its record.
fn apply(state: &AppState, key: &str, control: &Control) {
    update(state, key, |r| match control {
        Control::Rescale(p) => r.overrides.parallelism = Some(*p),
        Control::Upgrade { step, digest } => {
            r.overrides.artifacts.insert(step.clone(), digest.clone());
        }
        Control::Savepoint | Control::Stop => {}
    });
    let Ok(Some(mut record)) = state.store.get::<JobRecord>(Table::Jobs, key) else { return };
    let described =
        crate::jobs::spec_of(state, &record).and_then(|text| crate::jobs::describe(state, &mut record, &text));
    match described {
        Ok(_) => update(state, key, |r| *r = record),
        Err(e) => tracing::warn!(error = %e.detail, "the changed spec does not place"),
    }
}

/// The job's life on this server: attempts and restarts until it ends or the server stops.
fn supervise(state: &AppState, key: &str, live: &Live) {
    let mut counters: Option<Counters> = None;
    loop {
        let record = match state.store.get::<JobRecord>(Table::Jobs, key) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => return tracing::error!(job = %key, error = %e, "cannot read the job"),
        };
        let counters = counters.get_or_insert(Counters {
            restarts: record.restarts,
            fast_failures: record.fast_failures,
            infrastructure_failures: 0,
        });
        let span = tracing::info_span!("job", tenant = %record.tenant, job = %record.id, name = %record.name);
        let _entered = span.enter();
        let placed = crate::jobs::spec_of(state, &record).and_then(|text| place(state, &record, &text));
        let (spec, digests) = match placed {
            Ok(placed) => placed,
            Err(e) => {
                tracing::warn!(error = %e.detail, "the job's spec no longer places");
                update(state, key, |r| r.push_failure(e.detail.clone(), FailureDetail::default()));
                return end(state, key, JobStatus::Failed);
            }
        };
        if adopt_swapped_code(state, &record, &spec, &digests) {
            continue;
        }
        let policy = RestartPolicy::new(spec.restart);
        update(state, key, |r| {
            r.status = JobStatus::Running;
            r.attempts = r.attempts.saturating_add(1);
        });
        tracing::info!(generation = record.generation, "job running");
        let started = Instant::now();
        let outcome = attempt(state, &record, &spec, &digests, live);
        *lock(&live.view) = None;
        match outcome {
            Outcome::Finished => {
                tracing::info!("job finished");
                return end(state, key, JobStatus::Finished);
            }
            Outcome::Canceled => {
                tracing::info!("job canceled");
                return end(state, key, JobStatus::Canceled);
            }
            Outcome::Refused(reason) => {
                tracing::warn!(reason, "the service ended the job");
                update(state, key, |r| r.push_failure(reason.clone(), FailureDetail::default()));
                return end(state, key, JobStatus::Failed);
            }
            Outcome::Savepointed(None) => return,
            Outcome::Savepointed(Some((Control::Stop, reply, savepoint))) => {
                tracing::info!("job stopped with a savepoint");
                end(state, key, JobStatus::Stopped);
                let _ = reply.send(Ok(savepoint));
                return;
            }
            Outcome::Savepointed(Some((change, reply, savepoint))) => {
                tracing::info!(change = ?change, "job restarts from its savepoint with a change");
                apply(state, key, &change);
                let _ = reply.send(Ok(savepoint));
            }
            Outcome::Failed { message, detail, cause, checkpointed } => {
                let message = redact(state, &record.tenant, &message);
                let detail = FailureDetail {
                    causes: detail.causes.iter().map(|c| redact(state, &record.tenant, c)).collect(),
                    guest_message: detail.guest_message.map(|m| redact(state, &record.tenant, &m)),
                };
                tracing::warn!(error = %message, ?cause, "job failed");
                if checkpointed {
                    policy.on_progress(counters);
                }
                let ran_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                let verdict = policy.on_failure(counters, Failed { cause, ran_ms, checkpointed });
                let c = *counters;
                // One change, so nobody sees the failure without the status it led to.
                update(state, key, |r| {
                    r.push_failure(message.clone(), detail.clone());
                    r.restarts = c.restarts;
                    r.fast_failures = c.fast_failures;
                    match &verdict {
                        Verdict::Restart { .. } => r.status = JobStatus::Restarting,
                        Verdict::Exhausted => {}
                        Verdict::Stop { reason } => r.push_failure(reason.clone(), FailureDetail::default()),
                    }
                    if !matches!(verdict, Verdict::Restart { .. }) {
                        r.status = JobStatus::Failed;
                        r.ended_ms = Some(now_ms());
                    }
                });
                let Verdict::Restart { after } = verdict else {
                    tracing::warn!("the job failed for good");
                    return;
                };
                // A spinning operator's CPU is charged to its tenant's share: its restart
                // waits until the share has paid it off.
                let debt = crate::quotas::of(state, &record.tenant)
                    .map(|q| state.supervisor.cpu_share(&record.tenant, q.cpu_millicores).debt())
                    .unwrap_or_default();
                if !wait_or_stop(state, key, live, after.max(debt)) {
                    return;
                }
            }
        }
    }
}

/// Waits out a restart delay; false if the job was cancelled or the server stops meanwhile.
fn wait_or_stop(state: &AppState, key: &str, live: &Live, delay: Duration) -> bool {
    let until = Instant::now() + delay;
    while Instant::now() < until {
        if live.cancel.load(Ordering::SeqCst) {
            end(state, key, JobStatus::Canceled);
            return false;
        }
        if state.supervisor.stopping.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
