//! The three Nexmark event types and their JSON form.
//!
//! The JSON is a contract with guests written in any language: an object tagged by `"type"`
//! (`"person"`, `"auction"`, `"bid"`), then the fields in declaration order, snake_case, times
//! in ms since the epoch, ids and money (cents) as unsigned integers.

use serde::{Deserialize, Serialize};

/// A new user of the auction site.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Person {
    /// Unique, `1000 + n` for the `n`-th person generated.
    pub id: u64,
    /// First and last name, e.g. `"Kate Smith"`.
    pub name: String,
    /// A made-up address ending in `.com`.
    pub email_address: String,
    /// Four space-separated groups of four digits.
    pub credit_card: String,
    /// A US city.
    pub city: String,
    /// A US state code (`"AZ"`, `"CA"`, `"ID"`, `"OR"`, `"WA"`, `"WY"`).
    pub state: String,
    /// Event time, ms since the epoch.
    pub date_time: i64,
    /// Padding that brings the event to its configured average size.
    pub extra: String,
}

/// An item put up for auction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Auction {
    /// Unique, `1000 + m` for the `m`-th auction generated.
    pub id: u64,
    /// Short random text.
    pub item_name: String,
    /// Longer random text.
    pub description: String,
    /// Starting price in cents.
    pub initial_bid: u64,
    /// Lowest acceptable price in cents (above `initial_bid`).
    pub reserve: u64,
    /// Event time, ms since the epoch.
    pub date_time: i64,
    /// When the auction closes, ms since the epoch (after `date_time`).
    pub expires: i64,
    /// The selling [`Person`]'s id.
    pub seller: u64,
    /// Category id, from 10 up.
    pub category: u64,
    /// Padding that brings the event to its configured average size.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bid {
    /// The [`Auction`]'s id.
    pub auction: u64,
    /// The bidding [`Person`]'s id.
    pub bidder: u64,
    /// Offered price in cents.
    pub price: u64,
    /// Where the bid came from: `"Google"`, `"Facebook"`, `"Baidu"`, `"Apple"` or `"channel-<n>"`.
    pub channel: String,
    /// The page the bid was placed on (fixed per channel).
    pub url: String,
    /// Event time, ms since the epoch.
    pub date_time: i64,
    /// Padding that brings the event to its configured average size.
    pub extra: String,
}

/// One Nexmark event: `{"type":"person"|"auction"|"bid", ...fields}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A new bid.
    Bid(Bid),
}

impl Event {
    /// The event time, ms since the epoch.
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}

/// The event as compact JSON, e.g. `{"type":"bid","auction":1000,"bidder":1001,...}`.
pub fn to_json(event: &Event) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_json(event, &mut out);
    out
}

/// Appends the event's compact JSON to `out` (no allocation once `out` is large enough).
pub fn write_json(event: &Event, out: &mut Vec<u8>) {
    // Writing integers and strings into a Vec cannot fail.
    let _ = serde_json::to_writer(out, event);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NexmarkConfig, event};

    fn text(s: &str) -> String {
        serde_json::to_string(s).unwrap()
    }

    /// The JSON is the guests' contract: field names, their order and `"type"` first.
    #[test]
    fn json_is_the_documented_contract() {
        let config = NexmarkConfig { seed: 5, ..NexmarkConfig::default() };
        for i in [0, 1, 4, 50, 51, 99] {
            let e = event(&config, i);
            let json = String::from_utf8(to_json(&e)).unwrap();
            let expected = match &e {
                Event::Person(p) => format!(
                    r#"{{"type":"person","id":{},"name":{},"email_address":{},"credit_card":{},"city":{},"state":{},"date_time":{},"extra":{}}}"#,
                    p.id,
                    text(&p.name),
                    text(&p.email_address),
                    text(&p.credit_card),
                    text(&p.city),
                    text(&p.state),
                    p.date_time,
                    text(&p.extra)
                ),
                Event::Auction(a) => format!(
                    r#"{{"type":"auction","id":{},"item_name":{},"description":{},"initial_bid":{},"reserve":{},"date_time":{},"expires":{},"seller":{},"category":{},"extra":{}}}"#,
                    a.id,
                    text(&a.item_name),
                    text(&a.description),
                    a.initial_bid,
                    a.reserve,
                    a.date_time,
                    a.expires,
                    a.seller,
                    a.category,
                    text(&a.extra)
                ),
                Event::Bid(b) => format!(
                    r#"{{"type":"bid","auction":{},"bidder":{},"price":{},"channel":{},"url":{},"date_time":{},"extra":{}}}"#,
                    b.auction,
                    b.bidder,
                    b.price,
                    text(&b.channel),
                    text(&b.url),
                    b.date_time,
                    text(&b.extra)
                ),
            };
            assert_eq!(json, expected, "event {i}");
            assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), e, "event {i} round trip");
            let mut appended = b"x".to_vec();
            write_json(&e, &mut appended);
            assert_eq!(&appended[1..], json.as_bytes());
        }
    }

    #[test]
    fn hand_written_json_parses() {
        let bid = r#"{"type":"bid","auction":1000,"bidder":1001,"price":5,"channel":"Apple","url":"u","date_time":-3,"extra":""}"#;
        let e: Event = serde_json::from_str(bid).unwrap();
        assert_eq!(e.date_time(), -3);
        assert!(matches!(e, Event::Bid(Bid { auction: 1000, bidder: 1001, price: 5, .. })));
        assert!(serde_json::from_str::<Event>(r#"{"type":"sale","id":1}"#).is_err());
    }
}
