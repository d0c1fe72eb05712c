//! When a failed job restarts, as a state machine without I/O or clock: the supervisor tells it
//! how an attempt ended and does what it answers.
//!
//! A tenant's `restart:` strategy decides within bounds the service sets, since a strategy of
//! 4 294 967 295 attempts without delay restarted a failing job 1 261 times in 10 s:
//! - attempts are at most [`MAX_RESTART_ATTEMPTS`] and pauses at least
//!   [`MIN_RESTART_DELAY_MS`] (refused at submit beyond, see [`check_strategy`]);
//! - an attempt that fails within [`FAST_FAILURE_MS`] of starting, before completing a
//!   checkpoint, failed *fast*: each fast failure in a row doubles the pause (up to
//!   [`MAX_BACKOFF_MS`]), and after [`MAX_FAST_FAILURES`] in a row the job is stopped with a
//!   status saying so, whatever attempts the strategy has left;
//! - a failure the tenant did not cause (a worker was lost, the cluster had no room) costs
//!   it no attempt: the job restarts after [`INFRASTRUCTURE_FIRST_DELAY_MS`], a pause that
//!   doubles while such failures repeat.

use std::time::Duration;

use eddy_plan::RestartSpec;

/// Restarts a job's strategy may allow at most.
pub const MAX_RESTART_ATTEMPTS: u32 = 100;
/// The shortest pause a strategy may ask before a restart.
pub const MIN_RESTART_DELAY_MS: u64 = 500;
/// The longest pause a strategy may ask, and the longest any backoff waits.
pub const MAX_BACKOFF_MS: u64 = 5 * 60_000;
/// An attempt that fails sooner than this after it started, without a completed checkpoint,
/// failed fast.
pub const FAST_FAILURE_MS: u64 = 10_000;
/// Fast failures in a row after which the job is stopped.
pub const MAX_FAST_FAILURES: u32 = 5;

/// Why an attempt failed, as far as the restart budget cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Something of the job's: its operators, its spec, its data.
    Job,
    /// Something of the cluster's: a worker was lost or restarted, a link between workers
    /// broke, no slots came free. The tenant did nothing.
    Infrastructure,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// Why, for the budget.
    pub cause: Cause,
    /// How long it ran, ms.
    pub ran_ms: u64,
    /// Whether it completed at least one checkpoint of its own.
    pub checkpointed: bool,
}

/// The counters a job keeps across attempts (stored in its record, so a server restart
/// keeps them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Restarts charged to the job's strategy so far.
    pub restarts: u32,
    /// Fast failures in a row.
    pub fast_failures: u32,
    /// Failures of the cluster's in a row (not stored: a server restart forgets them).
    pub infrastructure_failures: u32,
}

/// What to do after a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Restart after `after`.
    Restart {
        /// The pause.
        after: Duration,
    },
    /// The strategy allows no more restarts: the job failed (its failure says why).
    Exhausted,
    /// The service stops the job, for this reason (recorded as one more failure).
    Stop {
        /// Why.
        reason: String,
    },
}

/// Refuses a strategy beyond the service's bounds, naming the field and the bound.
pub fn check_strategy(strategy: &RestartSpec) -> Result<(), (String, String)> {
    let (attempts, delay_ms, max_delay_ms) = match *strategy {
        RestartSpec::None => return Ok(()),
        RestartSpec::FixedDelay { attempts, delay_ms } => (attempts, delay_ms, None),
        RestartSpec::ExponentialBackoff { attempts, delay_ms, max_delay_ms } => {
            (attempts, delay_ms, Some(max_delay_ms))
        }
    };
    if attempts > MAX_RESTART_ATTEMPTS {
        return Err((
            "restart.attempts".into(),
            format!("{attempts} is more than the {MAX_RESTART_ATTEMPTS} restarts this service allows"),
        ));
    }
    if !(MIN_RESTART_DELAY_MS..=MAX_BACKOFF_MS).contains(&delay_ms) {
        return Err((
            "restart.delay_ms".into(),
            format!("{delay_ms} is outside {MIN_RESTART_DELAY_MS}..={MAX_BACKOFF_MS} ms"),
        ));
    }
    if let Some(max) = max_delay_ms
        && !(delay_ms..=MAX_BACKOFF_MS).contains(&max)
    {
        return Err(("restart.max_delay_ms".into(), format!("{max} is outside {delay_ms}..={MAX_BACKOFF_MS} ms")));
    }
    Ok(())
}

