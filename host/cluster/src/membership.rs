//! Who is in the cluster, as an I/O-free state machine driven by registrations, heartbeats and
//! the clock: the coordinator's shell feeds it and reads the verdicts, and the tests drive it
//! with a simulated clock.
//!
//! A worker registers with its slots and gets an incarnation number; every heartbeat names
//! that incarnation. A worker that registers again under its name (it restarted) replaces the
//! old incarnation, which is dead from then on: its subtasks are lost. A worker whose last
//! heartbeat is older than the timeout is declared dead and removed; if it is still alive it
//! learns so at its next heartbeat (unknown incarnation) and registers afresh.

use std::collections::BTreeMap;

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

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Membership {
    members: BTreeMap<String, Member>,
    timeout_ms: u64,
    next_incarnation: u64,
}

impl Membership {
    /// An empty cluster whose workers die after `timeout_ms` without a heartbeat.
    pub fn new(timeout_ms: u64) -> Self {
        Self { members: BTreeMap::new(), timeout_ms, next_incarnation: 1 }
    }

    /// Worker `name` registered: returns its new incarnation, and the previous incarnation if
    /// this replaces one.
    pub fn register(&mut self, name: &str, slots: u32, data_addr: &str, now_ms: u64) -> (u64, Option<Departed>) {
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
        (incarnation, previous.map(|member| Departed { member, why: Departure::Restarted }))
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
    pub fn free_slots(&self) -> u32 {
        self.members.values().map(Member::free_slots).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_live_while_they_beat_and_die_after_the_timeout() {
        let mut m = Membership::new(1_000);
        let (w1, replaced) = m.register("w1", 2, "10.0.0.1:7000", 0);
        assert_eq!(replaced, None);
        let (w2, _) = m.register("w2", 4, "10.0.0.2:7000", 100);
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
        let (first, _) = m.register("w1", 2, "10.0.0.1:7000", 0);
        let (second, replaced) = m.register("w1", 3, "10.0.0.9:7001", 500);
        assert!(second > first);
        let replaced = replaced.expect("the old incarnation");
        assert_eq!((replaced.member.incarnation, replaced.why), (first, Departure::Restarted));
        assert!(m.heartbeat("w1", first, 600).is_err());
        m.heartbeat("w1", second, 600).expect("the new one");
        assert_eq!(m.get("w1").map(|w| (w.slots, w.data_addr.as_str())), Some((3, "10.0.0.9:7001")));
    }

    #[test]
    fn a_heartbeat_never_moves_a_worker_back_in_time() {
        let mut m = Membership::new(100);
        let (w, _) = m.register("w", 1, "h:1", 1_000);
        m.heartbeat("w", w, 500).expect("member");
        assert_eq!(m.get("w").map(|w| w.last_heartbeat_ms), Some(1_000));
    }
}
