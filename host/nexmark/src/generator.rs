//! The deterministic generator: event `i` is a pure function of `(config, i)`.
//!
//! There is no generator state. Which kind of event index `i` is, and how many persons and
//! auctions precede it, follow from `i` alone (per 50 events: 1 person, 3 auctions, 46 bids, by
//! `i % 50`), so ids derive from the index and references (sellers, bidders, auctions) are drawn
//! among ids known to exist. Every random choice is an xxh3 hash of `(seed, i, salt)`. Hence any
//! partitioning of the index space yields the same events, and a reader resumes at any index.
//!
//! Shapes and proportions follow the Nexmark generator (Beam / Flink): hot sellers, bidders and
//! auctions chosen with probability `1 - 1/ratio` among the latest group of 100, the others
//! among active people or in-flight auctions; prices spread over six decades from $1; auction
//! lengths around the time it takes to create `num_in_flight_auctions` more auctions; `extra`
//! padding to an average event size. Unlike that generator, references never point at ids not
//! yet generated, so every join partner exists earlier in index order.

use std::fmt;
use std::hint::select_unpredictable;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::model::{AuctionRef, BidRef, Event, EventRef, PersonRef};

/// Id of the first person; person `n` (counted from 0) has id `FIRST_PERSON_ID + n`.
pub const FIRST_PERSON_ID: u64 = 1000;
/// Id of the first auction; auction `m` (counted from 0) has id `FIRST_AUCTION_ID + m`.
pub const FIRST_AUCTION_ID: u64 = 1000;
/// The smallest category id; categories are `FIRST_CATEGORY_ID..FIRST_CATEGORY_ID + num_categories`.
pub const FIRST_CATEGORY_ID: u64 = 10;
/// Persons per [`TOTAL_PROPORTION`] events (at `i % 50 == 0`).
pub const PERSON_PROPORTION: u64 = 1;
/// Auctions per [`TOTAL_PROPORTION`] events (at `i % 50` in `1..=3`).
pub const AUCTION_PROPORTION: u64 = 3;
/// Bids per [`TOTAL_PROPORTION`] events (at `i % 50` in `4..50`).
pub const BID_PROPORTION: u64 = 46;
/// Length of the repeating person / auction / bid pattern.
pub const TOTAL_PROPORTION: u64 = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION;
/// The states a person lives in. Few, so that q3 (OR, ID, CA) finds results in small runs.
pub const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];

/// Hot entities are the first of the latest group of this many ids (as in Nexmark).
const HOT_GROUP: u64 = 100;
const US_CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
const FIRST_NAMES: [&str; 11] =
    ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"];
const LAST_NAMES: [&str; 9] = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"];
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// Other channels are `channel-0` .. `channel-9999`.
const COLD_CHANNELS: u64 = 10_000;
/// One bid in this many comes from a cold channel.
const HOT_CHANNEL_RATIO: u64 = 2;

/// What to generate. `Default` gives the Nexmark defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NexmarkConfig {
    /// Same seed, same events.
    pub seed: u64,
    /// Number of events for [`events`]; none = unbounded. [`event`] ignores it.
    pub events: Option<u64>,
    /// Event time of event 0, ms since the epoch.
    pub first_event_time_ms: i64,
    /// Event-time distance between consecutive events in µs (100 = 10 000 events per second
    /// of event time).
    pub inter_event_us: u64,
    /// Each event's time is moved back by up to this much (bounded disorder); 0 = in order.
    pub max_disorder_ms: i64,
    /// A bid is on the hot auction with probability `1 - 1/hot_auction_ratio`.
    pub hot_auction_ratio: u64,
    /// A bid is by the hot bidder with probability `1 - 1/hot_bidder_ratio`.
    pub hot_bidder_ratio: u64,
    /// An auction is by the hot seller with probability `1 - 1/hot_seller_ratio`.
    pub hot_seller_ratio: u64,
    /// Other sellers and bidders are drawn among this many most recent persons.
    pub num_active_people: u64,
    /// Other bids go to one of this many most recent auctions; auctions last about as long as
    /// it takes to create this many more.
    pub num_in_flight_auctions: u64,
    /// Number of auction categories.
    pub num_categories: u64,
    /// Average person size in bytes (numbers count 8, strings their length); `extra` pads to it.
    pub avg_person_bytes: u64,
    /// Average auction size in bytes, as for persons.
    pub avg_auction_bytes: u64,
    /// Average bid size in bytes, as for persons.
    pub avg_bid_bytes: u64,
}

impl Default for NexmarkConfig {
    fn default() -> Self {
        NexmarkConfig {
            seed: 0,
            events: None,
            first_event_time_ms: 1_700_000_000_000,
            inter_event_us: 100,
            max_disorder_ms: 0,
            hot_auction_ratio: 2,
            hot_bidder_ratio: 4,
            hot_seller_ratio: 4,
            num_active_people: 1000,
            num_in_flight_auctions: 100,
            num_categories: 5,
            avg_person_bytes: 200,
            avg_auction_bytes: 500,
            avg_bid_bytes: 100,
        }
    }
}

/// A configuration field with a value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig {
    /// The field's name in [`NexmarkConfig`].
    pub field: &'static str,
    /// What is wrong and what would be right.
    pub problem: String,
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nexmark `{}`: {}", self.field, self.problem)
    }
}

impl std::error::Error for InvalidConfig {}

impl NexmarkConfig {
    /// Checks the fields; the error names the first bad one. [`event`] never panics on an
    /// invalid configuration (it treats zero counts and ratios as 1 and negative disorder as
    /// none), but such a configuration does not mean what it says.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let invalid = |field, problem: &str| Err(InvalidConfig { field, problem: problem.to_string() });
        if self.max_disorder_ms < 0 {
            return invalid("max_disorder_ms", "must not be negative");
        }
        let at_least_one = [
            ("hot_auction_ratio", self.hot_auction_ratio, "(1 = no hot auction)"),
            ("hot_bidder_ratio", self.hot_bidder_ratio, "(1 = no hot bidder)"),
            ("hot_seller_ratio", self.hot_seller_ratio, "(1 = no hot seller)"),
            ("num_active_people", self.num_active_people, ""),
            ("num_in_flight_auctions", self.num_in_flight_auctions, ""),
            ("num_categories", self.num_categories, ""),
        ];
        for (field, value, hint) in at_least_one {
            if value == 0 {
                return invalid(field, format!("must be at least 1 {hint}").trim_end());
            }
        }
        Ok(())
    }
}

/// The kind of event at an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `index % 50 == 0`.
    Person,
    /// `index % 50` in `1..=3`.
    Auction,
    /// `index % 50` in `4..50`.
    Bid,
}

