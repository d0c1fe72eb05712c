//! # eddy-engine: pipelines and how they run
//!
//! The pipeline spec and the planner live in `eddy-plan` ([`eddy_plan::PipelineSpec`],
//! [`eddy_plan::PhysicalPlan`], with the crate's example of parsing and planning). [`Job`] runs
//! a spec's plan on the embedded default: one thread per subtask, local channels with
//! credit-based flow control, heap state. Running needs the components:
//! `Job::start(&spec, &runtime, JobOptions::default())?.wait()?` (see `eddy run` in `host/cli`).
//! Its sources and sinks come from `eddy-connectors`, its checkpoint storage from
//! `eddy-checkpoint`; this crate is the task loop, the operators and windows, and the checkpoint
//! protocol that ties them together.
//!
//! With a `checkpoints:` section the job takes aligned checkpoints ([`checkpoint`]): sources
//! record their positions and send barriers, tasks align them and snapshot their state (heap or
//! RocksDB, `state:`), a checkpoint thread writes the files and the metadata, and sinks commit
//! (`eddy_connectors::FilesSink`) or upsert idempotently (`eddy_connectors::UpsertSink`).
//! [`Job::start`] resumes from the newest valid checkpoint; [`Job::run_with_restarts`] restarts
//! failed jobs under the spec's `restart:` strategy; [`Job::stop_with_savepoint`] and
//! [`JobOptions::restore_from`] move a job to a new version or parallelism. A step with
//! `debug: {journal: true}` records its input ([`journal`]), and [`replay::replay`] runs one of
//! its subtasks again from a checkpoint over it, tracing what the operator did.

pub mod buffer;
pub mod checkpoint;
mod checkpoint_history;
mod checkpoint_parts;
mod checkpointing;
mod failure;
mod job;
pub mod journal;
mod messages;
pub mod metrics;
mod operator;
pub mod replay;
pub mod router;
mod task;
mod wasm_operator;
pub mod window_operator;

pub use checkpoint_history::{CompletedCheckpoint, HISTORY_KEPT, SubtaskStateBytes};
pub use checkpointing::PARTS_LINK_CLOSED;
pub use failure::{FailureDetail, MAX_CAUSE_BYTES, MAX_CAUSES, MAX_MESSAGE_BYTES};
pub use job::{
    Job, JobOptions, Placement, PrepareParts, RunError, RunSummary, SinkFactory, SourceEntry, SourceObserver, SwapDone,
    SwapError, files_output,
};
pub use messages::{
    CheckpointRole, FaultHook, FaultPoint, MasterCommand, MasterLink, PartLink, PartReport, SwapOrder, local_links,
};
pub use metrics::{MetricsSnapshot, SubtaskSnapshot, TaskSnapshot};
pub use operator::{OperatorError, StreamOperator};
pub use task::TaskError;
