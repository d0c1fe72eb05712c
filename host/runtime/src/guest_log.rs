//! The `log` import: a token bucket per instance (rate and burst) drops what a guest logs
//! beyond its budget and reports how many lines it dropped at most once per interval; a
//! message is cut to its limit before it is copied out of guest memory.
//!
//! [`LogThrottle`] is the decision alone, with time passed in, so it is tested without a
//! clock; [`add_to_linker`] is the shell that reads the clock and the guest's memory.

use std::time::Instant;

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, WasmStr};

use crate::bindings::log::Level;
use crate::sandbox::HasSandbox;

/// How often dropped lines are reported, at most (after the first report, which comes at once).
pub(crate) const REPORT_EVERY_MS: u64 = 10_000;

/// What became of an instance's log lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Lines that reached the host's log.
    pub written: u64,
    /// Lines dropped by the rate limit.
    pub dropped: u64,
    /// Lines cut to `max_log_message_bytes`.
    pub truncated: u64,
}

/// A token bucket over log lines: `burst` lines at once, refilled at `per_second`.
#[derive(Debug, Clone)]
pub(crate) struct LogThrottle {
    per_second: u64,
    burst: u64,
    /// Tokens in thousandths of a line, so any rate refills exactly in integers
    /// (`per_second` thousandths per millisecond).
    milli_tokens: u64,
    refilled_at_ms: u64,
    dropped_since_report: u64,
    reported_at_ms: Option<u64>,
}

impl LogThrottle {
    /// A full bucket at time 0.
    pub(crate) fn new(per_second: u32, burst: u32) -> Self {
        let burst = u64::from(burst);
        Self {
            per_second: u64::from(per_second),
            burst,
            milli_tokens: burst * 1_000,
            refilled_at_ms: 0,
            dropped_since_report: 0,
            reported_at_ms: None,
        }
    }

    /// Whether a line logged at `now_ms` may be written; a line that may not is counted.
    pub(crate) fn admit(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.refilled_at_ms);
        self.refilled_at_ms = self.refilled_at_ms.max(now_ms);
        self.milli_tokens =
            self.milli_tokens.saturating_add(elapsed.saturating_mul(self.per_second)).min(self.burst * 1_000);
        if self.milli_tokens >= 1_000 {
            self.milli_tokens -= 1_000;
            true
        } else {
            self.dropped_since_report += 1;
            false
        }
    }

    /// The lines dropped since the last report, if a report is due at `now_ms`: the first
    /// as soon as there is something to say, later ones at most every [`REPORT_EVERY_MS`].
    pub(crate) fn report(&mut self, now_ms: u64) -> Option<u64> {
        let due = self.reported_at_ms.is_none_or(|at| now_ms.saturating_sub(at) >= REPORT_EVERY_MS);
        if self.dropped_since_report == 0 || !due {
            return None;
        }
        self.reported_at_ms = Some(now_ms);
        Some(std::mem::take(&mut self.dropped_since_report))
    }

    /// The lines dropped since the last report, whether or not one is due: the instance ends,
    /// and a count left for a next report would never be told.
    pub(crate) fn report_last(&mut self) -> Option<u64> {
        (self.dropped_since_report > 0).then(|| std::mem::take(&mut self.dropped_since_report))
    }
}

/// The longest prefix of `text` within `max` bytes that ends on a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// An instance's log budget and what became of its lines.
#[derive(Debug)]
pub(crate) struct GuestLog {
    throttle: LogThrottle,
    started: Instant,
    max_message_bytes: usize,
    per_second: u32,
    burst: u32,
    pub(crate) stats: LogStats,
}

