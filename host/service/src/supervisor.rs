//! Runs accepted jobs on the embedded worker: one supervising thread per job starts it with
//! the engine, publishes its live view, restarts it from its newest checkpoint after a failure
//! (as its `restart` strategy allows), and records each change of status in the store.
//!
//! The store is the truth about a job's status; the live view only carries what changes too
//! fast to store (metrics, checkpoints). A server that dies leaves running jobs recorded as
//! running, and [`Supervisor::resume_all`] starts them again at the next start: each resumes
//! from its newest checkpoint, because every service job checkpoints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eddy_core::WATERMARK_MIN;
use eddy_engine::{Job, JobOptions, MetricsSnapshot, PhysicalPlan, PipelineSpec};
use serde::Serialize;
use utoipa::ToSchema;

use crate::AppState;
use crate::model::{JobRecord, JobStatus, now_ms};
use crate::placement::place;
use crate::problem::ApiError;
use crate::store::Table;

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
    /// Completed checkpoints of this attempt, oldest first.
    pub checkpoints: Vec<CheckpointView>,
    /// The checkpoint this attempt resumed from.
    pub restored_from: Option<u64>,
}

impl LiveView {
    fn of(job: &Job, now: &MetricsSnapshot, before: &MetricsSnapshot) -> Self {
        let secs = now.elapsed.saturating_sub(before.elapsed).as_secs_f64().max(1e-3);
        let parallelisms = job.parallelisms();
        let tasks = now
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let prev = before.tasks.get(i).cloned().unwrap_or_default();
                let parallelism = parallelisms.get(i).copied().unwrap_or(1);
                let blocked = t.blocked_ns.saturating_sub(prev.blocked_ns) as f64 / 1e9;
                TaskView {
                    label: t.label.clone(),
                    parallelism,
                    records_in: t.records_in,
                    records_out: t.records_out,
                    records_in_per_sec: t.records_in.saturating_sub(prev.records_in) as f64 / secs,
                    records_out_per_sec: t.records_out.saturating_sub(prev.records_out) as f64 / secs,
                    watermark: (t.watermark > WATERMARK_MIN).then_some(t.watermark),
                    backpressure: (blocked / (secs * parallelism as f64)).clamp(0.0, 1.0),
                    late_records: t.late_records,
                }
            })
            .collect();
        let checkpoints = job
            .completed_checkpoints()
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
    slots: u32,
    cancel: AtomicBool,
    view: Mutex<Option<LiveView>>,
}

impl Live {
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
    live: Mutex<HashMap<String, Arc<Live>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
}

/// Slots a job holds: one subtask of every task shares a slot (as in Flink), so the widest task.
pub fn slots_of(spec: &PipelineSpec) -> u32 {
    PhysicalPlan::new(spec).tasks.iter().map(|t| t.parallelism).max().unwrap_or(1)
}

impl Supervisor {
    /// A supervisor with `slots` slots.
    pub fn new(slots: u32) -> Self {
        Self { slots, live: Mutex::default(), threads: Mutex::default(), stopping: AtomicBool::new(false) }
    }

    /// Total slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Slots held by running jobs.
    pub fn used_slots(&self) -> u32 {
        lock(&self.live).values().map(|l| l.slots).sum()
    }

    /// The live handle of a running job.
    pub fn live(&self, job: &str) -> Option<Arc<Live>> {
        lock(&self.live).get(job).cloned()
    }

    /// Stores `record` and starts it, if its slots are free; atomically, so two submissions
    /// cannot both take the last slot.
    pub fn admit(&self, state: &Arc<AppState>, record: JobRecord) -> Result<(), ApiError> {
        let mut live = lock(&self.live);
        let used: u32 = live.values().map(|l| l.slots).sum();
        let free = self.slots.saturating_sub(used);
        if record.slots > free {
            return Err(ApiError::conflict(format!(
                "the job needs {} slot(s) and {free} of {} are free: wait for a job to end, or lower its parallelism",
                record.slots, self.slots
            ))
            .at("parallelism"));
        }
        state.store.write(|txn| txn.put(Table::Jobs, &record.id, &record))?;
        self.spawn(state, &mut live, record);
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
        let handle = Arc::new(Live { slots: record.slots, cancel: AtomicBool::new(false), view: Mutex::new(None) });
        live.insert(record.id.clone(), handle.clone());
        let state = state.clone();
        let name = format!("job-{}", record.id);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let id = record.id.clone();
            supervise(&state, record, &handle);
            lock(&state.supervisor.live).remove(&id);
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

/// How one attempt ended.
enum Outcome {
    Finished,
    Canceled,
    ServerStopping,
    Failed(String),
}

/// Runs one attempt until it ends, publishing its live view.
fn attempt(state: &AppState, spec: &PipelineSpec, live: &Live) -> Outcome {
    let job = match Job::start(spec, &state.runtime, JobOptions::default()) {
        Ok(job) => job,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let mut before = job.metrics();
    let mut last = Instant::now();
    while !job.is_done() {
        std::thread::sleep(Duration::from_millis(20));
        if live.cancel.load(Ordering::SeqCst) || state.supervisor.stopping.load(Ordering::SeqCst) {
            job.cancel();
            let _ = job.wait();
            *lock(&live.view) = None;
            return if live.cancel.load(Ordering::SeqCst) { Outcome::Canceled } else { Outcome::ServerStopping };
        }
        if last.elapsed() >= REFRESH {
            last = Instant::now();
            let now = job.metrics();
            *lock(&live.view) = Some(LiveView::of(&job, &now, &before));
            before = now;
        }
    }
    match job.wait() {
        Ok(summary) if summary.finished => Outcome::Finished,
        Ok(_) => Outcome::Canceled,
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// The job's life on this server: attempts and restarts until it ends or the server stops.
fn supervise(state: &AppState, record: JobRecord, live: &Live) {
    let span = tracing::info_span!("job", tenant = %record.tenant, job = %record.id, name = %record.name);
    let _entered = span.enter();
    let spec = match place(state, &record.tenant, &record.id, &record.spec) {
        Ok((spec, _)) => spec,
        Err(e) => {
            tracing::warn!(error = %e.detail, "the job's spec no longer places");
            update(state, &record.id, |r| {
                r.push_failure(e.detail.clone());
                r.status = JobStatus::Failed;
            });
            return;
        }
    };
    let mut restarts = record.restarts;
    loop {
        update(state, &record.id, |r| r.status = JobStatus::Running);
        tracing::info!("job running");
        match attempt(state, &spec, live) {
            Outcome::Finished => {
                tracing::info!("job finished");
                return update(state, &record.id, |r| r.status = JobStatus::Finished);
            }
            Outcome::Canceled => {
                tracing::info!("job canceled");
                return update(state, &record.id, |r| r.status = JobStatus::Canceled);
            }
            Outcome::ServerStopping => return,
            Outcome::Failed(message) => {
                tracing::warn!(error = %message, "job failed");
                let delay = spec.restart.delay_before(restarts + 1);
                update(state, &record.id, |r| {
                    r.push_failure(message.clone());
                    r.status = if delay.is_some() { JobStatus::Restarting } else { JobStatus::Failed };
                    if delay.is_some() {
                        r.restarts += 1;
                    }
                });
                let Some(delay) = delay else { return };
                restarts += 1;
                let until = Instant::now() + delay;
                while Instant::now() < until {
                    if live.cancel.load(Ordering::SeqCst) {
                        return update(state, &record.id, |r| r.status = JobStatus::Canceled);
                    }
                    if state.supervisor.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}