/// The kind of event `index` is.
#[inline]
pub fn kind(index: u64) -> EventKind {
    match index % TOTAL_PROPORTION {
        offset if offset < PERSON_PROPORTION => EventKind::Person,
        offset if offset < PERSON_PROPORTION + AUCTION_PROPORTION => EventKind::Auction,
        _ => EventKind::Bid,
    }
}

/// Number of persons among the events `0..index`; a person at `index` has id
/// `FIRST_PERSON_ID + persons_before(index)`.
#[inline]
pub fn persons_before(index: u64) -> u64 {
    let (epoch, offset) = (index / TOTAL_PROPORTION, index % TOTAL_PROPORTION);
    epoch * PERSON_PROPORTION + offset.min(PERSON_PROPORTION)
}

/// Number of auctions among the events `0..index`; an auction at `index` has id
/// `FIRST_AUCTION_ID + auctions_before(index)`.
#[inline]
pub fn auctions_before(index: u64) -> u64 {
    let (epoch, offset) = (index / TOTAL_PROPORTION, index % TOTAL_PROPORTION);
    epoch * AUCTION_PROPORTION + offset.saturating_sub(PERSON_PROPORTION).min(AUCTION_PROPORTION)
}

/// The event time of event `index`:
/// `first_event_time_ms + index * inter_event_us / 1000 - disorder(index)`, with the disorder
/// drawn uniformly from `0..=max_disorder_ms`, saturating at the ends of `i64`.
#[inline]
pub fn event_time(config: &NexmarkConfig, index: u64) -> i64 {
    let draws = Draws { seed: config.seed, index };
    let disorder = match config.max_disorder_ms {
        d if d > 0 => draws.below(Salt::Disorder, d as u64 + 1),
        _ => 0,
    };
    // 64-bit arithmetic when it cannot overflow (always, in practice): a 128-bit division
    // per event was a tenth of the generator's time.
    let fast = index
        .checked_mul(config.inter_event_us)
        .and_then(|us| i64::try_from(us / 1000).ok())
        .and_then(|base| config.first_event_time_ms.checked_add(base))
        .and_then(|t| t.checked_sub(disorder as i64));
    if let Some(t) = fast {
        return t;
    }
    let base = i128::from(index).saturating_mul(i128::from(config.inter_event_us)) / 1000;
    clamp_i64(i128::from(config.first_event_time_ms) + base - i128::from(disorder))
}

/// Event `index`: a pure function of `(config, index)` (see the module docs).
pub fn event(config: &NexmarkConfig, index: u64) -> Event {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
    }
    SCRATCH.with_borrow_mut(|scratch| event_ref(config, index, scratch).to_owned())
}

/// The events `0..config.events` in index order (`0..u64::MAX` when unbounded).
pub fn events(config: &NexmarkConfig) -> impl Iterator<Item = Event> + '_ {
    let mut scratch = Scratch::default();
    (0..config.events.unwrap_or(u64::MAX)).map(move |index| event_ref(config, index, &mut scratch).to_owned())
}

/// Reused buffers for the text of one event: [`event_ref`] writes the strings it makes here
/// (names, emails, channels, paddings) instead of allocating, and keeps each channel's URL.
#[derive(Debug, Default)]
pub struct Scratch {
    name: String,
    email: String,
    card: String,
    extra: String,
    channels: Channels,
}

/// Event `index` as [`event`] makes it, borrowing its text from `scratch` and from the
/// generator's static text: no allocation once `scratch` has seen a few events.
// Inlined into the caller, which usually writes the event right away (`write_row`): returned
// through memory, the fields were read back before their stores had landed (a failed store
// forward, the hottest instruction of the profile); inlined, they stay in registers.
#[inline(always)]
pub fn event_ref<'s>(config: &NexmarkConfig, index: u64, scratch: &'s mut Scratch) -> EventRef<'s> {
    let draws = Draws { seed: config.seed, index };
    let date_time = event_time(config, index);
    match kind(index) {
        EventKind::Person => EventRef::Person(person(config, draws, date_time, scratch)),
        EventKind::Auction => EventRef::Auction(auction(config, draws, date_time, &mut scratch.extra)),
        EventKind::Bid => EventRef::Bid(bid(config, draws, date_time, scratch)),
    }
}

fn person<'s>(config: &NexmarkConfig, draws: Draws, date_time: i64, scratch: &'s mut Scratch) -> PersonRef<'s> {
    let Scratch { name, email, card, extra: padding, .. } = scratch;
    // Appended piece by piece rather than with `write!`: formatting machinery cost more than
    // the rest of a person.
    name.clear();
    name.push_str(FIRST_NAMES[draws.below(Salt::FirstName, FIRST_NAMES.len() as u64) as usize]);
    name.push(' ');
    name.push_str(LAST_NAMES[draws.below(Salt::LastName, LAST_NAMES.len() as u64) as usize]);
    email.clear();
    email.push_str(words(draws.hash(Salt::EmailUser), 7));
    email.push('@');
    email.push_str(words(draws.hash(Salt::EmailHost), 5));
    email.push_str(".com");
    // Four groups of four digits from one hash: 10^16 is far below 2^64, so the bias is tiny.
    let digits = draws.hash(Salt::CreditCard) % 10_000_000_000_000_000;
    card.clear();
    for group in [digits / 1_000_000_000_000, digits / 100_000_000, digits / 10_000, digits] {
        if !card.is_empty() {
            card.push(' ');
        }
        let group = (group % 10_000) as usize;
        card.push_str(&DIGIT_PAIRS[2 * (group / 100)..][..2]);
        card.push_str(&DIGIT_PAIRS[2 * (group % 100)..][..2]);
    }
    let city = US_CITIES[draws.below(Salt::City, US_CITIES.len() as u64) as usize];
    let state = US_STATES[draws.below(Salt::State, US_STATES.len() as u64) as usize];
    let size = 16 + name.len() + email.len() + card.len() + city.len() + state.len();
    let extra = extra(draws, size, config.avg_person_bytes, padding);
    PersonRef {
        id: FIRST_PERSON_ID + persons_before(draws.index),
        name,
        email_address: email,
        credit_card: card,
        city,
        state,
        date_time,
        extra,
    }
}

