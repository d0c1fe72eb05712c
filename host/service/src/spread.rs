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
use std::time::{Duration, Instant};

use eddy_cluster::protocol::{CoordinatorMessage, Deployment, PartState};
use eddy_cluster::{ControlPlane, QuicPlacement, SlotHolder};
use eddy_engine::{CheckpointRole, FailureDetail, Job, JobOptions};
use eddy_plan::{PhysicalPlan, PipelineSpec};

use crate::AppState;
use crate::model::{JobRecord, now_ms};
use crate::problem::{ApiError, ApiResult};
use crate::quotas::Quotas;
use crate::restarts::Cause;
use crate::supervisor::{Live, Loss, OtherParts, Outcome, watch};

/// How long an attempt waits for enough free slots (workers registering after a restart of
/// the coordinator, or replacing a dead one) before it fails.
const SCHEDULE_WAIT: Duration = Duration::from_secs(60);

/// A number no earlier attempt of any job on this coordinator used, before a restart of it
/// too: links and checkpoint streams are named after it, so a stale part can never feed a new
/// attempt. A counter in the store (not the wall clock, which steps back); a store that has
/// none yet starts past the wall-clock numbers older versions used.
fn next_attempt(state: &AppState) -> Result<u64, String> {
    let first = u64::try_from(now_ms()).unwrap_or(0);
    state.store.write(|txn| txn.next("attempt", first)).map_err(|e| e.to_string())
}

/// The largest worker name (a DNS label) and data address a deployment can name.
const WORST_NAME: &str = "a-worker-name-as-long-as-a-dns-label-may-be-sixty-three-bytes-x";
const WORST_ADDR: &str = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535";

/// Refuses a job whose deployment could exceed the control protocol's message limit (a huge
/// `config`, many steps at a high parallelism): sent, it would cost each worker its session,
/// and every other tenant's job there an attempt. Counted as the deployment is encoded, with
/// every worker name and address as long as they may be.
pub(crate) fn check_deployment_size(
    state: &AppState,
    record: &JobRecord,
    spec: &PipelineSpec,
    digests: &[String],
) -> ApiResult<()> {
    if state.supervisor_runs_on_workers() {
        let plan = PhysicalPlan::new(spec);
        let slots = crate::supervisor::slots_of(spec);
        let deployment = Deployment {
            job: record.id.clone(),
            tenant: record.tenant.clone(),
            attempt: u64::MAX,
            spec: spec.clone(),
            artifacts: digests.to_vec(),
            assignment: plan.tasks.iter().map(|t| vec![WORST_NAME.to_owned(); t.parallelism as usize]).collect(),
            addrs: (0..slots).map(|i| (format!("{WORST_NAME}{i}"), WORST_ADDR.to_owned())).collect(),
            master: WORST_NAME.to_owned(),
            restore_from: Some(crate::placement::job_store(state, &record.tenant, &record.id).join("savepoints/x")),
            cpu_millicores: Some(u32::MAX),
            instance_memory_bytes: Some(u64::MAX),
        };
        let mut wire = Vec::new();
        eddy_cluster::protocol::encode(&CoordinatorMessage::Deploy(Box::new(deployment)), &mut wire).map_err(|e| {
            ApiError::unprocessable(format!(
                "the job's deployment to its workers would be too large ({e}): make steps' `config` smaller or \
                     use fewer steps or a lower parallelism"
            ))
            .at("steps")
        })?;
    }
    Ok(())
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
        return Outcome::job_failed("this server coordinates no cluster".into(), false);
    };
    let slots = crate::supervisor::slots_of(spec);
    let holders = match schedule(control, &record.id, slots, live, || state.supervisor.is_stopping()) {
        Ok(holders) => holders,
        Err(outcome) => return outcome,
    };
    let attempt = match next_attempt(state) {
        Ok(attempt) => attempt,
        Err(e) => {
            control.release(&record.id);
            return Outcome::job_failed(format!("cannot number the attempt: {e}"), false);
        }
    };
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
    // Each worker may report on its part, and fetch its artifacts, from now on, and only that.
    for w in &workers {
        control.deployed(&record.id, attempt, w, a.digests);
    }
    let layout = Layout { attempt, assignment, addrs, workers };
    let outcome = run(state, control, &node, a, &layout, live);
    // Whatever ended the attempt, no part of it may run on.
    for w in &layout.workers {
        let _ = control.send(w, &CoordinatorMessage::Cancel { job: record.id.clone(), attempt });
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
            // The cluster had no room: not the tenant's doing.
            Err(e) if since.elapsed() >= SCHEDULE_WAIT => {
                return Err(Outcome::infrastructure(e.to_string()));
            }
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
            Err(e) => {
                let message = format!("worker `{name}` advertises `{addr}`, no address: {e}");
                return Outcome::infrastructure(message);
            }
        };
    }
    let parts: Vec<(String, std::net::SocketAddr)> = parsed.iter().map(|(n, a)| (n.clone(), *a)).collect();
    let master = match eddy_cluster::checkpoint_link::master_link(node, &record.id, attempt, &parts) {
        Ok(link) => link,
        Err(e) => {
            let message = format!("cannot reach a worker's checkpoint stream: {e}");
            return Outcome::infrastructure(message);
        }
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
        Err(e) => return Outcome::of_start(&e),
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
    let message = CoordinatorMessage::Deploy(Box::new(deployment));
    for w in &layout.workers {
        if let Err(e) = control.send(w, &message) {
            job.cancel();
            let _ = job.wait();
            return Outcome::infrastructure(format!("cannot deploy: {e}"));
        }
    }
    let mut parts = Parts {
        control,
        job: &record.id,
        attempt,
        assignment,
        workers: &layout.workers,
        judge: Judge::new(control.heartbeat_timeout()),
    };
    let outcome = watch(state, record, live, job, &mut parts);
    parts.judge.settle(outcome, control, (&record.id, attempt), &layout.workers)
}

