//! # eddy-nexmark: the Nexmark benchmark for Eddy
//!
//! Nexmark models an online auction site: [`Person`]s register, put items up for
//! [`Auction`], and place [`Bid`]s. This crate holds
//!
//! - the event model and its JSON (the contract for Wasm guests): an object tagged by `"type"`,
//!   e.g. `{"type":"bid","auction":1000,"bidder":1001,"price":4250,"channel":"Google",
//!   "url":"https://www.nexmark.com/…","date_time":1700000000000,"extra":"…"}`;
//! - a deterministic generator: [`event`]`(config, i)` is a pure function of `(config, i)`, so
//!   parallel readers split the index space and a reader resumes at any index;
//! - [`native`]: the queries in plain Rust, the baselines Eddy's pipelines are measured against
//!   and checked with.
//!
//! The engine reads the generator as a source `{type: nexmark, ...}` (see `eddy-engine`).
//!
//! ```
//! use eddy_nexmark::{Event, NexmarkConfig, event, events, native, to_json};
//!
//! let config = NexmarkConfig { seed: 7, events: Some(10_000), ..NexmarkConfig::default() };
//! // Event 0 is the first person, events 1..=3 auctions, then 46 bids, and again.
//! let Event::Person(first) = event(&config, 0) else { unreachable!() };
//! assert_eq!(first.id, 1000);
//! assert!(to_json(&event(&config, 4)).starts_with(br#"{"type":"bid","auction":"#));
//!
//! // Events are a function of their index: generating twice gives the same events.
//! assert_eq!(event(&config, 1234), event(&config, 1234));
//!
//! // 10 000 events at the default 10 000 events/s of event time: one second of bids.
//! let all: Vec<Event> = events(&config).collect();
//! // Rows as JSON (the oracle) or only counted (the benchmark's ceiling).
//! let rows: Vec<serde_json::Value> = native::q0(&all);
//! assert_eq!(rows.len(), 10_000 / 50 * 46);
//! let native::RowCount(windows) = native::q7(&all);
//! assert_eq!(windows, 1); // all bids fall into one 10 s window
//! ```

#![deny(missing_docs)]

mod generator;
mod model;
pub mod native;

pub use generator::{
    AUCTION_PROPORTION, BID_PROPORTION, EventKind, FIRST_AUCTION_ID, FIRST_CATEGORY_ID, FIRST_PERSON_ID, InvalidConfig,
    NexmarkConfig, PERSON_PROPORTION, Scratch, TOTAL_PROPORTION, US_STATES, auctions_before, event, event_ref,
    event_time, events, kind, persons_before,
};
pub use model::{
    Auction, AuctionRef, Bid, BidRef, Event, EventRef, Person, PersonRef, row_schemas, to_json, write_json, write_row,
};
