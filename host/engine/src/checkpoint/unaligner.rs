//! Barrier handling for every checkpoint mode as one state machine (no I/O): aligned,
//! unaligned, and aligned with a timeout that switches a slow alignment to unaligned.
//!
//! **Aligned**: a channel that delivered barrier `n` is blocked
//! until every live channel did; then the task snapshots, forwards the barrier and unblocks.
//!
//! **Unaligned**: the first barrier `n` on any channel makes the task snapshot at once and
//! forward the barrier. No channel is ever blocked. Every record arriving afterwards on a
//! channel whose barrier `n` has not come yet is in flight for checkpoint `n`: it was sent
//! before the upstream's snapshot, so neither side's state holds it. Those records are recorded
//! per channel (in arrival order) until the channel's barrier arrives or the channel ends; a
//! barrier that overtook records queued in its channel brings copies of them along, and they
//! are recorded too. When every live channel delivered barrier `n` the snapshot is complete:
//! the state taken at the first barrier plus the recorded records, which a restore replays
//! into the operators before any new input.
//!
//! **Aligned with a timeout**: a checkpoint starts aligned; once `aligned_timeout_ms` has passed
//! since it was triggered (or, trigger time unknown, since its first barrier) it switches to
//! unaligned. The task snapshots at that moment, so the
//! snapshot covers everything processed so far. A channel that already delivered barrier `n`
//! is released: what it held back came after its barrier, belongs after the snapshot, and is
//! processed normally (never recorded). A channel still waiting for barrier `n` holds records
//! from before that barrier the snapshot has not seen: they are recorded until the barrier
//! comes, and the shell asks those channels to let barrier `n` overtake what is queued
//! ([`Outcome::overtake`]), so the checkpoint need not wait for the queue to drain. A barrier
//! that arrives having overtaken records during alignment switches the checkpoint at once:
//! what it overtook is still to be processed, so it must be recorded, never held back. If the
//! timeout passes before any barrier of the checkpoint arrived, every channel is asked to let it
//! overtake ([`BarrierHandler::on_tick`]).
//!
//! A newer barrier abandons the checkpoint in progress (given up upstream): its held snapshot
//! and records are dropped ([`Outcome::abandoned`]).

use eddy_checkpoint::CheckpointId;

/// How barriers are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierMode {
    /// Aligned; with `Some(ms)`, a checkpoint whose alignment took `ms` switches to unaligned.
    Aligned {
        /// The alignment timeout, ms.
        timeout_ms: Option<u64>,
    },
    /// Unaligned from the first barrier.
    Unaligned,
}

/// What the task does after an event. Several fields may be set at once; the task applies
/// them in field order: drop the abandoned snapshot, take the new one (and forward the
/// barrier), ask channels to let the barrier overtake, report the complete snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<T> {
    /// A checkpoint whose snapshot was taken but is given up: drop it and its records.
    pub abandoned: Option<CheckpointId>,
    /// Snapshot now and forward barrier `id` downstream.
    pub snapshot: Option<CheckpointId>,
    /// Ask these channels to let barrier `id` overtake the data queued in them.
    pub overtake: Option<(CheckpointId, Vec<usize>)>,
    /// The snapshot of checkpoint `id` is complete: report it with these in-flight records
    /// (channel, record), in arrival order (empty when aligned).
    pub complete: Option<(CheckpointId, Vec<(usize, T)>)>,
}

impl<T> Default for Outcome<T> {
    fn default() -> Self {
        Self { abandoned: None, snapshot: None, overtake: None, complete: None }
    }
}

impl<T> Outcome<T> {
    /// Nothing to do.
    pub fn is_nothing(&self) -> bool {
        self.abandoned.is_none() && self.snapshot.is_none() && self.overtake.is_none() && self.complete.is_none()
    }
}

#[derive(Debug, Clone)]
enum Phase<T> {
    /// Channels that delivered the barrier are blocked.
    Aligning,
    /// Snapshot taken; recording in-flight records.
    Unaligned { recorded: Vec<(usize, T)> },
}

#[derive(Debug, Clone)]
struct Current<T> {
    id: CheckpointId,
    /// When its first barrier arrived, ms.
    started_ms: i64,
    phase: Phase<T>,
}

