//! Aligned barrier handling as a state machine (no I/O): which input channels a task must
//! hold back while a checkpoint's barriers arrive, and when it may snapshot.
//!
//! When barrier `n` arrives on a channel, that channel is blocked: records behind the barrier
//! belong after the snapshot and must not reach the operators before it. Once barrier `n` has
//! arrived on every channel that has not ended, the task is aligned: it snapshots, forwards
//! the barrier and unblocks every channel. An ended channel sends no more barriers, so it
//! never holds an alignment back. A barrier newer than the one being aligned means the older
//! checkpoint was given up upstream; alignment restarts for the newer one.

use super::coordinator::CheckpointId;

/// What the task does after a barrier or an end of input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alignment {
    /// Keep going; the listed channels are blocked until alignment completes.
    Waiting,
    /// Every live channel delivered barrier `id`: snapshot, forward the barrier, unblock all.
    Aligned(CheckpointId),
    /// A barrier of a checkpoint already handled or given up: drop it.
    Stale,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct BarrierAligner {
    blocked: Vec<bool>,
    ended: Vec<bool>,
    current: Option<CheckpointId>,
    last: Option<CheckpointId>,
}

impl BarrierAligner {
    /// An aligner over `channels` input channels.
    pub fn new(channels: usize) -> Self {
        Self { blocked: vec![false; channels], ended: vec![false; channels], current: None, last: None }
    }

    /// Which channels are held back (indexed by channel).
    pub fn blocked(&self) -> &[bool] {
        &self.blocked
    }

    /// The checkpoint being aligned.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.current
    }

    /// Barrier `id` arrived on `channel`.
    pub fn on_barrier(&mut self, channel: usize, id: CheckpointId) -> Alignment {
        if channel >= self.blocked.len() || self.last.is_some_and(|last| id <= last) {
            return Alignment::Stale;
        }
        match self.current {
            Some(current) if id < current => return Alignment::Stale,
            Some(current) if id > current => self.blocked.fill(false),
            _ => {}
        }
        self.current = Some(id);
        self.blocked[channel] = true;
        self.check()
    }

    /// `channel` ended; an alignment waiting only for it completes.
    pub fn on_end(&mut self, channel: usize) -> Alignment {
        if let Some(e) = self.ended.get_mut(channel) {
            *e = true;
        }
        if let Some(b) = self.blocked.get_mut(channel) {
            *b = false;
        }
        match self.current {
            Some(_) => self.check(),
            None => Alignment::Waiting,
        }
    }

    fn check(&mut self) -> Alignment {
        let Some(id) = self.current else { return Alignment::Waiting };
        if self.blocked.iter().zip(&self.ended).all(|(b, e)| *b || *e) {
            self.blocked.fill(false);
            self.current = None;
            self.last = Some(id);
            return Alignment::Aligned(id);
        }
        Alignment::Waiting
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn blocks_each_channel_after_its_barrier_until_all_arrived() {
        let mut a = BarrierAligner::new(3);
        assert_eq!(a.on_barrier(1, 5), Alignment::Waiting);
        assert_eq!(a.blocked(), &[false, true, false]);
        assert_eq!(a.on_barrier(0, 5), Alignment::Waiting);
        assert_eq!(a.blocked(), &[true, true, false]);
        assert_eq!(a.on_barrier(2, 5), Alignment::Aligned(5));
        assert_eq!(a.blocked(), &[false, false, false]);
        assert_eq!(a.on_barrier(0, 5), Alignment::Stale, "already taken");
        assert_eq!(a.on_barrier(0, 4), Alignment::Stale);
    }

    #[test]
    fn an_ended_channel_does_not_hold_alignment_back() {
        let mut a = BarrierAligner::new(2);
        assert_eq!(a.on_barrier(0, 1), Alignment::Waiting);
        assert_eq!(a.on_end(1), Alignment::Aligned(1));
        assert_eq!(a.on_barrier(0, 2), Alignment::Aligned(2), "one live channel left");
        let mut b = BarrierAligner::new(1);
        assert_eq!(b.on_end(0), Alignment::Waiting, "nothing to align");
    }

    #[test]
    fn a_newer_barrier_restarts_alignment() {
        let mut a = BarrierAligner::new(2);
        assert_eq!(a.on_barrier(0, 1), Alignment::Waiting);
        assert_eq!(a.on_barrier(1, 2), Alignment::Waiting);
        assert_eq!(a.blocked(), &[false, true]);
        assert_eq!(a.on_barrier(0, 1), Alignment::Stale);
        assert_eq!(a.on_barrier(0, 2), Alignment::Aligned(2));
    }

    proptest! {
        /// With barriers 1..=k sent on every channel in order (and some channels ending), the
        /// aligner completes each checkpoint exactly once, in order, and only after every live
        /// channel delivered it; a blocked channel never delivers anything before that.
        #[test]
        fn each_checkpoint_aligns_once_in_order(
            channels in 1usize..5,
            checkpoints in 1u64..6,
            order in proptest::collection::vec(0usize..5, 0..200),
            ends in proptest::collection::vec(any::<bool>(), 5),
        ) {
            // Per channel: the barriers still to deliver, then maybe an end.
            let mut queues: Vec<Vec<Option<u64>>> = (0..channels)
                .map(|c| {
                    let mut q: Vec<Option<u64>> = (1..=checkpoints).map(Some).collect();
                    if ends[c] {
                        let cut = (c as u64 % (checkpoints + 1)) as usize;
                        q.truncate(cut);
                        q.push(None);
                    }
                    q.reverse();
                    q
                })
                .collect();
            let mut a = BarrierAligner::new(channels);
            let mut aligned = Vec::new();
            let mut picks = order.into_iter().chain(std::iter::repeat_n(0, 10_000));
            while queues.iter().any(|q| !q.is_empty()) {
                let live: Vec<usize> =
                    (0..channels).filter(|&c| !queues[c].is_empty() && !a.blocked()[c]).collect();
                prop_assert!(!live.is_empty(), "deadlock: every channel with input is blocked");
                let c = live[picks.next().unwrap_or(0) % live.len()];
                match queues[c].pop() {
                    Some(Some(id)) => match a.on_barrier(c, id) {
                        Alignment::Aligned(n) => aligned.push(n),
                        Alignment::Waiting => prop_assert!(a.blocked()[c]),
                        Alignment::Stale => prop_assert!(false, "no stale barriers here"),
                    },
                    Some(None) => {
                        if let Alignment::Aligned(n) = a.on_end(c) {
                            aligned.push(n);
                        }
                    }
                    None => {}
                }
            }
            // Every checkpoint that some live channel carried completes, in order.
            let carried = (0..channels).map(|c| if ends[c] { c as u64 % (checkpoints + 1) } else { checkpoints }).max();
            let expected: Vec<u64> = (1..=carried.unwrap_or(0)).collect();
            prop_assert_eq!(aligned, expected);
        }
    }
}
