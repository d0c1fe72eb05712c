//! # eddy-engine: pipelines and how they run
//!
//! A pipeline spec (YAML) names a source, a chain of Wasm operator steps and a sink.
//! [`PipelineSpec::from_yaml`] parses and validates it, naming the field at fault;
//! [`ChainRunner`] runs it in one thread on the embedded runtime: records flow from the source
//! in batches through each step in order, and the last step's output goes to the sink.
//!
//! Scope today: a linear chain at parallelism 1 (every key group on one subtask), heap state;
//! and the I/O-free channel protocol pieces the parallel engine is being built from:
//! [`credit`] (credit-based flow control), [`buffer`] (size/timeout flushing) and [`window`]
//! (tumbling, sliding and merging session windows).
//!
//! ```
//! use eddy_engine::PipelineSpec;
//!
//! let spec = PipelineSpec::from_yaml(r#"
//! name: demo
//! source: { type: file, path: input.txt }
//! steps:
//!   - { name: split, wasm: split.wasm }
//! sink: { type: print }
//! "#)?;
//! assert_eq!(spec.steps[0].name, "split");
//!
//! let err = PipelineSpec::from_yaml("name: demo\nsteps: []\nsource: {type: file, path: x}\nsink: {type: print}").unwrap_err();
//! assert!(err.to_string().contains("steps"));
//! # Ok::<(), eddy_engine::SpecError>(())
//! ```

pub mod buffer;
mod chain;
pub mod credit;
mod spec;
pub mod window;

pub use chain::{Blackhole, ChainRunner, JsonLinesSink, PrintSink, RunError, RunSummary, Sink, StepCounts};
pub use spec::{PipelineSpec, SinkSpec, SourceFormat, SourceSpec, SpecError, StepSpec};
