//! Event-time progress as I/O-free state machines: watermark generation at a source
//! ([`BoundedOutOfOrderness`]) and the combination of input channels at an operator
//! ([`WatermarkTracker`]), with idle channels excluded until they speak again.
//!
//! Time is passed in (`now_ms`), never read, so every behaviour is tested deterministically.

use crate::WATERMARK_MIN;

/// Watermarks for events that arrive at most `max_out_of_orderness_ms` late: after seeing
/// event time `t`, no event older than `t - bound` is expected, so the watermark is
/// `max_seen - bound - 1` (Flink's convention: the watermark is the last time known complete).
#[derive(Debug, Clone)]
pub struct BoundedOutOfOrderness {
    bound_ms: i64,
    max_seen: Option<i64>,
}

impl BoundedOutOfOrderness {
    /// A generator for events at most `bound_ms` out of order.
    pub fn new(bound_ms: i64) -> Self {
        Self { bound_ms: bound_ms.max(0), max_seen: None }
    }

    /// Notes an event's time.
    #[inline]
    pub fn on_event(&mut self, timestamp_ms: i64) {
        self.max_seen = Some(self.max_seen.map_or(timestamp_ms, |m| m.max(timestamp_ms)));
    }

    /// The current watermark; [`WATERMARK_MIN`] before the first event.
    pub fn current(&self) -> i64 {
        self.max_seen.map_or(WATERMARK_MIN, |m| m.saturating_sub(self.bound_ms).saturating_sub(1))
    }
}

/// How often a source reader passes its watermark on (Flink's auto-watermark interval): at most
/// once per `interval_ms` of processing time, the newest then. One held back goes with the
/// first batch or idle poll of the reader after the interval (a reader polls at least every
/// 5 ms when quiet), so a watermark is late by at most the interval and a poll, never lost.
/// Interval 0 passes every one on at once.
///
/// Each watermark a reader passes on crosses every exchange behind it as a message of its own
/// or cuts the buffer it follows short, and wakes the subtasks there: with a watermark per
/// batch of 1 024 events, most of those wake-ups change nothing downstream.
#[derive(Debug, Clone)]
pub struct WatermarkInterval {
    interval_ms: i64,
    last_passed_ms: Option<i64>,
    held: Option<i64>,
}

impl WatermarkInterval {
    /// Watermarks passed on at most once per `interval_ms` (negative means 0).
    pub fn new(interval_ms: i64) -> Self {
        Self { interval_ms: interval_ms.max(0), last_passed_ms: None, held: None }
    }

    /// The reader's watermark is now `watermark`: the watermark to pass on now, if any.
    pub fn offer(&mut self, watermark: i64, now_ms: i64) -> Option<i64> {
        if self.held.is_none_or(|held| watermark > held) {
            self.held = Some(watermark);
        }
        self.due(now_ms)
    }

    /// The held watermark, once the interval since the last one passed on has run out.
    pub fn due(&mut self, now_ms: i64) -> Option<i64> {
        if self.last_passed_ms.is_some_and(|last| now_ms.saturating_sub(last) < self.interval_ms) {
            return None;
        }
        let watermark = self.held.take()?;
        self.last_passed_ms = Some(now_ms);
        Some(watermark)
    }
}

#[derive(Debug, Clone, Copy)]
struct Channel {
    watermark: i64,
    last_active_ms: i64,
    idle: bool,
    ended: bool,
}

/// The watermark of an operator with several input channels: the minimum over the channels
/// that are not idle.
///
/// Contract: the output watermark never decreases; a channel silent (no record, no watermark)
/// for `idle_timeout_ms` is excluded from the minimum and rejoins the moment it speaks (its
/// watermark then counts again, but cannot pull the output back); if every channel is idle the
/// output holds where it was. `None` as timeout disables idleness: a silent channel stalls the
/// operator, as it must when correctness needs every input.
#[derive(Debug, Clone)]
pub struct WatermarkTracker {
    channels: Vec<Channel>,
    idle_timeout_ms: Option<i64>,
    output: i64,
}

impl WatermarkTracker {
    /// A tracker for `channels` inputs, all active as of `now_ms`.
    pub fn new(channels: usize, idle_timeout_ms: Option<i64>, now_ms: i64) -> Self {
        let channel = Channel { watermark: WATERMARK_MIN, last_active_ms: now_ms, idle: false, ended: false };
        Self { channels: vec![channel; channels], idle_timeout_ms, output: WATERMARK_MIN }
    }

    /// The current output watermark.
    pub fn current(&self) -> i64 {
        self.output
    }

    /// Adds a channel, active as of `now_ms` (a Kafka partition found while running); returns
    /// its index. It holds the output back until it speaks or goes idle, but cannot pull the
    /// output back: the output never decreases.
    pub fn add_channel(&mut self, now_ms: i64) -> usize {
        self.channels.push(Channel { watermark: WATERMARK_MIN, last_active_ms: now_ms, idle: false, ended: false });
        self.channels.len() - 1
    }

    /// Whether `channel` is currently excluded as idle.
    pub fn is_idle(&self, channel: usize) -> bool {
        self.channels.get(channel).is_some_and(|c| c.idle)
    }

