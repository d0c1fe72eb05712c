//! Nexmark q2, selection: the bids on a sample of auctions (ids that are multiples of 123).
//! Nexmark's definition:
//!
//! ```sql
//! SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
//! ```
//!
//! The pipeline (`q2.yaml`) is this one stateless step right after the source: it drops
//! persons, auctions and other bids and emits `{"auction", "price"}` per selected bid,
//! unkeyed, with the bid's event time.

use eddy_sdk::codec::Field;
use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result, Row};
use serde::{Deserialize, Serialize};

/// Auctions whose id is a multiple of this are selected.
pub const AUCTION_SKIP: u64 = 123;

/// One output row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Row)]
pub struct AuctionPrice {
    /// The auction.
    pub auction: u64,
    /// The bid's price.
    pub price: u64,
}

/// The operator.
#[derive(Debug)]
pub struct Selection {
    /// The events' `type`, its slot remembered per schema.
    kind: Field,
}

/// The fields of a bid this query reads.
#[derive(Debug, Deserialize, Row)]
struct BidAuction {
    auction: u64,
    price: u64,
}

impl Operator for Selection {
    type Config = ();

    fn open(_config: (), _ctx: &mut OpenContext) -> Result<Self> {
        Ok(Selection { kind: Field::new("type") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let kind = record.value_str_bytes(&self.kind)?.ok_or_else(|| Error::bad_record("an event without a `type`"))?;
        if *kind != *b"bid" {
            return Ok(());
        }
        let bid: BidAuction = record.row()?;
        if !bid.auction.is_multiple_of(AUCTION_SKIP) {
            return Ok(());
        }
        ctx.emit_row(&AuctionPrice { auction: bid.auction, price: bid.price })
    }
}

eddy_sdk::export_operator!(Selection);
