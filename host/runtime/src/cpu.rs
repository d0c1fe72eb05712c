//! A share of the CPU for a group of instances (one tenant's), enforced between guest calls.
//!
//! Each call is charged the CPU time its thread spent in it. The group earns `cores` CPU
//! seconds per wall second; what it spends beyond that is debt, and a call that starts in debt
//! first waits until the group's earnings pay it off. A group can save up to `burst` of unused
//! time, so short spikes run unthrottled. A guest that spins therefore gets its share of the
//! cores and no more, however many instances it runs, while a single call is still bounded by
//! the call timeout. The bookkeeping is [`Bucket`], a state machine of numbers only; the
//! [`CpuShare`] around it reads the clocks and sleeps.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bookkeeping of one share, in nanoseconds, I/O-free.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    cores: f64,
    burst_ns: f64,
    /// CPU spent beyond what was earned (negative: savings, down to `-burst_ns`).
    debt_ns: f64,
    /// When earnings were last counted.
    at_ns: u64,
}

impl Bucket {
    /// A share of `cores` (above 0) that may save up to `burst_ns`, starting at `now_ns` with
    /// full savings.
    pub fn new(cores: f64, burst_ns: u64, now_ns: u64) -> Self {
        let cores = if cores.is_finite() && cores > 0.0 { cores } else { f64::MIN_POSITIVE };
        Self { cores, burst_ns: burst_ns as f64, debt_ns: -(burst_ns as f64), at_ns: now_ns }
    }

    fn earn(&mut self, now_ns: u64) {
        let elapsed = now_ns.saturating_sub(self.at_ns) as f64;
        self.at_ns = self.at_ns.max(now_ns);
        self.debt_ns = (self.debt_ns - elapsed * self.cores).max(-self.burst_ns);
    }

    /// Charges a call that used `cpu_ns` and ended at `now_ns`. The share earned while the
    /// call ran pays for it first ([`Bucket::wait_ns`] counted earnings up to its start).
    pub fn charge(&mut self, cpu_ns: u64, now_ns: u64) {
        self.debt_ns += cpu_ns as f64;
        self.earn(now_ns);
    }

    /// How long a call starting at `now_ns` must wait so the group is out of debt.
    pub fn wait_ns(&mut self, now_ns: u64) -> u64 {
        self.earn(now_ns);
        if self.debt_ns <= 0.0 { 0 } else { (self.debt_ns / self.cores).ceil() as u64 }
    }
}

/// A share shared by every instance of one group (`Arc` it).
#[derive(Debug)]
pub struct CpuShare {
    bucket: Mutex<Bucket>,
    origin: Instant,
    cores: f64,
    throttled_ns: std::sync::atomic::AtomicU64,
}

/// The longest one wait lasts; the debt stays, so the next call waits again. Keeps a
/// throttled subtask responsive to cancellation between calls.
const MAX_WAIT: Duration = Duration::from_millis(200);

impl CpuShare {
    /// `cores` CPU seconds per second, saving up to `burst`.
    pub fn new(cores: f64, burst: Duration) -> Self {
        let burst_ns = u64::try_from(burst.as_nanos()).unwrap_or(u64::MAX);
        Self {
            bucket: Mutex::new(Bucket::new(cores, burst_ns, 0)),
            origin: Instant::now(),
            cores,
            throttled_ns: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The share, in cores.
    pub fn cores(&self) -> f64 {
        self.cores
    }

    /// Time calls of this group have waited for their share so far.
    pub fn throttled(&self) -> Duration {
        Duration::from_nanos(self.throttled_ns.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// How long a call starting now would wait for the group's debt to be paid off: a job
    /// about to restart waits this long too, so a spinning operator's restarts are charged.
    pub fn debt(&self) -> Duration {
        Duration::from_nanos(self.bucket().wait_ns(self.now_ns()))
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.bucket.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits, if the group is in debt, before a call. Returns the thread's CPU clock, to pass
    /// to [`CpuShare::after_call`].
    pub(crate) fn before_call(&self) -> Duration {
        let wait = Duration::from_nanos(self.bucket().wait_ns(self.now_ns())).min(MAX_WAIT);
        if !wait.is_zero() {
            std::thread::sleep(wait);
            let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            self.throttled_ns.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        }
        thread_cpu_time()
    }

    /// Charges the call that started at the thread CPU clock `started`.
    pub(crate) fn after_call(&self, started: Duration) {
        let used = thread_cpu_time().saturating_sub(started);
        let used_ns = u64::try_from(used.as_nanos()).unwrap_or(u64::MAX);
        let now = self.now_ns();
        self.bucket().charge(used_ns, now);
    }
}

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_group_within_its_share_never_waits() {
        // Half a core: 5 ms of CPU every 10 ms is exactly the share.
        let mut b = Bucket::new(0.5, 0, 0);
        for i in 1..=100 {
            assert_eq!(b.wait_ns(i * 10 * MS), 0, "call {i}");
            b.charge(5 * MS, i * 10 * MS);
        }
    }

    #[test]
    fn a_spinner_waits_until_its_share_has_paid_for_what_it_used() {
        let mut b = Bucket::new(0.5, 0, 0);
        b.charge(100 * MS, 100 * MS); // used 100 ms in 100 ms: earned 50, owes 50
        assert_eq!(b.wait_ns(100 * MS), 100 * MS, "50 ms of debt at half a core takes 100 ms to earn");
        assert_eq!(b.wait_ns(150 * MS), 50 * MS);
        assert_eq!(b.wait_ns(200 * MS), 0);
    }

    #[test]
    fn over_a_long_run_a_spinner_gets_its_share_and_no_more() {
        // A guest that would use every nanosecond: each call burns 10 ms, starting as soon as
        // the bucket allows. Its CPU over 10 s must be 0.25 of the time, within one call.
        let mut b = Bucket::new(0.25, 20 * MS, 0);
        let (mut now, mut used) = (0u64, 0u64);
        while now < 10_000 * MS {
            now += b.wait_ns(now);
            now += 10 * MS;
            used += 10 * MS;
            b.charge(10 * MS, now);
        }
        let share = used as f64 / now as f64;
        assert!((share - 0.25).abs() < 0.01, "share {share}");
    }

    #[test]
    fn savings_are_capped_at_the_burst() {
        let mut b = Bucket::new(0.5, 30 * MS, 0);
        // Idle for a minute (30 s earned, 30 ms kept), then an 80 ms call: 30 saved + 40
        // earned while it ran leave 10 ms of debt, 20 ms to earn at half a core.
        assert_eq!(b.wait_ns(60_000 * MS), 0);
        b.charge(80 * MS, 60_080 * MS);
        assert_eq!(b.wait_ns(60_080 * MS), 20 * MS);
    }

    #[test]
    fn a_clock_that_steps_back_earns_nothing() {
        let mut b = Bucket::new(1.0, 0, 100 * MS);
        b.charge(10 * MS, 50 * MS);
        assert_eq!(b.wait_ns(50 * MS), 10 * MS);
    }

    #[test]
    fn the_thread_clock_counts_cpu_not_sleep() {
        let share = CpuShare::new(1.0, Duration::from_secs(1));
        let start = share.before_call();
        std::thread::sleep(Duration::from_millis(30));
        let slept = thread_cpu_time().saturating_sub(start);
        assert!(slept < Duration::from_millis(20), "sleeping used {slept:?} of CPU");
        // Spinning advances it (the deadline only turns a broken clock into a failure).
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut x = 0u64;
        while thread_cpu_time().saturating_sub(start) < Duration::from_millis(10) {
            assert!(Instant::now() < deadline, "the thread's CPU clock never advanced");
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }
}
