//! # eddy-engine: pipelines and how they run
//!
//! A pipeline spec (YAML) names sources, steps (keyed Wasm operators, or windows over a Wasm
//! aggregate) and a sink. [`PipelineSpec::from_yaml`] parses and validates it, naming the field
//! at fault; [`PhysicalPlan`] chains steps joined by forward edges into tasks and puts
//! exchanges at `key_by` and parallelism changes; [`Job`] runs the plan on the embedded default:
//! one thread per subtask, local channels with credit-based flow control, heap state.
//!
//! ```
//! use eddy_engine::{PhysicalPlan, PipelineSpec};
//!
//! let spec = PipelineSpec::from_yaml(r#"
//! name: demo
//! sources: [{ type: file, name: lines, path: input.txt }]
//! steps:
//!   - { name: split, wasm: split.wasm }
//!   - { name: count, wasm: count.wasm, key_by: key, parallelism: 2 }
//! sink: { type: print }
//! "#)?;
//! let plan = PhysicalPlan::new(&spec);
//! assert_eq!(plan.task_label(0), "source:lines -> split");   // chained: forward edge
//! assert_eq!(plan.edges[0].partitioning.to_string(), "hash(key)");
//! assert!(plan.to_string().contains("subtask 1: key groups 64..=127"));
//!
//! let err = PipelineSpec::from_yaml("name: demo\nsteps: []\nsources: [{type: file, name: a, path: x}]\nsink: {type: print}").unwrap_err();
//! assert!(err.to_string().contains("steps"));
//! # Ok::<(), eddy_engine::SpecError>(())
//! ```
//!
//! Running it needs the components: `Job::start(&spec, &runtime, JobOptions::default())?.wait()?`
//! (see `eddy run` in `host/cli`).
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
mod checkpointing;
pub mod connectors;
mod files_sink;
mod job;
pub mod metrics;
mod operator;
pub mod plan;
pub mod router;
mod sink;
mod spec;
mod task;
mod upsert_sink;
pub mod values;
mod wasm_operator;
pub mod window;
pub mod window_operator;

pub use checkpointing::{CompletedCheckpoint, FaultHook, FaultPoint};
pub use files_sink::{FilesSink, FilesSinkState};
pub use job::{Job, JobOptions, RunError, RunSummary, SinkFactory};
pub use metrics::MetricsSnapshot;
pub use operator::{OperatorError, OperatorSnapshot, StreamOperator};
pub use plan::PhysicalPlan;
pub use sink::{Blackhole, JsonLinesSink, PrintSink, Sink};
pub use spec::{
    CheckpointSpec, GeneratorSpec, KeyBy, NexmarkSourceSpec, PipelineSpec, RestartSpec, S3Spec, SinkSpec, SourceFormat,
    SourceSpec, SpecError, StateBackendKind, StateSpec, StepSpec, WatermarkSpec, WindowSpec, WindowType,
};
pub use task::TaskError;
pub use upsert_sink::UpsertSink;