    /// A record arrived on `channel`: it is active again. Returns a new output watermark if the
    /// change advanced it.
    pub fn on_record(&mut self, channel: usize, now_ms: i64) -> Option<i64> {
        let c = self.channels.get_mut(channel)?;
        c.last_active_ms = now_ms;
        c.idle = false;
        self.advance()
    }

    /// A watermark arrived on `channel` (a channel's own watermarks never go back; an older one
    /// is ignored). Returns the new output watermark if it advanced.
    pub fn on_watermark(&mut self, channel: usize, watermark: i64, now_ms: i64) -> Option<i64> {
        let c = self.channels.get_mut(channel)?;
        c.watermark = c.watermark.max(watermark);
        c.last_active_ms = now_ms;
        c.idle = false;
        self.advance()
    }

    /// `channel` ended: it holds nothing back any more, ever. An ended channel is never idle
    /// (else, once every other input went idle too, the output would hold forever instead of
    /// following the live inputs). Returns the new output watermark if it advanced.
    pub fn on_end(&mut self, channel: usize) -> Option<i64> {
        let c = self.channels.get_mut(channel)?;
        c.watermark = i64::MAX;
        c.idle = false;
        c.ended = true;
        self.advance()
    }

    /// Marks channels silent for the idle timeout as idle. Call it periodically (the engine
    /// does, on its processing-time tick). Returns the new output watermark if it advanced.
    ///
    /// Channels go idle in the order they fell silent, the output advancing after each group,
    /// so one late tick ends where ticking every millisecond of the gap would have: a channel
    /// that never spoke idles before one that spoke later, and the output takes the later one's
    /// watermark before it, too, goes idle (else a busy machine that skipped ticks would see
    /// every channel idle at once and hold the output forever).
    pub fn on_tick(&mut self, now_ms: i64) -> Option<i64> {
        let timeout = self.idle_timeout_ms?;
        let before = self.output;
        let mut silent: Vec<i64> = self
            .channels
            .iter()
            .filter(|c| !c.ended && !c.idle && now_ms.saturating_sub(c.last_active_ms) >= timeout)
            .map(|c| c.last_active_ms)
            .collect();
        silent.sort_unstable();
        silent.dedup();
        for fell_silent in silent {
            for c in self.channels.iter_mut().filter(|c| !c.ended && c.last_active_ms == fell_silent) {
                c.idle = true;
            }
            self.advance();
        }
        (self.output > before).then_some(self.output)
    }

