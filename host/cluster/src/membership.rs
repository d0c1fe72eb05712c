//! Who is in the cluster, as an I/O-free state machine driven by registrations, heartbeats and
//! the clock: the coordinator's shell feeds it and reads the verdicts, and the tests drive it
//! with a simulated clock.
//!
//! A worker registers with its slots and gets an incarnation number; every heartbeat names
//! that incarnation. A worker that registers again under its name (it restarted) replaces the
//! old incarnation, which is dead from then on: its subtasks are lost. A worker whose last
//! heartbeat is older than the timeout is declared dead and removed; if it is still alive it
//! learns so at its next heartbeat (unknown incarnation) and registers afresh.
//!
//! A worker is trusted with what it was given and nothing more, and what it was given is
//! state here: each part of a job attempt is [deployed](Membership::deploy) to one worker
//! incarnation with the artifacts it runs. A part's reports are taken only from the
//! incarnation it was deployed to ([`Membership::part_report`]), and a worker may fetch only
//! the artifacts of parts deployed to it ([`Membership::may_fetch`]). A worker offers at most
//! [`MAX_SLOTS_PER_WORKER`] slots, and slots are summed as `u64`.

use std::collections::{BTreeMap, BTreeSet};

use crate::protocol::PartState;

/// The most slots one worker may offer: more than any machine's cores, so a worker claiming
/// more is misconfigured or lying, and is refused rather than given jobs it cannot run.
pub const MAX_SLOTS_PER_WORKER: u32 = 256;

/// A live worker as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Its name (the DNS name in its certificate).
    pub name: String,
    /// This registration's number, unique within the coordinator's run.
    pub incarnation: u64,
    /// Slots it offers.
    pub slots: u32,
    /// Slots subtasks hold.
    pub used_slots: u32,
    /// Where other workers reach its data plane (`host:port`).
    pub data_addr: String,
    /// When it registered (ms on the control plane's monotonic clock).
    pub registered_ms: u64,
    /// When its last heartbeat came.
    pub last_heartbeat_ms: u64,
}

impl Member {
    /// Slots no subtask holds.
    pub fn free_slots(&self) -> u32 {
        self.slots.saturating_sub(self.used_slots)
    }
}

/// Why a worker left the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Departure {
    /// No heartbeat for longer than the timeout.
    MissedHeartbeats {
        /// How long it had been silent (ms).
        silent_ms: u64,
    },
    /// It registered again: the previous incarnation is gone.
    Restarted,
}

/// A worker that left, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    /// The worker as it was.
    pub member: Member,
    /// Why it left.
    pub why: Departure,
}

/// A heartbeat the membership does not know: the worker must register again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("worker `{name}` incarnation {incarnation} is not a member (declared dead or replaced): register again")]
pub struct UnknownIncarnation {
    /// The worker's name.
    pub name: String,
    /// The incarnation it named.
    pub incarnation: u64,
}

/// The cluster has too few free slots for a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the job needs {needed} slot(s) and the cluster's {workers} live worker(s) have {free} free: start more workers or lower the job's parallelism"
)]
pub struct NoSlots {
    /// Slots the job needs.
    pub needed: u32,
    /// Slots free across the cluster.
    pub free: u64,
    /// Live workers.
    pub workers: usize,
}

/// A worker offered more slots than [`MAX_SLOTS_PER_WORKER`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("worker `{name}` offers {slots} slots; at most {MAX_SLOTS_PER_WORKER} are taken: start it with fewer --slots")]
pub struct TooManySlots {
    /// The worker.
    pub name: String,
    /// What it offered.
    pub slots: u32,
}

/// A report about a part that was not deployed to its sender.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "worker `{from}` incarnation {incarnation} reported on job {job} attempt {attempt}, whose part it does not run"
)]
pub struct NotDeployed {
    /// The sender.
    pub from: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// The job it named.
    pub job: String,
    /// The attempt it named.
    pub attempt: u64,
}

impl NotDeployed {
    fn of(from: &SlotHolder, job: &str, attempt: u64) -> Self {
        Self { from: from.name.clone(), incarnation: from.incarnation, job: job.to_owned(), attempt }
    }
}

