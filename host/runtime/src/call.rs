//! One guarded crossing into a guest: deadline, fuel, per-call bookkeeping, and the mapping of
//! whatever went wrong onto a [`CallError`]. Shared by both worlds.

use std::sync::Arc;

use wasmtime::{Store, Trap};

use crate::bindings::types::{ErrorKind, OperatorError};
use crate::config::SandboxLimits;
use crate::cpu::CpuShare;
use crate::error::{CallError, CallErrorKind, GuestErrorKind, HostTrap, Violation};
use crate::sandbox::HasSandbox;

/// Per-instance call policy.
#[derive(Debug, Clone)]
pub(crate) struct CallPolicy {
    pub(crate) limits: SandboxLimits,
    pub(crate) deadline_ticks: u64,
    pub(crate) poisoned: bool,
    /// The group's CPU share each call is charged to, if the instance has one.
    pub(crate) cpu: Option<Arc<CpuShare>>,
}

impl CallPolicy {
    pub(crate) fn new(limits: SandboxLimits, epoch_tick_ms: u64, cpu: Option<Arc<CpuShare>>) -> Self {
        // One extra tick: the deadline counts ticks from an arbitrary point inside the current one.
        let deadline_ticks = limits.call_timeout_ms.div_ceil(epoch_tick_ms.max(1)) + 1;
        Self { limits, deadline_ticks, poisoned: false, cpu }
    }

    /// Arms the store for a call that is about to start.
    pub(crate) fn arm<T: HasSandbox>(&self, store: &mut Store<T>) -> wasmtime::Result<()> {
        store.set_epoch_deadline(self.deadline_ticks);
        if let Some(fuel) = self.limits.fuel_per_call {
            store.set_fuel(fuel)?;
        }
        store.data_mut().sandbox().begin_call();
        Ok(())
    }

    /// Runs one export call. A trap poisons the instance: wasmtime forbids re-entering a
    /// component instance that trapped, so the owner must recreate it.
    pub(crate) fn call<T: HasSandbox, R>(
        &mut self,
        store: &mut Store<T>,
        call: &'static str,
        f: impl FnOnce(&mut Store<T>) -> wasmtime::Result<Result<R, OperatorError>>,
    ) -> Result<R, CallError> {
        // The operator name is cloned only on failure: this runs once per batch.
        let fail = |store: &mut Store<T>, kind, guest_message| {
            let operator = store.data_mut().sandbox().operator.clone();
            CallError { operator, call, kind, guest_message }
        };
        if self.poisoned {
            return Err(fail(store, CallErrorKind::Poisoned, None));
        }
        // Waiting for the share happens before the deadline is armed, so it never counts
        // against the call's timeout.
        let cpu_started = self.cpu.as_ref().map(|c| c.before_call());
        if let Err(e) = self.arm(store) {
            return Err(fail(store, CallErrorKind::Internal(format!("{e:#}")), None));
        }
        let result = f(store);
        if let (Some(cpu), Some(started)) = (&self.cpu, cpu_started) {
            cpu.after_call(started);
        }
        store.data_mut().sandbox().end_call();
        match result {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                Err(fail(store, CallErrorKind::Operator { kind: guest_kind(e.kind), message: e.message }, None))
            }
            Err(e) => {
                self.poisoned = true;
                let guest_message = store.data_mut().sandbox().guest_message();
                Err(fail(store, classify(&e, &self.limits), guest_message))
            }
        }
    }
}

fn guest_kind(k: ErrorKind) -> GuestErrorKind {
    match k {
        ErrorKind::BadConfig => GuestErrorKind::BadConfig,
        ErrorKind::BadRecord => GuestErrorKind::BadRecord,
        ErrorKind::Failed => GuestErrorKind::Failed,
    }
}

/// Maps a trap onto what the user needs to know.
pub(crate) fn classify(e: &wasmtime::Error, limits: &SandboxLimits) -> CallErrorKind {
    if let Some(host) = e.downcast_ref::<HostTrap>() {
        return match host {
            HostTrap::Violation(v) => CallErrorKind::Violation(v.clone()),
            // A state limit is the operator's doing, not storage failing: restarting will not help.
            HostTrap::State(eddy_state::StateError::LimitExceeded(e)) => {
                CallErrorKind::Violation(Violation::StateLimit(e.clone()))
            }
            HostTrap::State(s) => CallErrorKind::State(s.to_string()),
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallErrorKind::Timeout { timeout_ms: limits.call_timeout_ms },
        Some(Trap::StackOverflow) => CallErrorKind::StackOverflow,
        Some(Trap::OutOfFuel) => CallErrorKind::OutOfFuel,
        Some(t) => CallErrorKind::Trap { trap: t.to_string() },
        None => CallErrorKind::Trap { trap: format!("{e:#}") },
    }
}