fn auction<'s>(config: &NexmarkConfig, draws: Draws, date_time: i64, padding: &'s mut String) -> AuctionRef<'s> {
    // Event 0 is a person, so an auction always has one before it.
    let last_person = persons_before(draws.index).saturating_sub(1);
    let seller = select_unpredictable(
        draws.hot(Salt::HotSeller, config.hot_seller_ratio),
        last_person / HOT_GROUP * HOT_GROUP,
        active_person(config, draws, Salt::Seller, last_person),
    );
    let item_name = words(draws.hash(Salt::ItemName), 20);
    let description = words(draws.hash(Salt::Description), 100);
    let initial_bid = price(draws.hash(Salt::InitialBid));
    let length = 1 + draws.below(Salt::Expires, auction_lengths(config));
    let size = 56 + item_name.len() + description.len();
    let extra = extra(draws, size, config.avg_auction_bytes, padding);
    AuctionRef {
        id: FIRST_AUCTION_ID + auctions_before(draws.index),
        item_name,
        description,
        initial_bid,
        reserve: initial_bid.saturating_add(price(draws.hash(Salt::Reserve))),
        date_time,
        expires: clamp_i64(i128::from(date_time) + i128::from(length)),
        seller: FIRST_PERSON_ID + seller,
        category: FIRST_CATEGORY_ID + draws.below(Salt::Category, config.num_categories.max(1)),
        extra,
    }
}

#[inline(always)]
fn bid<'s>(config: &NexmarkConfig, draws: Draws, date_time: i64, scratch: &'s mut Scratch) -> BidRef<'s> {
    let Scratch { extra: padding, channels, .. } = scratch;
    // The channel first: its text is often a cache miss, which the draws below then overlap.
    // Hot or not is a coin toss, so each choice here computes both sides and selects one
    // instead of branching (a mispredicted branch costs more than the draw it would skip).
    let hash = draws.hash(Salt::Channel);
    let hot = draws.hot(Salt::HotChannel, HOT_CHANNEL_RATIO);
    let channel =
        select_unpredictable(hot, COLD_CHANNELS + below(hash, HOT_CHANNELS.len() as u64), below(hash, COLD_CHANNELS));
    let (channel, url) = channels.get(config.seed, channel);
    // Events 1..=3 are auctions, so a bid always has three before it.
    let last_auction = auctions_before(draws.index).saturating_sub(1);
    let oldest = (last_auction + 1).saturating_sub(config.num_in_flight_auctions.max(1));
    let auction = select_unpredictable(
        draws.hot(Salt::HotAuction, config.hot_auction_ratio),
        last_auction / HOT_GROUP * HOT_GROUP,
        oldest + draws.below(Salt::Auction, last_auction - oldest + 1),
    );
    let last_person = persons_before(draws.index).saturating_sub(1);
    let bidder = select_unpredictable(
        draws.hot(Salt::HotBidder, config.hot_bidder_ratio),
        // The second of the group, so that the hot bidder is not the hot seller (unless the
        // group has only one person yet).
        (last_person / HOT_GROUP * HOT_GROUP + 1).min(last_person),
        active_person(config, draws, Salt::Bidder, last_person),
    );
    let size = 32 + channel.len() + url.len();
    let extra = extra(draws, size, config.avg_bid_bytes, padding);
    BidRef {
        auction: FIRST_AUCTION_ID + auction,
        bidder: FIRST_PERSON_ID + bidder,
        price: price(draws.hash(Salt::Price)),
        channel,
        url,
        date_time,
        extra,
    }
}

/// How many auction lengths (in ms) there are: twice the time it takes to create
/// `num_in_flight_auctions` more auctions, so that roughly that many are open at any time.
#[inline(always)]
fn auction_lengths(config: &NexmarkConfig) -> u64 {
    // In 64 bits when nothing overflows (the same value then): 128-bit divisions are calls
    // into the runtime library, two per auction.
    let fast = (config.num_in_flight_auctions.max(1).checked_mul(TOTAL_PROPORTION))
        .and_then(|events| (events / AUCTION_PROPORTION).checked_mul(config.inter_event_us))
        .and_then(|us| (us / 1000).checked_mul(2));
    match fast {
        Some(lengths) => lengths.max(1),
        None => auction_lengths_wide(config),
    }
}

#[cold]
fn auction_lengths_wide(config: &NexmarkConfig) -> u64 {
    let horizon_events = u128::from(config.num_in_flight_auctions.max(1)) * u128::from(TOTAL_PROPORTION)
        / u128::from(AUCTION_PROPORTION);
    let horizon_ms = horizon_events.saturating_mul(u128::from(config.inter_event_us)) / 1000;
    u64::try_from(horizon_ms * 2).unwrap_or(u64::MAX - 1).max(1)
}

/// Each channel's name and URL, a function of the seed and the channel only. Channels
/// `0..COLD_CHANNELS` are `channel-<n>` (URL ending `&channel_id=<n>`), the rest hot.
///
/// The hot channels' texts are kept whole. For a cold channel only its URL's three path pieces
/// are kept (where each starts in [`URL_TEXT_PADDED`] and how long it is: 6 bytes a channel),
/// and its texts are rebuilt per bid in fixed buffers. The texts kept whole for all 10 000 took
/// 960 KB: a bid on a cold channel then missed the cache on one or two lines of them (a quarter
/// of the source's time in q0, whose guest evicts the table between batches); the pieces take
/// 60 KB, and rebuilding costs less than the misses did.
#[derive(Debug, Default)]
struct Channels {
    seed: u64,
    /// Per cold channel, its URL's pieces as `start << 3 | len`.
    pieces: Vec<[u16; 3]>,
    /// The hot channels' URLs.
    hot: Vec<String>,
    name: Buffer,
    url: Buffer,
}

const URL_PREFIX: &[u8; 24] = b"https://www.nexmark.com/";
/// What follows the last path piece of a cold channel's URL, padded to a fixed-size copy; a hot
/// channel's ends before `&`.
const URL_SUFFIX: &[u8; 32] = b"item.htm?query=1&channel_id=    ";
const HOT_URL_SUFFIX: usize = "item.htm?query=1".len();
const COLD_URL_SUFFIX: usize = "item.htm?query=1&channel_id=".len();
const COLD_NAME_PREFIX: &[u8; 8] = b"channel-";

impl Channels {
    #[inline(always)]
    fn get(&mut self, seed: u64, channel: u64) -> (&str, &str) {
        if self.seed != seed || self.pieces.is_empty() {
            self.reset(seed);
        }
        let Some(&cold) = self.pieces.get(channel as usize) else {
            let hot = (channel - COLD_CHANNELS) as usize;
            return (HOT_CHANNELS[hot], &self.hot[hot]);
        };
        let at = self.url.put_url(cold) + COLD_URL_SUFFIX;
        let (digits, count) = decimal(channel as u16);
        self.url.put(at, &digits);
        self.url.end_at(at + count);
        self.name.put(COLD_NAME_PREFIX.len(), &digits);
        self.name.end_at(COLD_NAME_PREFIX.len() + count);
        (self.name.text(), self.url.text())
    }

