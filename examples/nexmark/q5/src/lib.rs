//! Nexmark q5, hot items: in every sliding window of 10 s (starting every 2 s), the auctions
//! with the most bids. Nexmark's definition:
//!
//! ```sql
//! SELECT AuctionBids.auction, AuctionBids.num
//! FROM (SELECT auction, COUNT(*) AS num, HOP_END(date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS window_end
//!       FROM bid GROUP BY auction, HOP(date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)) AS AuctionBids
//! JOIN (SELECT MAX(num) AS maxn, window_end
//!       FROM (SELECT COUNT(*) AS num, HOP_END(date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS window_end
//!             FROM bid GROUP BY auction, HOP(date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)) AS CountBids
//!       GROUP BY window_end) AS MaxBids
//! ON AuctionBids.window_end = MaxBids.window_end AND AuctionBids.num >= MaxBids.maxn
//! ```
//!
//! Rows: `{"window_end", "auction", "count"}`, one per auction tied for the most bids.
//!
//! The pipeline (`q5.yaml`):
//! 1. `nexmark-select` keeps bids, keyed by `auction`, the key alone (`value: none`);
//! 2. a sliding window (10 s / 2 s, `key_by: key`) with the `nexmark-count` aggregate emits
//!    per auction and window `{"start", "end", "result": {"auction", "count"}}`, timestamp
//!    `end - 1`, when the watermark reaches `end - 1`;
//! 3. this operator, `key_by: /end` (one key per window end, so all auctions of a window meet
//!    in one subtask), keeps per window end the highest count and the auctions that have it
//!    (`ValueState`), and emits them when an event-time timer at `end` fires, then forgets
//!    the window. The timer is registered with the window's first result (the state is empty
//!    exactly then: it is cleared when the timer fires).
//!
//! Why the output is complete when the timer fires: every subtask of step 2 fires window
//! `[end - 10 s, end)` at the first watermark `>= end - 1` it sees and sends the results
//! ahead of that watermark on the same channel (events never overtake records). This
//! operator's watermark is the minimum over those channels, so once it reaches `end - 1`
//! every result of the window has been processed; and while a result is processed the
//! watermark is still below `end - 1` (its channel has not delivered the firing watermark
//! yet), so the timer is registered before it is due. The result's own timestamp (`end - 1`)
//! is thus never behind this operator's watermark, but a timer at `end - 1` would leave no
//! margin: the timer sits at `end`, which keeps the operator right should the window fire at
//! `end` instead (as session windows do). A timer registered late would still fire, at the
//! next watermark. What this relies on: no `allowed_lateness_ms` on the window (a late
//! re-fire would come after the rows were emitted and start a second, partial set of rows)
//! and no idleness that lets the watermark pass a silent window subtask.
//! Rows are emitted in auction order, keyed by the window end, with timestamp `end`.

use eddy_sdk::{Context, OpenContext, Operator, Record, Result, TimeDomain, Timer, ValueState};
use nexmark_model::WindowResult;
use serde::{Deserialize, Serialize};

/// What `nexmark-count` (config `{key_as: auction, count_as: count}`) computes per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct AuctionCount {
    /// The auction.
    pub auction: u64,
    /// Its bids in the window.
    pub count: u64,
}

/// The leaders of one window so far.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaders {
    /// The highest count.
    pub count: u64,
    /// The auctions with that count.
    pub auctions: Vec<u64>,
}

impl Leaders {
    /// Takes one auction's count into account; whether the leaders changed.
    pub fn offer(&mut self, c: AuctionCount) -> bool {
        let mut changed = false;
        if c.count > self.count || self.auctions.is_empty() {
            self.count = c.count;
            self.auctions.clear();
            changed = true;
        }
        if c.count == self.count && !self.auctions.contains(&c.auction) {
            self.auctions.push(c.auction);
            changed = true;
        }
        changed
    }
}

