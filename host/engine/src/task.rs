//! One subtask: a thread running a mailbox loop over its chain.
//!
//! The head is a source reader or an input gate; the operators are called in chain order by
//! plain function calls; the tail is an exchange ([`OutputRouter`]) or the sink. The loop takes
//! one thing at a time: a batch of records, a watermark, end of input, or the periodic tick
//! (processing-time timers, idleness, buffer timeouts) — so an operator never runs
//! concurrently with itself and needs no locks.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use eddy_core::{BoundedOutOfOrderness, RecordBatch, WatermarkInterval, WatermarkTracker};
use eddy_runtime::{AggregateInstance, Output};
use eddy_state::TtlClock;

use eddy_checkpoint::format::InFlightBatch;
use eddy_checkpoint::upload::TakenSnapshot;
use eddy_checkpoint::{CheckpointId, OperatorSnapshot};

use crate::checkpoint::{BarrierHandler, BarrierMode, Outcome};
use crate::messages::{FaultHook, FaultPoint, Report, Signals, now_ms};
use crate::metrics::SubtaskMetrics;
use crate::operator::{OperatorError, StreamOperator};
use crate::router::{OutputRouter, RouteError};
use crate::window_operator::LocalWindowAggregate;
use eddy_connectors::Sink;
use eddy_connectors::{Source, SourceError, SourceStatus};
use eddy_transport::channel::{InputGate, Message};

/// How long a barrier waits for the job master's trigger to reach this process (see
/// `SubtaskRunner::await_trigger`): it was sent before the barrier, over another connection.
const TRIGGER_WAIT: Duration = Duration::from_secs(30);

/// Why a subtask stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// An operator failed.
    #[error(transparent)]
    Operator(#[from] OperatorError),
    /// The source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Records could not be routed.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// Writing to the sink failed.
    #[error("writing to the sink: {0}")]
    Sink(#[source] std::io::Error),
    /// The synchronous phase of a checkpoint failed (the local staging directory).
    #[error("taking a snapshot: {0}")]
    Snapshot(String),
    /// The subtask panicked: a bug in Eddy (guests trap, they cannot panic the host).
    #[error("panicked: {0}")]
    Panicked(String),
}

/// A subtask's part in checkpoints.
pub(crate) struct Checkpointing {
    /// Index among all the job's subtasks.
    pub participant: usize,
    pub task: usize,
    pub subtask: u32,
    pub parallelism: u32,
    pub keyed: bool,
    /// The source this subtask reads, if it is a source reader.
    pub source_name: Option<String>,
    /// Step name of each operator of the chain.
    pub steps: Vec<String>,
    pub signals: Arc<Signals>,
    pub reports: SyncSender<Report>,
    /// Where snapshots are staged (on the state backends' file system, for hard links).
    pub staging_root: PathBuf,
    /// The newest checkpoint this subtask snapshotted (sources) or aligned.
    pub last_checkpoint: CheckpointId,
    /// The newest completed checkpoint this subtask's sink heard of.
    pub last_completed: CheckpointId,
    /// Input tasks: the barrier protocol (aligned, unaligned, or aligned with a timeout): which
    /// channels are held, when to snapshot, which records are in flight.
    pub barriers: Option<BarrierHandler<Message>>,
    /// An unaligned snapshot taken, waiting for the records in flight until its last barrier.
    pub held: Option<(CheckpointId, TakenSnapshot)>,
    /// Tests: called at [`FaultPoint::BeforeCommit`].
    pub faults: Option<FaultHook>,
}

/// Where the chain's records enter.
pub(crate) enum Head {
    /// A source reader with its watermark generator.
    Source {
        source: Box<dyn Source>,
        watermarks: BoundedOutOfOrderness,
        /// How often its watermark is passed on (`watermarks.interval_ms`).
        interval: WatermarkInterval,
        batch_size: usize,
        /// Reused for every read, so the hot loop does not allocate a batch per poll.
        buffer: RecordBatch,
        /// Told of each batch and of the end, with the source's position and the reader's index.
        observer: Option<(usize, u32, crate::job::SourceObserver)>,
    },
    /// Input channels from upstream tasks.
    Input { gate: Box<dyn InputGate>, tracker: WatermarkTracker, ended: Vec<bool> },
}

/// Where the chain's records leave.
pub(crate) enum Tail {
    /// Towards the next task (boxed: a router is ten times a sink's handle).
    Exchange(Box<OutputRouter>),
    /// Into the sink (the last task).
    Sink(Box<dyn Sink>),
}

impl Tail {
    fn main(&mut self, batch: Cow<'_, RecordBatch>, now_ms: i64) -> Result<(), TaskError> {
        match self {
            Tail::Exchange(router) => Ok(router.emit(batch, now_ms)?),
            Tail::Sink(sink) if !batch.is_empty() => sink.write(None, &batch).map_err(TaskError::Sink),
            Tail::Sink(_) => Ok(()),
        }
    }

    fn side(&mut self, name: &str, batch: RecordBatch) -> Result<(), TaskError> {
        match self {
            Tail::Exchange(router) => Ok(router.emit_side(name, batch)?),
            Tail::Sink(sink) if !batch.is_empty() => sink.write(Some(name), &batch).map_err(TaskError::Sink),
            Tail::Sink(_) => Ok(()),
        }
    }

    fn watermark(&mut self, w: i64) -> Result<(), TaskError> {
        match self {
            Tail::Exchange(router) => Ok(router.watermark(w)?),
            Tail::Sink(_) => Ok(()),
        }
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        match self {
            Tail::Exchange(router) => Ok(router.flush_all()?),
            Tail::Sink(_) => Ok(()),
        }
    }

    fn event(&mut self, message: Message) -> Result<(), TaskError> {
        match self {
            Tail::Exchange(router) => Ok(router.broadcast(message)?),
            Tail::Sink(sink) if message == Message::EndOfStream => sink.finish().map_err(TaskError::Sink),
            Tail::Sink(_) => Ok(()),
        }
    }

    fn tick(&mut self, now_ms: i64) -> Result<(), TaskError> {
        match self {
            Tail::Exchange(router) => Ok(router.flush_due(now_ms)?),
            Tail::Sink(_) => Ok(()),
        }
    }
}

/// How a subtask ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its input ended and everything was flushed downstream.
    Finished,
    /// The job was cancelled.
    Cancelled,
}