    #[cold]
    fn reset(&mut self, seed: u64) {
        self.seed = seed;
        self.pieces = (0..COLD_CHANNELS).map(|channel| url_pieces(seed, channel)).collect();
        self.url.put(0, URL_PREFIX);
        self.hot = (COLD_CHANNELS..COLD_CHANNELS + HOT_CHANNELS.len() as u64)
            .map(|channel| {
                let at = self.url.put_url(url_pieces(seed, channel));
                self.url.end_at(at + HOT_URL_SUFFIX);
                self.url.text().to_owned()
            })
            .collect();
        self.name.put(0, COLD_NAME_PREFIX);
    }
}

/// A text rebuilt in place: room for the longest (a cold URL is at most 24 + 3 * 6 + 28 + 4
/// bytes) and for the fixed-size copies that run past its end.
///
/// It holds only ASCII, so that it is read as `&str` without validating it per bid (which
/// cost more than the rebuild): it starts zeroed and [`Buffer::put`], its only writer, keeps
/// 7 bits of each byte.
#[derive(Debug)]
struct Buffer {
    bytes: [u8; 128],
    len: usize,
}

impl Default for Buffer {
    fn default() -> Self {
        Buffer { bytes: [0; 128], len: 0 }
    }
}

impl Buffer {
    /// Writes `src` at `at` as ASCII (each byte masked to 7 bits: a no-op on the ASCII it is
    /// given). A fixed size, so the copy is a few register moves instead of a `memcpy` call.
    #[inline(always)]
    fn put<const N: usize>(&mut self, at: usize, src: &[u8; N]) {
        if let Some(to) = self.bytes.get_mut(at..).and_then(<[u8]>::first_chunk_mut::<N>) {
            *to = src.map(|byte| byte & 0x7F);
        }
    }

    /// Writes a channel's URL after [`URL_PREFIX`] (which stays in place) up to its last path
    /// piece, then [`URL_SUFFIX`]; returns where the suffix starts.
    #[inline(always)]
    fn put_url(&mut self, pieces: [u16; 3]) -> usize {
        let mut at = URL_PREFIX.len();
        for piece in pieces {
            let start = usize::from(piece >> 3);
            // A fixed 8-byte copy (the text is padded), then only the piece's length counts.
            self.put(at, URL_TEXT_PADDED[start..].first_chunk::<8>().unwrap_or(&[b'_'; 8]));
            at += usize::from(piece & 7);
            self.put(at, b"/");
            at += 1;
        }
        self.put(at, URL_SUFFIX);
        at
    }

    /// The first `len` bytes are the text.
    #[inline(always)]
    fn end_at(&mut self, len: usize) {
        self.len = len.min(self.bytes.len());
    }

    #[inline(always)]
    fn text(&self) -> &str {
        // SAFETY: every byte of `bytes` is below 0x80 (zeroed at construction, written only by
        // `put`, which masks), so any prefix of them is ASCII and hence UTF-8.
        unsafe { std::str::from_utf8_unchecked(&self.bytes[..self.len]) }
    }
}

/// The three path pieces of a channel's page `https://www.nexmark.com/<a>/<b>/<c>/item.htm?query=1`
/// (`start << 3 | len` in [`URL_TEXT_PADDED`]), a function of `(seed, channel)` only.
fn url_pieces(seed: u64, channel: u64) -> [u16; 3] {
    let draws = Draws { seed, index: channel };
    [Salt::UrlA, Salt::UrlB, Salt::UrlC].map(|salt| {
        let hash = draws.hash(salt);
        let len = 3 + below(hash, 3) as usize;
        let start = text_start(hash, len);
        // TEXT_LEN is 2^13 and a piece at most 5 long: both fit 16 bits.
        (start << 3 | len) as u16
    })
}

/// `n` (below 10 000) in decimal: its digits first in the array, and how many there are.
#[inline(always)]
fn decimal(n: u16) -> ([u8; 4], usize) {
    let pair = |p: u16| &DIGIT_PAIR_BYTES[2 * usize::from(p)..][..2];
    let mut padded = [0u8; 4];
    padded[..2].copy_from_slice(pair(n / 100));
    padded[2..].copy_from_slice(pair(n % 100));
    let count = 1 + usize::from(n >= 10) + usize::from(n >= 100) + usize::from(n >= 1000);
    // Little-endian: shifting right drops the leading zeros from the front.
    let digits = (u32::from_le_bytes(padded) >> (8 * (4 - count))).to_le_bytes();
    (digits, count)
}

/// A person (base 0) among the `num_active_people` most recent ones up to `last_person`:
/// limiting to active people keeps the bids and auctions per person steady in long runs.
#[inline(always)]
fn active_person(config: &NexmarkConfig, draws: Draws, salt: Salt, last_person: u64) -> u64 {
    let people = last_person + 1;
    let active = people.min(config.num_active_people.max(1));
    people - active + draws.below(salt, active)
}

/// A price in cents, log-spread from $1 to $1M: a decade drawn uniformly, then a uniform
/// value inside it (integer arithmetic only, so identical on every platform).
#[inline(always)]
fn price(hash: u64) -> u64 {
    const LOW: [u64; 6] = [100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];
    // The remainder by the decade's width without a division: a 64-bit `div` (and the power
    // of ten before it) were a fifth of the generator's time, and a bid has a price.
    const WIDTH: [Divisor; 6] = {
        let mut width = [Divisor::new(1); 6];
        let mut d = 0;
        while d < 6 {
            width[d] = Divisor::new(9 * LOW[d]);
            d += 1;
        }
        width
    };
    // The decade comes from the high bits, the value inside it from the low bits.
    let decade = below(hash, 6) as usize;
    LOW[decade] + WIDTH[decade].rem(hash)
}

/// Text of 3 to `max - 1` characters (letters and spaces), trimmed, like Nexmark's strings.
#[inline(always)]
fn words(hash: u64, max: u64) -> &'static str {
    let len = 3 + below(hash, max.saturating_sub(3).max(1)) as usize;
    let start = text_start(hash, len);
    // The text's only whitespace is ASCII spaces: the same as `trim`, without its call.
    TEXT[start..start + len].trim_ascii()
}