/// The highest count alone, read from the row [`Leaders`] wrote (rows are read by field name,
/// so the list of auctions is left undecoded). Never written: `Serialize` is only what
/// `ValueState` asks of its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeadingCount {
    /// [`Leaders::count`].
    pub count: u64,
}

/// One output row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HotItem {
    /// End of the window (exclusive, ms).
    pub window_end: i64,
    /// An auction with the most bids in it.
    pub auction: u64,
    /// Its number of bids.
    pub count: u64,
}

/// The operator.
#[derive(Debug)]
pub struct HotItems {
    leaders: ValueState<Leaders>,
    /// The same state, its count alone.
    leading_count: ValueState<LeadingCount>,
}

impl Operator for HotItems {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        // One state under one name, read whole or by its count: a declaration of a name
        // already declared names the same state.
        Ok(HotItems { leaders: ctx.value_state("leaders"), leading_count: ctx.value_state("leaders") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let window: WindowResult<AuctionCount> = record.value()?;
        // Most of a window's results trail its leaders: the count alone says so, without
        // decoding the list (a stored state always holds at least one auction, so `offer`
        // would change nothing).
        let first = match self.leading_count.get()? {
            Some(leading) if window.result.count < leading.count => return Ok(()),
            Some(_) => false,
            None => true,
        };
        let mut leaders = if first { Leaders::default() } else { self.leaders.get()?.unwrap_or_default() };
        // Only a change is written (an encoding and a state write fewer per result).
        if leaders.offer(window.result) {
            self.leaders.set(&leaders)?;
        }
        // The window's first result registers its timer; the rest find it pending (a
        // registration is a crossing to the host, and a window has hundreds of results).
        if first {
            ctx.register_timer(TimeDomain::EventTime, window.end)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, timer: &Timer<'_>, ctx: &mut Context) -> Result<()> {
        let window_end: i64 = timer.key()?;
        let Some(mut leaders) = self.leaders.get()? else { return Ok(()) };
        self.leaders.clear()?;
        leaders.auctions.sort_unstable();
        for auction in leaders.auctions {
            ctx.emit(&window_end, &HotItem { window_end, auction, count: leaders.count })?;
        }
        Ok(())
    }
}

eddy_sdk::export_operator!(HotItems);

#[cfg(test)]
mod tests {
    use super::*;

    /// The count read alone from the stored leaders is their count, and an offer below it
    /// is one `offer` refuses: skipping it without the list changes nothing.
    #[test]
    fn the_leading_count_reads_from_the_leaders_row() {
        let leaders = Leaders { count: 4, auctions: vec![9, 3] };
        let row = eddy_sdk::codec::encode_value(&leaders).expect("encodes");
        let leading: LeadingCount = eddy_sdk::codec::decode_value(&row).expect("the count alone");
        assert_eq!(leading, LeadingCount { count: 4 });
        let mut offered = leaders.clone();
        assert!(!offered.offer(AuctionCount { auction: 5, count: 3 }));
        assert_eq!(offered, leaders);
    }

    /// Offers in arrival order, each with whether the leaders changed and what they are then,
    /// worked out by hand from "the highest count and every auction that has it".
    #[test]
    fn only_an_offer_that_changes_the_leaders_says_so() {
        let offers: [((u64, u64), bool, u64, &[u64]); 6] = [
            ((7, 2), true, 2, &[7]),     // the first
            ((8, 1), false, 2, &[7]),    // behind
            ((9, 2), true, 2, &[7, 9]),  // a tie joins
            ((9, 2), false, 2, &[7, 9]), // already there
            ((8, 3), true, 3, &[8]),     // a new highest
            ((7, 3), true, 3, &[8, 7]),  // ties again
        ];
        let mut leaders = Leaders::default();
        for ((auction, count), changed, top, auctions) in offers {
            assert_eq!(leaders.offer(AuctionCount { auction, count }), changed, "offer of {auction}: {count}");
            assert_eq!((leaders.count, leaders.auctions.as_slice()), (top, auctions));
        }
    }
}
