//! Readers of index-addressed event streams (the generator and Nexmark sources): event `i` is
//! a pure function of `i`, so reader `j` of `p` produces the indices `i ≡ j (mod p)` in
//! increasing order, a position is just the next index, and a rate limit paces each reader.

use std::time::{Duration, Instant};

use eddy_core::RecordBatch;

use super::{SourceError, SourcePosition, SourceStatus};

/// The longest a rate-limited reader sleeps inside one poll, so that its task stays responsive
/// (to checkpoint barriers, cancellation) at low rates.
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// An event stream addressed by index.
pub(super) trait IndexedEvents: Send + std::fmt::Debug {
    /// The source's name, for errors.
    fn source_name(&self) -> &str;
    /// Number of events; none = unbounded.
    fn events(&self) -> Option<u64>;
    /// Appends event `index`'s value to `out` (a batch's buffer) and returns its event time.
    fn write(&self, index: u64, out: &mut Vec<u8>) -> i64;
}

/// Reader `subtask` of `parallelism` over `E`.
#[derive(Debug)]
pub(super) struct IndexedSource<E> {
    events: E,
    parallelism: u32,
    next_index: u64,
    /// `next_index` would pass `u64::MAX`: an unbounded stream has run out of indices (then
    /// `next_index` is the last index produced; unreachable in practice, after 2^64 events).
    exhausted: bool,
    /// The pacer and the reader's start, when rate-limited.
    pacer: Option<(Pacer, Instant)>,
}

impl<E: IndexedEvents> IndexedSource<E> {
    /// Opens the reader, resuming at `start` when given; `rate_per_sec` paces it.
    pub(super) fn open(
        events: E,
        subtask: u32,
        parallelism: u32,
        start: Option<&SourcePosition>,
        rate_per_sec: Option<u64>,
    ) -> Result<Self, SourceError> {
        let bad_position = |position: &SourcePosition, problem: String| SourceError::BadPosition {
            source_name: events.source_name().to_string(),
            position: position.clone(),
            problem,
        };
        let next_index = match start {
            None => u64::from(subtask),
            Some(position @ &SourcePosition::Generator { next_index }) => {
                if next_index % u64::from(parallelism) != u64::from(subtask) {
                    return Err(bad_position(
                        position,
                        format!(
                            "reader {subtask} of {parallelism} produces the indices i with \
                             i % {parallelism} == {subtask}"
                        ),
                    ));
                }
                next_index
            }
            Some(other) => return Err(bad_position(other, "it is not a generator position".into())),
        };
        let pacer = rate_per_sec.map(|rate| (Pacer::new(rate), Instant::now()));
        Ok(Self { events, parallelism, next_index, exhausted: false, pacer })
    }

    fn done(&self) -> bool {
        self.exhausted || self.events.events().is_some_and(|events| self.next_index >= events)
    }
}

impl<E: IndexedEvents> super::Source for IndexedSource<E> {
    fn poll(&mut self, out: &mut RecordBatch, max: usize) -> Result<SourceStatus, SourceError> {
        if self.done() {
            return Ok(SourceStatus::End);
        }
        let allowed = match &mut self.pacer {
            Some((pacer, start)) => match pacer.next(start.elapsed(), max) {
                Pace::Release(n) => usize::try_from(n).unwrap_or(max),
                Pace::Wait(wait) if wait <= MAX_SLEEP => {
                    std::thread::sleep(wait);
                    match pacer.next(start.elapsed(), max) {
                        Pace::Release(n) => usize::try_from(n).unwrap_or(max),
                        Pace::Wait(_) => 0,
                    }
                }
                Pace::Wait(_) => {
                    // Further off than a poll may sleep: the task stays responsive meanwhile.
                    std::thread::sleep(MAX_SLEEP);
                    0
                }
            },
            None => max,
        };
        let mut produced = 0;
        while produced < allowed && !self.done() {
            let (events, index) = (&self.events, self.next_index);
            out.push_written(|buf| Some(events.write(index, buf)));
            produced += 1;
            match self.next_index.checked_add(u64::from(self.parallelism)) {
                Some(next) => self.next_index = next,
                None => self.exhausted = true,
            }
        }
        Ok(if produced > 0 { SourceStatus::Ready } else { SourceStatus::Idle })
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::Generator { next_index: self.next_index }
    }
}