/// A part of a job attempt, deployed to one worker incarnation.
#[derive(Debug, Clone)]
struct Deployed {
    incarnation: u64,
    /// The artifacts it runs: what the worker may fetch.
    digests: BTreeSet<String>,
    /// What it last reported.
    state: Option<PartState>,
    /// The newest live swap it was asked to prepare (step, digest), and its answer.
    asked: Option<(String, String)>,
    swap: Option<SwapAnswer>,
}

/// A worker's answer to a [`PrepareSwap`](crate::protocol::CoordinatorMessage::PrepareSwap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapAnswer {
    /// The step.
    pub step: String,
    /// The new code's digest.
    pub digest: String,
    /// Why the code is not ready (bounded); `None`: ready.
    pub problem: Option<String>,
}

/// One slot of a job: the worker incarnation that holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlotHolder {
    /// The worker's name.
    pub name: String,
    /// Its incarnation when the slot was given: a restarted worker holds none of its
    /// predecessor's slots.
    pub incarnation: u64,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Membership {
    members: BTreeMap<String, Member>,
    timeout_ms: u64,
    next_incarnation: u64,
    /// The slots each job holds, slot `i` first.
    held: BTreeMap<String, Vec<SlotHolder>>,
    /// The parts of each job attempt, by worker name.
    deployed: BTreeMap<(String, u64), BTreeMap<String, Deployed>>,
}

impl Membership {
    /// An empty cluster whose workers die after `timeout_ms` without a heartbeat.
    pub fn new(timeout_ms: u64) -> Self {
        Self {
            members: BTreeMap::new(),
            timeout_ms,
            next_incarnation: 1,
            held: BTreeMap::new(),
            deployed: BTreeMap::new(),
        }
    }

    /// Worker `name` registered: returns its new incarnation, and the previous incarnation if
    /// this replaces one. Refused past [`MAX_SLOTS_PER_WORKER`].
    pub fn register(
        &mut self,
        name: &str,
        slots: u32,
        data_addr: &str,
        now_ms: u64,
    ) -> Result<(u64, Option<Departed>), TooManySlots> {
        if slots > MAX_SLOTS_PER_WORKER {
            return Err(TooManySlots { name: name.to_owned(), slots });
        }
        let incarnation = self.next_incarnation;
        self.next_incarnation += 1;
        let member = Member {
            name: name.to_owned(),
            incarnation,
            slots,
            used_slots: 0,
            data_addr: data_addr.to_owned(),
            registered_ms: now_ms,
            last_heartbeat_ms: now_ms,
        };
        let previous = self.members.insert(name.to_owned(), member);
        Ok((incarnation, previous.map(|member| Departed { member, why: Departure::Restarted })))
    }

    /// `job`'s `attempt` has a part on `to`, running `digests`: from now on that incarnation
    /// may report on it and fetch those artifacts.
    pub fn deploy(&mut self, job: &str, attempt: u64, to: &SlotHolder, digests: &[String]) {
        let part = Deployed {
            incarnation: to.incarnation,
            digests: digests.iter().cloned().collect(),
            state: None,
            asked: None,
            swap: None,
        };
        self.deployed.entry((job.to_owned(), attempt)).or_default().insert(to.name.clone(), part);
    }

    /// `from` says its part of `job`'s `attempt` is in `state`; refused unless that part was
    /// deployed to that very incarnation.
    pub fn part_report(
        &mut self,
        from: &SlotHolder,
        job: &str,
        attempt: u64,
        state: PartState,
    ) -> Result<(), NotDeployed> {
        match self.part_of(from, job, attempt) {
            Some(part) => {
                part.state = Some(state);
                Ok(())
            }
            None => Err(NotDeployed::of(from, job, attempt)),
        }
    }

