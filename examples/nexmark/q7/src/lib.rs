//! Nexmark q7, highest bid: the highest bid of every 10-second tumbling window. Nexmark's
//! definition:
//!
//! ```sql
//! SELECT B.auction, B.price, B.bidder, B.date_time
//! FROM bid B
//! JOIN (SELECT MAX(price) AS maxprice, TUMBLE_ROWTIME(date_time, INTERVAL '10' SECOND) AS date_time
//!       FROM bid GROUP BY TUMBLE(date_time, INTERVAL '10' SECOND)) B1
//! ON B.price = B1.maxprice
//! WHERE B.date_time BETWEEN B1.date_time - INTERVAL '10' SECOND AND B1.date_time
//! ```
//!
//! Here: one row per window, `{"window_end", "auction", "bidder", "price"}`; among bids with
//! the highest price the one with the smallest `(auction, bidder)` wins, so the row does not
//! depend on arrival order.
//!
//! The pipeline (`q7.yaml`):
//! 1. `nexmark-select` keeps bids, all under the constant key `0` (the window is global);
//! 2. a tumbling window of 10 s (`key_by: key`) with this aggregate, whose accumulator and
//!    result are the best bid so far, `{"auction", "bidder", "price"}`; the window emits
//!    `{"start", "end", "result": {"auction", "bidder", "price"}}`;
//! 3. `nexmark-window-row` (config `{end: window_end}`) flattens that into the row.
//!
//! The accumulator is one bid and merging keeps the better one, so the window may add
//! records in any grouping. Everything goes through one key, hence one subtask of the
//! window: that is the query (a global maximum), and the state per window is three numbers.

use eddy_sdk::{Aggregate, Record, Result, Row};
use serde::{Deserialize, Serialize};

/// The best bid of a window so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Highest {
    /// The auction bid on.
    pub auction: u64,
    /// The bidder.
    pub bidder: u64,
    /// The price.
    pub price: u64,
}

impl Highest {
    /// Whether `self` beats `other`: a higher price, or the same price and a smaller
    /// `(auction, bidder)`.
    pub fn beats(&self, other: &Highest) -> bool {
        (self.price, std::cmp::Reverse((self.auction, self.bidder)))
            > (other.price, std::cmp::Reverse((other.auction, other.bidder)))
    }
}

/// The better of two candidates.
pub fn best(a: Option<Highest>, b: Option<Highest>) -> Option<Highest> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.beats(&a) { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// The fields of a bid this query reads.
#[derive(Debug, Deserialize, Row)]
struct BidPrice {
    auction: u64,
    bidder: u64,
    price: u64,
}

/// The aggregate function.
#[derive(Debug)]
pub struct HighestBid;

impl Aggregate for HighestBid {
    type Config = ();
    type Accumulator = Option<Highest>;
    type Output = Option<Highest>;

    fn open(_config: ()) -> Result<Self> {
        Ok(HighestBid)
    }

    fn create_accumulator(&self) -> Option<Highest> {
        None
    }

    fn add(&self, acc: &mut Option<Highest>, record: &Record<'_>) -> Result<()> {
        let bid: BidPrice = record.row()?;
        *acc = best(*acc, Some(Highest { auction: bid.auction, bidder: bid.bidder, price: bid.price }));
        Ok(())
    }

    fn merge(&self, a: Option<Highest>, b: Option<Highest>) -> Option<Highest> {
        best(a, b)
    }

    /// Never `None`: a window exists only once a bid was added to it.
    fn result(&self, acc: Option<Highest>) -> Option<Highest> {
        acc
    }
}

eddy_sdk::export_aggregate!(HighestBid);
