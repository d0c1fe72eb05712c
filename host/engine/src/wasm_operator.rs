//! A keyed Wasm operator as a chain member: records go to the guest's `process`, watermark and
//! processing-time progress fire the guest's timers through `on-timer`, and state older than
//! the step's TTL is purged on the processing-time tick.

use eddy_core::RecordBatch;
use eddy_runtime::{Component, OperatorInstance, Output, Subtask};

use eddy_checkpoint::OperatorSnapshot;

use crate::operator::{OperatorError, StreamOperator};

/// How often a purge step runs. Each step examines a bounded number of entries
/// ([`eddy_state::PURGE_STEP_ENTRIES`] by default) from where the last one stopped: at 1 000 per
/// 100 ms, a million entries are swept in under two minutes, each step well under a millisecond.
const PURGE_EVERY_MS: i64 = 100;

/// One subtask of a Wasm operator step.
#[derive(Debug)]
pub struct WasmOperator {
    name: String,
    instance: OperatorInstance,
    purge_due_ms: Option<i64>,
    /// What a live swap needs to open new code as this subtask.
    reopen: Reopen,
}

/// The subtask an instance serves and the step's config its `open` gets.
#[derive(Debug, Clone)]
pub struct Reopen {
    /// The subtask (its key groups).
    pub subtask: Subtask,
    /// The step's config, JSON text.
    pub config: String,
    /// The artifact's digest.
    pub artifact: String,
}

impl WasmOperator {
    /// Wraps an opened instance; `purges_state` when its backend expires entries (TTL).
    pub fn new(name: String, instance: OperatorInstance, purges_state: bool, reopen: Reopen) -> Self {
        Self { name, instance, purge_due_ms: purges_state.then_some(i64::MIN), reopen }
    }

    fn fire(&mut self, fired: Vec<eddy_core::FiredTimer>) -> Result<Output, OperatorError> {
        if fired.is_empty() {
            return Ok(Output::default());
        }
        Ok(self.instance.on_timers(&fired)?)
    }
}

impl StreamOperator for WasmOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn process(&mut self, batch: &RecordBatch) -> Result<Output, OperatorError> {
        Ok(self.instance.process(batch)?)
    }

    fn wasm_memory_bytes(&mut self) -> u64 {
        self.instance.memory_bytes() as u64
    }

    fn on_watermark(&mut self, watermark: i64) -> Result<Output, OperatorError> {
        let fired = self.instance.timer_service().advance_watermark(watermark);
        self.fire(fired)
    }

    fn on_processing_time(&mut self, now_ms: i64) -> Result<Output, OperatorError> {
        if let Some(due) = self.purge_due_ms
            && now_ms >= due
        {
            self.purge_due_ms = Some(now_ms.saturating_add(PURGE_EVERY_MS));
            let removed = self
                .instance
                .state_backend_mut()
                .purge_expired()
                .map_err(|source| OperatorError::State { operator: self.name.clone(), source })?;
            if removed > 0 {
                tracing::debug!(operator = %self.name, removed, "purged expired state");
            }
        }
        let fired = self.instance.timer_service().advance_processing_time(now_ms);
        self.fire(fired)
    }

    fn finish(&mut self) -> Result<Output, OperatorError> {
        Ok(self.instance.close()?)
    }

    fn snapshot(&mut self, staging: &std::path::Path) -> Result<OperatorSnapshot, OperatorError> {
        let timers = self.instance.timer_service().pending();
        let backend = self.instance.state_backend_mut();
        let usage = backend.usage();
        let state =
            backend.snapshot(staging).map_err(|source| OperatorError::State { operator: self.name.clone(), source })?;
        let (states, schemas) = (self.declared_states(), self.instance.declared_schemas());
        let artifact = Some(self.reopen.artifact.clone());
        Ok(OperatorSnapshot { timers, state, usage, states, schemas, artifact, partial_input: false })
    }

    fn artifact(&self) -> Option<&str> {
        Some(&self.reopen.artifact)
    }

    fn declared_states(&self) -> Vec<eddy_state::DeclaredState> {
        self.instance.declared_states()
    }

    fn swap_code(self: Box<Self>, component: &Component) -> Result<Box<dyn StreamOperator>, OperatorError> {
        let Self { name, instance, purge_due_ms, mut reopen } = *self;
        let failed = |problem: String| OperatorError::Swap { operator: name.clone(), problem };
        let (backend, timers) = instance.into_keyed_state();
        let mut instance =
            component.instantiate_operator(reopen.subtask, backend, timers).map_err(|e| failed(e.to_string()))?;
        instance.open(&reopen.config).map_err(|e| failed(format!("the new code's `open`: {e}")))?;
        reopen.artifact = component.digest().to_owned();
        tracing::info!(operator = %name, artifact = %reopen.artifact, "swapped to new code");
        Ok(Box::new(Self { name, instance, purge_due_ms, reopen }))
    }
}
