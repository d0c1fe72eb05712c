//! A job attempt on the cluster's workers. The coordinator schedules the job's slots over the
//! live workers (slot `i` runs subtask `i` of every task), runs the job master itself (a part
//! of the job with no subtasks: it coordinates the checkpoints of every part and writes their
//! metadata, which is the commit point), and deploys each worker's part over its control
//! stream. The attempt fails, and the supervisor restarts the job from its newest checkpoint,
//! when a worker it placed subtasks on dies or restarts, or a part fails.
//!
//! The order matters: the master's checkpoint streams are opened first (a worker holds an
//! early stream until its part registers it), then the master starts and recovers the store
//! and the sink's files, and only then do the workers start writing.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eddy_cluster::protocol::{CoordinatorMessage, Deployment, PartState};
use eddy_cluster::{ControlPlane, QuicPlacement, SlotHolder};
use eddy_engine::{CheckpointRole, Job, JobOptions};
use eddy_plan::{PhysicalPlan, PipelineSpec};

use crate::AppState;
use crate::model::JobRecord;
use crate::quotas::Quotas;
use crate::supervisor::{Live, Outcome, watch};

/// How long an attempt waits for enough free slots (workers registering after a restart of
/// the coordinator, or replacing a dead one) before it fails.
const SCHEDULE_WAIT: Duration = Duration::from_secs(60);

/// A number no earlier attempt of any job on this coordinator used, nor one before a restart
/// of it (it starts from the wall clock): links and checkpoint streams are named after it, so
/// a stale part can never feed a new attempt.
fn next_attempt() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::model::now_ms().max(0) as u64;
    let mut last = LAST.load(Ordering::SeqCst);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// What an attempt runs.
pub(crate) struct Attempt<'a> {
    /// The job.
    pub record: &'a JobRecord,
    /// Its placed spec.
    pub spec: &'a PipelineSpec,
    /// The digest of each step's artifact, in step order.
    pub digests: &'a [String],
    /// The tenant's quotas.
    pub quotas: &'a Quotas,
    /// The savepoint to start from.
    pub restore_from: Option<eddy_plan::StoreLocation>,
}

/// Where an attempt's parts run.
struct Layout {
    attempt: u64,
    assignment: Vec<Vec<String>>,
    addrs: BTreeMap<String, String>,
    /// Each worker of the attempt once.
    workers: Vec<SlotHolder>,
}

/// Runs one attempt on the workers.
pub(crate) fn attempt(state: &AppState, control: &ControlPlane, a: &Attempt<'_>, live: &Live) -> Outcome {
    let (record, spec) = (a.record, a.spec);
    let Some(node) = state.config.cluster.as_ref().map(|c| c.node.clone()) else {
        return Outcome::Failed("this server coordinates no cluster".into());
    };
    let slots = crate::supervisor::slots_of(spec);
    let holders = match schedule(control, &record.id, slots, live, || state.supervisor.is_stopping()) {
        Ok(holders) => holders,
        Err(outcome) => return outcome,
    };
    let attempt = next_attempt();
    let plan = PhysicalPlan::new(spec);
    // The job holds as many slots as its widest task: every subtask index has its slot.
    let slot_of = |i: u32| holders.get(i as usize).map(|h| h.name.clone()).unwrap_or_default();
    let assignment: Vec<Vec<String>> = plan.tasks.iter().map(|t| (0..t.parallelism).map(slot_of).collect()).collect();
    let members: HashMap<String, String> = control.workers().into_iter().map(|m| (m.name, m.data_addr)).collect();
    let mut workers: Vec<SlotHolder> = Vec::new();
    for h in &holders {
        if !workers.iter().any(|w| w.name == h.name) {
            workers.push(h.clone());
        }
    }
    let addrs: BTreeMap<String, String> =
        workers.iter().filter_map(|w| Some((w.name.clone(), members.get(&w.name)?.clone()))).collect();
    tracing::info!(attempt, slots, workers = ?addrs.keys().collect::<Vec<_>>(), "deploying the job on workers");
    control.expect_parts(&record.id, attempt);
    let layout = Layout { attempt, assignment, addrs, workers };
    let outcome = run(state, control, &node, a, &layout, live);
    // Whatever ended the attempt, no part of it may run on.
    for w in &layout.workers {
        let _ = control.send(w, CoordinatorMessage::Cancel { job: record.id.clone(), attempt });
    }
    control.forget_parts(&record.id, attempt);
    control.release(&record.id);
    outcome
}