/// See the module docs. `T` is whatever the shell records (a channel message).
#[derive(Debug, Clone)]
pub struct BarrierHandler<T> {
    mode: BarrierMode,
    /// Barrier of the current checkpoint arrived on the channel.
    arrived: Vec<bool>,
    ended: Vec<bool>,
    /// The gate's blocked set, kept in step with the state.
    blocked: Vec<bool>,
    current: Option<Current<T>>,
    /// The newest checkpoint snapshotted (or, aligning, completed).
    last: Option<CheckpointId>,
    /// When the newest checkpoint's first barrier arrived, ms.
    started_ms: Option<i64>,
    /// The newest checkpoint whose barriers were asked to overtake before any arrived.
    overtake_asked: Option<CheckpointId>,
}

impl<T> BarrierHandler<T> {
    /// A handler over `channels` input channels.
    pub fn new(channels: usize, mode: BarrierMode) -> Self {
        Self {
            mode,
            arrived: vec![false; channels],
            ended: vec![false; channels],
            blocked: vec![false; channels],
            current: None,
            last: None,
            started_ms: None,
            overtake_asked: None,
        }
    }

    /// The mode.
    pub fn mode(&self) -> BarrierMode {
        self.mode
    }

    /// Which channels the gate must hold back (indexed by channel): the one truth the gate follows.
    pub fn blocked(&self) -> &[bool] {
        &self.blocked
    }

    /// The checkpoint in progress (aligning or recording).
    pub fn in_progress(&self) -> Option<CheckpointId> {
        self.current.as_ref().map(|c| c.id)
    }

    /// When the newest checkpoint (in progress or just completed) started: its first barrier, ms.
    pub fn started_ms(&self) -> Option<i64> {
        self.started_ms
    }

    /// Whether a record arriving on `channel` now is in flight for the checkpoint in progress.
    pub fn records(&self, channel: usize) -> bool {
        matches!(&self.current, Some(Current { phase: Phase::Unaligned { .. }, .. }))
            && !self.arrived.get(channel).copied().unwrap_or(true)
            && !self.ended.get(channel).copied().unwrap_or(true)
    }

    /// A record (made by `record` only if needed) arrived on `channel`; returns whether it was
    /// recorded as in flight. It is processed either way.
    pub fn on_data(&mut self, channel: usize, record: impl FnOnce() -> T) -> bool {
        if !self.records(channel) {
            return false;
        }
        if let Some(Current { phase: Phase::Unaligned { recorded }, .. }) = &mut self.current {
            recorded.push((channel, record()));
        }
        true
    }

    /// Barrier `id` arrived on `channel` at `now_ms`, having overtaken `overtaken` (copies of
    /// the records queued ahead of it in its channel, oldest first; empty if it overtook none).
    pub fn on_barrier(&mut self, channel: usize, id: CheckpointId, overtaken: Vec<T>, now_ms: i64) -> Outcome<T> {
        let mut out = Outcome::default();
        if channel >= self.arrived.len() || self.ended[channel] {
            return out;
        }
        match &self.current {
            Some(c) if id < c.id => return out,
            Some(c) if id > c.id => {
                if matches!(c.phase, Phase::Unaligned { .. }) {
                    out.abandoned = Some(c.id);
                }
                self.current = None;
                self.arrived.fill(false);
            }
            Some(_) => {}
            None if self.last.is_some_and(|last| id <= last) => return out,
            None => {}
        }
        if self.current.is_none() {
            self.arrived.fill(false);
            self.current = Some(Current { id, started_ms: now_ms, phase: Phase::Aligning });
            self.started_ms = Some(now_ms);
            if self.mode == BarrierMode::Unaligned {
                self.unalign(&mut out);
            }
        }
        if self.arrived[channel] {
            // A second barrier `id` on one channel: not from a well-behaved sender; ignore it.
            self.refresh();
            return out;
        }
        self.arrived[channel] = true;
        if !overtaken.is_empty() && matches!(self.current, Some(Current { phase: Phase::Aligning, .. })) {
            // What it overtook comes before it and is still to be processed: never hold it back.
            self.unalign(&mut out);
        }
        if let Some(Current { phase: Phase::Unaligned { recorded }, .. }) = &mut self.current {
            recorded.extend(overtaken.into_iter().map(|r| (channel, r)));
        }
        self.check(&mut out);
        self.refresh();
        out
    }

