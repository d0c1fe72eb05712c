//! The three Nexmark event types and their JSON form.
//!
//! The JSON is a contract with guests written in any language: an object tagged by `"type"`
//! (`"person"`, `"auction"`, `"bid"`), then the fields in declaration order, snake_case, times
//! in ms since the epoch, ids and money (cents) as unsigned integers.

use eddy_wire::row::{Kind, RowFrame};
use eddy_wire::schema::Schema;
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

/// A [`Person`] whose text is borrowed (from the generator's [`crate::Scratch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PersonRef<'a> {
    pub id: u64,
    pub name: &'a str,
    pub email_address: &'a str,
    pub credit_card: &'a str,
    pub city: &'a str,
    pub state: &'a str,
    pub date_time: i64,
    pub extra: &'a str,
}

/// An [`Auction`] whose text is borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct AuctionRef<'a> {
    pub id: u64,
    pub item_name: &'a str,
    pub description: &'a str,
    pub initial_bid: u64,
    pub reserve: u64,
    pub date_time: i64,
    pub expires: i64,
    pub seller: u64,
    pub category: u64,
    pub extra: &'a str,
}

/// A [`Bid`] whose text is borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct BidRef<'a> {
    pub auction: u64,
    pub bidder: u64,
    pub price: u64,
    pub channel: &'a str,
    pub url: &'a str,
    pub date_time: i64,
    pub extra: &'a str,
}

/// An [`Event`] whose text is borrowed: what the generator makes without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// A person.
    Person(PersonRef<'a>),
    /// An auction.
    Auction(AuctionRef<'a>),
    /// A bid.
    Bid(BidRef<'a>),
}

impl EventRef<'_> {
    /// Event time (ms since the epoch).
    pub fn date_time(&self) -> i64 {
        match self {
            EventRef::Person(p) => p.date_time,
            EventRef::Auction(a) => a.date_time,
            EventRef::Bid(b) => b.date_time,
        }
    }

    /// The event with its own strings.
    pub fn to_owned(&self) -> Event {
        match *self {
            EventRef::Person(p) => Event::Person(Person {
                id: p.id,
                name: p.name.into(),
                email_address: p.email_address.into(),
                credit_card: p.credit_card.into(),
                city: p.city.into(),
                state: p.state.into(),
                date_time: p.date_time,
                extra: p.extra.into(),
            }),
            EventRef::Auction(a) => Event::Auction(Auction {
                id: a.id,
                item_name: a.item_name.into(),
                description: a.description.into(),
                initial_bid: a.initial_bid,
                reserve: a.reserve,
                date_time: a.date_time,
                expires: a.expires,
                seller: a.seller,
                category: a.category,
                extra: a.extra.into(),
            }),
            EventRef::Bid(b) => Event::Bid(Bid {
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: b.channel.into(),
                url: b.url.into(),
                date_time: b.date_time,
                extra: b.extra.into(),
            }),
        }
    }
}

impl Event {
    /// The event with its text borrowed.
    pub fn as_ref(&self) -> EventRef<'_> {
        match self {
            Event::Person(p) => EventRef::Person(PersonRef {
                id: p.id,
                name: &p.name,
                email_address: &p.email_address,
                credit_card: &p.credit_card,
                city: &p.city,
                state: &p.state,
                date_time: p.date_time,
                extra: &p.extra,
            }),
            Event::Auction(a) => EventRef::Auction(AuctionRef {
                id: a.id,
                item_name: &a.item_name,
                description: &a.description,
                initial_bid: a.initial_bid,
                reserve: a.reserve,
                date_time: a.date_time,
                expires: a.expires,
                seller: a.seller,
                category: a.category,
                extra: &a.extra,
            }),
            Event::Bid(b) => EventRef::Bid(BidRef {
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: &b.channel,
                url: &b.url,
                date_time: b.date_time,
                extra: &b.extra,
            }),
        }
    }
}

/// The row schemas of the three event types: the JSON object's keys in order, `type` first.
pub fn row_schemas() -> [Schema; 3] {
    [Schema::new("person", &PERSON_FIELDS), Schema::new("auction", &AUCTION_FIELDS), Schema::new("bid", &BID_FIELDS)]
}

const PERSON_FIELDS: [&str; 9] =
    ["type", "id", "name", "email_address", "credit_card", "city", "state", "date_time", "extra"];
const AUCTION_FIELDS: [&str; 11] = [
    "type",
    "id",
    "item_name",
    "description",
    "initial_bid",
    "reserve",
    "date_time",
    "expires",
    "seller",
    "category",
    "extra",
];
const BID_FIELDS: [&str; 8] = ["type", "auction", "bidder", "price", "channel", "url", "date_time", "extra"];

