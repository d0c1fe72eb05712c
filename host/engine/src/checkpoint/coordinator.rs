//! The checkpoint coordinator as a state machine: when to trigger, when a checkpoint is
//! complete, when it has timed out. No I/O and no clock of its own: the shell passes `now`
//! in, performs the returned [`Decision`]s and reports acknowledgements back, so every rule
//! here is tested deterministically.
//!
//! Rules (Flink's): at most one checkpoint in flight; a new one starts `interval_ms` after the
//! previous trigger and never sooner than `min_pause_ms` after the previous one ended
//! (completed or aborted); one that is not acknowledged by every participant within
//! `timeout_ms` is aborted. Acknowledgements of a checkpoint that is not the pending one
//! (late, aborted, duplicate) change nothing. A participant that finished stands in every
//! later checkpoint with its final snapshot.
//!
//! Who may speak for a participant is part of the state: each [`Participant`] is run by this
//! process or by one named part (a worker, named by its certificate), and a report is taken
//! only from that speaker and only for the subtask it claims to be. A part of a spread job
//! therefore cannot acknowledge, decline or finish another part's subtasks: what it says of
//! them is [`Refused`].

use std::collections::BTreeSet;

use eddy_checkpoint::CheckpointId;

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

/// A subtask taking part in checkpoints: where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// Its task in the plan.
    pub task: usize,
    /// Its subtask index.
    pub subtask: u32,
    /// The part that runs it (a worker's name); `None`: this process.
    pub part: Option<String>,
}

/// Who a report comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From<'a> {
    /// A subtask of this process.
    Local,
    /// The part of a spread job with this name (from its certificate, not from the report).
    Part(&'a str),
}

/// A report about a participant, as the coordinator judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speaker<'a> {
    /// The participant the report is about.
    pub participant: usize,
    /// Who sent it.
    pub from: From<'a>,
    /// The (task, subtask) its snapshot says it is of, if it carries one.
    pub claims: Option<(usize, u32)>,
}

/// A report the coordinator refused: its sender may not speak for that participant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a report for subtask {participant} from {from} refused: {why}")]
pub struct Refused {
    /// The participant it was about.
    pub participant: usize,
    /// Who sent it.
    pub from: String,
    /// Why.
    pub why: String,
}

/// What [`CheckpointCoordinator::finish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Whether the final snapshot became the participant's part of the pending checkpoint
    /// (it had not taken its part yet).
    pub acknowledged: bool,
    /// What to do now.
    pub decision: Option<Decision>,
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
    participants: Vec<Participant>,
    finished: BTreeSet<usize>,
    next_id: CheckpointId,
    pending: Option<Pending>,
    last_trigger_ms: i64,
    last_end_ms: Option<i64>,
}

impl CheckpointCoordinator {
    /// A coordinator for `participants` (numbered by their index) whose first checkpoint will
    /// be `first_id` (one past the checkpoint a job restored from), started at `now_ms`: the
    /// first trigger comes one interval later.
    pub fn new(config: CoordinatorConfig, participants: Vec<Participant>, first_id: CheckpointId, now_ms: i64) -> Self {
        Self {
            config,
            participants,
            finished: BTreeSet::new(),
            next_id: first_id,
            pending: None,
            last_trigger_ms: now_ms,
            last_end_ms: None,
        }
    }

    /// Whether `speaker` may report what it reports: the participant exists, is run by its
    /// sender, and is the subtask its snapshot claims.
    fn judge(&self, speaker: &Speaker<'_>) -> Result<(), Refused> {
        let from = match speaker.from {
            From::Local => "this process".to_owned(),
            From::Part(name) => format!("part `{name}`"),
        };
        let refused = |why: String| Refused { participant: speaker.participant, from: from.clone(), why };
        let Some(p) = self.participants.get(speaker.participant) else {
            return Err(refused(format!("the job has {} subtasks", self.participants.len())));
        };
        let runs = match (&p.part, speaker.from) {
            (None, From::Local) => true,
            (Some(owner), From::Part(name)) => owner == name,
            _ => false,
        };
        if !runs {
            let owner = p.part.as_ref().map_or("this process".to_owned(), |o| format!("part `{o}`"));
            return Err(refused(format!("it runs in {owner}")));
        }
        if let Some(claims) = speaker.claims
            && claims != (p.task, p.subtask)
        {
            return Err(refused(format!(
                "its snapshot is of task {} subtask {}, not task {} subtask {}",
                claims.0, claims.1, p.task, p.subtask
            )));
        }
        Ok(())
    }