    /// `channel` ended: it sends no more barriers, and nothing more is in flight on it.
    pub fn on_end(&mut self, channel: usize) -> Outcome<T> {
        let mut out = Outcome::default();
        if let Some(e) = self.ended.get_mut(channel) {
            *e = true;
        }
        self.check(&mut out);
        self.refresh();
        out
    }

    /// Time passes. `triggered` is the newest checkpoint the coordinator triggered and when
    /// (ms), if known: the aligned timeout counts from there, as the barrier itself may wait a
    /// long time behind queued data before it arrives at all. An alignment that has taken the
    /// timeout switches to unaligned; a checkpoint whose barrier has not arrived on any channel
    /// by then has its barrier asked to overtake on every channel, and when it arrives having
    /// overtaken records the checkpoint is unaligned at once (see [`Self::on_barrier`]).
    pub fn on_tick(&mut self, now_ms: i64, triggered: Option<(CheckpointId, i64)>) -> Outcome<T> {
        let mut out = Outcome::default();
        let BarrierMode::Aligned { timeout_ms: Some(timeout) } = self.mode else { return out };
        let timeout = i64::try_from(timeout).unwrap_or(i64::MAX);
        let triggered_at = |id: CheckpointId| triggered.filter(|(t, ms)| *t == id && *ms > 0).map(|(_, ms)| ms);
        match &self.current {
            Some(c) if matches!(c.phase, Phase::Aligning) => {
                let since = triggered_at(c.id).map_or(c.started_ms, |t| t.min(c.started_ms));
                if now_ms.saturating_sub(since) >= timeout {
                    self.unalign(&mut out);
                    self.check(&mut out);
                    self.refresh();
                }
            }
            Some(_) => {}
            None => {
                if let Some((id, at)) = triggered.filter(|(_, ms)| *ms > 0)
                    && self.last.is_none_or(|last| id > last)
                    && self.overtake_asked.is_none_or(|asked| id > asked)
                    && now_ms.saturating_sub(at) >= timeout
                {
                    self.overtake_asked = Some(id);
                    out.overtake = Some((id, (0..self.ended.len()).filter(|&c| !self.ended[c]).collect()));
                }
            }
        }
        out
    }

    /// Switches the checkpoint in progress to unaligned: snapshot now, ask the channels still
    /// waiting for its barrier to let it overtake.
    fn unalign(&mut self, out: &mut Outcome<T>) {
        let Some(c) = &mut self.current else { return };
        if matches!(c.phase, Phase::Unaligned { .. }) {
            return;
        }
        c.phase = Phase::Unaligned { recorded: Vec::new() };
        out.snapshot = Some(c.id);
        self.last = Some(c.id);
        // In unaligned mode every barrier overtakes anyway (the shell set that up once).
        if self.mode != BarrierMode::Unaligned {
            let waiting = (0..self.arrived.len()).filter(|&ch| !self.arrived[ch] && !self.ended[ch]).collect();
            out.overtake = Some((c.id, waiting));
        }
    }

    fn check(&mut self, out: &mut Outcome<T>) {
        if self.current.is_none() || !self.arrived.iter().zip(&self.ended).all(|(a, e)| *a || *e) {
            return;
        }
        let Some(c) = self.current.take() else { return };
        match c.phase {
            Phase::Aligning => {
                out.snapshot = Some(c.id);
                out.complete = Some((c.id, Vec::new()));
            }
            Phase::Unaligned { recorded } => out.complete = Some((c.id, recorded)),
        }
        self.last = Some(c.id);
        // Channels that have not yet delivered it are now all ended: nothing left to overtake.
        out.overtake = None;
        self.arrived.fill(false);
    }

