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

use eddy_sdk::codec::Field;
use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result, Row};
use serde::{Deserialize, Serialize};

/// One output row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Row)]
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
    // `dollars * 908 / 1000` without its overflow and without u128, whose division is a
    // software routine in WebAssembly (3% of q1's CPU): with dollars = 1000 q + r,
    // floor(dollars * 0.908) = 908 q + floor(908 r / 1000) exactly.
    dollars / 1000 * 908 + dollars % 1000 * 908 / 1000
}

/// The fields of a bid this query reads: from a row only these four slots are read.
#[derive(Debug, Deserialize, Row)]
struct BidPrice {
    auction: u64,
    bidder: u64,
    price: u64,
    date_time: i64,
}

/// The operator.
#[derive(Debug)]
pub struct CurrencyConversion {
    /// The events' `type`, its slot remembered per schema.
    kind: Field,
}

impl Operator for CurrencyConversion {
    type Config = ();

    fn open(_config: (), _ctx: &mut OpenContext) -> Result<Self> {
        Ok(CurrencyConversion { kind: Field::new("type") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let kind = record.value_str_bytes(&self.kind)?.ok_or_else(|| Error::bad_record("an event without a `type`"))?;
        if *kind != *b"bid" {
            return Ok(());
        }
        let bid: BidPrice = record.row()?;
        let row =
            EuroBid { auction: bid.auction, bidder: bid.bidder, price: to_euros(bid.price), date_time: bid.date_time };
        ctx.emit_row(&row)
    }
}

eddy_sdk::export_operator!(CurrencyConversion);

#[cfg(test)]
mod tests {
    use super::to_euros;

    #[test]
    fn euros_are_the_exact_floor_of_0_908_times_the_dollars() {
        // The definition, in 128-bit arithmetic where the product cannot overflow.
        let definition = |d: u64| (u128::from(d) * 908 / 1000) as u64;
        let edges = [0, 1, 999, 1000, 1001, 1_099, 123_456_789, u64::MAX / 908, u64::MAX - 1, u64::MAX];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let spread = (0..10_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        });
        for d in edges.into_iter().chain(spread).chain(0..5_000) {
            assert_eq!(to_euros(d), definition(d), "{d} dollars");
        }
    }
}