/// A subtask, ready to run on its own thread.
pub(crate) struct SubtaskRunner {
    pub(crate) head: Head,
    pub(crate) operators: Vec<Box<dyn StreamOperator>>,
    /// The first phase of the two-phase window behind the exchange, if it is one: what leaves
    /// the chain is folded into partial accumulators before the tail routes it.
    pub(crate) local_phase: Option<Box<LocalWindowAggregate<AggregateInstance>>>,
    pub(crate) tail: Tail,
    pub(crate) metrics: Arc<SubtaskMetrics>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) ttl_clock: TtlClock,
    pub(crate) tick: Duration,
    pub(crate) watermark: i64,
    pub(crate) checkpointing: Option<Checkpointing>,
    /// Records in flight at the unaligned checkpoint restored from: replayed into the chain
    /// before any new input.
    pub(crate) replay: Vec<InFlightBatch>,
}

impl SubtaskRunner {
    /// Runs until the input ends, the job is cancelled or something fails.
    pub(crate) fn run(mut self) -> Result<Ended, TaskError> {
        let result = self.start().and_then(|()| self.run_loop());
        self.record_cpu();
        match result {
            // A closed channel during cancellation is the cancellation, not a failure.
            Err(TaskError::Route(RouteError::Disconnected(_))) if self.cancelled() => Ok(Ended::Cancelled),
            other => other,
        }
    }

    /// Before any input: in unaligned mode every barrier on every input channel overtakes; the
    /// records in flight at the restored checkpoint go through the chain first.
    fn start(&mut self) -> Result<(), TaskError> {
        let unaligned = self
            .checkpointing
            .as_ref()
            .and_then(|c| c.barriers.as_ref())
            .is_some_and(|b| b.mode() == BarrierMode::Unaligned);
        if let (true, Head::Input { gate, .. }) = (unaligned, &mut self.head) {
            for channel in 0..gate.channels() {
                gate.overtake_barriers(channel, 0..=CheckpointId::MAX);
            }
        }
        for InFlightBatch { side, batch, .. } in std::mem::take(&mut self.replay) {
            SubtaskMetrics::add(&self.metrics.records_in, batch.len());
            match side {
                None => self.process(0, &batch)?,
                Some(name) => {
                    SubtaskMetrics::add(&self.metrics.records_out, batch.len());
                    self.tail.side(&name, batch)?;
                }
            }
        }
        Ok(())
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn run_loop(&mut self) -> Result<Ended, TaskError> {
        let mut next_tick = Instant::now();
        loop {
            if self.cancelled() {
                return Ok(Ended::Cancelled);
            }
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + self.tick;
                self.on_tick()?;
            }
            self.on_checkpoint_signals()?;
            let wait = next_tick.saturating_duration_since(Instant::now());
            let input_done = match &mut self.head {
                Head::Source { .. } => self.poll_source(wait)?,
                Head::Input { .. } => self.poll_input(wait)?,
            };
            if input_done {
                self.finish()?;
                return Ok(Ended::Finished);
            }
        }
    }