/// Where a text of `len` bytes (at most `TEXT_LEN`) drawn from `hash` starts in [`TEXT`]:
/// `hash % (TEXT_LEN - len + 1)`, by a table of [`Divisor`]s for the lengths in use (under
/// 128): a 64-bit division takes tens of cycles, and an auction has two texts.
#[inline(always)]
fn text_start(hash: u64, len: usize) -> usize {
    const SHORT: usize = 128;
    const DIVISORS: [Divisor; SHORT] = {
        let mut divisors = [Divisor::new(1); SHORT];
        let mut len = 0;
        while len < SHORT {
            divisors[len] = Divisor::new((TEXT_LEN - len + 1) as u64);
            len += 1;
        }
        divisors
    };
    match DIVISORS.get(len) {
        Some(divisor) => divisor.rem(hash) as usize,
        None => (hash % (TEXT_LEN - len + 1) as u64) as usize,
    }
}

/// Padding so that events of this kind are `avg` bytes on average: `avg - size` ± 20 %. A
/// slice of the text, or for a padding that wraps around the text, written over `out`.
#[inline(always)]
fn extra(draws: Draws, size: usize, avg: u64, out: &mut String) -> &str {
    let want = avg.saturating_sub(size as u64);
    let delta = (want + 2) / 5;
    let hash = draws.hash(Salt::Extra);
    let len = (want - delta + below(hash, 2 * delta + 1)) as usize;
    // A power of two: a mask (this was a 64-bit division per event while `TEXT` was a
    // static, whose length the compiler does not know).
    let start = (hash % TEXT_LEN as u64) as usize;
    match TEXT.get(start..start + len) {
        Some(slice) => slice,
        None => wrapped_text(start, len, out),
    }
}

/// `len` bytes of the text from `start` on, going round it as often as needed.
#[cold]
fn wrapped_text(mut start: usize, len: usize, out: &mut String) -> &str {
    out.clear();
    while out.len() < len {
        let take = (len - out.len()).min(TEXT.len() - start);
        out.push_str(&TEXT[start..start + take]);
        start = 0;
    }
    out
}

/// `00`, `01`, .. `99`: two digits at a time without formatting.
const DIGIT_PAIRS: &str = match std::str::from_utf8(&DIGIT_PAIR_BYTES) {
    Ok(pairs) => pairs,
    Err(_) => panic!("digits are ASCII"),
};

const DIGIT_PAIR_BYTES: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        pairs[2 * i] = b'0' + (i / 10) as u8;
        pairs[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    pairs
};

/// A divisor with its reciprocal, for `a % d` by multiplications (Lemire, Kaser and Kurz,
/// "Faster remainder by direct computation", 2019): with a 128-bit reciprocal
/// `ceil(2^128 / d)` the result is exact for every 64-bit `a` and every `d >= 2`.
#[derive(Debug, Clone, Copy)]
struct Divisor {
    reciprocal: u128,
    d: u64,
}

impl Divisor {
    /// `d >= 2` (for `d == 1`, `rem` gives 0 as well, by wrapping to a zero reciprocal).
    const fn new(d: u64) -> Divisor {
        Divisor { reciprocal: (u128::MAX / d as u128).wrapping_add(1), d }
    }

    /// `a % d`.
    #[inline(always)]
    fn rem(self, a: u64) -> u64 {
        // The fraction `a / d` in 128 bits, times `d`: the integer part is the remainder.
        let fraction = self.reciprocal.wrapping_mul(u128::from(a));
        let d = u128::from(self.d);
        let high = (fraction >> 64) * d + ((fraction as u64 as u128 * d) >> 64);
        (high >> 64) as u64
    }
}

