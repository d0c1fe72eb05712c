//! # eddy-engine: pipelines and how they run
//!
//! A pipeline spec (YAML) names sources, a chain of Wasm operator steps (keyed operators and
//! windows over aggregates) and a sink. [`PipelineSpec::from_yaml`] parses and validates it,
//! naming the field at fault.
//!
//! ```
//! use eddy_engine::PipelineSpec;
//!
//! let spec = PipelineSpec::from_yaml(r#"
//! name: demo
//! sources: [{ type: file, name: lines, path: input.txt }]
//! steps:
//!   - { name: split, wasm: split.wasm }
//! sink: { type: print }
//! "#)?;
//! assert_eq!(spec.steps[0].name, "split");
//!
//! let err = PipelineSpec::from_yaml("name: demo\nsteps: []\nsources: [{type: file, name: a, path: x}]\nsink: {type: print}").unwrap_err();
//! assert!(err.to_string().contains("steps"));
//! # Ok::<(), eddy_engine::SpecError>(())
//! ```

pub mod buffer;
pub mod channel;
pub mod connectors;
pub mod credit;
mod job;
pub mod metrics;
mod operator;
pub mod plan;
pub mod router;
mod sink;
mod spec;
mod task;
mod wasm_operator;
pub mod window;
pub mod window_operator;

pub use job::{Job, JobOptions, RunError, RunSummary};
pub use metrics::MetricsSnapshot;
pub use operator::{OperatorError, StreamOperator};
pub use plan::PhysicalPlan;
pub use sink::{Blackhole, JsonLinesSink, PrintSink, Sink};
pub use spec::{
    GeneratorSpec, KeyBy, PipelineSpec, SinkSpec, SourceFormat, SourceSpec, SpecError, StepSpec, WatermarkSpec,
    WindowSpec, WindowType,
};
pub use task::TaskError;