/// Appends `event` to `out` as a row (`eddy_wire::row`) of its type's schema in
/// [`row_schemas`]: the fields of its JSON form, in the same order, with the same names.
// Inlined next to `event_ref` (itself inlined), so that the fields go from registers to the
// row instead of through the returned event.
#[inline]
pub fn write_row(event: &EventRef<'_>, out: &mut Vec<u8>) {
    static TEMPLATES: std::sync::LazyLock<[Template; 3]> = std::sync::LazyLock::new(Template::all);
    let [person, auction, bid] = &*TEMPLATES;
    use Field::{Int, Text};
    match event {
        EventRef::Person(p) => person.write(
            out,
            [
                Int(p.id),
                Text(p.name),
                Text(p.email_address),
                Text(p.credit_card),
                Text(p.city),
                Text(p.state),
                Int(p.date_time as u64),
                Text(p.extra),
            ],
        ),
        EventRef::Auction(a) => auction.write(
            out,
            [
                Int(a.id),
                Text(a.item_name),
                Text(a.description),
                Int(a.initial_bid),
                Int(a.reserve),
                Int(a.date_time as u64),
                Int(a.expires as u64),
                Int(a.seller),
                Int(a.category),
                Text(a.extra),
            ],
        ),
        EventRef::Bid(b) => bid.write(
            out,
            [
                Int(b.auction),
                Int(b.bidder),
                Int(b.price),
                Text(b.channel),
                Text(b.url),
                Int(b.date_time as u64),
                Text(b.extra),
            ],
        ),
    }
}

/// A field after `type` for [`Template::write`]: an integer's bits (`i64` as two's
/// complement, as the row stores it) or a text.
#[derive(Clone, Copy)]
enum Field<'a> {
    Int(u64),
    Text(&'a str),
}

/// Room for the largest template (an auction's 120 bytes of header, null bits, kinds and
/// slots, plus `"auction"`), so that every template is copied as one fixed-size block.
const TEMPLATE_ROOM: usize = 128;

/// The start of an event type's row as `RowFrame` writes it with every field set: header,
/// null bits (all clear), kinds, slots, and the `type` text first in the variable region.
/// `RowFrame` costs a call and bounds checks per field (writing a row took nearly as long as
/// making the event); copying this and filling in the slots makes the same bytes (the layout documented in
/// `eddy_wire::row`: 8-byte slots ending the fixed part, texts as `u32 offset | u32 length`
/// from the row's start).
struct Template {
    bytes: [u8; TEMPLATE_ROOM],
    len: usize,
    /// Where slot 0 starts.
    slots: usize,
}

impl Template {
    fn all() -> [Template; 3] {
        use Kind::{I64, Str, U64};
        let [person, auction, bid] = row_schemas();
        [
            Template::new(&person, &[Str, U64, Str, Str, Str, Str, Str, I64, Str]),
            Template::new(&auction, &[Str, U64, Str, Str, U64, U64, I64, I64, U64, U64, Str]),
            Template::new(&bid, &[Str, U64, U64, U64, Str, Str, I64, Str]),
        ]
    }

    fn new(schema: &Schema, kinds: &[Kind]) -> Template {
        let mut row = Vec::new();
        let frame = RowFrame::begin(&mut row, kinds.len(), schema.id());
        for (i, kind) in kinds.iter().enumerate() {
            match kind {
                Kind::Str if i == 0 => frame.variable(&mut row, i, Kind::Str, schema.name.as_bytes()),
                Kind::Str => frame.variable(&mut row, i, Kind::Str, b""),
                Kind::I64 => frame.i64(&mut row, i, 0),
                _ => frame.u64(&mut row, i, 0),
            }
        }
        let mut bytes = [0; TEMPLATE_ROOM];
        bytes[..row.len()].copy_from_slice(&row);
        let slots = row.len() - schema.name.len() - 8 * kinds.len();
        Template { bytes, len: row.len(), slots }
    }