/// What a paced reader does at a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pace {
    /// Release this many events now.
    Release(u64),
    /// Nothing is due yet: the next chunk is due after this long.
    Wait(Duration),
}

/// Spreads a reader's events evenly over time, free of clocks (the caller passes the time
/// since the reader's start): event `n` is due `n / rate` seconds after the start. Events
/// leave in chunks of a millisecond's worth (at least one, at most a batch), each once its
/// last event is due, so a fast rate costs a sleep per batch rather than a poll per event,
/// and an event waits at most a millisecond in the reader.
#[derive(Debug)]
pub(super) struct Pacer {
    rate: u64,
    /// Events released, as counted by the schedule.
    granted: u64,
}

impl Pacer {
    pub(super) fn new(rate: u64) -> Self {
        // Validation rejects rate 0; treating it as 1 keeps the arithmetic total.
        Pacer { rate: rate.max(1), granted: 0 }
    }

    /// Events due `elapsed` after the start (the first is due at once).
    fn due(&self, elapsed: Duration) -> u64 {
        let due = elapsed.as_nanos().saturating_mul(u128::from(self.rate)) / 1_000_000_000;
        u64::try_from(due).unwrap_or(u64::MAX).saturating_add(1)
    }

    /// When event `n` is due, after the start.
    fn due_at(&self, n: u64) -> Duration {
        let nanos = u128::from(n).saturating_mul(1_000_000_000) / u128::from(self.rate);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The decision at `elapsed` for a poll that takes at most `max` events; a release counts
    /// as granted.
    pub(super) fn next(&mut self, elapsed: Duration, max: usize) -> Pace {
        let max = u64::try_from(max).unwrap_or(u64::MAX);
        let due = self.due(elapsed);
        // A reader held up (backpressure, a slow poller) catches up at most one second's worth
        // in a burst, instead of flooding the pipeline with everything it missed.
        if due > self.granted.saturating_add(self.rate) {
            self.granted = due - self.rate;
        }
        let chunk = (self.rate / 1_000).clamp(1, max.max(1));
        let available = due.saturating_sub(self.granted);
        if available >= chunk {
            let released = available.min(max);
            self.granted += released;
            Pace::Release(released)
        } else {
            Pace::Wait(self.due_at(self.granted + chunk - 1).saturating_sub(elapsed))
        }
    }
}

/// The reader contract both index-addressed sources keep (positions, partitioning, the end of
/// the index space, pacing, resuming), tested once over each of them; plus the helpers their
/// own tests share.
#[cfg(test)]
pub(super) mod tests {
    use std::time::{Duration, Instant};

    use eddy_core::{Record, RecordBatch};
    use proptest::prelude::*;

    use crate::source::{Source, SourceError, SourcePosition, SourceStatus, open_source};
    use eddy_plan::SourceSpec;

    /// Polls with `max` until the reader ends.
    pub(in crate::source) fn drain(src: &mut dyn Source, max: usize) -> Vec<Record> {
        let mut batch = RecordBatch::default();
        loop {
            let before = batch.len();
            match src.poll(&mut batch, max).unwrap() {
                SourceStatus::Ready => assert!(batch.len() > before && batch.len() - before <= max),
                SourceStatus::End => return batch.iter().map(|r| r.to_owned()).collect(),
                SourceStatus::Idle => panic!("an unpaced source went idle"),
            }
        }
    }