    /// Reads one batch from the source. Returns whether the source ended.
    fn poll_source(&mut self, idle_wait: Duration) -> Result<bool, TaskError> {
        let Head::Source { source, batch_size, buffer, .. } = &mut self.head else { return Ok(false) };
        let mut batch = std::mem::take(buffer);
        batch.clear();
        let status = source.poll(&mut batch, *batch_size);
        let result = self.on_source_batch(status, &mut batch, idle_wait);
        if let Head::Source { buffer, .. } = &mut self.head {
            *buffer = batch;
        }
        result
    }

    fn on_source_batch(
        &mut self,
        status: Result<SourceStatus, SourceError>,
        batch: &mut RecordBatch,
        idle_wait: Duration,
    ) -> Result<bool, TaskError> {
        let Head::Source { source, watermarks, observer, interval, .. } = &mut self.head else { return Ok(false) };
        let status = status?;
        if status == SourceStatus::Ready {
            for r in batch.iter() {
                if let Some(t) = r.timestamp {
                    watermarks.on_event(t);
                }
            }
        }
        if let Some((source, reader, observe)) = observer {
            match status {
                SourceStatus::Ready => observe(*source, *reader, crate::job::SourceEntry::Batch(batch)),
                SourceStatus::End => observe(*source, *reader, crate::job::SourceEntry::End),
                SourceStatus::Idle => {}
            }
        }
        // A source that tracks event time per split says its watermark; others get theirs from
        // the batches' times.
        let watermark = source.watermark().unwrap_or_else(|| watermarks.current());
        // Offered on every poll, an idle one too: a quiet reader passes a held watermark on
        // once its interval ran out.
        let watermark = if watermark > self.watermark { interval.offer(watermark, now_ms()) } else { None };
        let side = source.take_side();
        for (name, rejected) in side {
            SubtaskMetrics::add(&self.metrics.records_out, rejected.len());
            self.tail.side(&name, rejected)?;
        }
        match status {
            SourceStatus::End => return Ok(true),
            SourceStatus::Idle => std::thread::sleep(idle_wait.min(Duration::from_millis(5))),
            SourceStatus::Ready => {
                SubtaskMetrics::add(&self.metrics.records_in, batch.len());
                self.process(0, batch)?;
            }
        }
        if let Some(watermark) = watermark {
            self.advance_watermark(watermark)?;
        }
        Ok(false)
    }

    /// Takes one message from the input gate. Returns whether every input ended.
    fn poll_input(&mut self, wait: Duration) -> Result<bool, TaskError> {
        let Head::Input { gate, tracker, ended } = &mut self.head else { return Ok(false) };
        let Some((channel, message)) = gate.recv(wait).map_err(RouteError::from)? else { return Ok(false) };
        let now = now_ms();
        if let (Message::Data { .. }, Some(barriers)) =
            (&message, self.checkpointing.as_mut().and_then(|c| c.barriers.as_mut()))
        {
            // In flight for an unaligned checkpoint: recorded, and processed as usual.
            barriers.on_data(channel, || message.clone());
        }
        match message {
            Message::Data { side: None, batch, watermark } => {
                let advanced = tracker.on_record(channel, now);
                // The tracker learns the watermark now; operators see it after the records.
                let advanced = match watermark {
                    Some(w) => tracker.on_watermark(channel, w, now).or(advanced),
                    None => advanced,
                };
                SubtaskMetrics::add(&self.metrics.records_in, batch.len());
                if let Some(first) = self.operators.first_mut().filter(|_| !batch.is_empty()) {
                    first.input_channel(channel as u32);
                }
                self.process(0, &batch)?;
                if let Head::Input { gate, .. } = &mut self.head {
                    gate.recycle(channel, batch);
                }
                if let Some(w) = advanced {
                    self.advance_watermark(w)?;
                }
            }
            Message::Data { side: Some(name), batch, .. } => {
                SubtaskMetrics::add(&self.metrics.records_in, batch.len());
                SubtaskMetrics::add(&self.metrics.records_out, batch.len());
                self.tail.side(&name, batch)?;
            }
            Message::Watermark(w) => {
                if let Some(w) = tracker.on_watermark(channel, w, now) {
                    self.advance_watermark(w)?;
                }
            }
            Message::Barrier(n) => self.on_barrier(channel, n)?,
            Message::EndOfStream => {
                if let Some(e) = ended.get_mut(channel) {
                    *e = true;
                }
                let all_ended = ended.iter().all(|e| *e);
                // An ended channel holds nothing back any more.
                if let Some(w) = tracker.on_end(channel)
                    && !all_ended
                {
                    self.advance_watermark(w)?;
                }
                let outcome = match self.checkpointing.as_mut().and_then(|c| c.barriers.as_mut()) {
                    Some(barriers) => barriers.on_end(channel),
                    None => Outcome::default(),
                };
                self.apply(outcome)?;
                return Ok(all_ended);
            }
        }
        Ok(false)
    }

