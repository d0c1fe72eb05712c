//! What a faulty network does to each datagram, decided I/O-free from a seed: the core of the
//! fault-injecting UDP relay the cluster tests put between workers (this machine's kernel has
//! no `netem`). The relay shell asks [`FaultPlan::verdict`] for every datagram it receives and
//! sends what it is told, when it is told; the same seed gives the same faults, so a failing
//! run can be repeated.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How bad the network is.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Share of datagrams lost (0–1).
    pub drop: f64,
    /// Share of datagrams sent twice (0–1).
    pub duplicate: f64,
    /// Every datagram is held this long at least, ms.
    pub delay_ms: u64,
    /// Plus up to this much more, at random: datagrams overtake each other (reordering).
    pub jitter_ms: u64,
    /// Windows `[from, to)` of ms since the relay started in which everything is lost (a
    /// partition that heals).
    pub cuts: Vec<(u64, u64)>,
}

impl Faults {
    /// A perfect network.
    pub fn none() -> Self {
        Self { drop: 0.0, duplicate: 0.0, delay_ms: 0, jitter_ms: 0, cuts: Vec::new() }
    }
}

/// What to do with one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Lose it.
    Drop,
    /// Send it after each of these delays (two entries: a duplicate), ms from now.
    Send(Vec<u64>),
}

/// A seeded schedule of faults.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    faults: Faults,
    rng: SmallRng,
}

impl FaultPlan {
    /// The plan for `faults` from `seed`.
    pub fn new(faults: Faults, seed: u64) -> Self {
        Self { faults, rng: SmallRng::seed_from_u64(seed) }
    }

    /// The fate of a datagram received `now_ms` after the relay started.
    pub fn verdict(&mut self, now_ms: u64) -> Verdict {
        // Draw every number for every datagram, so one fault's setting never shifts another's.
        let (lost, doubled) = (self.rng.random::<f64>(), self.rng.random::<f64>());
        let jitters = [self.jitter(), self.jitter()];
        let cut = self.faults.cuts.iter().any(|&(from, to)| (from..to).contains(&now_ms));
        if cut || lost < self.faults.drop {
            return Verdict::Drop;
        }
        let copies = if doubled < self.faults.duplicate { 2 } else { 1 };
        Verdict::Send(jitters[..copies].iter().map(|j| self.faults.delay_ms + j).collect())
    }

    fn jitter(&mut self) -> u64 {
        match self.faults.jitter_ms {
            0 => 0,
            j => self.rng.random_range(0..=j),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(faults: &Faults, seed: u64, n: u64) -> Vec<Verdict> {
        let mut plan = FaultPlan::new(faults.clone(), seed);
        (0..n).map(|i| plan.verdict(i)).collect()
    }

    #[test]
    fn a_seed_repeats_its_faults_and_another_seed_does_not() {
        let faults = Faults { drop: 0.2, duplicate: 0.1, delay_ms: 5, jitter_ms: 20, cuts: vec![] };
        assert_eq!(run(&faults, 7, 1000), run(&faults, 7, 1000));
        assert_ne!(run(&faults, 7, 1000), run(&faults, 8, 1000));
    }

    #[test]
    fn a_perfect_network_sends_everything_once_at_once() {
        assert!(run(&Faults::none(), 1, 1000).iter().all(|v| *v == Verdict::Send(vec![0])));
    }

    #[test]
    fn rates_come_out_as_configured() {
        let faults = Faults { drop: 0.25, duplicate: 0.1, delay_ms: 0, jitter_ms: 0, cuts: vec![] };
        let verdicts = run(&faults, 3, 100_000);
        let dropped = verdicts.iter().filter(|v| **v == Verdict::Drop).count() as f64 / 1e5;
        let doubled = verdicts.iter().filter(|v| matches!(v, Verdict::Send(d) if d.len() == 2)).count() as f64 / 1e5;
        assert!((dropped - 0.25).abs() < 0.01, "dropped {dropped}");
        // Duplicates are drawn among the datagrams that were not dropped.
        assert!((doubled - 0.75 * 0.1).abs() < 0.01, "doubled {doubled}");
    }

    #[test]
    fn a_cut_loses_everything_inside_it_and_nothing_outside() {
        let faults = Faults { cuts: vec![(100, 200)], ..Faults::none() };
        let verdicts = run(&faults, 1, 300);
        for (t, v) in verdicts.iter().enumerate() {
            assert_eq!(*v == Verdict::Drop, (100..200).contains(&t), "at {t} ms: {v:?}");
        }
    }

    #[test]
    fn jitter_reorders_within_its_bound() {
        let faults = Faults { delay_ms: 10, jitter_ms: 30, ..Faults::none() };
        let delays: Vec<u64> = run(&faults, 5, 1000)
            .into_iter()
            .map(|v| match v {
                Verdict::Send(d) => d[0],
                Verdict::Drop => unreachable!("nothing is dropped"),
            })
            .collect();
        assert!(delays.iter().all(|d| (10..=40).contains(d)));
        // Sent 1 ms apart, a later datagram with less delay overtakes an earlier one.
        let overtaken = delays.windows(2).filter(|w| w[1] + 1 < w[0]).count();
        assert!(overtaken > 100, "{overtaken} reorderings in 1000");
    }
}