    /// `job`'s `attempt` asks `to` to prepare a live swap of `step` to `digest`: that
    /// incarnation may now fetch it, and its earlier answer is forgotten. False if it runs no
    /// such part.
    pub fn ask_swap(&mut self, to: &SlotHolder, job: &str, attempt: u64, step: &str, digest: &str) -> bool {
        let Some(part) = self.part_of(to, job, attempt) else { return false };
        part.digests.insert(digest.to_owned());
        part.asked = Some((step.to_owned(), digest.to_owned()));
        part.swap = None;
        true
    }

    /// `from` answers whether its part of `job`'s `attempt` prepared a live swap; refused
    /// unless that part was deployed to that very incarnation and asked for that step and
    /// digest.
    pub fn swap_answer(
        &mut self,
        from: &SlotHolder,
        job: &str,
        attempt: u64,
        answer: SwapAnswer,
    ) -> Result<(), NotDeployed> {
        let asked = |part: &&mut Deployed| {
            part.asked.as_ref().is_some_and(|(step, digest)| *step == answer.step && *digest == answer.digest)
        };
        match self.part_of(from, job, attempt).filter(asked) {
            Some(part) => {
                part.swap = Some(answer);
                Ok(())
            }
            None => Err(NotDeployed::of(from, job, attempt)),
        }
    }

    /// Each worker's answer to the newest live swap of `job`'s `attempt` it was asked for.
    pub fn swap_answers(&self, job: &str, attempt: u64) -> BTreeMap<String, SwapAnswer> {
        let Some(parts) = self.deployed.get(&(job.to_owned(), attempt)) else { return BTreeMap::new() };
        parts.iter().filter_map(|(name, part)| Some((name.clone(), part.swap.clone()?))).collect()
    }

    /// Whether `from` runs a part of `job`'s `attempt` (and may send its metrics).
    pub fn runs_part(&mut self, from: &SlotHolder, job: &str, attempt: u64) -> bool {
        self.part_of(from, job, attempt).is_some()
    }

    fn part_of(&mut self, from: &SlotHolder, job: &str, attempt: u64) -> Option<&mut Deployed> {
        self.deployed
            .get_mut(&(job.to_owned(), attempt))?
            .get_mut(&from.name)
            .filter(|part| part.incarnation == from.incarnation)
    }

    /// Whether the live incarnation of worker `name` runs a part with artifact `digest`.
    pub fn may_fetch(&self, name: &str, digest: &str) -> bool {
        let Some(member) = self.members.get(name) else { return false };
        self.deployed
            .values()
            .filter_map(|parts| parts.get(name))
            .any(|part| part.incarnation == member.incarnation && part.digests.contains(digest))
    }

    /// What each worker last reported of its part of `job`'s `attempt`.
    pub fn part_states(&self, job: &str, attempt: u64) -> BTreeMap<String, PartState> {
        let Some(parts) = self.deployed.get(&(job.to_owned(), attempt)) else { return BTreeMap::new() };
        parts.iter().filter_map(|(name, part)| Some((name.clone(), part.state.clone()?))).collect()
    }

    /// `job`'s `attempt` ended: its parts' rights end with it.
    pub fn forget_attempt(&mut self, job: &str, attempt: u64) {
        self.deployed.remove(&(job.to_owned(), attempt));
    }

    /// Gives `job` `slots` slots (slot `i` runs subtask `i` of every task), spread over the
    /// workers so that each takes a share as even as their free slots allow: the worker with
    /// the most free slots takes the next slot, ties by name. Replaces what `job` held before.
    pub fn schedule(&mut self, job: &str, slots: u32) -> Result<Vec<SlotHolder>, NoSlots> {
        self.release(job);
        let mut free: Vec<(u32, &Member)> = self.members.values().map(|m| (m.free_slots(), m)).collect();
        let total: u64 = free.iter().map(|(f, _)| u64::from(*f)).sum();
        if total < u64::from(slots) || slots == 0 {
            return Err(NoSlots { needed: slots, free: total, workers: self.members.len() });
        }
        let mut holders = Vec::with_capacity(slots as usize);
        for _ in 0..slots {
            // Most free first; among equals the first by name (the map's order), so the
            // schedule is deterministic.
            let Some(best) = free.iter_mut().rev().max_by_key(|(f, _)| *f) else { break };
            best.0 -= 1;
            holders.push(SlotHolder { name: best.1.name.clone(), incarnation: best.1.incarnation });
        }
        self.held.insert(job.to_owned(), holders.clone());
        self.count_used();
        Ok(holders)
    }

