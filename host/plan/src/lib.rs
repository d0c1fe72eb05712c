//! # eddy-plan: pipeline specs and their physical plans
//!
//! A pipeline spec (YAML) names sources, steps (keyed Wasm operators, or windows over a Wasm
//! aggregate) and a sink. [`PipelineSpec::from_yaml`] parses and validates it, naming the field
//! at fault; [`PhysicalPlan`] chains steps joined by forward edges into tasks and puts
//! exchanges at `key_by` and parallelism changes. [`window`] holds the window assigners a
//! window step names.
//!
//! A spec may come from a hostile tenant, so before any value is built its text is walked
//! once with the YAML parser's own event stream and refused at the first anchor, alias or
//! merge key, or past the size, nesting and node limits of `eddy_core::limits`
//! ([`SpecError::Refused`], naming line and column): refusing a spec costs no more than its
//! text. Names are identifiers, as they become metric labels and log fields.
//!
//! Pure: no Wasm runtime, no state backend, no network; the only I/O is
//! [`PipelineSpec::from_file`] reading the spec. So a server can parse, validate and plan a
//! submitted pipeline without linking the engine that runs it (`eddy-engine`).
//!
//! ```
//! use eddy_plan::{PhysicalPlan, PipelineSpec};
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
//! # Ok::<(), eddy_plan::SpecError>(())
//! ```
//!
//! Running it needs the components and the engine:
//! `eddy_engine::Job::start(&spec, &runtime, JobOptions::default())?.wait()?` (see `eddy run`
//! in `host/cli`).

mod plan;
mod spec;
pub mod window;
pub mod window_state;
mod yaml_guard;

pub use plan::{EdgePlan, Node, Partitioning, PhysicalPlan, TaskPlan};
pub use spec::{
    CheckpointMode, CheckpointSpec, ColumnSource, ColumnSpec, DEFAULT_JOURNAL_MAX_MB, DebugSpec, GeneratorSpec,
    JournalCompression, KafkaDelivery, KafkaEnd, KafkaFormat, KafkaSinkFormat, KafkaSinkSpec, KafkaSourceSpec,
    KafkaStart, KeyBy, MAX_ADDRESS_BYTES, MAX_CONNECTION_NAME_BYTES, MAX_PROPERTIES, MAX_PROPERTY_VALUE_BYTES,
    NexmarkSourceSpec, OnDecodeError, PipelineSpec, PostgresMode, PostgresSinkSpec, PropertyValue, RestartSpec, S3Spec,
    SECRET_PROPERTIES, SinkSpec, SourceFormat, SourceSpec, SpecError, SqlType, StateBackendKind, StateSpec, StepSpec,
    StoreLocation, WatermarkSpec, WindowSpec, WindowType, check_connection_name, check_name, check_postgres_url,
};
