//! A live swap of one step's code at a checkpoint barrier ([`Job::swap_live`]): the new
//! component is probed first (instantiated and opened beside the old one, their declared
//! states compared), then the next checkpoint carries the swap ([`SwapRequest`]) and each
//! subtask of the step goes over right after its snapshot, keeping its state and timers. In
//! a job spread over workers the master first has every other part prepare the new code
//! ([`Job::prepare_swap`]), and its triggers carry the swap to them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use eddy_core::HeapTimerService;
use eddy_runtime::{Component, Subtask, World};
use eddy_state::{DeclaredState, HeapStateBackend, check_state_evolution};

use super::{Job, now_ms};
use crate::messages::{PreparedSwap, SwapRequest};

/// A Wasm operator step as a live swap needs it.
#[derive(Debug)]
pub(super) struct SwappableStep {
    pub name: String,
    pub config: String,
    /// The code it runs now (the newest swap's, once one completed).
    pub component: Arc<Component>,
    /// A two-phase window: its code runs in the upstream subtasks too, which a swap at one
    /// step's barrier does not reach.
    pub two_phase: bool,
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

/// Hands new code to a spread job's other parts before the master arms its swap: called with
/// the step and the new code's digest, it returns once every part has it ready
/// ([`Job::prepare_swap`] there), or why one does not.
pub type PrepareParts<'a> = &'a mut dyn FnMut(&str, &str) -> Result<(), String>;

impl Job {
    /// Swaps step `step` to `component` at the next checkpoint's barrier and waits (at most
    /// `timeout`) until a checkpoint that carries it completes. Refused without a change
    /// when the step is not a Wasm operator step of this job, the component is not an
    /// operator, its `open` fails, or a state both versions declare changed its kind.
    pub fn swap_live(&self, step: &str, component: Component, timeout: Duration) -> Result<SwapDone, SwapError> {
        self.swap(step, component, timeout, None)
    }

    /// [`Job::swap_live`] for the job master of a job spread over workers: after the checks
    /// here, `prepare_parts` gets the new code to every other part; only then is the swap
    /// armed, and the master's triggers carry it to the parts until a checkpoint completes.
    pub fn swap_live_spread(
        &self,
        step: &str,
        component: Component,
        timeout: Duration,
        prepare_parts: PrepareParts<'_>,
    ) -> Result<SwapDone, SwapError> {
        if !self.spread {
            return Err(SwapError::Refused("this job runs in one process; swap it with `swap_live`".into()));
        }
        self.swap(step, component, timeout, Some(prepare_parts))
    }

    /// In a part of a spread job: makes `component` ready to take over step `step` when the
    /// job master's trigger says so (compiled, given this part's sandbox, opened once over
    /// empty state). Nothing changes before that trigger.
    pub fn prepare_swap(&self, step: &str, component: Component) -> Result<(), SwapError> {
        let (current, config) = self.swappable_step(step, &component)?;
        let component = component.in_sandbox_of(&current);
        self.probe(&component, &config).map_err(SwapError::Open)?;
        tracing::info!(step, artifact = component.digest(), "live swap prepared");
        let ready = PreparedSwap { step: step.to_owned(), component: Arc::new(component) };
        *self.signals.prepared_swap.lock().map_err(|_| poisoned())? = Some(ready);
        Ok(())
    }

