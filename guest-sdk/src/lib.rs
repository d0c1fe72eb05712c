//! # eddy-sdk: stream operators in Rust for Eddy
//!
//! An Eddy operator is a WebAssembly component built for `wasm32-wasip2` against the WIT
//! contract in `wit/dataflow.wit`. This crate hides the generated bindings behind typed
//! records (serde, JSON on the wire), typed keyed state and one macro per kind of export.
//!
//! A complete operator — the keyed counter of word count. Every record's key is a word; the
//! operator keeps a count per word in [`ValueState`] and emits the new count:
//!
//! ```no_run
//! use eddy_sdk::{Context, OpenContext, Operator, Record, Result, ValueState};
//!
//! struct WordCounter {
//!     count: ValueState<u64>,
//! }
//!
//! impl Operator for WordCounter {
//!     type Config = ();
//!
//!     fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
//!         Ok(WordCounter { count: ctx.value_state("count") })
//!     }
//!
//!     fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
//!         // String, not &str: a JSON key with escapes cannot be borrowed.
//!         let word: String = record.key()?;
//!         let count = self.count.get()?.unwrap_or(0) + 1;
//!         self.count.set(&count)?;
//!         ctx.emit(&word, &count)
//!     }
//! }
//!
//! eddy_sdk::export_operator!(WordCounter);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` in a `cdylib` crate; the
//! `.wasm` in `target/wasm32-wasip2/release/` is the component to upload. With `lto = true`
//! and `codegen-units = 1` in the crate's `[profile.release]` the operator runs ~15% faster
//! (serde and the SDK are inlined into it); Eddy's own examples are built that way. The examples in
//! `examples/` (word count, purchase totals, fraud detection) are complete crates.
//!
//! What to know:
//! - State handles ([`ValueState`], [`ListState`], [`MapState`]) are declared in `open` and
//!   always act on the key of the record or timer being handled; the host enforces that.
//! - Output is buffered and handed to the host once per batch.
//! - Return an [`Error`] for failures you understand; a panic traps the instance, and the
//!   host reports the operator name and the panic message and fails the task.
//! - For host-side windows implement [`Aggregate`] and use [`export_aggregate!`].
//!
//! ## Rows at the cost of their fields
//!
//! [`Record::value`] and [`Context::emit_value`] take any serde type. A struct whose fields
//! are numbers, `bool`, `String` or `Option` of them can also derive [`Row`]: [`Record::row`]
//! then reads it slot by slot by a layout resolved once per schema and [`Context::emit_row`]
//! writes it the same way, with the same results and bytes as the serde path at about half
//! the instructions per record (Nexmark q1: 2 324 to 1 083 WebAssembly instructions an event).
//!
//! ```no_run
//! use eddy_sdk::{Context, OpenContext, Operator, Record, Result, Row};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize, Row)]
//! struct Bid {
//!     auction: u64,
//!     price: u64,
//! }
//!
//! #[derive(Row)]
//! struct Euros {
//!     auction: u64,
//!     euros: u64,
//! }
//!
//! struct Convert;
//!
//! impl Operator for Convert {
//!     type Config = ();
//!
//!     fn open(_config: (), _ctx: &mut OpenContext) -> Result<Self> {
//!         Ok(Convert)
//!     }
//!
//!     fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
//!         // Read as `record.value()` would (JSON values and other shapes go through serde).
//!         let bid: Bid = record.row()?;
//!         ctx.emit_row(&Euros { auction: bid.auction, euros: bid.price * 908 / 1000 })
//!     }
//! }
//!
//! eddy_sdk::export_operator!(Convert);
//! ```
//!
//! A field of a type of your own joins the fast path by implementing [`row::Slot`]; an
//! [`Aggregate`] whose accumulator derives [`Row`] stores it the same way by overriding
//! `read_accumulator` with [`row::decode`] and `write_accumulator` with
//! [`RowWrite::write_row`] (the bytes are serde's, so nothing already stored changes).

// The code `#[derive(Row)]` generates names this crate `::eddy_sdk`, in its own tests too.
#[cfg(test)]
extern crate self as eddy_sdk;

mod aggregate;
mod bindings;
pub mod codec;
mod context;
mod error;
pub mod log;
mod operator;
mod record;
pub mod row;
mod state;

pub use aggregate::Aggregate;
pub use context::{Context, OpenContext, SideOutput};
pub use eddy_sdk_derive::Row;
pub use error::{Error, ErrorKind, Result};
pub use operator::Operator;
pub use record::{Record, TimeDomain, Timer};
pub use row::{RowRead, RowWrite};
pub use state::{ListState, MapState, ValueState};

/// The WIT imports as generated, for operators that manage bytes and key handles themselves
/// (and for tests of the host's enforcement). Prefer the typed API.
pub mod raw {
    pub use crate::bindings::{log, output, state, timers, types};
}

/// Used by the export macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::aggregate_world;
    pub use crate::bindings::aggregate_world::exports::eddy::dataflow::aggregate::{
        AccumulatorUpdates, Guest as AggregateGuest, PackedItems,
    };
    pub use crate::bindings::operator_world;
    pub use crate::bindings::operator_world::exports::eddy::dataflow::operator::Guest as OperatorGuest;
    pub use crate::bindings::types::{Batch, OperatorError, TimerBatch};
    pub use crate::row::support as row;
    pub mod operator {
        pub use crate::operator::{close, on_timer, open, process};
    }
    pub mod aggregate {
        pub use crate::aggregate::{add, create_accumulator, get_results, merge, open};
    }
}