    /// Whether every participant finished.
    pub fn all_finished(&self) -> bool {
        self.finished.len() == self.participants.len()
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
                self.participants.len() - p.acknowledged.len(),
                self.participants.len(),
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

    /// The finished participants take their part of checkpoint `id` just triggered with their
    /// final snapshots; `Complete` when that was every participant.
    pub fn acknowledge_finished(&mut self, id: CheckpointId, now_ms: i64) -> Option<Decision> {
        let p = self.pending.as_mut().filter(|p| p.id == id)?;
        p.acknowledged.extend(self.finished.iter().copied());
        self.complete_if_acknowledged(now_ms)
    }

    fn complete_if_acknowledged(&mut self, now_ms: i64) -> Option<Decision> {
        let p = self.pending.as_ref()?;
        if p.acknowledged.len() < self.participants.len() {
            return None;
        }
        let id = p.id;
        self.pending = None;
        self.last_end_ms = Some(now_ms);
        Some(Decision::Complete(id))
    }

    /// Starts a checkpoint now, ignoring the interval and the pause (a savepoint); `None` while
    /// one is in flight (the caller retries when it ends).
    pub fn trigger_now(&mut self, now_ms: i64) -> Option<Decision> {
        self.pending.is_none().then(|| self.start(now_ms))
    }

    /// The speaker's participant took its part of `id`.
    pub fn acknowledge(
        &mut self,
        id: CheckpointId,
        speaker: &Speaker<'_>,
        now_ms: i64,
    ) -> Result<Option<Decision>, Refused> {
        self.judge(speaker)?;
        let Some(p) = self.pending.as_mut().filter(|p| p.id == id) else { return Ok(None) };
        p.acknowledged.insert(speaker.participant);
        Ok(self.complete_if_acknowledged(now_ms))
    }

    /// The speaker's participant could not take its part of `id` (for example its upload
    /// failed).
    pub fn decline(
        &mut self,
        id: CheckpointId,
        speaker: &Speaker<'_>,
        reason: &str,
        now_ms: i64,
    ) -> Result<Option<Decision>, Refused> {
        self.judge(speaker)?;
        if self.pending.as_ref().is_none_or(|p| p.id != id) {
            return Ok(None);
        }
        self.pending = None;
        self.last_end_ms = Some(now_ms);
        Ok(Some(Decision::Abort { id, reason: format!("subtask {} declined: {reason}", speaker.participant) }))
    }

    /// The speaker's participant ended; its final snapshot stands for it from now on, in the
    /// pending checkpoint too unless it took its part already.
    pub fn finish(&mut self, speaker: &Speaker<'_>, now_ms: i64) -> Result<Finished, Refused> {
        self.judge(speaker)?;
        self.finished.insert(speaker.participant);
        let Some(p) = self.pending.as_mut() else { return Ok(Finished { acknowledged: false, decision: None }) };
        let acknowledged = p.acknowledged.insert(speaker.participant);
        Ok(Finished { acknowledged, decision: self.complete_if_acknowledged(now_ms) })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const CONFIG: CoordinatorConfig = CoordinatorConfig { interval_ms: 100, timeout_ms: 1_000, min_pause_ms: 50 };

    /// `n` participants of this process (task 0, subtasks 0..n).
    fn local(n: u32) -> Vec<Participant> {
        (0..n).map(|subtask| Participant { task: 0, subtask, part: None }).collect()
    }

    /// A report of this process about participant `who` (subtask `who` of task 0).
    fn here(who: usize) -> Speaker<'static> {
        Speaker { participant: who, from: From::Local, claims: Some((0, who as u32)) }
    }

    /// Acknowledges as this process, which may speak for every participant here.
    fn ack(c: &mut CheckpointCoordinator, id: CheckpointId, who: usize, now: i64) -> Option<Decision> {
        c.acknowledge(id, &here(who), now).expect("this process speaks for its own subtasks")
    }

    #[test]
    fn triggers_on_the_interval_and_completes_when_everyone_acknowledged() {
        let mut c = CheckpointCoordinator::new(CONFIG, local(2), 7, 0);
        assert_eq!(c.poll(99), None);
        assert_eq!(c.poll(100), Some(Decision::Trigger(7)));
        assert_eq!(c.poll(250), None, "one in flight at a time");
        assert_eq!(ack(&mut c, 7, 1, 260), None);
        assert_eq!(ack(&mut c, 7, 1, 261), None, "a duplicate acknowledgement counts once");
        assert_eq!(ack(&mut c, 7, 0, 270), Some(Decision::Complete(7)));
        assert_eq!(c.pending(), None);
        // The interval has passed (last trigger 100) but the pause after completion has not.
        assert_eq!(c.poll(300), None);
        assert_eq!(c.poll(320), Some(Decision::Trigger(8)));
    }

    #[test]
    fn a_slow_checkpoint_times_out_and_late_acknowledgements_are_ignored() {
        let mut c = CheckpointCoordinator::new(CONFIG, local(2), 1, 0);
        assert_eq!(c.poll(100), Some(Decision::Trigger(1)));
        assert_eq!(ack(&mut c, 1, 0, 150), None);
        assert_eq!(c.poll(1_099), None);
        let Some(Decision::Abort { id: 1, reason }) = c.poll(1_100) else { panic!("times out") };
        assert!(reason.contains("1 of 2"), "{reason}");
        assert_eq!(ack(&mut c, 1, 1, 1_101), None, "too late");
        assert_eq!(c.poll(1_149), None, "minimum pause after an abort");
        assert_eq!(c.poll(1_150), Some(Decision::Trigger(2)));
    }

    #[test]
    fn a_forced_trigger_ignores_the_interval_but_not_the_one_in_flight() {
        let mut c = CheckpointCoordinator::new(CONFIG, local(1), 1, 0);
        assert_eq!(c.trigger_now(5), Some(Decision::Trigger(1)));
        assert_eq!(c.trigger_now(6), None, "one in flight");
        assert_eq!(ack(&mut c, 1, 0, 7), Some(Decision::Complete(1)));
        assert_eq!(c.trigger_now(8), Some(Decision::Trigger(2)), "no pause for a savepoint");
        assert_eq!(c.poll(100), None, "the interval counts from the forced trigger");
    }

    #[test]
    fn a_decline_aborts_and_unknown_participants_are_ignored() {
        let mut c = CheckpointCoordinator::new(CONFIG, local(1), 1, 0);
        assert_eq!(c.poll(100), Some(Decision::Trigger(1)));
        assert!(c.acknowledge(1, &here(5), 110).is_err(), "no participant 5");
        assert_eq!(c.decline(2, &here(0), "x", 110), Ok(None), "not the pending checkpoint");
        assert!(matches!(c.decline(1, &here(0), "disk full", 120), Ok(Some(Decision::Abort { id: 1, .. }))));
        assert_eq!(c.pending(), None);
    }

    /// Two parts, `a` running subtasks 0 and 1 of task 0, `b` subtask 0 of task 1.
    fn spread() -> Vec<Participant> {
        vec![
            Participant { task: 0, subtask: 0, part: Some("a".into()) },
            Participant { task: 0, subtask: 1, part: Some("a".into()) },
            Participant { task: 1, subtask: 0, part: Some("b".into()) },
        ]
    }

    fn from_part(part: &str, participant: usize, claims: (usize, u32)) -> Speaker<'_> {
        Speaker { participant, from: From::Part(part), claims: Some(claims) }
    }