    fn advance(&mut self) -> Option<i64> {
        let min = self.channels.iter().filter(|c| !c.idle).map(|c| c.watermark).min()?;
        if min > self.output {
            self.output = min;
            Some(min)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounded_out_of_orderness_trails_the_maximum() {
        let mut g = BoundedOutOfOrderness::new(5_000);
        assert_eq!(g.current(), WATERMARK_MIN);
        g.on_event(10_000);
        g.on_event(7_000);
        assert_eq!(g.current(), 4_999);
        g.on_event(20_000);
        assert_eq!(g.current(), 14_999);
    }

    /// (now ms, the reader's watermark offered or none for a tick, what is passed on).
    #[test]
    fn an_interval_passes_the_newest_watermark_on_at_most_once_per_interval() {
        let table: [(i64, Option<i64>, Option<i64>); 9] = [
            (0, Some(10), Some(10)),  // the first goes at once
            (1, Some(20), None),      // within 5 ms of it: held
            (3, Some(30), None),      // the newest is held
            (4, None, None),          // a tick within the interval
            (5, Some(25), Some(30)),  // the interval ran out: the newest seen, not the last offered
            (7, None, None),          // nothing held
            (20, Some(40), Some(40)), // long after: at once
            (22, Some(50), None),
            (25, None, Some(50)), // a tick once the interval ran out
        ];
        let mut interval = WatermarkInterval::new(5);
        for (now, offered, passed) in table {
            let got = match offered {
                Some(w) => interval.offer(w, now),
                None => interval.due(now),
            };
            assert_eq!(got, passed, "at {now} ms, offered {offered:?}");
        }
        let mut every = WatermarkInterval::new(0);
        assert_eq!((every.offer(1, 0), every.offer(2, 0), every.due(0)), (Some(1), Some(2), None), "0: each at once");
    }

    #[test]
    fn the_slowest_channel_holds_the_watermark() {
        let mut t = WatermarkTracker::new(2, None, 0);
        assert_eq!(t.on_watermark(0, 100, 1), None, "channel 1 has not spoken");
        assert_eq!(t.on_watermark(1, 50, 2), Some(50));
        assert_eq!(t.on_watermark(1, 200, 3), Some(100));
        assert_eq!(t.on_watermark(0, 90, 4), None, "a channel's watermark never goes back");
        assert_eq!(t.current(), 100);
    }

    #[test]
    fn an_ended_channel_never_counts_as_idle() {
        // Both channels fall silent at once: the live one idles, the ended one must not, so
        // event time follows the ended channel (to the end) instead of freezing.
        let mut t = WatermarkTracker::new(2, Some(100), 0);
        assert_eq!(t.on_end(0), None, "channel 1 still holds the watermark back");
        assert_eq!(t.on_tick(100), Some(i64::MAX));
        assert!(t.is_idle(1) && !t.is_idle(0));
    }

    #[test]
    fn a_silent_channel_stalls_without_idleness_and_not_with_it() {
        let mut stalled = WatermarkTracker::new(2, None, 0);
        stalled.on_watermark(0, 1_000, 0);
        assert_eq!(stalled.on_tick(1_000_000), None);
        assert_eq!(stalled.current(), WATERMARK_MIN);

        let mut t = WatermarkTracker::new(2, Some(10_000), 0);
        t.on_watermark(0, 1_000, 0);
        assert_eq!(t.on_tick(9_999), None);
        assert_eq!(t.on_watermark(0, 2_000, 9_999), None);
        assert_eq!(t.on_tick(10_000), Some(2_000), "channel 1 went idle");
        assert!(t.is_idle(1) && !t.is_idle(0));
        // Channel 1 speaks again: it rejoins, and its old watermark cannot pull the output back.
        assert_eq!(t.on_record(1, 10_001), None);
        assert!(!t.is_idle(1));
        assert_eq!(t.current(), 2_000);
        assert_eq!(t.on_watermark(0, 3_000, 10_002), None, "channel 1 (at MIN) holds it again");
        assert_eq!(t.on_watermark(1, 2_500, 10_003), Some(2_500));
    }

    #[test]
    fn all_idle_holds_the_output() {
        let mut t = WatermarkTracker::new(2, Some(10), 0);
        t.on_watermark(0, 5, 0);
        t.on_watermark(1, 7, 0);
        assert_eq!(t.current(), 5);
        assert_eq!(t.on_tick(100), None);
        assert_eq!(t.current(), 5);
    }

    #[test]
    fn channels_silent_by_one_late_tick_go_idle_in_the_order_they_fell_silent() {
        // Channel 1 never speaks; channel 0 is read to its end and falls silent later. A
        // machine too busy to tick until both are past the timeout must still let the output
        // take channel 0's watermark, as it would have between the two timeouts.
        let mut t = WatermarkTracker::new(2, Some(300), 0);
        t.on_watermark(0, 4_000, 200);
        assert_eq!(t.on_tick(1_000), Some(4_000));
        assert!(t.is_idle(0) && t.is_idle(1));
        assert_eq!(t.on_tick(2_000), None, "all idle: the output holds");
        assert_eq!(t.current(), 4_000);
    }

    #[derive(Debug, Clone)]
    enum Event {
        Watermark(usize, i64),
        Record(usize),
        Tick,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0usize..3, -100i64..1_000).prop_map(|(c, w)| Event::Watermark(c, w)),
            (0usize..3).prop_map(Event::Record),
            Just(Event::Tick),
        ]
    }

    proptest! {
        /// The output never decreases, every reported advance is the new current value, and it
        /// never passes the minimum over all channels' watermarks unless idleness allowed it.
        #[test]
        fn output_is_monotonic_and_bounded(events in proptest::collection::vec((event(), 0i64..50), 0..200), idle in proptest::option::of(1i64..200)) {
            let mut t = WatermarkTracker::new(3, idle, 0);
            let mut own = [WATERMARK_MIN; 3];
            let mut now = 0;
            for (e, dt) in events {
                now += dt;
                let before = t.current();
                let advanced = match e {
                    Event::Watermark(c, w) => { own[c] = own[c].max(w); t.on_watermark(c, w, now) }
                    Event::Record(c) => t.on_record(c, now),
                    Event::Tick => t.on_tick(now),
                };
                prop_assert!(t.current() >= before);
                if let Some(w) = advanced { prop_assert_eq!(w, t.current()); prop_assert!(w > before); }
                if idle.is_none() { prop_assert!(t.current() <= *own.iter().min().unwrap_or(&WATERMARK_MIN)); }
                prop_assert!(t.current() <= *own.iter().max().unwrap_or(&WATERMARK_MIN));
            }
        }

        /// One tick after a gap leaves the tracker exactly where a tick every millisecond of
        /// the gap would have: same output, same idle channels.
        #[test]
        fn a_late_tick_equals_ticking_through_the_gap(events in proptest::collection::vec((event(), 0i64..50), 0..100), idle in 1i64..200, gap in 0i64..600) {
            let mut t = WatermarkTracker::new(3, Some(idle), 0);
            let mut now = 0;
            for (e, dt) in events {
                now += dt;
                match e {
                    Event::Watermark(c, w) => { t.on_watermark(c, w, now); }
                    Event::Record(c) => { t.on_record(c, now); }
                    Event::Tick => { t.on_tick(now); }
                }
            }
            let mut fine = t.clone();
            for ms in now..=now + gap { fine.on_tick(ms); }
            t.on_tick(now + gap);
            prop_assert_eq!(t.current(), fine.current());
            for c in 0..3 { prop_assert_eq!(t.is_idle(c), fine.is_idle(c)); }
        }
    }
}