fn clamp_i64(value: i128) -> i64 {
    value.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Maps a uniform 64-bit hash to `0..n` (`n >= 1`) by multiply-high: no division, bias at most
/// `n / 2^64`, and it uses the high bits, leaving the low bits for a second choice.
#[inline(always)]
fn below(hash: u64, n: u64) -> u64 {
    ((u128::from(hash) * u128::from(n)) >> 64) as u64
}

/// One independent draw per quantity of an event: the salt in the hashed input.
#[derive(Debug, Clone, Copy)]
enum Salt {
    Disorder = 1,
    FirstName,
    LastName,
    EmailUser,
    EmailHost,
    CreditCard,
    City,
    State,
    HotSeller,
    Seller,
    ItemName,
    Description,
    InitialBid,
    Reserve,
    Expires,
    Category,
    HotAuction,
    Auction,
    HotBidder,
    Bidder,
    HotChannel,
    Channel,
    Price,
    Extra,
    UrlA,
    UrlB,
    UrlC,
}

/// The random choices of one event (or of one channel's URL).
#[derive(Debug, Clone, Copy)]
struct Draws {
    seed: u64,
    index: u64,
}

impl Draws {
    /// xxh3 of `(index, salt)` seeded with `seed`: a fixed algorithm, so events are the same
    /// across builds and machines.
    #[inline(always)]
    fn hash(self, salt: Salt) -> u64 {
        let mut input = [0u8; 16];
        input[..8].copy_from_slice(&self.index.to_le_bytes());
        input[8..].copy_from_slice(&(salt as u64).to_le_bytes());
        xxh3_64_with_seed(&input, self.seed)
    }

    /// Uniform in `0..n`; `n == 0` is treated as 1.
    #[inline(always)]
    fn below(self, salt: Salt, n: u64) -> u64 {
        below(self.hash(salt), n.max(1))
    }

    /// True with probability `1 - 1/ratio` (never for ratio 0 or 1).
    #[inline(always)]
    fn hot(self, salt: Salt, ratio: u64) -> bool {
        self.below(salt, ratio) > 0
    }
}

/// Random letters with one space in 13 (as in Nexmark's strings), made at compile time.
/// Strings are slices of it: generating per character would dominate the generator's cost.
/// A constant rather than a static so that its address and length are known when compiling.
const TEXT: &str = match std::str::from_utf8(&TEXT_BYTES) {
    Ok(text) => text,
    Err(_) => panic!("the text is ASCII"),
};

/// [`TEXT`] with `_` for each space (the pieces of channels' URLs are slices of it), and 8
/// bytes more, so that a piece is copied in one fixed-size block.
const URL_TEXT_PADDED: [u8; TEXT_LEN + 8] = {
    let mut text = [b'_'; TEXT_LEN + 8];
    let mut i = 0;
    while i < TEXT_LEN {
        if TEXT_BYTES[i] != b' ' {
            text[i] = TEXT_BYTES[i];
        }
        i += 1;
    }
    text
};

const TEXT_LEN: usize = 8192;
const TEXT_BYTES: [u8; TEXT_LEN] = random_text();

const fn random_text() -> [u8; TEXT_LEN] {
    let mut text = [0u8; TEXT_LEN];
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut i = 0;
    while i < TEXT_LEN {
        // splitmix64: any fixed sequence works; this one is well mixed and tiny.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        text[i] = if z.is_multiple_of(13) { b' ' } else { b'a' + ((z >> 32) % 26) as u8 };
        i += 1;
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::model::Bid;
    use crate::to_json;

    fn config(seed: u64) -> NexmarkConfig {
        NexmarkConfig { seed, ..NexmarkConfig::default() }
    }

    /// Events as sorted JSON texts: a multiset that ignores the order of generation.
    fn multiset(events: impl IntoIterator<Item = Event>) -> Vec<Vec<u8>> {
        let mut texts: Vec<Vec<u8>> = events.into_iter().map(|e| to_json(&e)).collect();
        texts.sort();
        texts
    }

    #[test]
    fn same_seed_same_events_other_seed_other_events() {
        let a: Vec<Event> = (0..2000).map(|i| event(&config(42), i)).collect();
        // Backwards: no hidden state carried from one event to the next.
        let mut b: Vec<Event> = (0..2000).rev().map(|i| event(&config(42), i)).collect();
        b.reverse();
        assert_eq!(a, b);
        let c: Vec<Event> = (0..2000).map(|i| event(&config(43), i)).collect();
        let differing = a.iter().zip(&c).filter(|(x, y)| x != y).count();
        assert!(differing > 1900, "only {differing} of 2000 events depend on the seed");
    }

    proptest! {
        /// Any assignment of the indices to 1 to 4 readers, each generating its share in any
        /// order, yields the same multiset of events as one reader going through them in order.
        #[test]
        fn any_partition_of_the_indices_yields_the_same_events(
            seed in any::<u64>(),
            start in 0u64..1_000_000,
            readers in 1usize..=4,
            picks in prop::collection::vec(any::<usize>(), 0..300),
            max_disorder_ms in 0i64..1000,
        ) {
            let config = NexmarkConfig { seed, max_disorder_ms, ..NexmarkConfig::default() };
            let indices = start..start + picks.len() as u64;
            let sequential = multiset(indices.clone().map(|i| event(&config, i)));
            let mut shares = vec![Vec::new(); readers];
            for (i, pick) in indices.clone().zip(&picks) {
                shares[pick % readers].push(i);
            }
            let mut union = Vec::new();
            for (r, share) in shares.iter().enumerate() {
                // Every other reader goes backwards.
                let order: Box<dyn Iterator<Item = &u64>> =
                    if r % 2 == 0 { Box::new(share.iter()) } else { Box::new(share.iter().rev()) };
                union.extend(order.map(|&i| event(&config, i)));
            }
            prop_assert_eq!(multiset(union), sequential.clone());
            // The engine's split: reader j of p takes the indices i with i % p == j.
            let residues = (0..readers as u64)
                .flat_map(|j| indices.clone().filter(move |i| i % readers as u64 == j))
                .map(|i| event(&config, i));
            prop_assert_eq!(multiset(residues), sequential);
        }
    }

    #[test]
    fn proportions_are_1_3_46_per_50() {
        let config = config(1);
        for block in [0u64, 1, 7, 1_000_000] {
            let mut counts = BTreeMap::new();
            for i in block * 50..(block + 1) * 50 {
                let e = event(&config, i);
                let name = match (&e, kind(i)) {
                    (Event::Person(_), EventKind::Person) => "person",
                    (Event::Auction(_), EventKind::Auction) => "auction",
                    (Event::Bid(_), EventKind::Bid) => "bid",
                    (e, k) => panic!("event {i} is {e:?} but kind says {k:?}"),
                };
                *counts.entry(name).or_insert(0) += 1;
            }
            assert_eq!(counts, BTreeMap::from([("person", 1), ("auction", 3), ("bid", 46)]), "block {block}");
        }
        assert_eq!((kind(0), kind(1), kind(3), kind(4), kind(49), kind(50)).0, EventKind::Person);
        assert_eq!([kind(1), kind(3), kind(53)], [EventKind::Auction; 3]);
        assert_eq!([kind(4), kind(49), kind(54)], [EventKind::Bid; 3]);
    }

    /// Walks the events in order, checking ids are consecutive and every reference points at
    /// an earlier event (in flight, for auctions).
    fn check_references(config: &NexmarkConfig, events: u64) {
        let (mut persons, mut auctions) = (HashSet::new(), Vec::new());
        for i in 0..events {
            match event(config, i) {
                Event::Person(p) => {
                    assert_eq!(p.id, FIRST_PERSON_ID + persons.len() as u64, "event {i}");
                    assert_eq!(p.id, FIRST_PERSON_ID + persons_before(i));
                    assert!(US_STATES.contains(&p.state.as_str()), "event {i}: state {}", p.state);
                    assert!(US_CITIES.contains(&p.city.as_str()), "event {i}: city {}", p.city);
                    let cc: Vec<&str> = p.credit_card.split(' ').collect();
                    assert!(cc.len() == 4 && cc.iter().all(|g| g.len() == 4 && g.bytes().all(|b| b.is_ascii_digit())));
                    assert!(p.email_address.ends_with(".com") && p.email_address.contains('@'));
                    persons.insert(p.id);
                }
                Event::Auction(a) => {
                    assert_eq!(a.id, FIRST_AUCTION_ID + auctions.len() as u64, "event {i}");
                    assert_eq!(a.id, FIRST_AUCTION_ID + auctions_before(i));
                    assert!(persons.contains(&a.seller), "event {i}: seller {} not yet created", a.seller);
                    let categories = FIRST_CATEGORY_ID..FIRST_CATEGORY_ID + config.num_categories;
                    assert!(categories.contains(&a.category), "event {i}: category {}", a.category);
                    assert!(a.expires > a.date_time, "event {i}: expires {} <= {}", a.expires, a.date_time);
                    assert!(a.initial_bid >= 100 && a.reserve > a.initial_bid, "event {i}: {a:?}");
                    assert!(!a.item_name.is_empty() && a.item_name.len() < 20 && a.description.len() < 100);
                    auctions.push(a.id);
                }
                Event::Bid(b) => {
                    assert!(persons.contains(&b.bidder), "event {i}: bidder {} not yet created", b.bidder);
                    let last = *auctions.last().expect("auctions precede bids");
                    let in_flight = last + 1 - auctions.len().min(config.num_in_flight_auctions as usize) as u64;
                    let hot = (last - FIRST_AUCTION_ID) / 100 * 100 + FIRST_AUCTION_ID;
                    assert!(b.auction >= in_flight.min(hot) && b.auction <= last, "event {i}: auction {}", b.auction);
                    assert!((100..100_000_000).contains(&b.price), "event {i}: price {}", b.price);
                    assert!(b.url.starts_with("https://www.nexmark.com/"), "event {i}: {}", b.url);
                }
            }
        }
    }

    #[test]
    fn ids_and_references_point_at_earlier_events() {
        check_references(&config(3), 60_000);
        // Few active people, few auctions in flight, no hot entities: the edges of the ranges.
        let narrow = NexmarkConfig {
            num_active_people: 2,
            num_in_flight_auctions: 1,
            num_categories: 1,
            hot_auction_ratio: 1,
            hot_bidder_ratio: 1,
            hot_seller_ratio: 1,
            ..config(4)
        };
        check_references(&narrow, 5_000);
        // Validation rejects zeros, but the generator still keeps its promises with them.
        let zeros = NexmarkConfig {
            num_active_people: 0,
            num_in_flight_auctions: 0,
            num_categories: 0,
            hot_auction_ratio: 0,
            ..config(5)
        };
        check_references(&NexmarkConfig { num_categories: 1, ..zeros }, 2_000);
    }

    #[test]
    fn event_times_follow_the_index_with_bounded_disorder() {
        let ordered = config(8);
        let times: Vec<i64> = (0..5000).map(|i| event(&ordered, i).date_time()).collect();
        assert_eq!(times[0], 1_700_000_000_000);
        assert_eq!(times[10], 1_700_000_000_001, "100 µs apart: 10 events per ms");
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "without disorder, times never go back");

        let disordered = NexmarkConfig { max_disorder_ms: 250, inter_event_us: 1000, ..config(8) };
        let mut seen = HashSet::new();
        for i in 0..20_000u64 {
            let base = 1_700_000_000_000 + i as i64;
            let t = event(&disordered, i).date_time();
            assert_eq!(t, event_time(&disordered, i));
            assert!((base - 250..=base).contains(&t), "event {i}: {t} vs {base}");
            seen.insert(base - t);
        }
        assert_eq!(seen.len(), 251, "every disorder 0..=250 occurs");
        let extreme = NexmarkConfig { first_event_time_ms: i64::MAX - 1, inter_event_us: u64::MAX, ..config(0) };
        assert_eq!(event(&extreme, u64::MAX).date_time(), i64::MAX);
        // The last 50 indices (every kind) under extreme settings: no overflow anywhere.
        let extreme = NexmarkConfig { max_disorder_ms: i64::MAX, avg_auction_bytes: 0, ..extreme };
        for i in u64::MAX - 49..=u64::MAX {
            if let Event::Auction(a) = event(&extreme, i) {
                assert!(a.expires >= a.date_time);
            }
        }
    }

    #[test]
    fn hot_ratios_shape_the_references() {
        let share = |config: &NexmarkConfig, pick: &dyn Fn(u64, &Bid) -> bool| {
            let bids: Vec<(u64, Bid)> = (0..50_000)
                .filter_map(|i| match event(config, i) {
                    Event::Bid(b) => Some((i, b)),
                    _ => None,
                })
                .collect();
            bids.iter().filter(|(i, b)| pick(*i, b)).count() as f64 / bids.len() as f64
        };
        let hot_auction = |i: u64, b: &Bid| b.auction == FIRST_AUCTION_ID + (auctions_before(i) - 1) / 100 * 100;
        let hot_bidder = |i: u64, b: &Bid| {
            b.bidder == FIRST_PERSON_ID + ((persons_before(i) - 1) / 100 * 100 + 1).min(persons_before(i) - 1)
        };
        // Hot with probability 1 - 1/ratio, plus the rare cold draw that lands on the hot one.
        let on_hot = share(&config(9), &hot_auction);
        assert!((0.48..0.56).contains(&on_hot), "{on_hot} of bids on the hot auction, ratio 2");
        let by_hot = share(&config(9), &hot_bidder);
        assert!((0.73..0.78).contains(&by_hot), "{by_hot} of bids by the hot bidder, ratio 4");
        let no_hot = NexmarkConfig { hot_auction_ratio: 1, hot_bidder_ratio: 1, ..config(9) };
        assert!(share(&no_hot, &hot_auction) < 0.05 && share(&no_hot, &hot_bidder) < 0.05);

        let sellers: Vec<(u64, u64)> = (0..50_000)
            .filter_map(|i| match event(&config(9), i) {
                Event::Auction(a) => Some((i, a.seller)),
                _ => None,
            })
            .collect();
        let hot = sellers.iter().filter(|(i, s)| *s == FIRST_PERSON_ID + (persons_before(*i) - 1) / 100 * 100).count();
        let by_hot = hot as f64 / sellers.len() as f64;
        assert!((0.72..0.79).contains(&by_hot), "{by_hot} of auctions by the hot seller, ratio 4");
    }

    #[test]
    fn prices_spread_over_six_decades() {
        let mut decades = [0u32; 6];
        for i in 0..30_000 {
            if let Event::Bid(b) = event(&config(10), i) {
                decades[(b.price.ilog10() - 2) as usize] += 1;
            }
        }
        let total: u32 = decades.iter().sum();
        for (d, n) in decades.iter().enumerate() {
            let share = f64::from(*n) / f64::from(total);
            assert!((0.14..0.19).contains(&share), "decade {d}: {share} of prices ({decades:?})");
        }
    }

    #[test]
    fn extra_pads_events_to_their_average_size() {
        let config = config(11);
        let (mut person_bytes, mut persons, mut auction_bytes, mut auctions) = (0, 0, 0, 0);
        for i in 0..20_000 {
            match event(&config, i) {
                Event::Person(p) => {
                    person_bytes += 16
                        + p.name.len()
                        + p.email_address.len()
                        + p.credit_card.len()
                        + p.city.len()
                        + p.state.len()
                        + p.extra.len();
                    persons += 1;
                }
                Event::Auction(a) => {
                    auction_bytes += 56 + a.item_name.len() + a.description.len() + a.extra.len();
                    auctions += 1;
                }
                Event::Bid(_) => {}
            }
        }
        let (person_avg, auction_avg) = (person_bytes as f64 / persons as f64, auction_bytes as f64 / auctions as f64);
        assert!((195.0..205.0).contains(&person_avg), "persons average {person_avg} bytes");
        assert!((490.0..510.0).contains(&auction_avg), "auctions average {auction_avg} bytes");
        let huge = NexmarkConfig { avg_bid_bytes: 100_000, ..config };
        let Event::Bid(b) = event(&huge, 4) else { panic!("event 4 is a bid") };
        assert!((70_000..130_000).contains(&b.extra.len()), "extra of {} bytes", b.extra.len());
    }

    #[test]
    fn decimal_digits_are_those_formatting_gives() {
        for n in 0..10_000u16 {
            let (digits, count) = decimal(n);
            assert_eq!(&digits[..count], n.to_string().as_bytes(), "{n}");
        }
    }

    #[test]
    fn channels_keep_their_urls() {
        let mut urls = BTreeMap::new();
        for i in 0..20_000 {
            if let Event::Bid(b) = event(&config(12), i) {
                let known = urls.entry(b.channel.clone()).or_insert_with(|| b.url.clone());
                assert_eq!(known, &b.url, "channel {}", b.channel);
                if let Some(n) = b.channel.strip_prefix("channel-") {
                    assert!(b.url.ends_with(&format!("&channel_id={n}")), "{}", b.url);
                }
            }
        }
        for hot in HOT_CHANNELS {
            assert!(urls.contains_key(hot), "hot channel {hot} never used");
        }
    }

    #[test]
    fn events_iterates_the_configured_count() {
        let bounded = NexmarkConfig { events: Some(120), ..config(13) };
        let all: Vec<Event> = events(&bounded).collect();
        assert_eq!(all.len(), 120);
        assert_eq!(all[77], event(&bounded, 77));
        assert_eq!(events(&config(13)).take(3).count(), 3);
    }

    #[test]
    fn validation_names_the_field() {
        assert_eq!(NexmarkConfig::default().validate(), Ok(()));
        let cases = [
            (NexmarkConfig { max_disorder_ms: -1, ..config(0) }, "max_disorder_ms"),
            (NexmarkConfig { hot_auction_ratio: 0, ..config(0) }, "hot_auction_ratio"),
            (NexmarkConfig { hot_bidder_ratio: 0, ..config(0) }, "hot_bidder_ratio"),
            (NexmarkConfig { hot_seller_ratio: 0, ..config(0) }, "hot_seller_ratio"),
            (NexmarkConfig { num_active_people: 0, ..config(0) }, "num_active_people"),
            (NexmarkConfig { num_in_flight_auctions: 0, ..config(0) }, "num_in_flight_auctions"),
            (NexmarkConfig { num_categories: 0, ..config(0) }, "num_categories"),
        ];
        for (config, field) in cases {
            let err = config.validate().unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
        }
    }

    /// Chains an xxh3 of each event's row (`write_row`) over `indices`.
    fn rows_checksum(config: &NexmarkConfig, indices: impl Iterator<Item = u64>) -> u64 {
        let (mut scratch, mut row, mut sum) = (Scratch::default(), Vec::new(), 0u64);
        for i in indices {
            row.clear();
            crate::write_row(&event_ref(config, i, &mut scratch), &mut row);
            sum = xxh3_64_with_seed(&row, sum);
        }
        sum
    }

    /// The events are fixed: a Java port of this generator fed Flink, and published figures
    /// compare checksums, so a faster generator must make the same bytes. The expected values
    /// were printed by this checksum run on the generator of commit b20fac3 (before it was made
    /// faster; `extreme` and `early` were added later, computed with that same code checked
    /// out), i.e. they are that code's output, not derived from the current code.
    #[test]
    fn rows_are_those_of_the_reference_generator() {
        let wide = NexmarkConfig {
            seed: 0xDEAD_BEEF,
            max_disorder_ms: 700,
            inter_event_us: 37,
            num_active_people: 3,
            num_in_flight_auctions: 1000,
            num_categories: 13,
            hot_seller_ratio: 1,
            // Paddings past the end of the text wrap around it.
            avg_person_bytes: 9000,
            avg_auction_bytes: 20,
            avg_bid_bytes: 300,
            ..config(0)
        };
        // Every slow path: 128-bit times and lengths, huge ratios and counts, both ends of the
        // index space.
        let extreme = NexmarkConfig {
            seed: u64::MAX,
            first_event_time_ms: i64::MAX - 1_000_000,
            inter_event_us: u64::MAX / 3,
            max_disorder_ms: i64::MAX,
            num_in_flight_auctions: u64::MAX / 7,
            num_active_people: u64::MAX,
            num_categories: u64::MAX,
            hot_auction_ratio: u64::MAX,
            hot_bidder_ratio: 3,
            hot_seller_ratio: 1_000_000,
            avg_person_bytes: 20_000,
            avg_auction_bytes: 0,
            avg_bid_bytes: 9_000,
            ..config(0)
        };
        let early = NexmarkConfig {
            first_event_time_ms: i64::MIN,
            inter_event_us: 1_000_000_007,
            max_disorder_ms: 1,
            ..config(0)
        };
        type Indices = Box<dyn Iterator<Item = u64>>;
        let cases: [(&str, NexmarkConfig, Indices, u64); 6] = [
            ("default", NexmarkConfig::default(), Box::new(0..400_000), 0x7ff1_3fb3_fcb5_a137),
            ("seed 42", config(42), Box::new(0..400_000), 0x38b6_1175_33b0_26c6),
            (
                "default, far",
                NexmarkConfig::default(),
                Box::new(1_000_000_000_000..1_000_000_050_000),
                0x1bcd_6a55_534e_9945,
            ),
            ("wide", wide, Box::new(0..100_000), 0x3b97_321e_5003_ba50),
            ("extreme", extreme, Box::new((0..2_000).chain(u64::MAX - 2_000..=u64::MAX)), 0xfdbd_0257_0ca4_c698),
            ("early", early, Box::new(0..20_000), 0xbecd_9f1f_89fb_ff91),
        ];
        for (name, config, indices, expected) in cases {
            let sum = rows_checksum(&config, indices);
            assert_eq!(sum, expected, "{name}: rows checksum {sum:#018x}");
        }
    }

    #[test]
    fn divisors_give_the_remainder() {
        let mut values = vec![0, 1, u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1];
        values.extend((0..20_000u64).map(|i| xxh3_64_with_seed(&i.to_le_bytes(), 99)));
        let mut divisors = vec![2, 3, 7, 900, 9_000, 90_000_000, 8_193, 8_190, 1 << 40, u64::MAX, u64::MAX - 1];
        divisors.extend((3..=TEXT_LEN as u64).step_by(97));
        for d in divisors {
            let divisor = Divisor::new(d);
            let edges = [d - 1, d, d.wrapping_add(1), d.wrapping_mul(d), u64::MAX / d * d, u64::MAX / d * d - 1];
            for &a in values.iter().chain(&edges) {
                assert_eq!(divisor.rem(a), a % d, "{a} % {d}");
            }
        }
        assert_eq!(Divisor::new(1).rem(12345), 0);
    }

    #[test]
    fn text_is_ascii_letters_and_spaces() {
        assert!(TEXT.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()));
        let spaces = TEXT.bytes().filter(|&b| b == b' ').count();
        assert!((500..780).contains(&spaces), "{spaces} spaces in {} bytes (about 1 in 13)", TEXT.len());
    }
}
