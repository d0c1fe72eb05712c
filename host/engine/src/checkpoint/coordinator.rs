//! The checkpoint coordinator as a state machine: when to trigger, when a checkpoint is
//! complete, when it has timed out. No I/O and no clock of its own: the shell passes `now`
//! in, performs the returned [`Decision`]s and reports acknowledgements back, so every rule
//! here is tested deterministically.
//!
//! Rules (Flink's): at most one checkpoint in flight; a new one starts `interval_ms` after the
//! previous trigger and never sooner than `min_pause_ms` after the previous one ended
//! (completed or aborted); one that is not acknowledged by every participant within
//! `timeout_ms` is aborted. Acknowledgements of a checkpoint that is not the pending one
//! (late, aborted, duplicate) change nothing.

use std::collections::BTreeSet;

/// Identifies a checkpoint; increases by one per trigger, across restarts of a job.
pub type CheckpointId = u64;

/// Timing of checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Time between triggers.
    pub interval_ms: u64,
    /// A checkpoint not complete after this long is aborted.
    pub timeout_ms: u64,
    /// Quiet time after a checkpoint ends before the next may start.
    pub min_pause_ms: u64,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start checkpoint `id`: tell the sources to record their positions and emit barriers.
    Trigger(CheckpointId),
    /// Every participant acknowledged `id`: write its metadata and notify completion.
    Complete(CheckpointId),
    /// Give up on `id` (its acknowledgements may still arrive and are ignored).
    Abort {
        /// The checkpoint.
        id: CheckpointId,
        /// Why, for logs and metrics.
        reason: String,
    },
}

#[derive(Debug)]
struct Pending {
    id: CheckpointId,
    triggered_ms: i64,
    acknowledged: BTreeSet<usize>,
}

/// See the module docs.
#[derive(Debug)]
pub struct CheckpointCoordinator {
    config: CoordinatorConfig,
    participants: usize,
    next_id: CheckpointId,
    pending: Option<Pending>,
    last_trigger_ms: i64,
    last_end_ms: Option<i64>,
}

impl CheckpointCoordinator {
    /// A coordinator for `participants` acknowledging subtasks whose first checkpoint will be
    /// `first_id` (one past the checkpoint a job restored from), started at `now_ms`: the first
    /// trigger comes one interval later.
    pub fn new(config: CoordinatorConfig, participants: usize, first_id: CheckpointId, now_ms: i64) -> Self {
        Self { config, participants, next_id: first_id, pending: None, last_trigger_ms: now_ms, last_end_ms: None }
    }

    /// The checkpoint in flight, if any.
    pub fn pending(&self) -> Option<CheckpointId> {
        self.pending.as_ref().map(|p| p.id)
    }

    fn after(t: i64, ms: u64) -> i64 {
        t.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
    }

    /// What is due at `now_ms`: a timeout of the pending checkpoint or a new trigger.
    pub fn poll(&mut self, now_ms: i64) -> Option<Decision> {
        if let Some(p) = &self.pending {
            if now_ms < Self::after(p.triggered_ms, self.config.timeout_ms) {
                return None;
            }
            let id = p.id;
            let reason = format!(
                "not acknowledged by {} of {} subtasks within {} ms",
                self.participants - p.acknowledged.len(),
                self.participants,
                self.config.timeout_ms
            );
            self.pending = None;
            self.last_end_ms = Some(now_ms);
            return Some(Decision::Abort { id, reason });
        }
        let interval_due = now_ms >= Self::after(self.last_trigger_ms, self.config.interval_ms);
        let pause_over = self.last_end_ms.is_none_or(|end| now_ms >= Self::after(end, self.config.min_pause_ms));
        (interval_due && pause_over).then(|| self.start(now_ms))
    }

    fn start(&mut self, now_ms: i64) -> Decision {
        let id = self.next_id;
        self.next_id += 1;
        self.last_trigger_ms = now_ms;
        self.pending = Some(Pending { id, triggered_ms: now_ms, acknowledged: BTreeSet::new() });
        Decision::Trigger(id)
    }

    /// Starts a checkpoint now, ignoring the interval and the pause (a savepoint); `None` while
    /// one is in flight (the caller retries when it ends).
    pub fn trigger_now(&mut self, now_ms: i64) -> Option<Decision> {
        self.pending.is_none().then(|| self.start(now_ms))
    }

    /// Participant `who` (0-based, below the participant count) finished its part of `id`.
    pub fn acknowledge(&mut self, id: CheckpointId, who: usize, now_ms: i64) -> Option<Decision> {
        let p = self.pending.as_mut().filter(|p| p.id == id && who < self.participants)?;
        p.acknowledged.insert(who);
        if p.acknowledged.len() < self.participants {
            return None;
        }
        self.pending = None;
        self.last_end_ms = Some(now_ms);
        Some(Decision::Complete(id))
    }