    /// `job` no longer holds slots.
    pub fn release(&mut self, job: &str) {
        if self.held.remove(job).is_some() {
            self.count_used();
        }
    }

    /// Whether every holder is still the live incarnation it was; else the first one gone.
    pub fn first_gone<'a>(&self, holders: &'a [SlotHolder]) -> Option<&'a SlotHolder> {
        holders.iter().find(|h| self.members.get(&h.name).is_none_or(|m| m.incarnation != h.incarnation))
    }

    fn count_used(&mut self) {
        for m in self.members.values_mut() {
            m.used_slots = 0;
        }
        for h in self.held.values().flatten() {
            if let Some(m) = self.members.get_mut(&h.name).filter(|m| m.incarnation == h.incarnation) {
                m.used_slots += 1;
            }
        }
    }

    /// A heartbeat from `name`'s `incarnation`.
    pub fn heartbeat(&mut self, name: &str, incarnation: u64, now_ms: u64) -> Result<(), UnknownIncarnation> {
        match self.members.get_mut(name) {
            Some(m) if m.incarnation == incarnation => {
                m.last_heartbeat_ms = m.last_heartbeat_ms.max(now_ms);
                Ok(())
            }
            _ => Err(UnknownIncarnation { name: name.to_owned(), incarnation }),
        }
    }

    /// Removes and returns the workers silent for longer than the timeout at `now_ms`.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Departed> {
        let dead: Vec<String> = self
            .members
            .values()
            .filter(|m| now_ms.saturating_sub(m.last_heartbeat_ms) > self.timeout_ms)
            .map(|m| m.name.clone())
            .collect();
        dead.into_iter()
            .filter_map(|name| self.members.remove(&name))
            .map(|member| {
                let silent_ms = now_ms.saturating_sub(member.last_heartbeat_ms);
                Departed { member, why: Departure::MissedHeartbeats { silent_ms } }
            })
            .collect()
    }

    /// The live workers, by name.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// A live worker.
    pub fn get(&self, name: &str) -> Option<&Member> {
        self.members.get(name)
    }

    /// Free slots across the cluster.
    pub fn free_slots(&self) -> u64 {
        self.members.values().map(|m| u64::from(m.free_slots())).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_live_while_they_beat_and_die_after_the_timeout() {
        let mut m = Membership::new(1_000);
        let (w1, replaced) = m.register("w1", 2, "10.0.0.1:7000", 0).expect("slots");
        assert_eq!(replaced, None);
        let (w2, _) = m.register("w2", 4, "10.0.0.2:7000", 100).expect("slots");
        assert_eq!(m.free_slots(), 6);
        m.heartbeat("w1", w1, 900).expect("member");
        // At 1 050: w1 beat 150 ms ago, w2 registered 950 ms ago: both live.
        assert!(m.expire(1_050).is_empty());
        m.heartbeat("w1", w1, 1_800).expect("member");
        // At 1 101 w2 has been silent 1 001 ms: dead. w1 lives on.
        let dead = m.expire(1_101);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].member.name, "w2");
        assert_eq!(dead[0].why, Departure::MissedHeartbeats { silent_ms: 1_001 });
        assert_eq!(m.members().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["w1"]);
        // A late heartbeat of the dead incarnation is refused: it must register again.
        assert_eq!(m.heartbeat("w2", w2, 1_200), Err(UnknownIncarnation { name: "w2".into(), incarnation: w2 }));
    }

    #[test]
    fn registering_again_replaces_the_previous_incarnation() {
        let mut m = Membership::new(1_000);
        let (first, _) = m.register("w1", 2, "10.0.0.1:7000", 0).expect("slots");
        let (second, replaced) = m.register("w1", 3, "10.0.0.9:7001", 500).expect("slots");
        assert!(second > first);
        let replaced = replaced.expect("the old incarnation");
        assert_eq!((replaced.member.incarnation, replaced.why), (first, Departure::Restarted));
        assert!(m.heartbeat("w1", first, 600).is_err());
        m.heartbeat("w1", second, 600).expect("the new one");
        assert_eq!(m.get("w1").map(|w| (w.slots, w.data_addr.as_str())), Some((3, "10.0.0.9:7001")));
    }

    #[test]
    fn jobs_spread_over_the_workers_with_most_free_slots_and_release_them() {
        let mut m = Membership::new(1_000);
        m.register("a", 2, "h:1", 0).expect("slots");
        m.register("b", 3, "h:2", 0).expect("slots");
        m.register("c", 1, "h:3", 0).expect("slots");
        let names = |h: &[SlotHolder]| h.iter().map(|h| h.name.clone()).collect::<Vec<_>>();
        // Free (a 2, b 3, c 1): b, then a and b tie at 2 (a by name), then b, c... .
        assert_eq!(names(&m.schedule("j1", 4).expect("room")), ["b", "a", "b", "a"]);
        assert_eq!(m.free_slots(), 2);
        assert_eq!(
            m.schedule("j2", 3),
            Err(NoSlots { needed: 3, free: 2, workers: 3 }),
            "a job that does not fit takes nothing"
        );
        assert_eq!(names(&m.schedule("j2", 2).expect("room")), ["b", "c"]);
        assert_eq!(m.free_slots(), 0);
        m.release("j1");
        assert_eq!(m.get("a").map(Member::free_slots), Some(2));
        assert_eq!(m.free_slots(), 4);
        // Scheduling a job again replaces its slots rather than adding to them.
        assert_eq!(names(&m.schedule("j2", 2).expect("room")), ["b", "a"]);
        assert_eq!(m.free_slots(), 4);
    }

    #[test]
    fn a_restarted_worker_holds_no_slots_of_its_predecessor() {
        let mut m = Membership::new(1_000);
        m.register("a", 2, "h:1", 0).expect("slots");
        let held = m.schedule("j", 2).expect("room");
        assert_eq!(m.first_gone(&held), None);
        m.register("a", 2, "h:1", 10).expect("slots");
        assert_eq!(m.first_gone(&held).map(|h| h.name.as_str()), Some("a"));
        assert_eq!(m.free_slots(), 2, "the new incarnation runs nothing yet");
        m.expire(5_000);
        assert_eq!(m.free_slots(), 0);
    }

    #[test]
    fn a_heartbeat_never_moves_a_worker_back_in_time() {
        let mut m = Membership::new(100);
        let (w, _) = m.register("w", 1, "h:1", 1_000).expect("slots");
        m.heartbeat("w", w, 500).expect("member");
        assert_eq!(m.get("w").map(|w| w.last_heartbeat_ms), Some(1_000));
    }
}