    /// Sources take a triggered checkpoint; sinks commit completed ones.
    fn on_checkpoint_signals(&mut self) -> Result<(), TaskError> {
        let Some(ck) = &mut self.checkpointing else { return Ok(()) };
        let completed = ck.signals.completed.load(Ordering::SeqCst);
        if completed > ck.last_completed {
            ck.last_completed = completed;
            if let Tail::Sink(sink) = &mut self.tail {
                if let Some(hook) = &ck.faults {
                    hook(FaultPoint::BeforeCommit);
                }
                sink.notify_complete(completed).map_err(TaskError::Sink)?;
            }
        }
        let trigger = ck.signals.trigger.load(Ordering::SeqCst);
        if matches!(self.head, Head::Source { .. }) && trigger > ck.last_checkpoint {
            ck.last_checkpoint = trigger;
            self.snapshot(Some(trigger), 0.0)?;
            self.tail.event(Message::Barrier(trigger))?;
        }
        Ok(())
    }

    /// Barrier `id` arrived on `channel` (with copies of what it overtook, if it did): the
    /// barrier handler decides whether to hold the channel, snapshot, or complete.
    fn on_barrier(&mut self, channel: usize, id: CheckpointId) -> Result<(), TaskError> {
        let Some(ck) = &mut self.checkpointing else {
            // Without checkpoints nobody aligns; pass it on.
            return self.tail.event(Message::Barrier(id));
        };
        let overtaken = match &mut self.head {
            Head::Input { gate, .. } => gate.take_overtaken(channel),
            Head::Source { .. } => Vec::new(),
        };
        let Some(barriers) = &mut ck.barriers else { return Ok(()) };
        let outcome = barriers.on_barrier(channel, id, overtaken, now_ms());
        self.apply(outcome)
    }

    /// Carries out what the barrier handler decided, in order: the gate's held channels follow
    /// it; an abandoned snapshot is dropped; a new one is taken and its barrier forwarded;
    /// channels still owing that barrier are asked to let it overtake; a complete snapshot is
    /// reported with its records in flight.
    fn apply(&mut self, outcome: Outcome<Message>) -> Result<(), TaskError> {
        self.follow_barriers();
        if outcome.is_nothing() {
            return Ok(());
        }
        let Some(ck) = &mut self.checkpointing else { return Ok(()) };
        if let Some(id) = outcome.abandoned
            && ck.held.as_ref().is_some_and(|(held, _)| *held == id)
        {
            ck.held = None;
        }
        let alignment_ms = ck.barriers.as_ref().and_then(|b| b.started_ms()).map_or(0.0, |t| (now_ms() - t) as f64);
        let ck_unaligned = ck.barriers.as_ref().is_some_and(|b| b.mode() == BarrierMode::Unaligned);
        if let Some(id) = outcome.snapshot {
            ck.last_checkpoint = id;
            if let Some(mut snapshot) = self.take_snapshot(Some(id), alignment_ms)? {
                // Taken at once when aligned; before its records in flight are known when not.
                snapshot.unaligned = ck_unaligned || outcome.complete.as_ref().is_none_or(|(_, r)| !r.is_empty());
                if let Some(ck) = &mut self.checkpointing {
                    ck.held = Some((id, snapshot));
                }
            }
            self.tail.event(Message::Barrier(id))?;
        }
        if let (Some((id, channels)), Head::Input { gate, .. }) = (&outcome.overtake, &mut self.head) {
            for &channel in channels {
                gate.overtake_barriers(channel, *id..=*id);
            }
        }
        if let Some((id, records)) = outcome.complete
            && let Some(ck) = &mut self.checkpointing
            && ck.held.as_ref().is_some_and(|(held, _)| *held == id)
            && let Some((_, mut snapshot)) = ck.held.take()
        {
            snapshot.in_flight = records
                .into_iter()
                .filter_map(|(channel, message)| match message {
                    Message::Data { side, batch, .. } => Some(InFlightBatch { channel: channel as u32, side, batch }),
                    _ => None,
                })
                .collect();
            // A gone checkpoint thread means the job is ending; nothing to tell.
            let _ = ck.reports.send(Report::Taken { id, snapshot });
        }
        Ok(())
    }

