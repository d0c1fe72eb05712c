//! Checkpoints: consistent snapshots of a running job, so a failure loses nothing and counts
//! nothing twice.
//!
//! The protocol (Flink's aligned checkpoints): the [`CheckpointCoordinator`] triggers
//! checkpoint `n`; each source reader records its position, snapshots its chain and sends
//! barrier `n` downstream in-band; a task with several input channels holds back each channel
//! that delivered barrier `n` ([`BarrierHandler`]) until all have, then snapshots and forwards
//! the barrier. A snapshot's synchronous phase is tiny (a copy of heap state, a RocksDB native
//! checkpoint); the files are written by the job's checkpoint thread while records flow
//! ([`eddy_checkpoint::upload`]). When every subtask has acknowledged, the thread writes the
//! checkpoint's metadata ([`eddy_checkpoint::metadata`]) — the commit point — and tells the
//! sinks, which commit their transactions. On start, a job restores from the newest checkpoint
//! that passes its checks ([`eddy_checkpoint::restore`]). Storage lives in `eddy-checkpoint`;
//! this module is the protocol.
//!
//! In unaligned mode (`checkpoints.mode: unaligned`, or an aligned checkpoint past its
//! `aligned_timeout_ms`) a barrier overtakes the data queued in its channel, a task snapshots at
//! its first barrier, and the records in flight (overtaken, or arriving on an input before its
//! barrier) are stored with the snapshot and replayed on restore before new input
//! ([`unaligner`]).
//!
//! Protocol logic lives in the I/O-free state machines [`coordinator`] and [`unaligner`]; the rest is the shell around them.

pub mod coordinator;
pub mod unaligner;

pub use coordinator::{
    CheckpointCoordinator, CoordinatorConfig, Decision, Finished, From, Participant, Refused, Speaker,
};
pub use unaligner::{BarrierHandler, BarrierMode, Outcome};