#[cfg(test)]
mod rights {
    use super::*;

    fn holder(m: &Membership, name: &str) -> SlotHolder {
        SlotHolder { name: name.into(), incarnation: m.get(name).expect("member").incarnation }
    }

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn a_worker_reports_only_on_parts_deployed_to_it() {
        let mut m = Membership::new(1_000);
        m.register("a", 2, "h:1", 0).expect("slots");
        m.register("rogue", 8, "h:2", 0).expect("slots");
        let (a, rogue) = (holder(&m, "a"), holder(&m, "rogue"));
        m.deploy("j1", 7, &a, &[digest('a')]);
        // The rogue reports the job failed, and finished: neither is taken.
        let failed = PartState::Failed { reason: "forged".into(), detail: Default::default() };
        assert!(m.part_report(&rogue, "j1", 7, failed).is_err());
        assert!(m.part_report(&rogue, "j1", 7, PartState::Finished).is_err());
        assert!(!m.runs_part(&rogue, "j1", 7), "nor its metrics");
        assert!(m.part_states("j1", 7).is_empty());
        // The right worker, but another attempt or a stale incarnation: not taken either.
        assert!(m.part_report(&a, "j1", 8, PartState::Running).is_err());
        let stale = SlotHolder { name: "a".into(), incarnation: a.incarnation + 99 };
        assert!(m.part_report(&stale, "j1", 7, PartState::Running).is_err());
        m.part_report(&a, "j1", 7, PartState::Running).expect("its own part");
        assert_eq!(m.part_states("j1", 7), BTreeMap::from([("a".to_owned(), PartState::Running)]));
        m.forget_attempt("j1", 7);
        assert!(m.part_report(&a, "j1", 7, PartState::Finished).is_err(), "the attempt ended");
    }

