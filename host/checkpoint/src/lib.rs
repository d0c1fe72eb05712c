//! # eddy-checkpoint: where checkpoints live and how they are read back
//!
//! Checkpoint storage, without the task loop: the [`CheckpointStore`] (a local directory or an
//! S3 bucket through `object_store`), the sealed file [`format`], the [`metadata`] that commits
//! a checkpoint, the [`upload`] of a subtask's snapshot (the asynchronous phase, incremental for
//! RocksDB), the [`restore`] of a checkpoint into state backends, [`recovery`] (which
//! checkpoint to resume from and what to skip) and [`savepoint`]s. The engine (`eddy-engine`)
//! runs the checkpoint protocol over it; the service and `eddy state` read checkpoints with it
//! alone.
//!
//! A checkpoint directory `chk-N/` holds the subtasks' files and, last, `_metadata`: a
//! checkpoint without valid metadata never happened. Files a checkpoint shares with later
//! ones (RocksDB SSTs) live once under `shared/`, named by their content hash.
//!
//! ```
//! use eddy_checkpoint::{CheckpointStore, metadata};
//!
//! let dir = tempfile::tempdir()?;
//! let store = CheckpointStore::local(dir.path())?;
//! // A fresh store holds no checkpoint to resume from.
//! assert!(metadata::completed_ids(&store)?.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod format;
pub mod inspect;
pub mod metadata;
pub mod recovery;
pub mod restore;
pub mod savepoint;
pub mod store;
pub mod upload;

use eddy_core::FiredTimer;
use eddy_state::{BackendSnapshot, StateUsage};
use serde::{Deserialize, Serialize};

pub use metadata::{CheckpointMetadata, CheckpointStats, SubtaskState};
pub use restore::RestorePoint;
pub use store::CheckpointStore;

/// Identifies a checkpoint; increases by one per trigger, across restarts of a job.
pub type CheckpointId = u64;

/// Where a source reader is in its input; recorded in checkpoints, so it is serializable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourcePosition {
    /// A file reader: the lines consumed so far (a CSV header included) and the byte offset
    /// just after them.
    File {
        /// Lines consumed, counting skipped empty lines and a CSV header.
        line: u64,
        /// Byte offset just after the last consumed line.
        byte: u64,
    },
    /// A generator (or Nexmark) reader: the next event index it will produce.
    Generator {
        /// The index of the next event (congruent to the reader's subtask modulo parallelism).
        next_index: u64,
    },
    /// A Kafka reader: where it is in each partition it owns. Partitions are splits, so a
    /// restore at another source parallelism hands every reader the union of these (see
    /// [`RestorePoint::source_position`]) and each takes the partitions it owns now.
    Kafka {
        /// One entry per owned partition.
        partitions: Vec<KafkaPartition>,
    },
}

/// A Kafka partition's place in a reader's position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset of the next record to read: one after the last record returned.
    pub next_offset: i64,
    /// A bounded source (`end: at_start`) stops before this offset, fixed when the job first
    /// started, so a restore reads to the same end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_offset: Option<i64>,
}

/// What an operator's snapshot took (the synchronous phase of a checkpoint), to be uploaded.
#[derive(Debug)]
pub struct OperatorSnapshot {
    /// Pending timers (operators that rebuild their timers from state leave this empty).
    pub timers: Vec<FiredTimer>,
    /// The state backend's picture.
    pub state: BackendSnapshot,
    /// What the state quota counted in that picture ([`eddy_state::StateBackend::usage`]).
    pub usage: Option<StateUsage>,
    /// The states the operator declared, so a reader of the snapshot can name and decode
    /// its entries ([`inspect`]).
    pub states: Vec<eddy_state::DeclaredState>,
    /// The row schemas the operator declared, so its row values read by field name.
    pub schemas: Vec<eddy_wire::schema::Schema>,
    /// The digest of the code that goes on from this state: after a live swap at this
    /// checkpoint's barrier, the new artifact's (`None` for host operators).
    pub artifact: Option<String>,
    /// The operator reads partial accumulators (a two-phase window), not records: what was in
    /// flight into it at an unaligned checkpoint can only go on into the same kind of input.
    pub partial_input: bool,
}

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
