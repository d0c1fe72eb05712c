//! # eddy-connectors: where records come from and where they go
//!
//! Every source and sink of Eddy, behind two traits a connector author reads without the task
//! loop: [`Source`] (a reader of one split of an input, whose [`SourcePosition`] a checkpoint
//! records) and [`Sink`] (a writer that takes part in checkpoints as a two-phase commit when it
//! is exactly-once). Their contracts are written on the traits.
//!
//! Sources: a file (lines, CSV or JSON, followed or not, local or in an S3 bucket), the
//! deterministic generator and the Nexmark generator ([`open_source`]). Sinks: print, JSON
//! lines, blackhole, Kafka, the exactly-once [`FilesSink`] and `PostgresSink`, and the
//! idempotent [`UpsertSink`]. Kafka and PostgreSQL sit behind the `kafka` and `postgres`
//! features (both on by default).
//!
//! ```
//! use eddy_connectors::{Blackhole, Sink, SourceStatus, open_source};
//! use eddy_core::RecordBatch;
//! use eddy_plan::PipelineSpec;
//!
//! let spec = PipelineSpec::from_yaml(
//!     "name: g\nsources: [{type: generator, name: g, events: 4}]\n\
//!      steps: [{name: a, wasm: a.wasm}]\nsink: {type: blackhole}",
//! )?;
//! let mut reader = open_source(&spec.sources[0], 0, 1, None)?;
//! let mut sink = Blackhole;
//! let mut batch = RecordBatch::default();
//! while reader.poll(&mut batch, 2)? != SourceStatus::End {
//!     sink.write(None, &batch)?;
//!     batch.clear();
//! }
//! sink.finish()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod json_pointer;
pub mod sink;
pub mod source;
pub mod values;

pub use sink::{
    Blackhole, FilesSink, FilesSinkState, JsonLinesSink, LocalDir, OutputDir, PrintSink, Sink, StoreDir, UpsertSink,
};
#[cfg(feature = "kafka")]
pub use sink::{KafkaSink, KafkaSinkState};
#[cfg(feature = "postgres")]
pub use sink::{PostgresSink, PostgresSinkState};
pub use source::{Source, SourceError, SourcePosition, SourceStatus, generator_event, open_source};

/// The error of a connector whose spec still names a `connection`: connections are named in
/// the service (`eddy serve`, `eddy coordinator`), which resolves them when it places a job.
#[cfg(any(feature = "kafka", feature = "postgres"))]
pub(crate) fn unresolved_connection(what: &str, name: &str) -> String {
    format!(
        "{what}: `connection: {name}` names a connection of the service (PUT /v1/connections/{name}); \
         `eddy run` has none: give the brokers or URL in the spec"
    )
}