    #[test]
    fn a_worker_fetches_only_artifacts_of_parts_deployed_to_it() {
        let mut m = Membership::new(1_000);
        m.register("a", 2, "h:1", 0).expect("slots");
        m.register("b", 2, "h:2", 0).expect("slots");
        let a = holder(&m, "a");
        m.deploy("j1", 1, &a, &[digest('a'), digest('b')]);
        assert!(m.may_fetch("a", &digest('a')) && m.may_fetch("a", &digest('b')));
        assert!(!m.may_fetch("a", &digest('c')), "another tenant's artifact");
        assert!(!m.may_fetch("b", &digest('a')), "a worker the part is not on");
        assert!(!m.may_fetch("stranger", &digest('a')));
        // Restarted, `a` is a new incarnation that was deployed nothing.
        m.register("a", 2, "h:1", 10).expect("slots");
        assert!(!m.may_fetch("a", &digest('a')));
    }

    #[test]
    fn a_live_swap_lets_only_the_asked_parts_fetch_the_new_code_and_answer_for_it() {
        let mut m = Membership::new(1_000);
        m.register("a", 2, "h:1", 0).expect("slots");
        m.register("rogue", 2, "h:2", 0).expect("slots");
        let (a, rogue) = (holder(&m, "a"), holder(&m, "rogue"));
        m.deploy("j1", 1, &a, &[digest('a')]);
        let answer = |d: char, problem: Option<&str>| SwapAnswer {
            step: "count".into(),
            digest: digest(d),
            problem: problem.map(str::to_owned),
        };
        assert!(m.swap_answer(&a, "j1", 1, answer('b', None)).is_err(), "not asked for that code");
        assert!(m.swap_answer(&a, "j1", 1, answer('a', None)).is_err(), "code it runs, but was not asked for");
        assert!(!m.ask_swap(&rogue, "j1", 1, "count", &digest('b')), "the rogue runs no part of the attempt");
        assert!(!m.may_fetch("rogue", &digest('b')));
        assert!(m.ask_swap(&a, "j1", 1, "count", &digest('b')));
        assert!(m.may_fetch("a", &digest('b')), "the part asked may fetch the new code");
        let other_step = SwapAnswer { step: "other".into(), ..answer('b', None) };
        assert!(m.swap_answer(&a, "j1", 1, other_step).is_err(), "an answer for a step it was not asked about");
        assert!(m.swap_answer(&rogue, "j1", 1, answer('b', None)).is_err(), "no answer for another's part");
        assert!(m.swap_answers("j1", 1).is_empty());
        m.swap_answer(&a, "j1", 1, answer('b', Some("traps in open"))).expect("its own part");
        assert_eq!(m.swap_answers("j1", 1), BTreeMap::from([("a".to_owned(), answer('b', Some("traps in open")))]));
        // Asked again, the earlier answer no longer counts.
        assert!(m.ask_swap(&a, "j1", 1, "count", &digest('b')));
        assert!(m.swap_answers("j1", 1).is_empty());
    }

    #[test]
    fn slots_are_capped_per_worker_and_summed_without_overflow() {
        let mut m = Membership::new(1_000);
        let refused = m.register("big", u32::MAX, "h:1", 0).expect_err("too many");
        assert_eq!(refused.slots, u32::MAX);
        assert!(m.get("big").is_none());
        for i in 0..20 {
            m.register(&format!("w{i}"), MAX_SLOTS_PER_WORKER, "h:1", 0).expect("at the cap");
        }
        assert_eq!(m.free_slots(), 20 * u64::from(MAX_SLOTS_PER_WORKER));
    }
}
