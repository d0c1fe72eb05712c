//! The job's checkpoint thread: the shell around [`CheckpointCoordinator`]. It triggers
//! checkpoints (the sources poll [`Signals::trigger`]), writes the snapshots the subtasks
//! report (the asynchronous phase, off the task threads), acknowledges them to the
//! coordinator, writes the metadata when a checkpoint is complete, publishes
//! [`Signals::completed`] (sinks commit on it), and collects garbage. When every subtask has
//! finished it writes a final checkpoint marked `finished` and commits the sink's last files.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eddy_checkpoint::metadata::{Sweep, collect_garbage};
use eddy_checkpoint::upload::{Uploader, upload_snapshot};
use eddy_checkpoint::{
    CheckpointError, CheckpointId, CheckpointMetadata, CheckpointStats, CheckpointStore, SubtaskState,
};
use eddy_plan::CheckpointSpec;

use crate::checkpoint::{CheckpointCoordinator, CoordinatorConfig, Decision, From, Participant, Speaker};
use crate::checkpoint_history::CheckpointHistory;
use crate::messages::{
    FaultHook, FaultPoint, MasterCommand, MasterLink, PartReport, Report, Signals, SinkCommitter, SwapOrder,
    SwapOutcome, now_ms,
};

/// How the master's failure reads when a part's checkpoint link closed before it finished (its
/// process went away): the cluster's doing, not the job's.
pub const PARTS_LINK_CLOSED: &str = "their checkpoint link closed before they finished";

/// Everything the thread needs.
pub(crate) struct CheckpointThread {
    pub job: String,
    pub max_parallelism: u32,
    pub spec: CheckpointSpec,
    pub store: CheckpointStore,
    /// Whether a step journals its input into the store (whose segments follow the retained
    /// checkpoints).
    pub journaled: bool,
    /// The spec's two-phase window steps: what an operator of another part read (partials or
    /// records) is set from these, not taken on the part's word.
    pub two_phase: Vec<String>,
    /// Every subtask of the plan, numbered as in every part, with the part that runs it.
    pub participants: Vec<Participant>,
    pub first_id: CheckpointId,
    /// Checkpoints kept from before this run, oldest first (the one restored from is last).
    pub retained: Vec<CheckpointMetadata>,
    pub signals: Arc<Signals>,
    pub reports: Receiver<Report>,
    pub cancel: Arc<AtomicBool>,
    pub history: Arc<Mutex<CheckpointHistory>>,
    /// Commits the sink's pre-committed files listed in a sink state (the final commit).
    pub commit_sink: SinkCommitter,
    pub faults: Option<FaultHook>,
    /// A job spread over several parts: the other parts' reports and the commands to them.
    pub remote: Option<MasterLink>,
}

/// This process's report about `participant`, whose uploaded snapshot is `state`.
fn local_speaker(participant: usize, state: &SubtaskState) -> Speaker<'static> {
    Speaker { participant, from: From::Local, claims: Some((state.task, state.subtask)) }
}

/// Part `part`'s report about `participant`, with the snapshot it sent, if any.
fn part_speaker<'a>(part: &'a str, participant: usize, state: Option<&SubtaskState>) -> Speaker<'a> {
    Speaker { participant, from: From::Part(part), claims: state.map(|s| (s.task, s.subtask)) }
}

/// Refused reports, logged at most once a second (a rogue part can send them as fast as it
/// likes) with how many were left out.
#[derive(Debug, Default)]
struct RefusalLog {
    last: Option<Instant>,
    left_out: u64,
}

impl RefusalLog {
    fn note(&mut self, job: &str, refused: &crate::checkpoint::Refused) {
        if self.last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            self.left_out += 1;
            return;
        }
        self.last = Some(Instant::now());
        let left_out = std::mem::take(&mut self.left_out);
        tracing::warn!(job, %refused, left_out, "a checkpoint report was refused");
    }
}

/// The checkpoint in flight: each participant's uploaded part and the phase durations.
struct InFlight {
    id: CheckpointId,
    triggered: Instant,
    parts: Vec<Option<SubtaskState>>,
    stats: CheckpointStats,
}