    #[test]
    fn a_part_speaks_only_for_its_own_subtasks() {
        let mut c = CheckpointCoordinator::new(CONFIG, spread(), 1, 0);
        assert_eq!(c.poll(100), Some(Decision::Trigger(1)));
        // `a` acknowledges for `b`'s subtask, with a forged snapshot of it: refused, and the
        // checkpoint still waits for `b`.
        let refused = c.acknowledge(1, &from_part("a", 2, (1, 0)), 110).expect_err("not a's");
        assert_eq!(refused.why, "it runs in part `b`");
        assert!(c.decline(1, &Speaker { participant: 2, from: From::Part("a"), claims: None }, "x", 110).is_err());
        assert!(c.acknowledge(1, &here(2), 110).is_err(), "this process runs none of them");
        // `a` acknowledges its own participant 1 with a snapshot of another subtask: refused.
        let forged = c.acknowledge(1, &from_part("a", 1, (0, 0)), 110).expect_err("a forged snapshot");
        assert!(forged.why.contains("snapshot is of task 0 subtask 0, not task 0 subtask 1"), "{forged}");
        assert_eq!(c.acknowledge(1, &from_part("a", 0, (0, 0)), 120), Ok(None));
        assert_eq!(c.acknowledge(1, &from_part("a", 1, (0, 1)), 120), Ok(None));
        assert_eq!(c.pending(), Some(1), "b has not spoken");
        assert_eq!(c.acknowledge(1, &from_part("b", 2, (1, 0)), 130), Ok(Some(Decision::Complete(1))));
    }

