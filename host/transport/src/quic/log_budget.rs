//! A budget for warnings that strangers can trigger: anyone who can send UDP can fail a
//! handshake, and a member can misbehave on purpose, so a node logs at most
//! [`LINES_PER_WINDOW`] such lines per [`WINDOW_MS`] and then says how many it left out.
//! [`crate::quic::QuicNode`] keeps one for its refused handshakes, dropped peers and refused
//! streams; any other endpoint that strangers can reach (the coordinator's control plane)
//! should keep its own the same way.
//!
//! I/O-free: the caller passes a monotonic clock in milliseconds (a wall clock that steps back
//! only starts a new window late).
//!
//! ```
//! use std::sync::Mutex;
//! use eddy_transport::quic::LogBudget;
//!
//! let budget = Mutex::new(LogBudget::default());
//! let start = std::time::Instant::now();
//! let failed_handshake = |reason: &str| {
//!     let now_ms = start.elapsed().as_millis() as u64;
//!     if let Some(left_out) = budget.lock().expect("not poisoned").admit(now_ms) {
//!         eprintln!("refused a connection: {reason} ({left_out} warnings left out before this one)");
//!     }
//! };
//! for _ in 0..100 {
//!     failed_handshake("unknown certificate"); // ten are logged, ninety counted
//! }
//! ```

/// Lines allowed per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// The window, in milliseconds.
pub const WINDOW_MS: u64 = 1_000;

/// At most [`LINES_PER_WINDOW`] lines per [`WINDOW_MS`]; the first line logged after some were
/// left out says how many. One per endpoint, behind a mutex: [`LogBudget::admit`] is cheap.
#[derive(Debug, Default)]
pub struct LogBudget {
    window_start_ms: u64,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    /// A budget with nothing used, whose first window starts at 0 ms.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a line may be logged at `now_ms`: `Some(n)` with the lines left out since the
    /// last one logged, or `None` to leave this one out.
    pub fn admit(&mut self, now_ms: u64) -> Option<u64> {
        if now_ms.saturating_sub(self.window_start_ms) >= WINDOW_MS {
            self.window_start_ms = now_ms;
            self.used = 0;
        }
        if self.used >= LINES_PER_WINDOW {
            self.suppressed += 1;
            return None;
        }
        self.used += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_budget_and_the_next_line_counts_what_was_left_out() {
        let mut budget = LogBudget::default();
        let logged: Vec<Option<u64>> = (0..25).map(|_| budget.admit(10)).collect();
        assert_eq!(logged.iter().filter(|l| l.is_some()).count(), 10);
        assert!(logged[..10].iter().all(|l| *l == Some(0)));
        assert!(logged[10..].iter().all(Option::is_none));
        // Within the window (from 0) nothing more; in the next one the first line reports
        // the 15 and the one after them.
        assert_eq!(budget.admit(999), None);
        assert_eq!(budget.admit(1_000), Some(16));
        assert_eq!(budget.admit(1_001), Some(0));
    }
}
