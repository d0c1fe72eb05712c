//! What the task loop, the job's checkpoint thread and the parts of a spread job tell each other:
//! the signals a checkpoint is triggered and completed by, the reports subtasks send, the
//! messages between a job master and its parts, and the points a test may crash at. Both the
//! task loop (`task`) and the checkpoint threads (`checkpointing`, `checkpoint_parts`) import
//! this module; it imports neither, so neither side needs the other.

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use eddy_checkpoint::upload::TakenSnapshot;
use eddy_checkpoint::{CheckpointId, CheckpointStats, SubtaskState};
use serde::{Deserialize, Serialize};

/// Shared between the checkpoint thread, the subtasks and the job's owner.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    /// The newest checkpoint triggered; a source that has not handled it yet does.
    pub trigger: AtomicU64,
    /// When `trigger` was triggered, ms since the epoch (written before it; 0 = unknown): the
    /// aligned timeout counts from here.
    pub triggered_ms: AtomicI64,
    /// The newest completed checkpoint; sinks commit up to it.
    pub completed: AtomicU64,
    /// A savepoint asked for: the next checkpoint starts at once and is copied here.
    pub savepoint: Mutex<Option<SavepointRequest>>,
    /// A live swap of one step's code asked for: the next checkpoint carries it.
    pub swap: Mutex<Option<SwapRequest>>,
    /// In a part of a spread job: the code the job master's coming swap of a step goes to,
    /// compiled and probed here before the master arms it ([`MasterCommand::Trigger`]'s
    /// `swap` then arms `swap` from it).
    pub prepared_swap: Mutex<Option<PreparedSwap>>,
}

/// New code for one step, ready in a part before the checkpoint that carries its swap.
#[derive(Debug)]
pub(crate) struct PreparedSwap {
    pub step: String,
    pub component: Arc<eddy_runtime::Component>,
}

/// New code for one Wasm step, taken over at a checkpoint's barrier: each subtask of the step
/// snapshots, then goes on with `component` over the same state and timers, at its first
/// snapshot of checkpoint `checkpoint` or later (a later one subsumes an aborted one).
#[derive(Debug)]
pub(crate) struct SwapRequest {
    pub step: String,
    pub component: Arc<eddy_runtime::Component>,
    /// The checkpoint that carries the swap, once triggered.
    pub checkpoint: Option<CheckpointId>,
    /// Once a checkpoint at or after `checkpoint` completed: what it recorded of the swap.
    pub outcome: Option<SwapOutcome>,
}

/// A completed checkpoint that carries a live swap, as its metadata tells it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SwapOutcome {
    /// From this checkpoint on, the new code runs everywhere.
    pub checkpoint: CheckpointId,
    /// Subtasks of the step whose state goes on with the new code.
    pub subtasks: u32,
    /// The longest time one subtask spent opening the new code after its snapshot (what
    /// the swap added to the barrier's pause).
    pub longest_ms: f64,
}

/// A live swap that a job master's trigger carries to the other parts: each arms the code it
/// prepared for it ([`Signals::prepared_swap`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapOrder {
    /// The step.
    pub step: String,
    /// The new code's digest (hex sha256, as the checkpoint metadata names code).
    pub digest: String,
}

/// A pending savepoint and, once taken, its outcome.
#[derive(Debug)]
pub(crate) struct SavepointRequest {
    pub to: eddy_plan::StoreLocation,
    /// The forced checkpoint, once triggered.
    pub checkpoint: Option<CheckpointId>,
    pub outcome: Option<Result<CheckpointId, String>>,
}

/// What a subtask tells the checkpoint thread.
#[derive(Debug)]
pub(crate) enum Report {
    /// Its synchronous snapshot for checkpoint `id`.
    Taken { id: CheckpointId, snapshot: TakenSnapshot },
    /// It ended; its final snapshot stands for every later checkpoint.
    Finished(TakenSnapshot),
}

/// Commits the pre-committed files a sink state lists.
pub(crate) type SinkCommitter = Box<dyn Fn(&serde_json::Value) -> std::io::Result<()> + Send>;