/// How long the workers may take to fetch, compile and open a live swap's new code.
const PREPARE_WAIT: Duration = Duration::from_secs(120);

/// The parts of an attempt on the workers, as the supervisor watches them.
struct Parts<'a> {
    control: &'a ControlPlane,
    job: &'a str,
    attempt: u64,
    assignment: &'a [Vec<String>],
    workers: &'a [SlotHolder],
    judge: Judge,
}

impl OtherParts for Parts<'_> {
    fn spread(&self) -> bool {
        true
    }

    fn assignment(&self) -> &[Vec<String>] {
        self.assignment
    }

    /// A worker's per-subtask rows count only for the subtasks it was given.
    fn metrics(&self) -> Vec<eddy_engine::MetricsSnapshot> {
        let mut parts = self.control.part_metrics(self.job, self.attempt);
        for (worker, metrics) in &mut parts {
            for (task, t) in metrics.tasks.iter_mut().enumerate() {
                let given =
                    |index: u32| self.assignment.get(task).and_then(|a| a.get(index as usize)) == Some(&*worker);
                t.subtasks.retain(|s| given(s.index));
            }
        }
        parts.into_iter().map(|(_, metrics)| metrics).collect()
    }

    fn lost(&mut self) -> Option<Loss> {
        self.judge.lost(self.control, self.job, self.attempt, self.workers)
    }

    /// Asks every worker of the attempt, and waits until each said its part has the code
    /// ready, one said why not, or one went away or failed.
    fn prepare_swap(&mut self, step: &str, digest: &str) -> Result<(), String> {
        for w in self.workers {
            self.control.ask_swap(w, self.job, self.attempt, step, digest)?;
        }
        let since = Instant::now();
        loop {
            if let Some(gone) = self.control.first_gone(self.workers) {
                return Err(format!("worker `{}` was lost", gone.name));
            }
            // A part that ended will not answer: its failure is the answer.
            if let Some((reason, _, _)) = part_failure(self.control, self.job, self.attempt) {
                return Err(reason);
            }
            let answers = self.control.swap_answers(self.job, self.attempt);
            let mut ready = 0;
            for w in self.workers {
                match answers.get(&w.name).filter(|a| a.step == step && a.digest == digest) {
                    Some(a) if a.problem.is_none() => ready += 1,
                    Some(a) => {
                        let problem = a.problem.as_deref().unwrap_or_default();
                        return Err(format!("worker `{}`: {problem}", w.name));
                    }
                    None => {}
                }
            }
            if ready == self.workers.len() {
                tracing::info!(step, digest, workers = ready, "live swap prepared on every worker");
                return Ok(());
            }
            if since.elapsed() >= PREPARE_WAIT {
                return Err(format!("{ready} of {} workers had it ready within {PREPARE_WAIT:?}", self.workers.len()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whose doing the end of an attempt was. A dead worker takes its parts' inputs and outputs,
/// and the master's link to it, down with it, and those failures may be seen before the
/// membership declares the worker dead (a heartbeat timeout later): a failure is the job's
/// only if no worker of the attempt goes away within that time.
struct Judge {
    grace: Duration,
    /// The first part failure seen, when, and its detail.
    failed: Option<(Instant, String, FailureDetail)>,
}

impl Judge {
    fn new(grace: Duration) -> Self {
        Self { grace, failed: None }
    }

    /// Why the attempt is lost, if it is, and whose doing that was.
    fn lost(&mut self, control: &ControlPlane, job: &str, attempt: u64, workers: &[SlotHolder]) -> Option<Loss> {
        if let Some(gone) = control.first_gone(workers) {
            let why = format!("worker `{}` was lost (declared dead, or restarted)", gone.name);
            return Some((why, Cause::Infrastructure, FailureDetail::default()));
        }
        if let Some((at, reason, detail)) = &self.failed {
            return (at.elapsed() >= self.grace).then(|| (reason.clone(), Cause::Job, detail.clone()));
        }
        let (reason, cause, detail) = part_failure(control, job, attempt)?;
        if cause == Cause::Infrastructure {
            return Some((reason, cause, detail));
        }
        tracing::info!(
            reason,
            grace_ms = self.grace.as_millis() as u64,
            "a part failed: waiting to see whether a worker was lost"
        );
        self.failed = Some((Instant::now(), reason, detail));
        None
    }

    /// The master itself failed (`outcome`). Within the grace, a worker of the attempt that
    /// goes away makes it the cluster's doing. Otherwise a part that reported a failure of its
    /// own names the cause (the master's failure is its echo: a failed part closes its
    /// checkpoint link); a part's link that closed while no part said why within
    /// [`PART_REPORT_WAIT`] means its process went away.
    fn settle(
        &self,
        outcome: Outcome,
        control: &ControlPlane,
        attempt: (&str, u64),
        workers: &[SlotHolder],
    ) -> Outcome {
        let Outcome::Failed { message, detail, cause: Cause::Job, checkpointed } = outcome else { return outcome };
        let link_closed = message.contains(eddy_engine::PARTS_LINK_CLOSED);
        let since = Instant::now();
        let mut reported = None;
        while since.elapsed() < self.grace {
            if let Some(gone) = control.first_gone(workers) {
                let message = format!("{message} (worker `{}` was lost)", gone.name);
                return Outcome::Failed { message, detail, cause: Cause::Infrastructure, checkpointed };
            }
            match part_failure(control, attempt.0, attempt.1) {
                Some((reason, Cause::Infrastructure, detail)) => {
                    return Outcome::Failed { message: reason, detail, cause: Cause::Infrastructure, checkpointed };
                }
                Some(job_failure) => reported = Some(job_failure),
                None if link_closed && since.elapsed() >= PART_REPORT_WAIT => {
                    return Outcome::Failed { message, detail, cause: Cause::Infrastructure, checkpointed };
                }
                None => {}
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        match reported {
            Some((reason, cause, detail)) => Outcome::Failed { message: reason, detail, cause, checkpointed },
            None if link_closed => Outcome::Failed { message, detail, cause: Cause::Infrastructure, checkpointed },
            None => Outcome::Failed { message, detail, cause: Cause::Job, checkpointed },
        }
    }
}

/// How long a master whose part's checkpoint link closed waits for that part to say why: its
/// report travels the control connection, a moment behind the link's end. Silence means its
/// process went away.
const PART_REPORT_WAIT: Duration = Duration::from_millis(1_000);

/// A part's failure, if one reported one, and whose doing it was by its reason: an input from
/// another worker that broke, or a cancellation it did not ask for, is the cluster's.
///
/// The part's reason and detail come from another process: bounded here (the detail already
/// while it was decoded; again once led by which worker's part failed).
fn part_failure(control: &ControlPlane, job: &str, attempt: u64) -> Option<Loss> {
    control.part_states(job, attempt).into_iter().find_map(|(worker, state)| match state {
        PartState::Failed { reason, mut detail } => {
            let cause = if reason.starts_with(eddy_cluster::executor::INPUT_BROKE) {
                Cause::Infrastructure
            } else {
                Cause::Job
            };
            if !detail.causes.is_empty() {
                detail.causes.insert(0, format!("the part on worker `{worker}`"));
            }
            let reason = FailureDetail::bounded_message(reason);
            Some((format!("the part on worker `{worker}` failed: {reason}"), cause, detail.bounded()))
        }
        PartState::Canceled => Some((
            format!("the part on worker `{worker}` was cancelled"),
            Cause::Infrastructure,
            FailureDetail::default(),
        )),
        PartState::Running | PartState::Finished => None,
    })
}
