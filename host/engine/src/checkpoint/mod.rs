//! Checkpoints: consistent snapshots of a running job, so a failure loses nothing and counts
//! nothing twice.
//!
//! The protocol (Flink's aligned checkpoints): the [`CheckpointCoordinator`] triggers
//! checkpoint `n`; each source reader records its position, snapshots its chain and sends
//! barrier `n` downstream in-band; a task with several input channels holds back each channel
//! that delivered barrier `n` ([`BarrierHandler`]) until all have, then snapshots and forwards
//! the barrier. A snapshot's synchronous phase is tiny (a copy of heap state, a RocksDB native
//! checkpoint); the files are written by the job's checkpoint thread while records flow
//! ([`upload`]). When every subtask has acknowledged, the thread writes the checkpoint's
//! metadata ([`metadata`]) — the commit point — and tells the sinks, which commit their
//! transactions. On start, a job restores from the newest checkpoint that passes its checks
//! ([`restore`]).
//!
//! In unaligned mode (`checkpoints.mode: unaligned`, or an aligned checkpoint past its
//! `aligned_timeout_ms`) a barrier overtakes the data queued in its channel, a task snapshots at
//! its first barrier, and the records in flight (overtaken, or arriving on an input before its
//! barrier) are stored with the snapshot and replayed on restore before new input
//! ([`unaligner`]).
//!
//! Protocol logic lives in the I/O-free state machines [`coordinator`] and [`unaligner`]; the rest is the shell around them.

pub mod coordinator;
pub mod format;
pub mod metadata;
pub mod recovery;
pub mod restore;
pub mod savepoint;
pub mod store;
pub mod unaligner;
pub mod upload;

pub use coordinator::{
    CheckpointCoordinator, CheckpointId, CoordinatorConfig, Decision, Finished, From, Participant, Refused, Speaker,
};
pub use metadata::{CheckpointMetadata, CheckpointStats, SubtaskState};
pub use restore::RestorePoint;
pub use store::CheckpointStore;
pub use unaligner::{BarrierHandler, BarrierMode, Outcome};

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The store could not be read or written just now (permissions, network, a full disk):
    /// the files may well be intact, so this is never taken for damage; a retry may help.
    #[error("checkpoint storage: {what}: {problem}")]
    Storage {
        /// What was being done.
        what: String,
        /// The cause.
        problem: String,
    },
    /// A file is torn, truncated, missing or damaged: reading it again will not help, and
    /// restore falls back to an older checkpoint.
    #[error("checkpoint file {file} is damaged: {problem}")]
    Corrupt {
        /// The file.
        file: String,
        /// What is wrong.
        problem: String,
    },
    /// The checkpoint does not fit the pipeline being restored.
    #[error("cannot restore: {0}")]
    Incompatible(String),
}