    /// Everything reader `subtask` of `parallelism` yields, from `start` (a next index) on.
    pub(in crate::source) fn read(
        spec: &SourceSpec,
        subtask: u32,
        parallelism: u32,
        start: Option<u64>,
        max: usize,
    ) -> Vec<Record> {
        let start = start.map(|next_index| SourcePosition::Generator { next_index });
        let mut src = open_source(spec, subtask, parallelism, start.as_ref()).unwrap();
        drain(src.as_mut(), max)
    }

    /// A generator and a Nexmark source with this seed and event count.
    fn both(seed: u64, events: Option<u64>) -> [SourceSpec; 2] {
        [
            SourceSpec::Generator(crate::source::generator::tests::gen_spec(seed, events)),
            crate::source::nexmark::tests::spec(seed, events),
        ]
    }

    /// Event `i` of `spec`, as its reader must yield it.
    fn expected(spec: &SourceSpec, i: u64) -> Record {
        match spec {
            SourceSpec::Generator(g) => crate::source::generator_event(g, i),
            SourceSpec::Nexmark(n) => crate::source::nexmark::tests::expected(&n.config(), i),
            SourceSpec::File { .. } | SourceSpec::Kafka(_) => unreachable!("not index-addressed"),
        }
    }

    fn paced(spec: SourceSpec, rate: u64) -> SourceSpec {
        match spec {
            SourceSpec::Generator(mut g) => {
                g.rate_per_sec = Some(rate);
                SourceSpec::Generator(g)
            }
            SourceSpec::Nexmark(mut n) => {
                n.rate_per_sec = Some(rate);
                SourceSpec::Nexmark(n)
            }
            other @ (SourceSpec::File { .. } | SourceSpec::Kafka(_)) => other,
        }
    }

    #[test]
    fn bad_start_positions_are_rejected() {
        for spec in both(0, Some(10)) {
            let cases = [
                (1, 3, SourcePosition::Generator { next_index: 5 }, "i % 3 == 1"),
                (0, 1, SourcePosition::File { line: 0, byte: 0 }, "not a generator position"),
            ];
            for (subtask, parallelism, position, needle) in cases {
                let err = open_source(&spec, subtask, parallelism, Some(&position)).err().unwrap();
                assert!(matches!(err, SourceError::BadPosition { .. }));
                let err = err.to_string();
                assert!(err.contains(&format!("source `{}`", spec.name())) && err.contains(needle), "{err}");
            }
            assert!(matches!(open_source(&spec, 3, 3, None), Err(SourceError::BadReader { .. })));
        }
    }

    #[test]
    fn unbounded_readers_run_to_the_last_index_and_positions_advance() {
        for spec in both(0, None) {
            let mut src =
                open_source(&spec, 1, 2, Some(&SourcePosition::Generator { next_index: u64::MAX - 2 })).unwrap();
            let mut batch = RecordBatch::default();
            assert_eq!(src.poll(&mut batch, 1000).unwrap(), SourceStatus::Ready);
            // Only u64::MAX - 2 and u64::MAX remain in this reader's residue class.
            assert_eq!(batch.len(), 2);
            assert_eq!(src.poll(&mut batch, 1000).unwrap(), SourceStatus::End);
            let mut src = open_source(&spec, 0, 1, None).unwrap();
            for round in 1..=5 {
                assert_eq!(src.poll(&mut batch, 100).unwrap(), SourceStatus::Ready);
                assert_eq!(src.position(), SourcePosition::Generator { next_index: round * 100 });
            }
        }
    }