/// Takes the job's slots, waiting for workers while none are free.
fn schedule(
    control: &ControlPlane,
    job: &str,
    slots: u32,
    live: &Live,
    stopping: impl Fn() -> bool,
) -> Result<Vec<SlotHolder>, Outcome> {
    let since = Instant::now();
    let mut logged = false;
    loop {
        match control.schedule(job, slots) {
            Ok(holders) => return Ok(holders),
            Err(e) if since.elapsed() >= SCHEDULE_WAIT => return Err(Outcome::Failed(e.to_string())),
            Err(e) => {
                if !logged {
                    tracing::warn!(reason = %e, "waiting for free slots");
                    logged = true;
                }
            }
        }
        if live.cancelled() {
            return Err(Outcome::Canceled);
        }
        if stopping() {
            // The server stops: the job stays recorded as running and resumes at the next start.
            return Err(Outcome::Savepointed(None));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts the master, deploys the parts and watches them.
fn run(
    state: &AppState,
    control: &ControlPlane,
    node: &eddy_transport::quic::QuicNode,
    a: &Attempt<'_>,
    layout: &Layout,
    live: &Live,
) -> Outcome {
    let (record, attempt, assignment) = (a.record, layout.attempt, &layout.assignment);
    let mut parsed = HashMap::new();
    for (name, addr) in &layout.addrs {
        match addr.parse() {
            Ok(a) => parsed.insert(name.clone(), a),
            Err(e) => return Outcome::Failed(format!("worker `{name}` advertises `{addr}`, no address: {e}")),
        };
    }
    let parts: Vec<(String, std::net::SocketAddr)> = parsed.iter().map(|(n, a)| (n.clone(), *a)).collect();
    let master = match eddy_cluster::checkpoint_link::master_link(node, &record.id, attempt, &parts) {
        Ok(link) => link,
        Err(e) => return Outcome::Failed(format!("cannot reach a worker's checkpoint stream: {e}")),
    };
    let placement = QuicPlacement::new(node.clone(), record.id.clone(), attempt, assignment.clone(), parsed);
    let options = JobOptions {
        placement: Some(std::sync::Arc::new(placement)),
        checkpoint_role: Some(CheckpointRole::Master(master)),
        restore_from: a.restore_from.clone(),
        ..JobOptions::default()
    };
    let job = match Job::start(a.spec, &state.runtime, options) {
        Ok(job) => job,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let deployment = Deployment {
        job: record.id.clone(),
        tenant: record.tenant.clone(),
        attempt,
        spec: a.spec.clone(),
        artifacts: a.digests.to_vec(),
        assignment: assignment.clone(),
        addrs: layout.addrs.clone(),
        master: node.name().to_owned(),
        restore_from: a.restore_from.clone(),
        cpu_millicores: Some(a.quotas.cpu_millicores),
        instance_memory_bytes: Some(a.quotas.instance_memory_bytes),
    };
    for w in &layout.workers {
        if let Err(e) = control.send(w, CoordinatorMessage::Deploy(Box::new(deployment.clone()))) {
            job.cancel();
            let _ = job.wait();
            return Outcome::Failed(format!("cannot deploy: {e}"));
        }
    }
    let parts = || control.part_metrics(&record.id, attempt);
    watch(state, record, live, job, assignment, parts, || lost(control, &record.id, attempt, &layout.workers))
}

/// Why the attempt is lost, if it is: a worker it runs on died or restarted, or a part failed.
fn lost(control: &ControlPlane, job: &str, attempt: u64, workers: &[SlotHolder]) -> Option<String> {
    if let Some(gone) = control.first_gone(workers) {
        return Some(format!("worker `{}` was lost (declared dead, or restarted)", gone.name));
    }
    control.part_states(job, attempt).into_iter().find_map(|(worker, state)| match state {
        PartState::Failed { reason } => Some(format!("the part on worker `{worker}` failed: {reason}")),
        PartState::Canceled => Some(format!("the part on worker `{worker}` was cancelled")),
        PartState::Running | PartState::Finished => None,
    })
}
