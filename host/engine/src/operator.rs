//! The host-side operator contract every step of a chain implements: Wasm keyed operators
//! ([`crate::wasm_operator`]) and host window operators ([`crate::window_operator`]).
//!
//! A task drives its chain through this trait only: records in, watermark and processing-time
//! progress, end of input. Every call returns what the operator emitted; the task forwards the
//! main output to the next operator of the chain and side outputs to the sink.

use std::path::Path;

use eddy_checkpoint::OperatorSnapshot;
use eddy_core::RecordBatch;
use eddy_runtime::{CallError, Component, Output};
use eddy_state::StateError;

/// Why an operator failed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The sandboxed guest failed (trap, limit, operator error).
    #[error(transparent)]
    Call(#[from] CallError),
    /// A record cannot be processed by this operator (for example a window step got a record
    /// without event time); names the operator and what is wrong.
    #[error("operator `{operator}`: {problem}")]
    BadRecord {
        /// The operator.
        operator: String,
        /// What is wrong with the record and what would fix it.
        problem: String,
    },
    /// New code could not take over at a live swap (it trapped in `open`, or this operator
    /// has no code to swap); the subtask fails, so the job restores its previous checkpoint
    /// with the old code.
    #[error("operator `{operator}`: the live swap failed: {problem}")]
    Swap {
        /// The operator.
        operator: String,
        /// What went wrong.
        problem: String,
    },
    /// State storage failed or holds damaged entries.
    #[error("operator `{operator}` state: {source}")]
    State {
        /// The operator.
        operator: String,
        /// The cause.
        source: StateError,
    },
}

/// One operator of a chain, owned by one subtask thread.
pub trait StreamOperator: Send {
    /// The step name (for errors, logs and metrics).
    fn name(&self) -> &str;
    /// Processes a batch of records.
    fn process(&mut self, batch: &RecordBatch) -> Result<Output, OperatorError>;
    /// The subtask's input watermark advanced to `watermark`: fire event-time timers and
    /// windows up to it.
    fn on_watermark(&mut self, watermark: i64) -> Result<Output, OperatorError>;
    /// Processing time advanced to `now_ms`: fire processing-time timers up to it.
    fn on_processing_time(&mut self, now_ms: i64) -> Result<Output, OperatorError>;
    /// End of a bounded input (after the final watermark): emit whatever is pending.
    fn finish(&mut self) -> Result<Output, OperatorError>;
    /// Records that arrived too late for any window and went to the late output or were
    /// dropped (0 for operators without windows).
    fn late_records(&self) -> u64 {
        0
    }
    /// Linear memory its Wasm instance holds now (0 for operators without one).
    fn wasm_memory_bytes(&mut self) -> u64 {
        0
    }
    /// The synchronous phase of a checkpoint: the operator's state and timers as of now.
    /// `staging` is a fresh directory for disk backends.
    fn snapshot(&mut self, staging: &Path) -> Result<OperatorSnapshot, OperatorError>;
    /// The next batch [`StreamOperator::process`] gets came over input channel `channel` (told
    /// to the first operator of a chain behind an exchange, for its input journal).
    fn input_channel(&mut self, channel: u32) {
        let _ = channel;
    }
    /// Called after the chain's snapshot for checkpoint `checkpoint` (and a live swap at it):
    /// what the operator sees from here on comes after that checkpoint.
    fn after_snapshot(&mut self, checkpoint: u64) -> Result<(), OperatorError> {
        let _ = checkpoint;
        Ok(())
    }
    /// The keyed states it declared so far (names and kinds), as a snapshot records them.
    fn declared_states(&self) -> Vec<eddy_state::DeclaredState> {
        Vec::new()
    }
    /// The digest of the Wasm artifact it runs (`None` for host operators).
    fn artifact(&self) -> Option<&str> {
        None
    }
    /// Goes on with `component`'s code over this operator's state and timers (a live swap at
    /// a checkpoint barrier, right after [`StreamOperator::snapshot`]).
    fn swap_code(self: Box<Self>, component: &Component) -> Result<Box<dyn StreamOperator>, OperatorError> {
        let _ = component;
        Err(OperatorError::Swap {
            operator: self.name().to_owned(),
            problem: "only Wasm operator steps can swap code live; use a restart-mode upgrade".into(),
        })
    }
}