    /// The code step `step` runs now and its config, if `component` may replace it.
    fn swappable_step(&self, step: &str, component: &Component) -> Result<(Arc<Component>, String), SwapError> {
        let refused = |why: String| SwapError::Refused(why);
        if self.checkpoints.is_none() {
            return Err(refused("a live swap happens at a checkpoint; the pipeline needs `checkpoints:`".into()));
        }
        let swappable = self.swappable.lock().map_err(|_| poisoned())?;
        let Some(current) = swappable.iter().find(|s| s.name == step) else {
            let steps: Vec<&str> = swappable.iter().map(|s| s.name.as_str()).collect();
            return Err(refused(format!(
                "step `{step}` is not a Wasm operator step of this job; steps that can swap live: {}",
                if steps.is_empty() { "none".into() } else { steps.join(", ") }
            )));
        };
        if current.two_phase {
            return Err(refused(format!(
                "step `{step}` is a two-phase window, whose first phase runs in its upstream subtasks too; \
                 change its code with a restart-mode upgrade (`mode: restart`)"
            )));
        }
        if component.world() != current.component.world() {
            let runs = |world: World| match world {
                World::KeyedOperator => "a keyed operator",
                World::WindowAggregate => "a window aggregate",
            };
            return Err(refused(format!(
                "the new artifact is {}; step `{step}` runs {}",
                runs(component.world()),
                runs(current.component.world())
            )));
        }
        Ok((current.component.clone(), current.config.clone()))
    }

    fn swap(
        &self,
        step: &str,
        component: Component,
        timeout: Duration,
        prepare_parts: Option<PrepareParts<'_>>,
    ) -> Result<SwapDone, SwapError> {
        let started = Instant::now();
        let refused = |why: String| SwapError::Refused(why);
        if self.spread && prepare_parts.is_none() {
            return Err(refused(
                "this job runs on several workers; its coordinator swaps it (`eddy upgrade --live` against the server)"
                    .into(),
            ));
        }
        let (current, config) = self.swappable_step(step, &component)?;
        if component.digest() == current.digest() {
            return Err(refused(format!("step `{step}` already runs {}", component.digest())));
        }
        let component = component.in_sandbox_of(&current);
        let old = self.probe(&current, &config).map_err(|e| refused(format!("the running code: {e}")))?;
        let new = self.probe(&component, &config).map_err(SwapError::Open)?;
        check_state_evolution(&old, &new)
            .map_err(|e| refused(format!("the new code cannot go on from step `{step}`'s state: {e}")))?;
        if self.signals.swap.lock().map_err(|_| poisoned())?.as_ref().is_some_and(|r| r.outcome.is_none()) {
            return Err(refused("another live swap of this job is under way; try again when it completed".into()));
        }
        if let Some(prepare) = prepare_parts {
            prepare(step, component.digest())
                .map_err(|e| refused(format!("the new code is not ready on every worker: {e}")))?;
        }
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
                outcome: None,
            });
        }
        tracing::info!(step, artifact = component.digest(), "live swap requested");
        let deadline = started + timeout;
        loop {
            let outcome = self.signals.swap.lock().ok().and_then(|r| r.as_ref().and_then(|r| r.outcome));
            if let Some(outcome) = outcome {
                let mut swappable = self.swappable.lock().map_err(|_| poisoned())?;
                if let Some(s) = swappable.iter_mut().find(|s| s.name == step) {
                    s.component = component.clone();
                }
                return Ok(SwapDone {
                    checkpoint: outcome.checkpoint,
                    subtasks: outcome.subtasks,
                    longest_swap_ms: outcome.longest_ms,
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
    /// declares (none for a window aggregate, whose accumulators the host keeps), or how its
    /// `open` failed.
    fn probe(&self, component: &Component, config: &str) -> Result<Vec<DeclaredState>, String> {
        if component.world() == World::WindowAggregate {
            let mut aggregate = component.instantiate_aggregate().map_err(|e| e.to_string())?;
            aggregate.open(config).map_err(|e| e.to_string())?;
            return Ok(Vec::new());
        }
        let timers = Box::new(HeapTimerService::starting_at(now_ms()));
        let mut instance = component
            .instantiate_operator(Subtask::single(self.max_parallelism), Box::<HeapStateBackend>::default(), timers)
            .map_err(|e| e.to_string())?;
        instance.open(config).map_err(|e| e.to_string())?;
        Ok(instance.declared_states())
    }
}

fn poisoned() -> SwapError {
    SwapError::Refused("the job's control lock is poisoned".into())
}
