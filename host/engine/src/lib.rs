//! # eddy-engine: pipelines and how they run
//!
//! The pipeline spec and the planner live in `eddy-plan` ([`eddy_plan::PipelineSpec`],
//! [`eddy_plan::PhysicalPlan`], with the crate's example of parsing and planning). [`Job`] runs
//! a spec's plan on the embedded default: one thread per subtask, local channels with
//! credit-based flow control, heap state. Running needs the components:
//! `Job::start(&spec, &runtime, JobOptions::default())?.wait()?` (see `eddy run` in `host/cli`).
//!
//! With a `checkpoints:` section the job takes aligned checkpoints ([`checkpoint`]): sources
//! record their positions and send barriers, tasks align them and snapshot their state (heap or
//! RocksDB, `state:`), a checkpoint thread writes the files and the metadata, and sinks commit
//! ([`FilesSink`]) or upsert idempotently ([`UpsertSink`]). [`Job::start`] resumes from the
//! newest valid checkpoint; [`Job::run_with_restarts`] restarts failed jobs under the spec's
//! `restart:` strategy; [`Job::stop_with_savepoint`] and [`JobOptions::restore_from`] move a job
//! to a new version or parallelism.

pub mod buffer;
pub mod checkpoint;
mod checkpoint_parts;
mod checkpointing;
pub mod connectors;
mod files_sink;
mod job;
pub mod metrics;
mod operator;
pub mod router;
mod sink;
mod task;
mod upsert_sink;
pub mod values;
mod wasm_operator;
pub mod window_operator;

pub use checkpoint_parts::{CheckpointRole, MasterCommand, MasterLink, PartLink, PartReport, local_links};
pub use checkpointing::{CompletedCheckpoint, FaultHook, FaultPoint, PARTS_LINK_CLOSED};
pub use files_sink::{FilesSink, FilesSinkState, LocalDir, OutputDir, StoreDir};
pub use job::{Job, JobOptions, Placement, RunError, RunSummary, SinkFactory, files_output};
pub use metrics::MetricsSnapshot;
pub use operator::{OperatorError, OperatorSnapshot, StreamOperator};
pub use sink::{Blackhole, JsonLinesSink, PrintSink, Sink};
pub use task::TaskError;
pub use upsert_sink::UpsertSink;