    /// Holds back exactly the channels the barrier handler holds: it is the one truth about
    /// which channels are blocked (it releases channels itself when a newer barrier restarts
    /// alignment or the aligned timeout switches to unaligned, and a gate that kept its own
    /// view would hold them forever).
    fn follow_barriers(&mut self) {
        let (Some(ck), Head::Input { gate, .. }) = (&self.checkpointing, &mut self.head) else { return };
        let Some(barriers) = &ck.barriers else { return };
        for (channel, &blocked) in barriers.blocked().iter().enumerate() {
            gate.set_blocked(channel, blocked);
        }
    }

    /// The synchronous phase: the chain's state, the source position and the sink's
    /// pre-commit, handed to the checkpoint thread. `id: None` is the final snapshot of a
    /// finished subtask.
    fn snapshot(&mut self, id: Option<CheckpointId>, alignment_ms: f64) -> Result<(), TaskError> {
        let Some(snapshot) = self.take_snapshot(id, alignment_ms)? else { return Ok(()) };
        let Some(ck) = &self.checkpointing else { return Ok(()) };
        let report = match id {
            Some(id) => Report::Taken { id, snapshot },
            None => Report::Finished(snapshot),
        };
        // A gone checkpoint thread means the job is ending; nothing to tell.
        let _ = ck.reports.send(report);
        Ok(())
    }

    /// A live swap whose checkpoint is `id` or older, of a step of this chain not yet on the
    /// new code: right after the snapshot, so records before the barrier went through the old
    /// code and records after it go through the new one; the snapshot records the new code's
    /// digest, as that is the code a restore from it must run. Returns the time the swap took.
    fn swap_code_at(
        &mut self,
        id: CheckpointId,
        operators: &mut [(String, OperatorSnapshot)],
    ) -> Result<f64, TaskError> {
        let Some(ck) = &self.checkpointing else { return Ok(0.0) };
        let Ok(request) = ck.signals.swap.lock() else { return Ok(0.0) };
        let Some(swap) = request.as_ref().filter(|r| r.checkpoint.is_some_and(|c| c <= id)) else { return Ok(0.0) };
        let started = Instant::now();
        let mut swapped = false;
        for (i, (step, snapshot)) in operators.iter_mut().enumerate() {
            if *step != swap.step || self.operators[i].artifact() == Some(swap.component.digest()) {
                continue;
            }
            let old = self.operators.remove(i);
            self.operators.insert(i, old.swap_code(&swap.component)?);
            snapshot.artifact = Some(swap.component.digest().to_owned());
            swapped = true;
        }
        Ok(if swapped { started.elapsed().as_secs_f64() * 1e3 } else { 0.0 })
    }

