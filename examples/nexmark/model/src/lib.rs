//! The Nexmark event model as Eddy's `nexmark` source writes it: one JSON object per event,
//! tagged by `"type"`, with its event time (ms since the Unix epoch) in `date_time`:
//!
//! ```json
//! {"type":"person","id":1000,"name":"Peter Jones","email_address":"pj@example.com","credit_card":"1234 5678 9012 3456","city":"Boise","state":"ID","date_time":1436918400000,"extra":""}
//! {"type":"auction","id":1000,"item_name":"bike","description":"red","initial_bid":100,"reserve":150,"date_time":1436918400010,"expires":1436918410010,"seller":1000,"category":10,"extra":""}
//! {"type":"bid","auction":1000,"bidder":1001,"price":120,"channel":"Google","url":"https://example.com/a","date_time":1436918400020,"extra":""}
//! ```
//!
//! Shared by the Nexmark guests in `examples/nexmark/` (plain serde, no Eddy dependency, so a
//! native program can use it too). Fields that the source writes but a query never reads are
//! still declared: a record missing one is not a Nexmark event, and decoding says which field
//! is missing. Unknown fields are ignored.

use serde::{Deserialize, Serialize};

/// A person registering to buy or sell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// Unique person id (sellers and bidders refer to it).
    pub id: u64,
    /// Full name.
    pub name: String,
    /// Email address.
    pub email_address: String,
    /// Credit card number.
    pub credit_card: String,
    /// City.
    pub city: String,
    /// US state (two letters).
    pub state: String,
    /// When the person registered (event time, ms).
    pub date_time: i64,
    /// Padding.
    pub extra: String,
}

/// An item put up for auction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auction {
    /// Unique auction id (bids refer to it).
    pub id: u64,
    /// Item name.
    pub item_name: String,
    /// Item description.
    pub description: String,
    /// Starting price.
    pub initial_bid: u64,
    /// Reserve price.
    pub reserve: u64,
    /// When the auction opened (event time, ms).
    pub date_time: i64,
    /// When it closes (ms).
    pub expires: i64,
    /// The person selling (a [`Person::id`]).
    pub seller: u64,
    /// Item category.
    pub category: u64,
    /// Padding.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    /// The auction bid on (an [`Auction::id`]).
    pub auction: u64,
    /// The person bidding (a [`Person::id`]).
    pub bidder: u64,
    /// Price (in cents of a US dollar).
    pub price: u64,
    /// Where the bid came from.
    pub channel: String,
    /// The bid's URL.
    pub url: String,
    /// When the bid was made (event time, ms).
    pub date_time: i64,
    /// Padding.
    pub extra: String,
}

/// Any Nexmark event, tagged by its `"type"` field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Event {
    /// `"type": "person"`.
    Person(Person),
    /// `"type": "auction"`.
    Auction(Auction),
    /// `"type": "bid"`.
    Bid(Bid),
}

/// What a host window step emits per key and window: `{"start", "end", "result"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowResult<R> {
    /// Window start (inclusive, ms).
    pub start: i64,
    /// Window end (exclusive, ms).
    pub end: i64,
    /// The aggregate's result.
    pub result: R,
}

/// Start of the tumbling window of `size_ms` (aligned to the epoch) that contains `t`.
pub fn tumble_start(t: i64, size_ms: i64) -> i64 {
    t - t.rem_euclid(size_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_by_type() {
        let bid = r#"{"type":"bid","auction":7,"bidder":8,"price":9,"channel":"c","url":"u","date_time":5,"extra":""}"#;
        let Event::Bid(b) = serde_json::from_str(bid).unwrap() else { panic!("a bid") };
        assert_eq!((b.auction, b.bidder, b.price, b.date_time), (7, 8, 9, 5));
        let person = r#"{"type":"person","id":1,"name":"n","email_address":"e","credit_card":"c","city":"x","state":"OR","date_time":3,"extra":"","more":1}"#;
        assert!(matches!(serde_json::from_str(person).unwrap(), Event::Person(Person { id: 1, .. })));
        let missing = r#"{"type":"bid","auction":7}"#;
        assert!(serde_json::from_str::<Event>(missing).unwrap_err().to_string().contains("bidder"));
    }

    #[test]
    fn tumbling_windows_align_to_the_epoch() {
        assert_eq!(tumble_start(19_999, 10_000), 10_000);
        assert_eq!(tumble_start(20_000, 10_000), 20_000);
        assert_eq!(tumble_start(-1, 10_000), -10_000);
    }
}