    /// Participant `who` could not take its part of `id` (for example its upload failed).
    pub fn decline(&mut self, id: CheckpointId, who: usize, reason: &str, now_ms: i64) -> Option<Decision> {
        self.pending.as_ref().filter(|p| p.id == id)?;
        self.pending = None;
        self.last_end_ms = Some(now_ms);
        Some(Decision::Abort { id, reason: format!("subtask {who} declined: {reason}") })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const CONFIG: CoordinatorConfig = CoordinatorConfig { interval_ms: 100, timeout_ms: 1_000, min_pause_ms: 50 };

    #[test]
    fn triggers_on_the_interval_and_completes_when_everyone_acknowledged() {
        let mut c = CheckpointCoordinator::new(CONFIG, 2, 7, 0);
        assert_eq!(c.poll(99), None);
        assert_eq!(c.poll(100), Some(Decision::Trigger(7)));
        assert_eq!(c.poll(250), None, "one in flight at a time");
        assert_eq!(c.acknowledge(7, 1, 260), None);
        assert_eq!(c.acknowledge(7, 1, 261), None, "a duplicate acknowledgement counts once");
        assert_eq!(c.acknowledge(7, 0, 270), Some(Decision::Complete(7)));
        assert_eq!(c.pending(), None);
        // The interval has passed (last trigger 100) but the pause after completion has not.
        assert_eq!(c.poll(300), None);
        assert_eq!(c.poll(320), Some(Decision::Trigger(8)));
    }

    #[test]
    fn a_slow_checkpoint_times_out_and_late_acknowledgements_are_ignored() {
        let mut c = CheckpointCoordinator::new(CONFIG, 2, 1, 0);
        assert_eq!(c.poll(100), Some(Decision::Trigger(1)));
        assert_eq!(c.acknowledge(1, 0, 150), None);
        assert_eq!(c.poll(1_099), None);
        let Some(Decision::Abort { id: 1, reason }) = c.poll(1_100) else { panic!("times out") };
        assert!(reason.contains("1 of 2"), "{reason}");
        assert_eq!(c.acknowledge(1, 1, 1_101), None, "too late");
        assert_eq!(c.poll(1_149), None, "minimum pause after an abort");
        assert_eq!(c.poll(1_150), Some(Decision::Trigger(2)));
    }

    #[test]
    fn a_forced_trigger_ignores_the_interval_but_not_the_one_in_flight() {
        let mut c = CheckpointCoordinator::new(CONFIG, 1, 1, 0);
        assert_eq!(c.trigger_now(5), Some(Decision::Trigger(1)));
        assert_eq!(c.trigger_now(6), None, "one in flight");
        assert_eq!(c.acknowledge(1, 0, 7), Some(Decision::Complete(1)));
        assert_eq!(c.trigger_now(8), Some(Decision::Trigger(2)), "no pause for a savepoint");
        assert_eq!(c.poll(100), None, "the interval counts from the forced trigger");
    }

    #[test]
    fn a_decline_aborts_and_unknown_participants_are_ignored() {
        let mut c = CheckpointCoordinator::new(CONFIG, 1, 1, 0);
        assert_eq!(c.poll(100), Some(Decision::Trigger(1)));
        assert_eq!(c.acknowledge(1, 5, 110), None, "no participant 5");
        assert_eq!(c.decline(2, 0, "x", 110), None, "not the pending checkpoint");
        assert!(matches!(c.decline(1, 0, "disk full", 120), Some(Decision::Abort { id: 1, .. })));
        assert_eq!(c.pending(), None);
    }

    proptest! {
        /// Whatever the interleaving, ids increase by one per trigger, at most one checkpoint
        /// is pending, completions happen only after every participant acknowledged, and
        /// triggers respect the interval and the pause.
        #[test]
        fn invariants_hold_under_any_interleaving(
            steps in proptest::collection::vec((0u8..4, 0usize..3, 1i64..200), 1..200),
        ) {
            let participants = 3;
            let mut c = CheckpointCoordinator::new(CONFIG, participants, 1, 0);
            let (mut now, mut last_trigger, mut last_end) = (0i64, 0i64, None::<i64>);
            let mut expected_next = 1;
            let mut acked: BTreeSet<usize> = BTreeSet::new();
            for (kind, who, dt) in steps {
                now += dt;
                let pending = c.pending();
                let decision = match (kind, pending) {
                    (0 | 1, Some(id)) => c.acknowledge(id, who, now),
                    (2, Some(id)) => c.acknowledge(id.saturating_sub(1), who, now),
                    _ => c.poll(now),
                };
                if kind < 2 && pending.is_some() {
                    acked.insert(who);
                }
                match decision {
                    Some(Decision::Trigger(id)) => {
                        prop_assert_eq!(pending, None);
                        prop_assert_eq!(id, expected_next);
                        prop_assert!(now >= last_trigger + 100);
                        prop_assert!(last_end.is_none_or(|e| now >= e + 50));
                        expected_next += 1;
                        last_trigger = now;
                        acked.clear();
                    }
                    Some(Decision::Complete(id)) => {
                        prop_assert_eq!(Some(id), pending);
                        prop_assert_eq!(acked.len(), participants);
                        last_end = Some(now);
                    }
                    Some(Decision::Abort { id, .. }) => {
                        prop_assert_eq!(Some(id), pending);
                        last_end = Some(now);
                    }
                    None => {}
                }
            }
        }
    }
}
