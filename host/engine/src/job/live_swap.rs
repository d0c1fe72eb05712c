//! A live swap of one step's code at a checkpoint barrier ([`Job::swap_live`]): the new
//! component is probed first (instantiated and opened beside the old one, their declared
//! states compared), then the next checkpoint carries the swap ([`SwapRequest`]) and each
//! subtask of the step goes over right after its snapshot, keeping its state and timers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use eddy_core::HeapTimerService;
use eddy_runtime::{Component, Subtask, World};
use eddy_state::{DeclaredState, HeapStateBackend, check_state_evolution};

use super::{Job, now_ms};
use crate::messages::SwapRequest;

/// A Wasm operator step as a live swap needs it.
#[derive(Debug)]
pub(super) struct SwappableStep {
    pub name: String,
    pub config: String,
    /// The code it runs now (the newest swap's, once one completed).
    pub component: Arc<Component>,
}

/// What a completed live swap did.
#[derive(Debug, Clone, PartialEq)]
pub struct SwapDone {
    /// The checkpoint from whose barrier on the new code runs: a restore from it (or later)
    /// runs the new code; one from an earlier checkpoint, the old.
    pub checkpoint: eddy_checkpoint::CheckpointId,
    /// Subtasks that went over.
    pub subtasks: u32,
    /// The longest time one subtask spent instantiating and opening the new code after its
    /// snapshot: what the swap added to the barrier's pause.
    pub longest_swap_ms: f64,
    /// From the request to the completed checkpoint.
    pub total_ms: f64,
}

/// Why a live swap was refused or did not complete.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// The request cannot be carried out: nothing changed.
    #[error("{0}")]
    Refused(String),
    /// The new code trapped or failed in `open` while probed: nothing changed.
    #[error("the new code fails in `open`: {0}")]
    Open(String),
    /// The job ended or failed before the swap's checkpoint completed: a restore runs the old
    /// code from the previous checkpoint.
    #[error("{0}")]
    NotCompleted(String),
}

impl Job {
    /// Swaps step `step` to `component` at the next checkpoint's barrier and waits (at most
    /// `timeout`) until a checkpoint that carries it completes. Refused without a change
    /// when the step is not a Wasm operator step of this process, the component is not an
    /// operator, its `open` fails, or a state both versions declare changed its kind.
    pub fn swap_live(&self, step: &str, component: Component, timeout: Duration) -> Result<SwapDone, SwapError> {
        let started = Instant::now();
        let refused = |why: String| SwapError::Refused(why);
        if self.checkpoints.is_none() {
            return Err(refused("a live swap happens at a checkpoint; the pipeline needs `checkpoints:`".into()));
        }
        if self.spread {
            return Err(refused(
                "this job runs on several workers; a live swap runs on one process for now (use a restart-mode upgrade)"
                    .into(),
            ));
        }
        let poisoned = || refused("the job's control lock is poisoned".into());
        let swappable = self.swappable.lock().map_err(|_| poisoned())?;
        let Some(current) = swappable.iter().find(|s| s.name == step) else {
            let steps: Vec<&str> = swappable.iter().map(|s| s.name.as_str()).collect();
            return Err(refused(format!(
                "step `{step}` is not a Wasm operator step of this job; steps that can swap live: {}",
                if steps.is_empty() { "none".into() } else { steps.join(", ") }
            )));
        };
        if component.world() != World::KeyedOperator {
            return Err(refused(format!(
                "the new artifact is a window aggregate; step `{step}` runs a keyed operator"
            )));
        }
        if component.digest() == current.component.digest() {
            return Err(refused(format!("step `{step}` already runs {}", component.digest())));
        }
        let component = component.in_sandbox_of(&current.component);
        let old =
            self.probe(&current.component, &current.config).map_err(|e| refused(format!("the running code: {e}")))?;
        let new = self.probe(&component, &current.config).map_err(SwapError::Open)?;
        check_state_evolution(&old, &new)
            .map_err(|e| refused(format!("the new code cannot go on from step `{step}`'s state: {e}")))?;
        drop(swappable);
        let component = Arc::new(component);
        {
            let mut request = self.signals.swap.lock().map_err(|_| poisoned())?;
            if request.as_ref().is_some_and(|r| r.outcome.is_none()) {
                return Err(refused("another live swap of this job is under way; try again when it completed".into()));
            }
            *request = Some(SwapRequest {
                step: step.to_owned(),
                component: component.clone(),
                checkpoint: None,
                swapped: 0,
                longest_ms: 0.0,
                outcome: None,
            });
        }
        tracing::info!(step, artifact = component.digest(), "live swap requested");
        let deadline = started + timeout;
        loop {
            if let Ok(request) = self.signals.swap.lock()
                && let Some(r) = request.as_ref()
                && let Some(checkpoint) = r.outcome
            {
                let mut swappable = self.swappable.lock().map_err(|_| poisoned())?;
                if let Some(s) = swappable.iter_mut().find(|s| s.name == step) {
                    s.component = component.clone();
                }
                return Ok(SwapDone {
                    checkpoint,
                    subtasks: r.swapped,
                    longest_swap_ms: r.longest_ms,
                    total_ms: started.elapsed().as_secs_f64() * 1e3,
                });
            }
            if self.is_done() {
                return Err(SwapError::NotCompleted(
                    "the job ended before the swap's checkpoint completed; a restore runs the old code".into(),
                ));
            }
            if Instant::now() >= deadline {
                return Err(SwapError::NotCompleted(format!(
                    "no checkpoint carrying the swap completed within {timeout:?}; it stays armed for the next one"
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Instantiates `component` over empty state and opens it with `config`: what states it
    /// declares, or how its `open` failed.
    fn probe(&self, component: &Component, config: &str) -> Result<Vec<DeclaredState>, String> {
        let timers = Box::new(HeapTimerService::starting_at(now_ms()));
        let mut instance = component
            .instantiate_operator(Subtask::single(self.max_parallelism), Box::<HeapStateBackend>::default(), timers)
            .map_err(|e| e.to_string())?;
        instance.open(config).map_err(|e| e.to_string())?;
        Ok(instance.declared_states())
    }
}