    /// Waits until this process has seen checkpoint `id` triggered. In a part of a spread job
    /// a barrier from another process can overtake the job master's trigger, which carries a
    /// live swap the snapshot must see; everywhere else the trigger came first.
    fn await_trigger(&self, id: CheckpointId) -> Result<(), TaskError> {
        let Some(ck) = &self.checkpointing else { return Ok(()) };
        let since = Instant::now();
        while ck.signals.trigger.load(Ordering::SeqCst) < id {
            // Cancelled, the checkpoint cannot complete: what the snapshot sees no longer matters.
            if self.cancelled() {
                return Ok(());
            }
            if since.elapsed() >= TRIGGER_WAIT {
                return Err(TaskError::Snapshot(format!(
                    "checkpoint {id}'s barrier arrived, but not the job master's trigger within {TRIGGER_WAIT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Takes the synchronous snapshot without reporting it.
    fn take_snapshot(
        &mut self,
        id: Option<CheckpointId>,
        alignment_ms: f64,
    ) -> Result<Option<TakenSnapshot>, TaskError> {
        if let Some(id) = id {
            self.await_trigger(id)?;
        }
        let Some(ck) = &self.checkpointing else { return Ok(None) };
        let started = Instant::now();
        let staging = tempfile::Builder::new()
            .prefix("snapshot-")
            .tempdir_in(&ck.staging_root)
            .map_err(|e| TaskError::Snapshot(format!("staging in {}: {e}", ck.staging_root.display())))?;
        let steps = ck.steps.clone();
        let mut operators = Vec::with_capacity(self.operators.len());
        for (i, op) in self.operators.iter_mut().enumerate() {
            let dir = staging.path().join(format!("op{i}"));
            std::fs::create_dir(&dir).map_err(|e| TaskError::Snapshot(format!("{}: {e}", dir.display())))?;
            let name = steps.get(i).cloned().unwrap_or_else(|| op.name().to_owned());
            operators.push((name, op.snapshot(&dir)?));
        }
        let mut swap_ms = 0.0;
        if let Some(id) = id {
            swap_ms = self.swap_code_at(id, &mut operators)?;
            for op in &mut self.operators {
                op.after_snapshot(id)?;
            }
        }
        let sink = match &mut self.tail {
            Tail::Sink(sink) => sink.pre_commit(id.unwrap_or(u64::MAX)).map_err(TaskError::Sink)?,
            Tail::Exchange(_) => None,
        };
        let Some(ck) = &self.checkpointing else { return Ok(None) };
        let source = match &self.head {
            Head::Source { source, .. } => ck.source_name.clone().map(|n| (n, source.position())),
            Head::Input { .. } => None,
        };
        let snapshot = TakenSnapshot {
            participant: ck.participant,
            task: ck.task,
            subtask: ck.subtask,
            parallelism: ck.parallelism,
            keyed: ck.keyed,
            source,
            sink,
            operators,
            alignment_ms,
            sync_ms: started.elapsed().as_secs_f64() * 1e3,
            swap_ms,
            staging: Some(staging),
            in_flight: Vec::new(),
            unaligned: false,
        };
        Ok(Some(snapshot))
    }

    fn on_tick(&mut self) -> Result<(), TaskError> {
        let now = now_ms();
        self.ttl_clock.set(now);
        if let Some(ck) = self.checkpointing.as_mut()
            && let Some(barriers) = ck.barriers.as_mut()
        {
            let trigger = ck.signals.trigger.load(Ordering::SeqCst);
            let triggered = (trigger, ck.signals.triggered_ms.load(Ordering::SeqCst));
            let outcome = barriers.on_tick(now, Some(triggered));
            self.apply(outcome)?;
        }
        if let Head::Input { tracker, .. } = &mut self.head
            && let Some(w) = tracker.on_tick(now)
        {
            self.advance_watermark(w)?;
        }
        for i in 0..self.operators.len() {
            let out = self.operators[i].on_processing_time(now)?;
            self.forward(i, out)?;
        }
        let memory: u64 = self.operators.iter_mut().map(|o| o.wasm_memory_bytes()).sum::<u64>()
            + self.local_phase.as_mut().map_or(0, |l| l.memory_bytes());
        self.metrics.wasm_memory_bytes.store(memory, Ordering::Relaxed);
        self.record_cpu();
        self.tail.tick(now)
    }

    /// Publishes the CPU time this subtask's thread has used so far.
    fn record_cpu(&self) {
        let used = u64::try_from(eddy_runtime::thread_cpu_time().as_nanos()).unwrap_or(u64::MAX);
        self.metrics.cpu_ns.store(used, Ordering::Relaxed);
    }

    /// Feeds `batch` to operator `from` and everything after it.
    fn process(&mut self, from: usize, batch: &RecordBatch) -> Result<(), TaskError> {
        self.pass_on(from, Cow::Borrowed(batch))
    }

    /// [`Self::process`] for a batch that is the chain's own (an operator's output), which the
    /// tail may then take without a copy.
    fn pass_on(&mut self, from: usize, batch: Cow<'_, RecordBatch>) -> Result<(), TaskError> {
        if batch.is_empty() {
            return Ok(());
        }
        match self.operators.get_mut(from) {
            Some(op) => {
                let out = op.process(&batch)?;
                let late: u64 = self.operators.iter().map(|o| o.late_records()).sum();
                self.metrics.late_records.store(late, Ordering::Relaxed);
                self.forward(from, out)
            }
            None => {
                let batch = match &mut self.local_phase {
                    Some(local) => Cow::Owned(local.fold(&batch)?),
                    None => batch,
                };
                SubtaskMetrics::add(&self.metrics.records_out, batch.len());
                self.tail.main(batch, now_ms())
            }
        }
    }

    /// Sends operator `at`'s output on: main output to the next operator, side outputs to the tail.
    fn forward(&mut self, at: usize, out: Output) -> Result<(), TaskError> {
        for (name, side) in out.side {
            SubtaskMetrics::add(&self.metrics.records_out, side.len());
            self.tail.side(&name, side)?;
        }
        self.pass_on(at + 1, Cow::Owned(out.main))
    }

    /// Fires event time up to `watermark` through the chain in order, then passes it on.
    fn advance_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        let mut fired = false;
        for i in 0..self.operators.len() {
            let out = self.operators[i].on_watermark(watermark)?;
            fired |= !out.main.is_empty() || out.side.iter().any(|(_, b)| !b.is_empty());
            self.forward(i, out)?;
        }
        self.metrics.watermark.store(watermark, Ordering::Relaxed);
        if fired {
            // Results the watermark fired (windows, timers) leave with it: on a sparse channel
            // they would otherwise wait out the buffer timeout, and that wait is their latency.
            self.tail.flush()?;
        }
        self.tail.watermark(watermark)
    }

    /// End of input: event time jumps to the end (firing every window and timer), each operator
    /// finishes in chain order, and end-of-stream goes downstream.
    fn finish(&mut self) -> Result<(), TaskError> {
        self.advance_watermark(i64::MAX)?;
        for i in 0..self.operators.len() {
            let out = self.operators[i].finish()?;
            self.forward(i, out)?;
        }
        self.tail.event(Message::EndOfStream)?;
        self.snapshot(None, 0.0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use eddy_core::WATERMARK_MIN;

    use super::*;
    use eddy_transport::channel::{ChannelConfig, ChannelSender, local_gate};

    /// A sink subtask with two input channels and checkpoints on, over a local gate; returns the
    /// runner, the channels' senders and the reports it sends to the checkpoint thread.
    fn aligning_subtask(
        staging: &std::path::Path,
    ) -> (SubtaskRunner, Vec<eddy_transport::channel::LocalSender>, mpsc::Receiver<Report>) {
        subtask_in_mode(staging, BarrierMode::Aligned { timeout_ms: None })
    }

    fn subtask_in_mode(
        staging: &std::path::Path,
        mode: BarrierMode,
    ) -> (SubtaskRunner, Vec<eddy_transport::channel::LocalSender>, mpsc::Receiver<Report>) {
        let (_shared, mut gate, senders) =
            local_gate(2, ChannelConfig::default(), vec![Arc::default(), Arc::default()]);
        if mode == BarrierMode::Unaligned {
            // As the runner's start does, but before the test sends anything.
            for c in 0..2 {
                gate.overtake_barriers(c, 0..=CheckpointId::MAX);
            }
        }
        let (reports, received) = mpsc::sync_channel(16);
        let runner = SubtaskRunner {
            local_phase: None,
            head: Head::Input {
                gate: Box::new(gate),
                tracker: WatermarkTracker::new(2, None, 0),
                ended: vec![false; 2],
            },
            operators: Vec::new(),
            tail: Tail::Sink(Box::new(eddy_connectors::Blackhole)),
            metrics: Arc::new(SubtaskMetrics::new(0, 0)),
            cancel: Arc::new(AtomicBool::new(false)),
            ttl_clock: TtlClock::new(0),
            tick: Duration::from_millis(5),
            watermark: WATERMARK_MIN,
            checkpointing: Some(Checkpointing {
                participant: 0,
                task: 0,
                subtask: 0,
                parallelism: 1,
                keyed: false,
                source_name: None,
                steps: Vec::new(),
                // Barriers come straight from the test: as if every checkpoint was triggered.
                signals: Arc::new(Signals { trigger: u64::MAX.into(), ..Signals::default() }),
                reports,
                staging_root: staging.to_path_buf(),
                last_checkpoint: 0,
                last_completed: 0,
                barriers: Some(BarrierHandler::new(2, mode)),
                held: None,
                faults: None,
            }),
            replay: Vec::new(),
        };
        (runner, senders, received)
    }

    fn data(value: &str) -> Message {
        let mut batch = RecordBatch::default();
        batch.push(None, value.as_bytes(), None);
        Message::Data { side: None, batch, watermark: None }
    }

    /// Runs `runner` to its end and returns the checkpoints it reported, with the values of
    /// their records in flight as (channel, value).
    fn run_to_end(runner: SubtaskRunner, reports: &mpsc::Receiver<Report>) -> Vec<(CheckpointId, Vec<(u32, String)>)> {
        let cancel = runner.cancel.clone();
        let (done, ended) = mpsc::channel();
        std::thread::spawn(move || done.send(runner.run().map_err(|e| e.to_string())));
        let outcome = ended.recv_timeout(Duration::from_secs(30));
        cancel.store(true, Ordering::SeqCst);
        assert_eq!(outcome.expect("the subtask stalled"), Ok(Ended::Finished));
        reports
            .try_iter()
            .filter_map(|r| match r {
                Report::Taken { id, snapshot } => Some((
                    id,
                    snapshot
                        .in_flight
                        .iter()
                        .flat_map(|b| {
                            b.batch.iter().map(|r| (b.channel, String::from_utf8_lossy(r.value).into_owned()))
                        })
                        .collect(),
                )),
                Report::Finished(_) => None,
            })
            .collect()
    }

    #[test]
    fn an_unaligned_subtask_stores_what_each_barrier_overtook_with_its_snapshot() {
        let staging = tempfile::tempdir().expect("tempdir");
        let (runner, mut senders, reports) = subtask_in_mode(staging.path(), BarrierMode::Unaligned);
        for (c, values) in [(0, ["a0", "a1"]), (1, ["b0", "b1"])] {
            for v in values {
                senders[c].send(data(v)).expect("send");
            }
            senders[c].send(Message::Barrier(1)).expect("the barrier jumps the queue");
        }
        senders[0].send(data("a2 after the barrier")).expect("send");
        for sender in &mut senders {
            sender.send(Message::EndOfStream).expect("send");
        }
        let taken = run_to_end(runner, &reports);
        let expected: Vec<(u32, String)> =
            [(0, "a0"), (0, "a1"), (1, "b0"), (1, "b1")].iter().map(|(c, v)| (*c, v.to_string())).collect();
        assert_eq!(
            taken,
            [(1, expected)],
            "snapshot at the first barrier, with every record it and the other overtook"
        );
    }

    /// Emits one record per watermark that passes `fires_at`, as a window firing would.
    struct FiresAt(i64);
    impl crate::operator::StreamOperator for FiresAt {
        fn name(&self) -> &str {
            "fires-at"
        }
        fn process(&mut self, _: &RecordBatch) -> Result<Output, OperatorError> {
            Ok(Output::default())
        }
        fn on_watermark(&mut self, watermark: i64) -> Result<Output, OperatorError> {
            let mut out = Output::default();
            if watermark >= self.0 {
                out.main.push(Some(b"k"), b"fired", Some(self.0));
                self.0 = i64::MAX;
            }
            Ok(out)
        }
        fn on_processing_time(&mut self, _: i64) -> Result<Output, OperatorError> {
            Ok(Output::default())
        }
        fn finish(&mut self) -> Result<Output, OperatorError> {
            Ok(Output::default())
        }
        fn snapshot(&mut self, _: &std::path::Path) -> Result<eddy_checkpoint::OperatorSnapshot, OperatorError> {
            unreachable!("no checkpoint in this test")
        }
    }

    #[test]
    fn results_a_watermark_fires_leave_with_it_not_a_buffer_timeout_later() {
        use crate::router::tests::Collect;
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let router = OutputRouter::new(
            eddy_plan::Partitioning::Forward,
            vec![Box::new(Collect(sent.clone()))],
            128,
            1 << 20,
            3_600_000,
            "next".into(),
        );
        let (mut runner, _senders, _reports) = aligning_subtask(std::path::Path::new("/nonexistent"));
        runner.operators = vec![Box::new(FiresAt(100))];
        runner.tail = Tail::Exchange(Box::new(router));
        runner.advance_watermark(50).expect("watermark 50");
        assert!(matches!(sent.lock().expect("collector").as_slice(), [Message::Watermark(50)]));
        runner.advance_watermark(100).expect("watermark 100");
        let sent = sent.lock().expect("collector");
        assert_eq!(sent.len(), 3, "the fired record and the watermark, with no tick: {sent:?}");
        assert!(
            matches!(&sent[1], Message::Data { batch, .. } if batch.len() == 1),
            "the fired record first: {sent:?}"
        );
        assert!(matches!(&sent[2], Message::Watermark(100)), "then the watermark that fired it: {sent:?}");
    }

    #[test]
    fn a_newer_barrier_releases_the_channel_held_for_an_abandoned_checkpoint() {
        let staging = tempfile::tempdir().expect("tempdir");
        let (runner, mut senders, reports) = aligning_subtask(staging.path());
        // Checkpoint 1 timed out upstream: one source sent its barrier, the other skipped
        // straight to checkpoint 2.
        senders[0].send(Message::Barrier(1)).expect("send");
        senders[1].send(Message::Barrier(2)).expect("send");
        senders[0].send(Message::Barrier(2)).expect("send");
        for sender in &mut senders {
            sender.send(Message::EndOfStream).expect("send");
        }
        let cancel = runner.cancel.clone();
        let (done, ended) = mpsc::channel();
        std::thread::spawn(move || done.send(runner.run().map_err(|e| e.to_string())));
        let outcome = ended.recv_timeout(Duration::from_secs(30));
        cancel.store(true, Ordering::SeqCst);
        assert_eq!(
            outcome.expect("the subtask stalled: a channel stayed blocked"),
            Ok(Ended::Finished),
            "it reads every channel to its end"
        );
        let taken: Vec<CheckpointId> = reports
            .try_iter()
            .filter_map(|r| match r {
                Report::Taken { id, .. } => Some(id),
                Report::Finished(_) => None,
            })
            .collect();
        assert_eq!(taken, [2], "checkpoint 2 aligned and was taken; 1 was abandoned");
    }
}