impl CheckpointThread {
    /// Runs until every subtask finished (then writes the final checkpoint) or the job is
    /// cancelled. Errors are storage failures of the final checkpoint; ordinary checkpoint
    /// failures are logged and the next checkpoint tries again.
    pub fn run(mut self) -> Result<(), CheckpointError> {
        let config = CoordinatorConfig {
            interval_ms: self.spec.interval_ms,
            timeout_ms: self.spec.timeout_ms,
            min_pause_ms: self.spec.min_pause_ms,
        };
        let mut coordinator = CheckpointCoordinator::new(config, self.participants.clone(), self.first_id, now_ms());
        let mut uploader = Uploader::knowing(self.retained.iter().flat_map(|m| m.files()), self.first_id);
        let count = self.participants.len();
        // The final snapshots of finished subtasks (which finished is the coordinator's truth).
        let mut finished: Vec<Option<SubtaskState>> = vec![None; count];
        let mut in_flight: Option<InFlight> = None;
        let mut last_id = self.first_id.saturating_sub(1);
        let mut refused = RefusalLog::default();
        let local_running = |finished: &[Option<SubtaskState>], p: &[Participant]| {
            finished.iter().zip(p).any(|(f, p)| p.part.is_none() && f.is_none())
        };
        let remote_running = |finished: &[Option<SubtaskState>], p: &[Participant]| {
            finished.iter().zip(p).any(|(f, p)| p.part.is_some() && f.is_none())
        };
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Ok(());
            }
            let mut decisions = Vec::new();
            match self.reports.recv_timeout(Duration::from_millis(5)) {
                Ok(Report::Taken { id, snapshot }) => {
                    let participant = snapshot.participant;
                    match in_flight.as_mut().filter(|f| f.id == id) {
                        Some(flight) => match upload_snapshot(&self.store, &mut uploader, Some(id), snapshot) {
                            Ok((state, stats)) => {
                                self.fault(FaultPoint::AfterUpload);
                                let speaker = local_speaker(participant, &state);
                                match coordinator.acknowledge(id, &speaker, now_ms()) {
                                    Ok(decision) => {
                                        flight.stats.merge(&stats);
                                        flight.parts[participant] = Some(state);
                                        decisions.extend(decision);
                                    }
                                    Err(e) => refused.note(&self.job, &e),
                                }
                            }
                            Err(e) => {
                                let speaker = Speaker { participant, from: From::Local, claims: None };
                                match coordinator.decline(id, &speaker, &e.to_string(), now_ms()) {
                                    Ok(decision) => decisions.extend(decision),
                                    Err(e) => refused.note(&self.job, &e),
                                }
                            }
                        },
                        None => {
                            tracing::debug!(job = %self.job, checkpoint = id, "snapshot of an aborted checkpoint dropped")
                        }
                    }
                }
                Ok(Report::Finished(snapshot)) => {
                    let participant = snapshot.participant;
                    let (state, _) = upload_snapshot(&self.store, &mut uploader, None, snapshot)?;
                    let speaker = local_speaker(participant, &state);
                    match coordinator.finish(&speaker, now_ms()) {
                        Ok(done) => {
                            decisions.extend(self.finished(&mut in_flight, participant, &state, done));
                            finished[participant] = Some(state);
                        }
                        Err(e) => refused.note(&self.job, &e),
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                // Every local subtask is gone, one without finishing: the job was cancelled
                // or failed.
                Err(RecvTimeoutError::Disconnected) if local_running(&finished, &self.participants) => return Ok(()),
                // Every local subtask finished; other parts may still run.
                Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(5)),
            }
            loop {
                let (part, report) = match self.remote.as_ref().map(|r| r.reports.try_recv()) {
                    Some(Ok(report)) => report,
                    Some(Err(TryRecvError::Disconnected)) if remote_running(&finished, &self.participants) => {
                        return Err(CheckpointError::Storage {
                            what: "the job's other parts".into(),
                            problem: PARTS_LINK_CLOSED.into(),
                        });
                    }
                    _ => break,
                };
                // Each report is judged by who sent it (the part's name from its certificate):
                // a part speaks for its own subtasks only.
                match report {
                    PartReport::Acknowledged { id, participant, state, stats } => {
                        let state = self.as_given(state);
                        let speaker = part_speaker(&part, participant, Some(&state));
                        match coordinator.acknowledge(id, &speaker, now_ms()) {
                            Ok(decision) => {
                                if let Some(flight) = in_flight.as_mut().filter(|f| f.id == id) {
                                    flight.stats.merge(&stats);
                                    flight.parts[participant] = Some(state);
                                }
                                decisions.extend(decision);
                            }
                            Err(e) => refused.note(&self.job, &e),
                        }
                    }
                    PartReport::Declined { id, participant, reason } => {
                        match coordinator.decline(id, &part_speaker(&part, participant, None), &reason, now_ms()) {
                            Ok(decision) => decisions.extend(decision),
                            Err(e) => refused.note(&self.job, &e),
                        }
                    }
                    PartReport::Finished { participant, state } => {
                        let state = self.as_given(state);
                        match coordinator.finish(&part_speaker(&part, participant, Some(&state)), now_ms()) {
                            Ok(done) => {
                                decisions.extend(self.finished(&mut in_flight, participant, &state, done));
                                finished[participant] = Some(state);
                            }
                            Err(e) => refused.note(&self.job, &e),
                        }
                    }
                }
            }
            if coordinator.all_finished() {
                let parts: Vec<SubtaskState> = finished.into_iter().flatten().collect();
                return self.finish(last_id + 1, parts);
            }
            decisions.extend(coordinator.poll(now_ms()));
            if decisions.is_empty() && (self.savepoint_waiting() || self.swap_waiting()) {
                decisions.extend(coordinator.trigger_now(now_ms()));
            }
            for decision in decisions {
                match decision {
                    Decision::Trigger(id) => {
                        last_id = id;
                        if let Ok(mut request) = self.signals.savepoint.lock()
                            && let Some(r) = request.as_mut().filter(|r| r.checkpoint.is_none())
                        {
                            r.checkpoint = Some(id);
                        }
                        let swap = self.carry_swap(id);
                        let mut flight = InFlight {
                            id,
                            triggered: Instant::now(),
                            parts: finished.clone(),
                            stats: CheckpointStats::default(),
                        };
                        // Finished subtasks take part with their final snapshots.
                        let done = coordinator.acknowledge_finished(id, now_ms());
                        let at_ms = now_ms();
                        self.signals.triggered_ms.store(at_ms, Ordering::SeqCst);
                        self.signals.trigger.store(id, Ordering::SeqCst);
                        self.tell_parts(MasterCommand::Trigger { id, at_ms, swap });
                        tracing::debug!(job = %self.job, checkpoint = id, "checkpoint triggered");
                        if let Some(Decision::Complete(id)) = done {
                            flight.stats.total_ms = 0.0;
                            self.complete(id, flight, &mut uploader, &finished);
                        } else {
                            in_flight = Some(flight);
                        }
                    }
                    Decision::Complete(id) => {
                        if let Some(flight) = in_flight.take().filter(|f| f.id == id) {
                            self.complete(id, flight, &mut uploader, &finished);
                        }
                    }
                    Decision::Abort { id, reason } => {
                        in_flight = None;
                        self.savepoint_failed(id, &reason);
                        tracing::warn!(job = %self.job, checkpoint = id, %reason, "checkpoint aborted");
                    }
                }
            }
        }
    }

    /// A participant finished (the coordinator took it): a subtask that had not taken its
    /// part of the pending checkpoint takes it with its final snapshot, which is later than
    /// the checkpoint's barrier.
    fn finished(
        &self,
        in_flight: &mut Option<InFlight>,
        participant: usize,
        state: &SubtaskState,
        done: crate::checkpoint::Finished,
    ) -> Option<Decision> {
        if done.acknowledged
            && let Some(flight) = in_flight.as_mut()
        {
            flight.parts[participant] = Some(state.clone());
        }
        done.decision
    }

    /// A part's subtask state with what each operator read set from the spec the part was
    /// given: a restore refuses or replays in-flight records by it.
    fn as_given(&self, mut state: SubtaskState) -> SubtaskState {
        for op in &mut state.operators {
            op.partial_input = self.two_phase.contains(&op.step);
        }
        state
    }

    /// Whether a savepoint request has no checkpoint yet.
    fn savepoint_waiting(&self) -> bool {
        self.signals.savepoint.lock().is_ok_and(|r| r.as_ref().is_some_and(|r| r.checkpoint.is_none()))
    }

    /// Whether a live swap has no checkpoint to carry it yet.
    fn swap_waiting(&self) -> bool {
        self.signals.swap.lock().is_ok_and(|r| r.as_ref().is_some_and(|r| r.checkpoint.is_none()))
    }

    /// The live swap checkpoint `id` carries: stamped with its first checkpoint, and told to
    /// the other parts with every trigger until a checkpoint carrying it completes (a part
    /// whose subtasks went over already ignores it).
    fn carry_swap(&self, id: CheckpointId) -> Option<SwapOrder> {
        let Ok(mut request) = self.signals.swap.lock() else { return None };
        let r = request.as_mut().filter(|r| r.outcome.is_none())?;
        if r.checkpoint.is_none() {
            r.checkpoint = Some(id);
            tracing::info!(job = %self.job, checkpoint = id, step = %r.step, "checkpoint carries a live swap");
        }
        Some(SwapOrder { step: r.step.clone(), digest: r.component.digest().to_owned() })
    }

    /// A completed checkpoint at or after a swap's barrier: every subtask runs the new code
    /// from it on (each swapped at its first snapshot of the swap's checkpoint or later). Its
    /// metadata says how many subtasks went on with the new code, wherever they ran.
    fn swap_completed(&self, meta: &CheckpointMetadata) {
        if let Ok(mut request) = self.signals.swap.lock()
            && let Some(r) =
                request.as_mut().filter(|r| r.checkpoint.is_some_and(|c| c <= meta.id) && r.outcome.is_none())
        {
            let subtasks = meta
                .subtasks
                .iter()
                .flat_map(|s| &s.operators)
                .filter(|o| o.step == r.step && o.artifact.as_deref() == Some(r.component.digest()))
                .count();
            r.outcome = Some(SwapOutcome {
                checkpoint: meta.id,
                subtasks: u32::try_from(subtasks).unwrap_or(u32::MAX),
                longest_ms: meta.stats.swap_ms,
            });
            tracing::info!(job = %self.job, checkpoint = meta.id, step = %r.step, subtasks, "live swap completed");
        }
    }

    fn savepoint_failed(&self, id: CheckpointId, reason: &str) {
        if let Ok(mut request) = self.signals.savepoint.lock()
            && let Some(r) = request.as_mut().filter(|r| r.checkpoint == Some(id))
        {
            r.outcome = Some(Err(format!("checkpoint {id} for the savepoint was aborted: {reason}")));
        }
    }

    /// Copies checkpoint `meta` to the waiting savepoint directory, if it was the savepoint's.
    fn take_savepoint(&self, meta: &CheckpointMetadata) {
        let Ok(mut request) = self.signals.savepoint.lock() else { return };
        let Some(r) = request.as_mut().filter(|r| r.checkpoint == Some(meta.id)) else { return };
        let outcome = CheckpointStore::at(&r.to)
            .and_then(|to| eddy_checkpoint::savepoint::copy_checkpoint(&self.store, meta, &to))
            .map_err(|e| e.to_string());
        match &outcome {
            Ok(id) => tracing::info!(job = %self.job, checkpoint = id, to = %r.to, "savepoint written"),
            Err(e) => tracing::warn!(job = %self.job, error = %e, "savepoint failed"),
        }
        r.outcome = Some(outcome);
    }

    fn tell_parts(&self, command: MasterCommand) {
        if let Some(remote) = &self.remote {
            (remote.broadcast)(command);
        }
    }

    fn fault(&self, point: FaultPoint) {
        if let Some(hook) = &self.faults {
            hook(point);
        }
    }

    /// Writes the metadata of a checkpoint every participant acknowledged, then tells the sinks.
    /// `finished` holds the final snapshots of subtasks that ended: their files are live.
    fn complete(
        &mut self,
        id: CheckpointId,
        flight: InFlight,
        uploader: &mut Uploader,
        finished: &[Option<SubtaskState>],
    ) {
        let mut stats = flight.stats;
        stats.total_ms = flight.triggered.elapsed().as_secs_f64() * 1e3;
        let subtasks: Vec<SubtaskState> = flight.parts.into_iter().flatten().collect();
        let mut meta = CheckpointMetadata {
            version: eddy_checkpoint::metadata::FORMAT_VERSION,
            job: self.job.clone(),
            max_parallelism: Some(self.max_parallelism),
            id,
            completed_ms: now_ms(),
            finished: false,
            subtasks,
            stats: stats.clone(),
        };
        meta.stats.full_bytes = meta.files().map(|f| f.bytes).sum();
        self.fault(FaultPoint::BeforeMetadata);
        if let Err(e) = meta.write(&self.store) {
            tracing::warn!(job = %self.job, checkpoint = id, error = %e, "checkpoint metadata not written; the previous checkpoint stays the latest");
            return;
        }
        self.fault(FaultPoint::AfterMetadata);
        self.take_savepoint(&meta);
        self.swap_completed(&meta);
        self.signals.completed.store(id, Ordering::SeqCst);
        self.tell_parts(MasterCommand::Completed { id });
        tracing::info!(
            job = %self.job,
            checkpoint = id,
            full_bytes = meta.stats.full_bytes,
            incremental_bytes = meta.stats.incremental_bytes,
            alignment_ms = meta.stats.alignment_ms,
            sync_ms = meta.stats.sync_ms,
            async_ms = meta.stats.async_ms,
            "checkpoint completed"
        );
        if let Ok(mut history) = self.history.lock() {
            history.push(&meta);
        }
        self.retained.push(meta);
        let excess = self.retained.len().saturating_sub(self.spec.retained);
        self.retained.drain(..excess);
        if excess > 0 {
            self.prune_journal();
        }
        let live: HashSet<String> = finished.iter().flatten().flat_map(|s| s.files().map(|f| f.path.clone())).collect();
        let sweep = if self.remote.is_some() { Sweep::RunningWithParts } else { Sweep::Running };
        self.collect_garbage(uploader, &live, sweep);
    }

    /// Input journals reach back as far as the retained checkpoints do: a segment before the
    /// oldest one has no state left to replay from. (Until a checkpoint is dropped, the journal
    /// also keeps the job's start, replayable from empty state; the final checkpoint prunes
    /// nothing and keeps the retained ones, so a finished job's journal stays replayable.)
    fn prune_journal(&self) {
        let Some(oldest) = self.retained.first().filter(|_| self.journaled) else { return };
        match crate::journal::prune(&self.store, oldest.id) {
            Ok(0) => {}
            Ok(deleted) => {
                tracing::debug!(job = %self.job, deleted, before = oldest.id, "pruned input journal segments")
            }
            Err(e) => tracing::warn!(job = %self.job, error = %e, "pruning the input journal failed; will retry"),
        }
    }

    /// Deletes what neither the retained checkpoints nor `live` need.
    fn collect_garbage(&self, uploader: &mut Uploader, live: &HashSet<String>, sweep: Sweep) {
        match collect_garbage(&self.store, &self.retained, live, sweep) {
            // No shared file went: the uploader's knowledge holds.
            Ok(_) if sweep == Sweep::RunningWithParts => {}
            Ok(_) => {
                let mut still_there: HashSet<String> =
                    self.retained.iter().flat_map(|m| m.files().map(|f| f.path.clone())).collect();
                still_there.extend(live.iter().cloned());
                uploader.retain(&still_there);
            }
            Err(e) => tracing::warn!(job = %self.job, error = %e, "checkpoint garbage collection failed; will retry"),
        }
    }

    /// Every subtask finished: the final checkpoint, then the sink's last commit.
    fn finish(mut self, id: CheckpointId, subtasks: Vec<SubtaskState>) -> Result<(), CheckpointError> {
        let mut meta = CheckpointMetadata {
            version: eddy_checkpoint::metadata::FORMAT_VERSION,
            job: self.job.clone(),
            max_parallelism: Some(self.max_parallelism),
            id,
            completed_ms: now_ms(),
            finished: true,
            subtasks,
            stats: CheckpointStats::default(),
        };
        meta.stats.full_bytes = meta.files().map(|f| f.bytes).sum();
        meta.write(&self.store)?;
        // Every sink's final commit, the other parts' too (their sinks write where the master
        // reaches, as recovery's re-commit does): the job is finished only once its output is.
        for state in meta.subtasks.iter().filter_map(|s| s.sink.as_ref()) {
            (self.commit_sink)(state).map_err(|e| CheckpointError::Storage {
                what: "committing the sink's final files".into(),
                problem: e.to_string(),
            })?;
        }
        self.signals.completed.store(id, Ordering::SeqCst);
        self.tell_parts(MasterCommand::Final { id });
        // A journal replays from the retained checkpoints: a journaled job keeps them beside
        // the final one, so a finished job replays too. Any other keeps only the final one.
        if !self.journaled {
            self.retained.clear();
        }
        self.retained.push(meta);
        // Every part finished: nothing is on its way.
        self.collect_garbage(&mut Uploader::default(), &HashSet::new(), Sweep::Running);
        tracing::info!(job = %self.job, checkpoint = id, "job finished; final checkpoint written");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use eddy_state::BackendSnapshot;

    use super::*;
    use eddy_checkpoint::upload::TakenSnapshot;
    use eddy_checkpoint::{OperatorSnapshot, RestorePoint};

    /// Subtask `participant`'s snapshot: one state entry holding `value`.
    fn snapshot(participant: usize, value: &[u8]) -> TakenSnapshot {
        let entries: Vec<(Vec<u8>, Vec<u8>)> = vec![(vec![0, 0, b'a' + participant as u8], value.to_vec())];
        let state = BackendSnapshot::Frozen(Box::new(entries));
        let operators = vec![(
            "count".into(),
            OperatorSnapshot {
                timers: Vec::new(),
                partial_input: false,
                state,
                usage: None,
                states: Vec::new(),
                schemas: Vec::new(),
                artifact: None,
            },
        )];
        TakenSnapshot::of_keyed_subtask(participant as u32, 2, operators)
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "gave up waiting until {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A checkpoint thread over two participants in `dir`, triggering every millisecond; with
    /// `master`, participant 1 runs in another part.
    fn two_participants(
        dir: &std::path::Path,
        signals: &Arc<Signals>,
        reports: Receiver<Report>,
        master: Option<MasterLink>,
    ) -> CheckpointThread {
        let spec = CheckpointSpec { timeout_ms: 600_000, retained: 1, ..CheckpointSpec::in_dir(dir.to_path_buf(), 1) };
        CheckpointThread {
            job: "j".into(),
            max_parallelism: 128,
            spec,
            store: CheckpointStore::local(dir).expect("store"),
            journaled: false,
            two_phase: Vec::new(),
            participants: vec![
                Participant { task: 0, subtask: 0, part: None },
                Participant { task: 0, subtask: 1, part: master.is_some().then(|| "part-0".to_owned()) },
            ],
            first_id: 1,
            retained: Vec::new(),
            signals: signals.clone(),
            reports,
            cancel: Arc::new(AtomicBool::new(false)),
            history: Arc::default(),
            commit_sink: Box::new(|_| Ok(())),
            faults: None,
            remote: master,
        }
    }

    #[test]
    fn a_subtask_that_finishes_after_its_part_of_a_checkpoint_leaves_a_restorable_final_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (reports, received) = mpsc::sync_channel(16);
        let signals = Arc::new(Signals::default());
        let thread = two_participants(dir.path(), &signals, received, None);
        let running = std::thread::spawn(move || thread.run());
        wait_until("checkpoint 1 is triggered", || signals.trigger.load(Ordering::SeqCst) >= 1);
        let id = signals.trigger.load(Ordering::SeqCst);
        // Subtask 0 takes its part, then ends; subtask 1 takes its part: checkpoint `id`
        // completes (and collects garbage) while subtask 0's final files are not in it.
        reports.send(Report::Taken { id, snapshot: snapshot(0, b"zero at the barrier") }).expect("send");
        reports.send(Report::Finished(snapshot(0, b"zero at the end"))).expect("send");
        reports.send(Report::Taken { id, snapshot: snapshot(1, b"one at the barrier") }).expect("send");
        wait_until("the checkpoint completes", || signals.completed.load(Ordering::SeqCst) >= id);
        reports.send(Report::Finished(snapshot(1, b"one at the end"))).expect("send");
        running.join().expect("thread").expect("final checkpoint written");

        let store = CheckpointStore::local(dir.path()).expect("store");
        let (point, skipped) = RestorePoint::latest(&store).expect("read");
        assert!(skipped.is_empty(), "a checkpoint failed its checks: {skipped:?}");
        let point = point.expect("the final checkpoint");
        assert!(point.metadata().finished);
        let mut backend = eddy_state::HeapStateBackend::default();
        let all = eddy_checkpoint::restore::Share::KeyGroups(eddy_core::KeyGroupRange::all(128));
        point.restore_operator("count", all, &mut backend, &mut |_| {}).expect("restore");
        let mut values = Vec::new();
        eddy_state::StateBackend::scan_prefix(&backend, b"", &mut |_, v| values.push(v.to_vec())).expect("scan");
        assert_eq!(values, [b"zero at the end".to_vec(), b"one at the end".to_vec()], "each subtask's final state");
    }

    /// A master over `two_participants` in `dir` with participant 1 in another part, running.
    struct SpreadMaster {
        store: CheckpointStore,
        reports: mpsc::SyncSender<Report>,
        signals: Arc<Signals>,
        part: crate::messages::PartLink,
        /// The sink states the master committed.
        committed: Arc<Mutex<Vec<serde_json::Value>>>,
        running: std::thread::JoinHandle<Result<(), CheckpointError>>,
    }

    fn spread_master(dir: &std::path::Path) -> SpreadMaster {
        let (reports, received) = mpsc::sync_channel(16);
        let signals = Arc::new(Signals::default());
        let (master, mut parts) = crate::messages::local_links(1);
        let part = parts.remove(0);
        let mut thread = two_participants(dir, &signals, received, Some(master));
        let committed = Arc::new(Mutex::new(Vec::new()));
        let log = committed.clone();
        thread.commit_sink = Box::new(move |state| {
            log.lock().expect("log").push(state.clone());
            Ok(())
        });
        let running = std::thread::spawn(move || thread.run());
        SpreadMaster { store: CheckpointStore::local(dir).expect("store"), reports, signals, part, committed, running }
    }

    /// A spread job: participant 0 runs here, participant 1 in another part. The master tells
    /// the part of each trigger and completion, counts the part's acknowledgements like local
    /// ones, and after every participant finished writes the final checkpoint, commits both
    /// sinks' final files itself (the job is not finished while a part's output is pending:
    /// a reader looks as soon as it is) and says so.
    #[test]
    fn the_master_of_a_spread_job_counts_the_other_parts_and_tells_them_each_step() {
        use crate::messages::{MasterCommand, PartReport};
        let dir = tempfile::tempdir().expect("tempdir");
        let SpreadMaster { store, reports, signals, part, committed, running } = spread_master(dir.path());
        let next = || part.commands.recv_timeout(Duration::from_secs(30)).expect("a command");
        let MasterCommand::Trigger { id, .. } = next() else { panic!("the first command triggers") };
        assert_eq!(signals.trigger.load(Ordering::SeqCst), id, "the master's own sources are told too");
        reports.send(Report::Taken { id, snapshot: snapshot(0, b"zero") }).expect("send");
        // The other part uploads its own snapshot and reports the state.
        let mut uploader = Uploader::default();
        let (mut state, stats) = upload_snapshot(&store, &mut uploader, Some(id), snapshot(1, b"one")).expect("upload");
        // A claim the spec does not back: `count` is no two-phase window.
        state.operators[0].partial_input = true;
        (part.report)(PartReport::Acknowledged { id, participant: 1, state, stats });
        assert_eq!(next(), MasterCommand::Completed { id });
        let meta = CheckpointMetadata::read(&store, id).expect("metadata");
        assert_eq!(meta.subtasks.len(), 2, "the metadata holds both parts' subtasks");
        let read_partials = meta.subtasks.iter().flat_map(|s| &s.operators).any(|o| o.partial_input);
        assert!(!read_partials, "what a part's operator read comes from the spec, not the part");
        // Both end; the master writes the final checkpoint and tells the part.
        let sink = |participant: usize| serde_json::json!({ "pending": [[1, format!("{participant}.jsonl")]] });
        let mut own = snapshot(0, b"zero at the end");
        own.sink = Some(sink(0));
        reports.send(Report::Finished(own)).expect("send");
        let (mut state, _) =
            upload_snapshot(&store, &mut uploader, None, snapshot(1, b"one at the end")).expect("upload");
        state.sink = Some(sink(1));
        (part.report)(PartReport::Finished { participant: 1, state });
        drop(reports);
        let last = loop {
            match next() {
                MasterCommand::Final { id } => break id,
                MasterCommand::Trigger { .. } | MasterCommand::Completed { .. } => {}
            }
        };
        running.join().expect("no panic").expect("final checkpoint written");
        let meta = CheckpointMetadata::read(&store, last).expect("final metadata");
        assert!(meta.finished && meta.subtasks.len() == 2);
        assert_eq!(*committed.lock().expect("log"), [sink(0), sink(1)], "the master committed every sink");
    }

    /// The other part acknowledges and finishes the master's own subtask with forged state:
    /// refused, so the checkpoint waits for the real subtask and the forged state is in no
    /// metadata, and the job does not end on the part's word.
    #[test]
    fn a_part_cannot_acknowledge_or_finish_a_subtask_that_is_not_its_own() {
        use crate::messages::{MasterCommand, PartReport};
        let dir = tempfile::tempdir().expect("tempdir");
        let SpreadMaster { store, reports, signals, part, running, .. } = spread_master(dir.path());
        let next = || part.commands.recv_timeout(Duration::from_secs(30)).expect("a command");
        let MasterCommand::Trigger { id, .. } = next() else { panic!("the first command triggers") };
        let mut uploader = Uploader::default();
        let (forged, stats) = upload_snapshot(&store, &mut uploader, Some(id), snapshot(0, b"forged")).expect("upload");
        let (own, own_stats) = upload_snapshot(&store, &mut uploader, Some(id), snapshot(1, b"one")).expect("upload");
        (part.report)(PartReport::Acknowledged { id, participant: 0, state: forged.clone(), stats });
        // Its own participant, but with the forged snapshot of the other subtask.
        (part.report)(PartReport::Acknowledged { id, participant: 1, state: forged.clone(), stats: own_stats.clone() });
        (part.report)(PartReport::Finished { participant: 0, state: forged });
        (part.report)(PartReport::Acknowledged { id, participant: 1, state: own, stats: own_stats });
        std::thread::sleep(Duration::from_millis(100));
        assert!(signals.completed.load(Ordering::SeqCst) < id, "completed on the part's word alone");
        reports.send(Report::Taken { id, snapshot: snapshot(0, b"zero") }).expect("send");
        assert_eq!(next(), MasterCommand::Completed { id });
        let meta = CheckpointMetadata::read(&store, id).expect("metadata");
        let mut backend = eddy_state::HeapStateBackend::default();
        let point = RestorePoint::latest(&store).expect("read").0.expect("a checkpoint");
        let all = eddy_checkpoint::restore::Share::KeyGroups(eddy_core::KeyGroupRange::all(128));
        point.restore_operator("count", all, &mut backend, &mut |_| {}).expect("restore");
        let mut values = Vec::new();
        eddy_state::StateBackend::scan_prefix(&backend, b"", &mut |_, v| values.push(v.to_vec())).expect("scan");
        assert_eq!(values, [b"zero".to_vec(), b"one".to_vec()], "each subtask's own state, nothing forged");
        assert_eq!(meta.subtasks.len(), 2);
        drop(reports);
        drop(part);
        // The master's own subtask never finished (its report was refused): the job was
        // cancelled, not finished, and no final checkpoint says otherwise.
        running.join().expect("no panic").expect("cancelled");
        let newest = RestorePoint::latest(&store).expect("read").0.expect("a checkpoint");
        assert!(!newest.metadata().finished, "the job ended on the part's word");
    }
}
