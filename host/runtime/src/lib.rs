//! # eddy-runtime: operators in a WebAssembly sandbox
//!
//! Loads `.wasm` components that implement `wit/dataflow.wit`, validates them (a core module,
//! garbage, a component of another world and a component with missing exports each get a
//! clear [`LoadError`]), compiles each digest once (artifacts cached on disk, authenticated),
//! and instantiates one sandboxed instance per operator subtask. Instances reach keyed state
//! through a [`eddy_state::StateBackend`] and timers through an [`eddy_core::TimerService`],
//! both scoped to the keys of the current call.
//!
//! The sandbox: no WASI files, network, environment or clocks unless granted ([`WasiGrants`]);
//! a memory cap per instance; a wall-clock deadline per call (epoch interruption); optional
//! fuel; size limits on keys, values and output ([`SandboxLimits`]). Whatever a guest does, the
//! host gets a [`CallError`] naming the operator, the call and the guest's last message.
//!
//! Per-record tables cross the boundary as packed bytes (`eddy-wire`), and every record
//! carries its key slot, so a batched call costs ~1.2-1.4x the same logic in native Rust
//! (`cargo bench -p eddy-runtime --bench sandbox`). To see guest functions by name in `perf`,
//! run with `EDDY_WASM_PERFMAP=1` (the engine then writes `/tmp/perf-<pid>.map`).
//!
//! ```
//! use eddy_runtime::{LoadError, Runtime, RuntimeConfig};
//!
//! let runtime = Runtime::new(RuntimeConfig::default())?;
//! // Anything that is not an Eddy component is rejected with a reason.
//! let err = runtime.load("demo", b"print('hello')").unwrap_err();
//! assert!(matches!(err, LoadError::NotWasm));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With a real operator (see `examples/`):
//!
//! ```no_run
//! use eddy_core::{HeapTimerService, RecordBatch};
//! use eddy_runtime::{Runtime, RuntimeConfig, Subtask};
//! use eddy_state::HeapStateBackend;
//!
//! let runtime = Runtime::new(RuntimeConfig::default())?;
//! let counter = runtime.load_file("count", "wordcount_count.wasm".as_ref())?;
//! let mut instance = counter.instantiate_operator(
//!     Subtask::single(128),
//!     Box::new(HeapStateBackend::default()),
//!     Box::new(HeapTimerService::default()),
//! )?;
//! instance.open("null")?;
//! let mut batch = RecordBatch::default();
//! batch.push(Some(br#""hello""#), b"1", None);
//! let output = instance.process(&batch)?;
//! assert_eq!(output.main.get(0).map(|r| r.value), Some(&b"1"[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bindings;
mod cache;
mod call;
mod config;
mod cpu;
mod error;
mod guest_log;
mod instance;
mod items;
mod keyed;
mod output_import;
mod runtime;
mod sandbox;
mod schemas;
mod slots;
mod validate;

pub use cache::{CacheOutcome, digest_of};
pub use config::{InstanceAllocation, RuntimeConfig, SandboxLimits, WasiGrants, default_host_key_path};
pub use cpu::{Bucket, CpuShare, thread_cpu_time};
pub use eddy_wire::TableError;
pub use error::{CallError, CallErrorKind, Fault, GuestErrorKind, LoadError, RuntimeError, Violation};
pub use guest_log::LogStats;
pub use instance::{AccumulatorUpdate, AggregateInstance, OperatorInstance};
pub use items::Items;
pub use keyed::Output;
pub use runtime::{Component, Runtime, Subtask};
pub use sandbox::MAX_NOTED_SCHEMAS;
pub use schemas::{SchemaError, SchemaRegistry, schemas};
pub use validate::{AGGREGATE_EXPORT, OPERATOR_EXPORT, World};