    #[test]
    fn a_part_cannot_end_the_job_by_finishing_others_subtasks() {
        let mut c = CheckpointCoordinator::new(CONFIG, spread(), 1, 0);
        for who in 0..3 {
            let claims = if who == 2 { (1, 0) } else { (0, who as u32) };
            assert!(c.finish(&from_part("a", who, claims), 10).is_ok() == (who < 2), "participant {who}");
        }
        assert!(!c.all_finished(), "b's subtask did not finish");
        assert!(c.finish(&from_part("b", 2, (1, 0)), 20).is_ok());
        assert!(c.all_finished());
    }

    #[test]
    fn finished_subtasks_stand_in_later_checkpoints() {
        let mut c = CheckpointCoordinator::new(CONFIG, local(2), 1, 0);
        assert_eq!(c.poll(100), Some(Decision::Trigger(1)));
        let finished = c.finish(&here(0), 110).expect("own");
        assert_eq!(finished, Finished { acknowledged: true, decision: None });
        assert_eq!(ack(&mut c, 1, 1, 120), Some(Decision::Complete(1)));
        assert_eq!(c.poll(300), Some(Decision::Trigger(2)));
        assert_eq!(c.acknowledge_finished(2, 300), None, "participant 1 still runs");
        let last = c.finish(&here(1), 310).expect("own");
        assert_eq!(last, Finished { acknowledged: true, decision: Some(Decision::Complete(2)) });
        assert_eq!(c.poll(600), Some(Decision::Trigger(3)));
        assert_eq!(c.acknowledge_finished(3, 600), Some(Decision::Complete(3)));
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
            let mut c = CheckpointCoordinator::new(CONFIG, local(participants as u32), 1, 0);
            let (mut now, mut last_trigger, mut last_end) = (0i64, 0i64, None::<i64>);
            let mut expected_next = 1;
            let mut acked: BTreeSet<usize> = BTreeSet::new();
            for (kind, who, dt) in steps {
                now += dt;
                let pending = c.pending();
                let decision = match (kind, pending) {
                    (0 | 1, Some(id)) => ack(&mut c, id, who, now),
                    (2, Some(id)) => ack(&mut c, id.saturating_sub(1), who, now),
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