    /// Appends the row of fields `1..=N` (field 0, the type, is in the template).
    #[inline(always)]
    fn write<const N: usize>(&self, out: &mut Vec<u8>, fields: [Field<'_>; N]) {
        let text: usize = fields.iter().map(|f| if let Field::Text(t) = f { t.len() } else { 0 }).sum();
        out.reserve(TEMPLATE_ROOM + text);
        let start = out.len();
        out.extend_from_slice(&self.bytes);
        out.truncate(start + self.len);
        let mut offset = self.len;
        let slots = &mut out[start + self.slots + 8..][..8 * N];
        for (slot, field) in slots.chunks_exact_mut(8).zip(fields) {
            let bits = match field {
                Field::Int(v) => v,
                Field::Text(t) => {
                    // Truncated to 32 bits as `RowFrame` does (rows stay far below 4 GiB).
                    let at = u64::from(offset as u32) | u64::from(t.len() as u32) << 32;
                    offset += t.len();
                    at
                }
            };
            slot.copy_from_slice(&bits.to_le_bytes());
        }
        for field in fields {
            if let Field::Text(t) = field {
                out.extend_from_slice(t.as_bytes());
            }
        }
    }
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

    /// The row of an event renders (by `eddy_wire::json`, with the schemas by id) as the JSON
    /// `serde_json` writes for it, and reads back as the event through serde.
    #[test]
    fn rows_are_the_json_objects_in_binary() {
        struct Known([Schema; 3]);
        impl eddy_wire::schema::Schemas for Known {
            fn get(&self, id: u32) -> Option<std::sync::Arc<Schema>> {
                self.0.iter().find(|s| s.id() == id).cloned().map(std::sync::Arc::new)
            }
        }
        let known = Known(row_schemas());
        let config = NexmarkConfig { seed: 11, ..NexmarkConfig::default() };
        let mut decoder = eddy_wire::de::RowDecoder::new();
        for i in (0..200).chain(250_000..250_050) {
            let e = event(&config, i);
            let mut row = b"x".to_vec();
            write_row(&e.as_ref(), &mut row);
            let mut json = Vec::new();
            eddy_wire::json::row_to_json(&row[1..], &known, &mut json).unwrap();
            assert_eq!(String::from_utf8(json).unwrap(), String::from_utf8(to_json(&e)).unwrap(), "event {i}");
            assert_eq!(decoder.decode::<Event>(&row[1..], &known).unwrap(), e, "event {i} through serde");
        }
    }

    /// `write_row` as it was, one `RowFrame` call per field: the reference for the template.
    fn row_by_frame(event: &EventRef<'_>, out: &mut Vec<u8>) {
        let ids = row_schemas().map(|s| s.id());
        let str = |row: &RowFrame, out: &mut Vec<u8>, i, s: &str| row.variable(out, i, Kind::Str, s.as_bytes());
        match event {
            EventRef::Person(p) => {
                let row = RowFrame::begin(out, PERSON_FIELDS.len(), ids[0]);
                str(&row, out, 0, "person");
                row.u64(out, 1, p.id);
                str(&row, out, 2, p.name);
                str(&row, out, 3, p.email_address);
                str(&row, out, 4, p.credit_card);
                str(&row, out, 5, p.city);
                str(&row, out, 6, p.state);
                row.i64(out, 7, p.date_time);
                str(&row, out, 8, p.extra);
            }
            EventRef::Auction(a) => {
                let row = RowFrame::begin(out, AUCTION_FIELDS.len(), ids[1]);
                str(&row, out, 0, "auction");
                row.u64(out, 1, a.id);
                str(&row, out, 2, a.item_name);
                str(&row, out, 3, a.description);
                row.u64(out, 4, a.initial_bid);
                row.u64(out, 5, a.reserve);
                row.i64(out, 6, a.date_time);
                row.i64(out, 7, a.expires);
                row.u64(out, 8, a.seller);
                row.u64(out, 9, a.category);
                str(&row, out, 10, a.extra);
            }
            EventRef::Bid(b) => {
                let row = RowFrame::begin(out, BID_FIELDS.len(), ids[2]);
                str(&row, out, 0, "bid");
                row.u64(out, 1, b.auction);
                row.u64(out, 2, b.bidder);
                row.u64(out, 3, b.price);
                str(&row, out, 4, b.channel);
                str(&row, out, 5, b.url);
                row.i64(out, 6, b.date_time);
                str(&row, out, 7, b.extra);
            }
        }
    }

    /// The template is a shortcut: the bytes are those `RowFrame` writes, also after other
    /// bytes in the buffer and for paddings of any length.
    #[test]
    fn rows_are_those_row_frame_writes() {
        let config = NexmarkConfig { seed: 17, avg_person_bytes: 9_000, avg_bid_bytes: 0, ..NexmarkConfig::default() };
        let mut scratch = crate::Scratch::default();
        for i in (0..3_000).chain(u64::MAX - 100..=u64::MAX) {
            let e = crate::event_ref(&config, i, &mut scratch);
            let (mut fast, mut reference) = (b"before".to_vec(), b"before".to_vec());
            write_row(&e, &mut fast);
            row_by_frame(&e, &mut reference);
            assert_eq!(fast, reference, "event {i}");
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
