//! Nexmark q1, currency conversion: every bid with its price converted from dollars to euros.
//! Nexmark's definition:
//!
//! ```sql
//! SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid
//! ```
//!
//! Prices are integers, so the conversion is `price * 908 / 1000` with integer division
//! (rounding down), computed without overflow. The pipeline (`q1.yaml`) is this one stateless
//! step right after the source: it reads every event, drops persons and auctions, and emits
//! `{"auction", "bidder", "price", "date_time"}` per bid, unkeyed, with the bid's event time.

use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result};
use serde::{Deserialize, Serialize};

/// One output row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EuroBid {
    /// The auction.
    pub auction: u64,
    /// The bidder.
    pub bidder: u64,
    /// The price in euros.
    pub price: u64,
    /// The bid's time (ms).
    pub date_time: i64,
}

/// Dollars to euros at 0.908, rounded down.
pub fn to_euros(dollars: u64) -> u64 {
    // At most 908/1000 of a u64, so the result fits.
    (u128::from(dollars) * 908 / 1000) as u64
}

/// The fields of a bid this query reads: from a row only these four slots are read.
#[derive(Debug, Deserialize)]
struct BidPrice {
    auction: u64,
    bidder: u64,
    price: u64,
    date_time: i64,
}

/// The operator.
#[derive(Debug)]
pub struct CurrencyConversion;

impl Operator for CurrencyConversion {
    type Config = ();

    fn open(_config: (), _ctx: &mut OpenContext) -> Result<Self> {
        Ok(CurrencyConversion)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let kind = record.value_str("type")?.ok_or_else(|| Error::bad_record("an event without a `type`"))?;
        if kind != "bid" {
            return Ok(());
        }
        let bid: BidPrice = record.value()?;
        let row =
            EuroBid { auction: bid.auction, bidder: bid.bidder, price: to_euros(bid.price), date_time: bid.date_time };
        ctx.emit_value(&row)
    }
}

eddy_sdk::export_operator!(CurrencyConversion);