/// The first pause after a failure of the cluster's: short, since the job did nothing wrong
/// (recovery time is what a user sees of a lost worker); it doubles while such failures repeat.
pub const INFRASTRUCTURE_FIRST_DELAY_MS: u64 = 100;

/// `base` (at least [`MIN_RESTART_DELAY_MS`]) doubled `times - 1` times, capped at
/// [`MAX_BACKOFF_MS`].
fn backoff(base_ms: u64, times: u32) -> Duration {
    backoff_from(base_ms.max(MIN_RESTART_DELAY_MS), times)
}

fn backoff_from(base_ms: u64, times: u32) -> Duration {
    let factor = 1u64.checked_shl(times.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_millis(base_ms.saturating_mul(factor).min(MAX_BACKOFF_MS))
}

/// The job's restart decisions.
#[derive(Debug, Clone, Copy)]
pub struct RestartPolicy {
    strategy: RestartSpec,
}

impl RestartPolicy {
    /// Decides by `strategy` within the service's bounds.
    pub fn new(strategy: RestartSpec) -> Self {
        Self { strategy }
    }

    /// An attempt failed: updates `counters` and says what to do.
    pub fn on_failure(&self, counters: &mut Counters, failed: Failed) -> Verdict {
        if failed.cause == Cause::Infrastructure {
            counters.infrastructure_failures = counters.infrastructure_failures.saturating_add(1);
            return Verdict::Restart {
                after: backoff_from(INFRASTRUCTURE_FIRST_DELAY_MS, counters.infrastructure_failures),
            };
        }
        counters.infrastructure_failures = 0;
        let fast = failed.ran_ms < FAST_FAILURE_MS && !failed.checkpointed;
        counters.fast_failures = if fast { counters.fast_failures.saturating_add(1) } else { 0 };
        if counters.fast_failures >= MAX_FAST_FAILURES {
            return Verdict::Stop {
                reason: format!(
                    "stopped: its last {} attempts each failed within {} s of starting, before any checkpoint; \
                     fix the cause (see the failures) and submit it again",
                    counters.fast_failures,
                    FAST_FAILURE_MS / 1000
                ),
            };
        }
        let attempt = counters.restarts.saturating_add(1);
        let Some(delay) = self.strategy.delay_before(attempt.min(MAX_RESTART_ATTEMPTS + 1)) else {
            return Verdict::Exhausted;
        };
        if attempt > MAX_RESTART_ATTEMPTS {
            return Verdict::Stop {
                reason: format!("stopped after {MAX_RESTART_ATTEMPTS} restarts, all this service allows"),
            };
        }
        counters.restarts = attempt;
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let after = if fast { backoff(delay_ms, counters.fast_failures) } else { backoff(delay_ms, 1) };
        Verdict::Restart { after }
    }

    /// An attempt ran well (it completed a checkpoint): failures before it no longer count as
    /// a run of fast ones.
    pub fn on_progress(&self, counters: &mut Counters) {
        counters.fast_failures = 0;
        counters.infrastructure_failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB_FAST: Failed = Failed { cause: Cause::Job, ran_ms: 200, checkpointed: false };
    const JOB_SLOW: Failed = Failed { cause: Cause::Job, ran_ms: 60_000, checkpointed: true };
    const LOST: Failed = Failed { cause: Cause::Infrastructure, ran_ms: 200, checkpointed: false };

    fn ms(verdict: &Verdict) -> Option<u64> {
        match verdict {
            Verdict::Restart { after } => Some(after.as_millis() as u64),
            Verdict::Exhausted | Verdict::Stop { .. } => None,
        }
    }

    #[test]
    fn a_job_that_fails_fast_every_time_is_stopped_after_five_with_growing_pauses() {
        // The strategy, had it been admitted: endless attempts, no delay.
        let policy = RestartPolicy::new(RestartSpec::FixedDelay { attempts: u32::MAX, delay_ms: 0 });
        let mut counters = Counters::default();
        let pauses: Vec<Option<u64>> = (0..5).map(|_| ms(&policy.on_failure(&mut counters, JOB_FAST))).collect();
        // 500 ms at least, doubling per fast failure; the fifth stops the job.
        assert_eq!(pauses, [Some(500), Some(1_000), Some(2_000), Some(4_000), None]);
        let Verdict::Stop { reason } = policy.on_failure(&mut counters.clone(), JOB_FAST) else { panic!("stopped") };
        assert!(reason.contains("last 6 attempts each failed within 10 s"), "{reason}");
    }

    #[test]
    fn failures_after_progress_use_the_strategy_until_it_runs_out() {
        let policy = RestartPolicy::new(RestartSpec::FixedDelay { attempts: 2, delay_ms: 1_000 });
        let mut counters = Counters::default();
        assert_eq!(ms(&policy.on_failure(&mut counters, JOB_SLOW)), Some(1_000));
        assert_eq!(ms(&policy.on_failure(&mut counters, JOB_SLOW)), Some(1_000));
        let verdict = policy.on_failure(&mut counters, JOB_SLOW);
        assert_eq!(verdict, Verdict::Exhausted);
        assert_eq!(counters.restarts, 2);
    }

    #[test]
    fn a_lost_worker_costs_the_tenant_no_attempt() {
        let policy = RestartPolicy::new(RestartSpec::FixedDelay { attempts: 1, delay_ms: 1_000 });
        let mut counters = Counters::default();
        let pauses: Vec<Option<u64>> = (0..4).map(|_| ms(&policy.on_failure(&mut counters, LOST))).collect();
        assert_eq!(pauses, [Some(100), Some(200), Some(400), Some(800)]);
        assert_eq!((counters.restarts, counters.fast_failures), (0, 0));
        // The one attempt of its own is still there.
        assert_eq!(ms(&policy.on_failure(&mut counters, JOB_SLOW)), Some(1_000));
        assert_eq!(counters.infrastructure_failures, 0);
    }

    #[test]
    fn progress_forgets_a_run_of_fast_failures() {
        let policy = RestartPolicy::new(RestartSpec::FixedDelay { attempts: 100, delay_ms: 500 });
        let mut counters = Counters::default();
        for _ in 0..4 {
            policy.on_failure(&mut counters, JOB_FAST);
        }
        policy.on_progress(&mut counters);
        assert_eq!(ms(&policy.on_failure(&mut counters, JOB_FAST)), Some(500));
    }

    #[test]
    fn the_service_caps_what_a_strategy_may_ask() {
        let refused = |s: RestartSpec| check_strategy(&s).err().map(|(field, _)| field);
        assert_eq!(
            refused(RestartSpec::FixedDelay { attempts: u32::MAX, delay_ms: 1_000 }).as_deref(),
            Some("restart.attempts")
        );
        assert_eq!(refused(RestartSpec::FixedDelay { attempts: 3, delay_ms: 0 }).as_deref(), Some("restart.delay_ms"));
        assert_eq!(
            refused(RestartSpec::ExponentialBackoff { attempts: 3, delay_ms: 1_000, max_delay_ms: u64::MAX })
                .as_deref(),
            Some("restart.max_delay_ms")
        );
        assert_eq!(refused(RestartSpec::FixedDelay { attempts: 100, delay_ms: 500 }), None);
        assert_eq!(refused(RestartSpec::default()), None);
        assert_eq!(refused(RestartSpec::None), None);
    }
}