    #[test]
    fn rate_limit_paces_without_long_sleeps() {
        for spec in both(0, None) {
            // Slow enough that the next event is further off than one poll may sleep.
            let mut src = open_source(&paced(spec, 10), 0, 1, None).unwrap();
            let mut batch = RecordBatch::default();
            let start = Instant::now();
            let mut idle = 0;
            while start.elapsed() < Duration::from_millis(400) {
                let poll_start = Instant::now();
                if src.poll(&mut batch, 1000).unwrap() == SourceStatus::Idle {
                    idle += 1;
                }
                // 50 ms of sleep plus generous scheduling slack on a loaded machine.
                assert!(poll_start.elapsed() < Duration::from_millis(250), "a poll took {:?}", poll_start.elapsed());
            }
            let elapsed = start.elapsed().as_secs_f64();
            // Event n is due at n / 10 s: at most 1 + 10 * elapsed events by now.
            let bound = 1 + (10.0 * elapsed) as usize;
            assert!((1..=bound).contains(&batch.len()), "{} events in {elapsed:.3} s", batch.len());
            assert!(idle > 0, "never ahead of schedule");
        }
    }

    #[test]
    fn the_pacer_releases_a_millisecond_at_a_time_as_it_falls_due() {
        use super::{Pace, Pacer};
        let us = Duration::from_micros;
        // (rate, max per poll, [(time since start, decision)]), worked out from "event n is
        // due n / rate s after the start; a chunk is rate / 1000 events, at least 1, at most
        // max, released once its last event is due; at most one second behind".
        type Case<'a> = (u64, usize, &'a [(Duration, Pace)]);
        let cases: [Case<'_>; 3] = [
            (
                100_000,
                1000,
                &[
                    (us(0), Pace::Wait(us(990))),
                    (us(990), Pace::Release(100)),
                    (us(1000), Pace::Wait(us(990))),
                    (us(5000), Pace::Release(401)),
                    (us(2_000_000), Pace::Release(1000)),
                    (us(2_000_000), Pace::Release(1000)),
                ],
            ),
            (
                10,
                1000,
                &[
                    (us(0), Pace::Release(1)),
                    (us(50_000), Pace::Wait(us(50_000))),
                    (us(100_000), Pace::Release(1)),
                    (us(1_000_000), Pace::Release(9)),
                ],
            ),
            (1_000_000, 64, &[(us(0), Pace::Wait(us(63))), (us(63), Pace::Release(64)), (us(63), Pace::Wait(us(64)))]),
        ];
        for (rate, max, steps) in cases {
            let mut pacer = Pacer::new(rate);
            for (i, (at, expected)) in steps.iter().enumerate() {
                assert_eq!(pacer.next(*at, max), *expected, "rate {rate}, step {i} at {at:?}");
            }
        }
    }

    proptest! {
        /// A reader yields exactly its residue class of events, and a reader resumed at the
        /// position reached after any number of polls of any size yields exactly the tail of
        /// the uninterrupted read.
        #[test]
        fn resume_from_position_yields_the_tail(
            seed in any::<u64>(),
            events in 0u64..200,
            parallelism in 1u32..5,
            subtask_pick in any::<u32>(),
            batch_sizes in prop::collection::vec(1usize..20, 1..6),
            polls_before in 0usize..20,
        ) {
            for spec in both(seed, Some(events)) {
                let subtask = subtask_pick % parallelism;
                let all = read(&spec, subtask, parallelism, None, 1000);
                let mine: Vec<Record> = (0..events)
                    .filter(|i| i % u64::from(parallelism) == u64::from(subtask))
                    .map(|i| expected(&spec, i))
                    .collect();
                prop_assert_eq!(&all, &mine);

                let mut src = open_source(&spec, subtask, parallelism, None).unwrap();
                let mut batch = RecordBatch::default();
                for i in 0..polls_before {
                    if src.poll(&mut batch, batch_sizes[i % batch_sizes.len()]).unwrap() == SourceStatus::End {
                        break;
                    }
                }
                let SourcePosition::Generator { next_index } = src.position() else { panic!("generator position") };
                let mut got: Vec<Record> = batch.iter().map(|r| r.to_owned()).collect();
                got.extend(read(&spec, subtask, parallelism, Some(next_index), batch_sizes[0]));
                prop_assert_eq!(got, all);
            }
        }
    }
}