    fn refresh(&mut self) {
        let aligning = matches!(self.current, Some(Current { phase: Phase::Aligning, .. }));
        for (b, a) in self.blocked.iter_mut().zip(&self.arrived) {
            *b = aligning && *a;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A completed checkpoint of the model: its id and its recorded (channel, record) pairs.
    type Completed = (u64, Vec<(usize, (usize, usize))>);

    const ALIGNED: BarrierMode = BarrierMode::Aligned { timeout_ms: None };

    fn snapshot(id: CheckpointId) -> Outcome<&'static str> {
        Outcome { snapshot: Some(id), ..Outcome::default() }
    }

    fn complete(id: CheckpointId, records: Vec<(usize, &'static str)>) -> Outcome<&'static str> {
        Outcome { complete: Some((id, records)), ..Outcome::default() }
    }

    #[test]
    fn aligned_blocks_until_every_barrier_arrived_then_snapshots_and_completes_at_once() {
        let mut h = BarrierHandler::<&str>::new(2, ALIGNED);
        assert!(h.on_barrier(0, 1, vec![], 0).is_nothing());
        assert_eq!(h.blocked(), &[true, false]);
        assert!(!h.on_data(1, || "x"), "aligned mode records nothing");
        assert_eq!(h.on_barrier(1, 1, vec![], 5), Outcome { snapshot: Some(1), ..complete(1, vec![]) });
        assert_eq!(h.blocked(), &[false, false]);
        assert!(h.on_barrier(0, 1, vec![], 6).is_nothing(), "stale");
    }

    #[test]
    fn unaligned_snapshots_at_the_first_barrier_and_records_each_channel_until_its_barrier() {
        let mut h = BarrierHandler::new(3, BarrierMode::Unaligned);
        assert!(!h.on_data(0, || "before"), "no checkpoint in progress");
        assert_eq!(h.on_barrier(1, 7, vec![], 0), snapshot(7));
        assert_eq!(h.blocked(), &[false, false, false], "nothing is ever blocked");
        assert!(h.on_data(0, || "a1"));
        assert!(!h.on_data(1, || "after barrier"), "channel 1's records after its barrier belong after the snapshot");
        assert!(h.on_data(2, || "c1"));
        assert!(h.on_data(0, || "a2"));
        assert!(h.on_barrier(0, 7, vec!["a3 overtaken", "a4 overtaken"], 1).is_nothing());
        assert!(!h.on_data(0, || "a5"), "channel 0's barrier came");
        assert!(h.on_data(2, || "c2"));
        assert_eq!(
            h.on_barrier(2, 7, vec![], 2),
            complete(7, vec![(0, "a1"), (2, "c1"), (0, "a2"), (0, "a3 overtaken"), (0, "a4 overtaken"), (2, "c2")])
        );
        assert!(!h.on_data(2, || "later"));
        assert!(h.on_barrier(1, 7, vec!["late"], 3).is_nothing(), "a barrier of a taken checkpoint is stale");
    }

    #[test]
    fn unaligned_with_one_channel_completes_with_what_the_barrier_overtook() {
        let mut h = BarrierHandler::new(1, BarrierMode::Unaligned);
        assert_eq!(
            h.on_barrier(0, 1, vec!["q1", "q2"], 0),
            Outcome { snapshot: Some(1), ..complete(1, vec![(0, "q1"), (0, "q2")]) }
        );
    }

    #[test]
    fn an_ended_channel_stops_recording_and_never_holds_a_checkpoint_back() {
        let mut h = BarrierHandler::new(2, BarrierMode::Unaligned);
        assert_eq!(h.on_barrier(0, 1, vec![], 0), snapshot(1));
        assert!(h.on_data(1, || "last words"));
        assert_eq!(h.on_end(1), complete(1, vec![(1, "last words")]));
        assert_eq!(
            h.on_barrier(0, 2, vec![], 1),
            Outcome { snapshot: Some(2), ..complete(2, vec![]) },
            "one live channel left"
        );
    }

    #[test]
    fn a_newer_barrier_abandons_the_unaligned_checkpoint_in_progress() {
        let mut h = BarrierHandler::new(2, BarrierMode::Unaligned);
        assert_eq!(h.on_barrier(0, 1, vec![], 0), snapshot(1));
        assert!(h.on_data(1, || "for 1"));
        assert_eq!(
            h.on_barrier(0, 2, vec![], 1),
            Outcome { abandoned: Some(1), snapshot: Some(2), ..Outcome::default() }
        );
        assert!(h.on_data(1, || "for 2"));
        assert!(h.on_barrier(1, 1, vec!["stale"], 2).is_nothing(), "the abandoned checkpoint's barrier");
        assert_eq!(h.on_barrier(1, 2, vec![], 3), complete(2, vec![(1, "for 2")]));
    }

    #[test]
    fn the_aligned_timeout_switches_releasing_blocked_channels_and_recording_the_others() {
        let mut h = BarrierHandler::new(3, BarrierMode::Aligned { timeout_ms: Some(100) });
        assert!(h.on_barrier(0, 4, vec![], 1_000).is_nothing());
        assert_eq!(h.blocked(), &[true, false, false]);
        assert!(!h.on_data(1, || "aligned: processed, not recorded"));
        assert!(h.on_tick(1_099, None).is_nothing(), "not yet");
        assert_eq!(h.blocked(), &[true, false, false]);
        assert_eq!(
            h.on_tick(1_100, None),
            Outcome { snapshot: Some(4), overtake: Some((4, vec![1, 2])), ..Outcome::default() },
            "snapshot now; channels 1 and 2 still owe barrier 4"
        );
        assert_eq!(h.blocked(), &[false, false, false], "channel 0 released: what it held is after its barrier");
        assert!(!h.on_data(0, || "after barrier 4 on channel 0"));
        assert!(h.on_data(1, || "b1"));
        assert!(h.on_tick(5_000, Some((4, 900))).is_nothing(), "switched once");
        assert!(h.on_barrier(1, 4, vec!["b2 overtaken"], 1_200).is_nothing());
        assert!(h.on_data(2, || "c1"));
        assert_eq!(h.on_barrier(2, 4, vec![], 1_300), complete(4, vec![(1, "b1"), (1, "b2 overtaken"), (2, "c1")]));
        // The next checkpoint starts aligned again.
        assert!(h.on_barrier(2, 5, vec![], 2_000).is_nothing());
        assert_eq!(h.blocked(), &[false, false, true]);
    }

    #[test]
    fn the_aligned_timeout_counts_from_the_trigger_and_asks_barriers_to_overtake_before_they_arrive() {
        let mut h = BarrierHandler::new(2, BarrierMode::Aligned { timeout_ms: Some(100) });
        assert!(h.on_tick(1_050, Some((3, 1_000))).is_nothing(), "triggered 50 ms ago");
        assert_eq!(
            h.on_tick(1_100, Some((3, 1_000))),
            Outcome { overtake: Some((3, vec![0, 1])), ..Outcome::default() },
            "no barrier 3 yet after 100 ms: every channel is asked to let it overtake"
        );
        assert!(h.on_tick(1_200, Some((3, 1_000))).is_nothing(), "asked once");
        assert_eq!(
            h.on_barrier(1, 3, vec!["q1"], 1_210),
            Outcome { snapshot: Some(3), overtake: Some((3, vec![0])), ..Outcome::default() },
            "it overtook records: unaligned at once"
        );
        assert_eq!(h.blocked(), &[false, false]);
        assert!(h.on_data(0, || "a1"));
        assert_eq!(h.on_barrier(0, 3, vec![], 1_220), complete(3, vec![(1, "q1"), (0, "a1")]));
        // Checkpoint 4: its first barrier arrives 80 ms after the trigger; 20 ms later the
        // alignment has taken the timeout counted from the trigger.
        assert!(h.on_barrier(0, 4, vec![], 2_080).is_nothing());
        assert!(h.on_tick(2_099, Some((4, 2_000))).is_nothing());
        assert_eq!(
            h.on_tick(2_100, Some((4, 2_000))),
            Outcome { snapshot: Some(4), overtake: Some((4, vec![1])), ..Outcome::default() }
        );
        assert!(h.on_tick(9_000, Some((3, 1))).is_nothing(), "an old trigger asks nothing");
    }

    #[test]
    fn a_barrier_that_overtook_records_while_aligning_switches_to_unaligned() {
        let mut h = BarrierHandler::new(2, BarrierMode::Aligned { timeout_ms: Some(100) });
        assert!(h.on_barrier(0, 1, vec![], 0).is_nothing());
        assert_eq!(
            h.on_barrier(1, 1, vec!["q"], 10),
            Outcome { snapshot: Some(1), ..complete(1, vec![(1, "q")]) },
            "never held back behind its own barrier"
        );
        assert_eq!(h.blocked(), &[false, false]);
    }

    proptest! {
        /// Channels carry records and barriers 1..=k in order (barrier n+1 only once checkpoint
        /// n completed, as the coordinator has one in flight); the handler (unaligned, or
        /// aligned with a timeout ticking at random) completes every checkpoint once, in
        /// order, and the records it recorded for checkpoint n on a channel are exactly those
        /// of that channel that come before barrier n and were delivered after the snapshot
        /// of n: the snapshot plus the recorded records equal the prefix of every channel up
        /// to its barrier.
        #[test]
        fn snapshot_plus_recorded_equals_every_channel_up_to_its_barrier(
            channels in 1usize..4,
            checkpoints in 1u64..4,
            per_gap in 0usize..4,
            timeout in proptest::option::of(1u64..30),
            unaligned in any::<bool>(),
            order in proptest::collection::vec(0usize..8, 0..300),
        ) {
            // Channel c: records (c, i) with barrier n after the n-th group of `per_gap` records.
            let mut queues: Vec<std::collections::VecDeque<Result<(usize, usize), u64>>> = (0..channels)
                .map(|c| {
                    let mut q = std::collections::VecDeque::new();
                    let mut i = 0;
                    for n in 1..=checkpoints {
                        for _ in 0..per_gap {
                            q.push_back(Ok((c, i)));
                            i += 1;
                        }
                        q.push_back(Err(n));
                    }
                    q
                })
                .collect();
            let mode = if unaligned { BarrierMode::Unaligned } else { BarrierMode::Aligned { timeout_ms: timeout } };
            let mut h = BarrierHandler::<(usize, usize)>::new(channels, mode);
            let mut processed: Vec<(usize, usize)> = Vec::new();
            let mut snapshots: std::collections::BTreeMap<u64, Vec<(usize, usize)>> = Default::default();
            let mut completed = Vec::new();
            let mut now = 0i64;
            let mut picks = order.into_iter().chain(std::iter::repeat(0));
            let apply = |out: Outcome<(usize, usize)>, processed: &Vec<(usize, usize)>,
                         snapshots: &mut std::collections::BTreeMap<u64, Vec<(usize, usize)>>,
                         completed: &mut Vec<Completed>| {
                if let Some(id) = out.snapshot {
                    snapshots.insert(id, processed.clone());
                }
                if let Some(done) = out.complete {
                    completed.push(done);
                }
            };
            while queues.iter().any(|q| !q.is_empty()) {
                now += 1;
                let pick = picks.next().unwrap_or(0);
                if pick == 7 {
                    let out = h.on_tick(now, None);
                    apply(out, &processed, &mut snapshots, &mut completed);
                    continue;
                }
                // At most one checkpoint in flight: barrier n+1 is sent only once n completed.
                let next = completed.len() as u64 + 1;
                let sendable = |q: &std::collections::VecDeque<Result<(usize, usize), u64>>| match q.front() {
                    Some(Err(n)) => *n <= next,
                    Some(Ok(_)) => true,
                    None => false,
                };
                let live: Vec<usize> = (0..channels).filter(|&c| sendable(&queues[c]) && !h.blocked()[c]).collect();
                prop_assert!(!live.is_empty(), "deadlock");
                let c = live[pick % live.len()];
                match queues[c].pop_front() {
                    Some(Ok(r)) => {
                        h.on_data(c, || r);
                        processed.push(r);
                    }
                    Some(Err(n)) => {
                        let out = h.on_barrier(c, n, Vec::new(), now);
                        apply(out, &processed, &mut snapshots, &mut completed);
                    }
                    None => {}
                }
            }
            let ids: Vec<u64> = completed.iter().map(|(id, _)| *id).collect();
            prop_assert_eq!(ids, (1..=checkpoints).collect::<Vec<_>>());
            for (id, recorded) in completed {
                let mut restored: Vec<(usize, usize)> = snapshots[&id].clone();
                for (c, r) in recorded {
                    prop_assert_eq!(c, r.0, "recorded under its own channel");
                    restored.push(r);
                }
                restored.sort();
                let expected: Vec<(usize, usize)> = (0..channels)
                    .flat_map(|c| (0..per_gap * id as usize).map(move |i| (c, i)))
                    .collect();
                prop_assert_eq!(restored, expected, "checkpoint {}", id);
            }
        }
    }
}