/// Named points inside the checkpoint protocol, where a test's [`FaultHook`] may kill the
/// process on purpose so that crashes land inside a checkpoint, not only between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// A subtask's snapshot was written to the store; the checkpoint is not complete.
    AfterUpload,
    /// Every subtask acknowledged; the metadata (the commit point) is not written yet.
    BeforeMetadata,
    /// The metadata is written; the sink has not heard of the completion yet.
    AfterMetadata,
    /// The sink is about to commit a completed checkpoint's files.
    BeforeCommit,
}

/// Called at each [`FaultPoint`] (tests only; `None` in production).
pub type FaultHook = Arc<dyn Fn(FaultPoint) + Send + Sync>;

/// What a part tells the job master.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PartReport {
    /// A subtask's snapshot for checkpoint `id` is in the store.
    Acknowledged {
        /// The checkpoint.
        id: CheckpointId,
        /// The subtask's global participant number.
        participant: usize,
        /// Its part of the metadata.
        state: SubtaskState,
        /// Its phase durations and sizes.
        stats: CheckpointStats,
    },
    /// A subtask could not take its part of checkpoint `id`.
    Declined {
        /// The checkpoint.
        id: CheckpointId,
        /// The subtask's global participant number.
        participant: usize,
        /// Why.
        reason: String,
    },
    /// A subtask ended; its final snapshot is in the store and stands for every later checkpoint.
    Finished {
        /// The subtask's global participant number.
        participant: usize,
        /// Its final state.
        state: SubtaskState,
    },
}

/// What the job master tells every other part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MasterCommand {
    /// Checkpoint `id` is triggered (at `at_ms`, ms since the epoch): sources take it.
    Trigger {
        /// The checkpoint.
        id: CheckpointId,
        /// When it was triggered.
        at_ms: i64,
        /// A live swap not completed yet: the subtasks of its step go over to the prepared
        /// code at this barrier (or later, if this checkpoint does not complete).
        #[serde(default)]
        swap: Option<SwapOrder>,
    },
    /// Checkpoint `id` is complete: sinks commit up to it.
    Completed {
        /// The checkpoint.
        id: CheckpointId,
    },
    /// Every subtask finished, the final checkpoint `id` is written and the master committed
    /// every sink's final files: stop.
    Final {
        /// The final checkpoint.
        id: CheckpointId,
    },
}

/// The job master's end of the protocol.
pub struct MasterLink {
    /// Reports of the other parts, each with the name of the part that sent it (from its
    /// link, never from the report): the master takes a part's word for its own subtasks only.
    pub reports: Receiver<(String, PartReport)>,
    /// Sends a command to every other part.
    pub broadcast: Box<dyn Fn(MasterCommand) + Send>,
}

impl std::fmt::Debug for MasterLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterLink").finish_non_exhaustive()
    }
}

/// Another part's end of the protocol.
pub struct PartLink {
    /// The master's commands.
    pub commands: Receiver<MasterCommand>,
    /// Sends a report to the master.
    pub report: Box<dyn Fn(PartReport) + Send>,
}

impl std::fmt::Debug for PartLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartLink").finish_non_exhaustive()
    }
}

/// Which end of the checkpoint protocol this part of a spread job holds.
pub enum CheckpointRole {
    /// Coordinates the checkpoints of every part.
    Master(MasterLink),
    /// Follows the master.
    Part(PartLink),
}

impl std::fmt::Debug for CheckpointRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CheckpointRole::Master(_) => "CheckpointRole::Master",
            CheckpointRole::Part(_) => "CheckpointRole::Part",
        })
    }
}

/// In-process links between a master and `parts` other parts, named `part-0`, `part-1`, ...
/// (tests, and a spread job whose parts share a process).
pub fn local_links(parts: usize) -> (MasterLink, Vec<PartLink>) {
    let (report_tx, reports) = std::sync::mpsc::channel();
    let mut command_txs = Vec::new();
    let mut links = Vec::new();
    for i in 0..parts {
        let (tx, commands) = std::sync::mpsc::channel();
        command_txs.push(tx);
        let report_tx = report_tx.clone();
        let name = format!("part-{i}");
        links.push(PartLink {
            commands,
            report: Box::new(move |r| {
                let _ = report_tx.send((name.clone(), r));
            }),
        });
    }
    let broadcast = Box::new(move |c: MasterCommand| {
        for tx in &command_txs {
            let _ = tx.send(c.clone());
        }
    });
    (MasterLink { reports, broadcast }, links)
}

/// Wall-clock processing time in ms.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
