//! One subtask: a thread running a mailbox loop over its chain.
//!
//! The head is a source reader or an input gate; the operators are called in chain order by
//! plain function calls; the tail is an exchange ([`OutputRouter`]) or the sink. The loop takes
//! one thing at a time: a batch of records, a watermark, end of input, or the periodic tick
//! (processing-time timers, idleness, buffer timeouts) — so an operator never runs
//! concurrently with itself and needs no locks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eddy_core::{BoundedOutOfOrderness, RecordBatch, WatermarkTracker};
use eddy_runtime::Output;
use eddy_state::TtlClock;

use crate::channel::{InputGate, Message};
use crate::connectors::{Source, SourceError, SourceStatus};
use crate::metrics::SubtaskMetrics;
use crate::operator::{OperatorError, StreamOperator};
use crate::router::{OutputRouter, RouteError};
use crate::sink::Sink;

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
    Sink(std::io::Error),
}

/// Where the chain's records enter.
pub(crate) enum Head {
    /// A source reader with its watermark generator.
    Source {
        source: Box<dyn Source>,
        watermarks: BoundedOutOfOrderness,
        batch_size: usize,
        /// Reused for every read, so the hot loop does not allocate a batch per poll.
        buffer: RecordBatch,
    },
    /// Input channels from upstream tasks.
    Input { gate: Box<dyn InputGate>, tracker: WatermarkTracker, ended: Vec<bool> },
}

/// Where the chain's records leave.
pub(crate) enum Tail {
    /// Towards the next task.
    Exchange(OutputRouter),
    /// Into the sink (the last task).
    Sink(Box<dyn Sink>),
}

impl Tail {
    fn main(&mut self, batch: &RecordBatch, now_ms: i64) -> Result<(), TaskError> {
        match self {
            Tail::Exchange(router) => Ok(router.emit(batch, now_ms)?),
            Tail::Sink(sink) if !batch.is_empty() => sink.write(None, batch).map_err(TaskError::Sink),
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

/// Wall-clock processing time in ms.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
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
    pub(crate) tail: Tail,
    pub(crate) metrics: Arc<SubtaskMetrics>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) ttl_clock: TtlClock,
    pub(crate) tick: Duration,
    pub(crate) watermark: i64,
}

impl SubtaskRunner {
    /// Runs until the input ends, the job is cancelled or something fails.
    pub(crate) fn run(mut self) -> Result<Ended, TaskError> {
        let result = self.run_loop();
        match result {
            // A closed channel during cancellation is the cancellation, not a failure.
            Err(TaskError::Route(RouteError::Disconnected(_))) if self.cancelled() => Ok(Ended::Cancelled),
            other => other,
        }
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
        let Head::Source { watermarks, .. } = &mut self.head else { return Ok(false) };
        match status? {
            SourceStatus::End => Ok(true),
            SourceStatus::Idle => {
                std::thread::sleep(idle_wait.min(Duration::from_millis(5)));
                Ok(false)
            }
            SourceStatus::Ready => {
                for r in batch.iter() {
                    if let Some(t) = r.timestamp {
                        watermarks.on_event(t);
                    }
                }
                let watermark = watermarks.current();
                SubtaskMetrics::add(&self.metrics.records_in, batch.len());
                self.process(0, batch)?;
                if watermark > self.watermark {
                    self.advance_watermark(watermark)?;
                }
                Ok(false)
            }
        }
    }

    /// Takes one message from the input gate. Returns whether every input ended.
    fn poll_input(&mut self, wait: Duration) -> Result<bool, TaskError> {
        let Head::Input { gate, tracker, ended } = &mut self.head else { return Ok(false) };
        let Some((channel, message)) = gate.recv(wait).map_err(RouteError::from)? else { return Ok(false) };
        let now = now_ms();
        match message {
            Message::Data { side: None, batch } => {
                let advanced = tracker.on_record(channel, now);
                SubtaskMetrics::add(&self.metrics.records_in, batch.len());
                self.process(0, &batch)?;
                if let Some(w) = advanced {
                    self.advance_watermark(w)?;
                }
            }
            Message::Data { side: Some(name), batch } => {
                SubtaskMetrics::add(&self.metrics.records_in, batch.len());
                SubtaskMetrics::add(&self.metrics.records_out, batch.len());
                self.tail.side(&name, batch)?;
            }
            Message::Watermark(w) => {
                if let Some(w) = tracker.on_watermark(channel, w, now) {
                    self.advance_watermark(w)?;
                }
            }
            // Alignment and snapshots come with checkpoints; until then barriers pass through.
            Message::Barrier(n) => self.tail.event(Message::Barrier(n))?,
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
                return Ok(all_ended);
            }
        }
        Ok(false)
    }

    fn on_tick(&mut self) -> Result<(), TaskError> {
        let now = now_ms();
        self.ttl_clock.set(now);
        if let Head::Input { tracker, .. } = &mut self.head
            && let Some(w) = tracker.on_tick(now)
        {
            self.advance_watermark(w)?;
        }
        for i in 0..self.operators.len() {
            let out = self.operators[i].on_processing_time(now)?;
            self.forward(i, out)?;
        }
        self.tail.tick(now)
    }

    /// Feeds `batch` to operator `from` and everything after it.
    fn process(&mut self, from: usize, batch: &RecordBatch) -> Result<(), TaskError> {
        if batch.is_empty() {
            return Ok(());
        }
        match self.operators.get_mut(from) {
            Some(op) => {
                let out = op.process(batch)?;
                let late: u64 = self.operators.iter().map(|o| o.late_records()).sum();
                self.metrics.late_records.store(late, Ordering::Relaxed);
                self.forward(from, out)
            }
            None => {
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
        self.process(at + 1, &out.main)
    }

    /// Fires event time up to `watermark` through the chain in order, then passes it on.
    fn advance_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        for i in 0..self.operators.len() {
            let out = self.operators[i].on_watermark(watermark)?;
            self.forward(i, out)?;
        }
        self.metrics.watermark.store(watermark, Ordering::Relaxed);
        self.tail.event(Message::Watermark(watermark))
    }

    /// End of input: event time jumps to the end (firing every window and timer), each operator
    /// finishes in chain order, and end-of-stream goes downstream.
    fn finish(&mut self) -> Result<(), TaskError> {
        self.advance_watermark(i64::MAX)?;
        for i in 0..self.operators.len() {
            let out = self.operators[i].finish()?;
            self.forward(i, out)?;
        }
        self.tail.event(Message::EndOfStream)
    }
}