impl GuestLog {
    pub(crate) fn new(per_second: u32, burst: u32, max_message_bytes: usize) -> Self {
        Self {
            throttle: LogThrottle::new(per_second, burst),
            started: Instant::now(),
            max_message_bytes,
            per_second,
            burst,
            stats: LogStats::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Logs how many lines were dropped, if a report is due.
    pub(crate) fn report_drops(&mut self, operator: &str) {
        let now = self.now_ms();
        let dropped = self.throttle.report(now);
        self.warn_dropped(operator, dropped);
    }

    /// Logs the lines dropped since the last report, at the instance's end.
    pub(crate) fn report_last_drops(&mut self, operator: &str) {
        let dropped = self.throttle.report_last();
        self.warn_dropped(operator, dropped);
    }

    fn warn_dropped(&self, operator: &str, dropped: Option<u64>) {
        if let Some(dropped) = dropped {
            tracing::warn!(
                operator,
                dropped,
                "dropped {dropped} log lines: the operator logs more than {} lines/s (burst {}); \
                 log less or raise SandboxLimits::log_lines_per_second",
                self.per_second,
                self.burst
            );
        }
    }
}

/// Links the `log` import by hand (not through the generated bindings) so that it receives
/// the message as a view into guest memory: a dropped line is never read, and a kept one is
/// copied only up to `max_log_message_bytes` (a UTF-8 guest's string is validated in place;
/// a UTF-16 one is transcoded whole by wasmtime first).
pub(crate) fn add_to_linker<T: HasSandbox + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.instance("eddy:dataflow/log@0.4.0")?.func_wrap(
        "log",
        |mut store: StoreContextMut<'_, T>, (level, message): (Level, WasmStr)| {
            let log = &mut store.data_mut().sandbox().log;
            let now_ms = log.now_ms();
            let admitted = log.throttle.admit(now_ms);
            if !admitted {
                log.stats.dropped += 1;
            }
            // Error lines are the guest's last words (the SDKs log panics there): kept even
            // when the host's log drops them.
            if !admitted && !matches!(level, Level::Error) {
                return Ok(());
            }
            let max = log.max_message_bytes;
            let text = message.to_str(&store)?;
            let kept = cut(&text, max);
            let truncated = kept.len() < text.len();
            let kept = kept.to_owned();
            drop(text);
            let sandbox = store.data_mut().sandbox();
            if admitted {
                sandbox.log.stats.written += 1;
                sandbox.log.stats.truncated += u64::from(truncated);
                sandbox.log.report_drops(&sandbox.operator);
            }
            crate::sandbox::guest_log(sandbox, level, kept, admitted);
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which of `times` (ms, ascending) a bucket admits.
    fn admitted(per_second: u32, burst: u32, times: &[u64]) -> Vec<bool> {
        let mut t = LogThrottle::new(per_second, burst);
        times.iter().map(|&now| t.admit(now)).collect()
    }

    #[test]
    fn a_burst_then_the_rate() {
        // 10 lines/s = one line per 100 ms, burst 3.
        let times = [0, 0, 0, 0, 50, 99, 100, 150, 199, 200, 500];
        let expected = [true, true, true, false, false, false, true, false, false, true, true];
        assert_eq!(admitted(10, 3, &times), expected);
    }

    #[test]
    fn an_idle_bucket_refills_only_up_to_its_burst() {
        let times = [0, 0, 60_000, 60_000, 60_000];
        assert_eq!(admitted(1_000, 2, &times), [true, true, true, true, false]);
    }

    #[test]
    fn a_fractional_rate_accumulates() {
        // 3 lines/s: a token every 333.3 ms, so the line at 333 ms is early and 334 is not.
        assert_eq!(admitted(3, 1, &[0, 333, 334]), [true, false, true]);
    }

    #[test]
    fn time_going_back_refills_nothing() {
        assert_eq!(admitted(10, 1, &[1_000, 500, 1_050, 1_100]), [true, false, false, true]);
    }

    #[test]
    fn drops_not_yet_reported_are_told_at_the_end() {
        let mut t = LogThrottle::new(0, 1);
        assert!(t.admit(0));
        assert!(!t.admit(0));
        assert_eq!(t.report(1), Some(1));
        assert!(!t.admit(2) && !t.admit(3));
        assert_eq!(t.report(4), None, "the next report is not due");
        assert_eq!(t.report_last(), Some(2), "the end tells them anyway");
        assert_eq!(t.report_last(), None);
    }

    #[test]
    fn drops_are_reported_at_once_then_at_most_once_per_interval() {
        let mut t = LogThrottle::new(0, 1);
        assert_eq!(t.report(0), None, "nothing dropped yet");
        assert!(t.admit(0));
        assert!(!t.admit(0) && !t.admit(1));
        assert_eq!(t.report(2), Some(2));
        assert!(!t.admit(3));
        assert_eq!(t.report(4), None, "the next report waits for the interval");
        assert!(!t.admit(REPORT_EVERY_MS));
        assert_eq!(t.report(REPORT_EVERY_MS + 1), None, "one millisecond short of the interval");
        assert_eq!(t.report(REPORT_EVERY_MS + 2), Some(2));
        assert_eq!(t.report(3 * REPORT_EVERY_MS), None, "nothing new to say");
    }

    #[test]
    fn messages_are_cut_on_character_boundaries() {
        let cases = [
            ("hello", 10, "hello"),
            ("hello", 5, "hello"),
            ("hello", 3, "hel"),
            ("héllo", 2, "h"),
            ("héllo", 3, "hé"),
            ("€", 2, ""),
            ("", 0, ""),
        ];
        for (text, max, expected) in cases {
            assert_eq!(cut(text, max), expected, "{text:?} within {max}");
        }
    }
}
