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
    /// Replaces `out` with event `index`'s value and returns its event time.
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
    pacer: Option<Pacer>,
    scratch: Vec<u8>,
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
        let pacer = rate_per_sec.map(Pacer::new);
        Ok(Self { events, parallelism, next_index, exhausted: false, pacer, scratch: Vec::new() })
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
            Some(pacer) => pacer.allowance(max),
            None => max,
        };
        let mut produced = 0;
        while produced < allowed && !self.done() {
            let time = self.events.write(self.next_index, &mut self.scratch);
            out.push(None, &self.scratch, Some(time));
            produced += 1;
            match self.next_index.checked_add(u64::from(self.parallelism)) {
                Some(next) => self.next_index = next,
                None => self.exhausted = true,
            }
        }
        if let Some(pacer) = &mut self.pacer {
            pacer.spent(produced);
        }
        Ok(if produced > 0 { SourceStatus::Ready } else { SourceStatus::Idle })
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::Generator { next_index: self.next_index }
    }
}

/// Spreads a reader's events evenly over time: event `n` (counted from the reader's start) is
/// due `n / rate` seconds after it.
#[derive(Debug)]
pub(super) struct Pacer {
    rate: u64,
    origin: Instant,
    /// Events handed out, as counted by the schedule.
    granted: u64,
}

impl Pacer {
    pub(super) fn new(rate: u64) -> Self {
        // Validation rejects rate 0; treating it as 1 keeps the arithmetic total.
        Pacer { rate: rate.max(1), origin: Instant::now(), granted: 0 }
    }

    /// Events due by now (the first is due at once).
    fn due(&self) -> u64 {
        let elapsed = self.origin.elapsed().as_nanos();
        u64::try_from(elapsed * u128::from(self.rate) / 1_000_000_000).unwrap_or(u64::MAX).saturating_add(1)
    }

    /// How many events may go out now, at most `max`: sleeps up to [`MAX_SLEEP`] for the next
    /// one when ahead of schedule, and allows none if it is further off.
    pub(super) fn allowance(&mut self, max: usize) -> usize {
        let mut due = self.due();
        // A reader held up (backpressure, a slow poller) catches up at most one second's worth
        // in a burst, instead of flooding the pipeline with everything it missed.
        if due > self.granted.saturating_add(self.rate) {
            self.granted = due - self.rate;
        }
        if due <= self.granted && max > 0 {
            let next_due = Duration::from_nanos(
                u64::try_from(u128::from(self.granted) * 1_000_000_000 / u128::from(self.rate)).unwrap_or(u64::MAX),
            );
            let wait = next_due.saturating_sub(self.origin.elapsed());
            std::thread::sleep(wait.min(MAX_SLEEP));
            due = self.due();
        }
        usize::try_from(due.saturating_sub(self.granted)).unwrap_or(usize::MAX).min(max)
    }

    pub(super) fn spent(&mut self, events: usize) {
        self.granted = self.granted.saturating_add(events as u64);
    }
}
