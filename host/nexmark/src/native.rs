//! The queries in plain Rust, without the engine: the "hardware limit" baselines that Eddy's
//! pipelines are measured against, and the oracles their output is checked with.
//!
//! Each query takes events in generation order (anything iterable over `Event` or `&Event`)
//! and hands its output rows to a [`Rows`]: `Vec<Value>` collects them as JSON objects (the
//! oracle), [`RowCount`] only counts them, so the benchmark's ceiling does not pay for JSON. It sees every event: there is no watermark, so
//! nothing is late, and disordered input gives the same answer as sorted input (except for the
//! order of the rows of q0 to q3, which follow the input).
//!
//! Windows are `[start, end)` in event time (`date_time`), aligned to the epoch
//! (`start = t - t.rem_euclid(size or slide)`), as in the engine's windows; a session is closed
//! by a gap longer than [`SESSION_GAP_MS`] (bids exactly a gap apart share a session, as the
//! engine merges touching session windows).

use std::borrow::Borrow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde_json::{Value, json};

use crate::model::{Bid, Event};

/// Size of the tumbling windows of q7 and q8 and of the sliding windows of q5.
pub const WINDOW_MS: i64 = 10_000;
/// Slide of q5's windows.
pub const HOT_ITEMS_SLIDE_MS: i64 = 2_000;
/// Inactivity that closes a q11 session.
pub const SESSION_GAP_MS: i64 = 10_000;
/// q1's dollar-to-euro rate, in thousandths.
pub const EURO_PER_THOUSAND_DOLLARS: u64 = 908;
/// q2 keeps the auctions whose id is a multiple of this.
pub const Q2_AUCTION_MODULUS: u64 = 123;
/// q3's auction category.
pub const Q3_CATEGORY: u64 = 10;
/// q3's seller states.
pub const Q3_STATES: [&str; 3] = ["OR", "ID", "CA"];

/// Where a query's rows go. A row is built only if the sink wants it.
pub trait Rows: Default {
    /// One output row, built by `make` on demand.
    fn row(&mut self, make: impl FnOnce() -> Value);
}

impl Rows for Vec<Value> {
    fn row(&mut self, make: impl FnOnce() -> Value) {
        self.push(make());
    }
}

/// Counts rows without building them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RowCount(pub usize);

impl Rows for RowCount {
    fn row(&mut self, _make: impl FnOnce() -> Value) {
        self.0 += 1;
    }
}

fn as_bid(event: &Event) -> Option<&Bid> {
    match event {
        Event::Bid(b) => Some(b),
        _ => None,
    }
}

fn window_start(time: i64, size: i64) -> i64 {
    time - time.rem_euclid(size)
}

/// q0, pass-through: `SELECT * FROM bid`. Every bid as its JSON object, `"type": "bid"`
/// included; rows in input order.
pub fn q0<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    let mut out = R::default();
    for event in events {
        let Some(b) = as_bid(event.borrow()) else { continue };
        out.row(|| {
            json!({
                "type": "bid", "auction": b.auction, "bidder": b.bidder, "price": b.price,
                "channel": b.channel, "url": b.url, "date_time": b.date_time, "extra": b.extra,
            })
        });
    }
    out
}

/// q1, currency conversion:
/// `SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid`, the price in integer
/// arithmetic (`price * 908 / 1000`, rounded down). Rows `{"auction", "bidder", "price",
/// "date_time"}` in input order.
pub fn q1<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    let mut out = R::default();
    for event in events {
        let Some(b) = as_bid(event.borrow()) else { continue };
        // Through u128: the product may exceed u64, the quotient never does.
        let euros = (u128::from(b.price) * u128::from(EURO_PER_THOUSAND_DOLLARS) / 1000) as u64;
        out.row(|| json!({"auction": b.auction, "bidder": b.bidder, "price": euros, "date_time": b.date_time}));
    }
    out
}

/// q2, selection: `SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0`. Rows
/// `{"auction", "price"}` in input order.
pub fn q2<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    let mut out = R::default();
    for event in events {
        let Some(b) = as_bid(event.borrow()).filter(|b| b.auction % Q2_AUCTION_MODULUS == 0) else { continue };
        out.row(|| json!({"auction": b.auction, "price": b.price}));
    }
    out
}

/// q3, local item suggestion:
/// `SELECT P.name, P.city, P.state, A.id FROM auction A, person P WHERE A.seller = P.id AND
/// P.state IN ('OR', 'ID', 'CA') AND A.category = 10`.
///
/// An incremental inner join keeping both sides, so it does not matter which side of a pair
/// comes first. Rows `{"name", "city", "state", "id"}` (`id` is the auction's) in the order the
/// join completes them (at the later event of each pair); compare as a multiset.
pub fn q3<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    // Qualifying persons by id (a Vec: the join must not assume ids are unique) and
    // qualifying auctions by seller.
    let mut persons: HashMap<u64, Vec<(String, String, String)>> = HashMap::new();
    let mut auctions: HashMap<u64, Vec<u64>> = HashMap::new();
    let row = |(name, city, state): &(String, String, String), id: u64| json!({"name": name, "city": city, "state": state, "id": id});
    let mut out = R::default();
    for event in events {
        match event.borrow() {
            Event::Person(p) if Q3_STATES.contains(&p.state.as_str()) => {
                let person = (p.name.clone(), p.city.clone(), p.state.clone());
                for &id in auctions.get(&p.id).into_iter().flatten() {
                    out.row(|| row(&person, id));
                }
                persons.entry(p.id).or_default().push(person);
            }
            Event::Auction(a) if a.category == Q3_CATEGORY => {
                for person in persons.get(&a.seller).into_iter().flatten() {
                    out.row(|| row(person, a.id));
                }
                auctions.entry(a.seller).or_default().push(a.id);
            }
            _ => {}
        }
    }
    out
}

/// q5, hot items: per sliding window of 10 s sliding by 2 s over bid time, the auctions with
/// the most bids.
///
/// ```sql
/// SELECT auction, num, window_end FROM (
///   SELECT auction, count(*) AS num, window_start, window_end
///   FROM HOP(bid, date_time, 2 s, 10 s) GROUP BY auction, window_start, window_end)
/// WHERE num >= ALL (the counts of every auction in the same window)
/// ```
///
/// Rows `{"window_end", "auction", "count"}`, every tied auction, sorted by
/// `(window_end, auction)`. Windows without bids have no rows.
pub fn q5<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    let mut counts: HashMap<(i64, u64), u64> = HashMap::new();
    for event in events {
        let Some(b) = as_bid(event.borrow()) else { continue };
        let last = window_start(b.date_time, HOT_ITEMS_SLIDE_MS);
        for k in 0..WINDOW_MS / HOT_ITEMS_SLIDE_MS {
            *counts.entry((last - k * HOT_ITEMS_SLIDE_MS, b.auction)).or_default() += 1;
        }
    }
    let mut hottest: BTreeMap<i64, (u64, Vec<u64>)> = BTreeMap::new();
    for ((start, auction), count) in counts {
        let (best, auctions) = hottest.entry(start).or_default();
        if count > *best {
            (*best, *auctions) = (count, vec![auction]);
        } else if count == *best {
            auctions.push(auction);
        }
    }
    let mut out = R::default();
    for (start, (count, mut auctions)) in hottest {
        auctions.sort_unstable();
        for auction in auctions {
            out.row(|| json!({"window_end": start + WINDOW_MS, "auction": auction, "count": count}));
        }
    }
    out
}

/// q7, highest bid: per tumbling 10 s window over bid time, the bid with the highest price.
///
/// ```sql
/// SELECT window_end, auction, bidder, price FROM (
///   SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start
///                                ORDER BY price DESC, auction, bidder) AS rank
///   FROM TUMBLE(bid, date_time, 10 s))
/// WHERE rank = 1
/// ```
///
/// One row `{"window_end", "auction", "bidder", "price"}` per window with bids (ties broken by
/// the smallest `(auction, bidder)`), sorted by `window_end`.
pub fn q7<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    let mut best: BTreeMap<i64, (u64, Reverse<u64>, Reverse<u64>)> = BTreeMap::new();
    for event in events {
        let Some(b) = as_bid(event.borrow()) else { continue };
        let candidate = (b.price, Reverse(b.auction), Reverse(b.bidder));
        best.entry(window_start(b.date_time, WINDOW_MS))
            .and_modify(|top| *top = (*top).max(candidate))
            .or_insert(candidate);
    }
    let mut out = R::default();
    for (start, (price, Reverse(auction), Reverse(bidder))) in best {
        out.row(|| json!({"window_end": start + WINDOW_MS, "auction": auction, "bidder": bidder, "price": price}));
    }
    out
}

/// q8, monitor new users: persons who created an auction (as its seller) in the tumbling 10 s
/// window in which they were created.
///
/// ```sql
/// SELECT P.id, P.name, P.window_start FROM
///   (SELECT id, name, window_start FROM TUMBLE(person, date_time, 10 s)
///    GROUP BY id, name, window_start) P
/// JOIN
///   (SELECT seller, window_start FROM TUMBLE(auction, date_time, 10 s)
///    GROUP BY seller, window_start) A
/// ON P.id = A.seller AND P.window_start = A.window_start
/// ```
///
/// Rows `{"id", "name", "window_start"}`, once per person and window however many auctions,
/// sorted by `(window_start, id, name)`.
pub fn q8<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    let mut persons: BTreeSet<(i64, u64, String)> = BTreeSet::new();
    let mut sellers: HashSet<(i64, u64)> = HashSet::new();
    for event in events {
        match event.borrow() {
            Event::Person(p) => {
                persons.insert((window_start(p.date_time, WINDOW_MS), p.id, p.name.clone()));
            }
            Event::Auction(a) => {
                sellers.insert((window_start(a.date_time, WINDOW_MS), a.seller));
            }
            Event::Bid(_) => {}
        }
    }
    let mut out = R::default();
    for (start, id, name) in persons.into_iter().filter(|(start, id, _)| sellers.contains(&(*start, *id))) {
        out.row(|| json!({"id": id, "name": name, "window_start": start}));
    }
    out
}

/// q11, user sessions: per bidder, the bids of each session window with a 10 s gap.
///
/// ```sql
/// SELECT bidder, count(*) AS bids, SESSION_START(date_time, 10 s) AS start,
///        SESSION_END(date_time, 10 s) AS end
/// FROM bid GROUP BY bidder, SESSION(date_time, 10 s)
/// ```
///
/// Rows `{"bidder", "bids", "start", "end"}` with `start` the first bid's time and `end` the
/// last bid's time plus the gap (the session window `[start, end)`), sorted by
/// `(bidder, start)`.
pub fn q11<I, R: Rows>(events: I) -> R
where
    I: IntoIterator,
    I::Item: Borrow<Event>,
{
    let mut times: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for event in events {
        let Some(b) = as_bid(event.borrow()) else { continue };
        times.entry(b.bidder).or_default().push(b.date_time);
    }
    let row = |bidder: u64, bids: u64, start: i64, last: i64| json!({"bidder": bidder, "bids": bids, "start": start, "end": last + SESSION_GAP_MS});
    let mut out = R::default();
    for (bidder, mut times) in times {
        times.sort_unstable();
        // (start, last, bids) of the open session; `times` is never empty.
        let mut session = (times[0], times[0], 0u64);
        for t in times {
            if t > session.1 + SESSION_GAP_MS {
                out.row(|| row(bidder, session.2, session.0, session.1));
                session = (t, t, 0);
            }
            session.1 = t;
            session.2 += 1;
        }
        out.row(|| row(bidder, session.2, session.0, session.1));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{Auction, Person};
    use crate::{NexmarkConfig, event, to_json};

    fn person(id: u64, name: &str, state: &str, t: i64) -> Event {
        Event::Person(Person {
            id,
            name: name.into(),
            email_address: "a@b.com".into(),
            credit_card: "0000 0000 0000 0000".into(),
            city: format!("city of {name}"),
            state: state.into(),
            date_time: t,
            extra: String::new(),
        })
    }

    fn auction(id: u64, seller: u64, category: u64, t: i64) -> Event {
        Event::Auction(Auction {
            id,
            item_name: "item".into(),
            description: "desc".into(),
            initial_bid: 100,
            reserve: 200,
            date_time: t,
            expires: t + 1000,
            seller,
            category,
            extra: String::new(),
        })
    }

    fn bid(auction: u64, bidder: u64, price: u64, t: i64) -> Event {
        Event::Bid(Bid {
            auction,
            bidder,
            price,
            channel: "Apple".into(),
            url: "https://www.nexmark.com/a/b/c/item.htm?query=1".into(),
            date_time: t,
            extra: "x".into(),
        })
    }

    #[test]
    fn q0_passes_every_bid_through() {
        let events = [person(1, "Ann", "OR", 0), bid(7, 1, 300, 5), auction(2, 1, 10, 6), bid(8, 1, 400, 7)];
        let expected: Vec<Value> =
            [&events[1], &events[3]].iter().map(|e| serde_json::from_slice(&to_json(e)).unwrap()).collect();
        assert_eq!(q0::<_, Vec<Value>>(&events), expected);
        assert_eq!(expected[0]["type"], "bid");
        // Owned events work the same.
        assert_eq!(q0::<_, Vec<Value>>(events.to_vec()), expected);
    }

    #[test]
    fn q1_converts_prices_rounding_down() {
        let events = [bid(7, 1, 1000, 5), person(1, "Ann", "OR", 0), bid(8, 2, 999, 6), bid(9, 3, u64::MAX, 7)];
        assert_eq!(
            q1::<_, Vec<Value>>(&events),
            [
                json!({"auction": 7, "bidder": 1, "price": 908, "date_time": 5}),
                json!({"auction": 8, "bidder": 2, "price": 907, "date_time": 6}),
                // 18446744073709551615 * 908 / 1000, computed without overflow.
                json!({"auction": 9, "bidder": 3, "price": 16_749_643_618_928_272_866u64, "date_time": 7}),
            ]
        );
    }

    #[test]
    fn q2_selects_auctions_divisible_by_123() {
        let events =
            [bid(246, 1, 10, 0), bid(247, 1, 11, 1), bid(0, 2, 12, 2), auction(123, 1, 10, 3), bid(123, 3, 13, 4)];
        assert_eq!(
            q2::<_, Vec<Value>>(&events),
            [
                json!({"auction": 246, "price": 10}),
                json!({"auction": 0, "price": 12}),
                json!({"auction": 123, "price": 13}),
            ]
        );
    }

    #[test]
    fn q3_joins_local_sellers_with_category_10_in_either_order() {
        let events = [
            person(1, "Ann", "OR", 0),
            person(2, "Bob", "WA", 1),
            person(3, "Cy", "CA", 2),
            auction(10, 1, 10, 3), // Ann, OR, category 10: a row
            auction(11, 2, 10, 4), // Bob lives in WA: none
            auction(12, 3, 11, 5), // category 11: none
            auction(13, 4, 10, 6), // seller 4 is not known yet ...
            bid(10, 2, 100, 7),
            person(4, "Di", "ID", 8), // ... and arrives now: a row
            auction(14, 1, 10, 9),    // Ann again: a row
        ];
        let row = |name: &str, state: &str, id: u64| json!({"name": name, "city": format!("city of {name}"), "state": state, "id": id});
        assert_eq!(q3::<_, Vec<Value>>(&events), [row("Ann", "OR", 10), row("Di", "ID", 13), row("Ann", "OR", 14)]);
    }

    #[test]
    fn q5_reports_every_auction_tied_for_most_bids_per_sliding_window() {
        // Windows [s, s + 10 s) with s a multiple of 2 s; a bid at t falls in the five with
        // t - 10 s < s <= t.
        let events = [
            bid(101, 1, 10, 1000), // windows starting -8 s .. 0 s
            person(1, "Ann", "OR", 2000),
            bid(101, 2, 10, 3000),   // -6 s .. 2 s
            bid(102, 1, 10, 3500),   // -6 s .. 2 s
            bid(102, 3, 10, 5000),   // -4 s .. 4 s
            bid(103, 1, 10, 11_000), // 2 s .. 10 s
        ];
        let row = |end: i64, auction: u64, count: u64| json!({"window_end": end, "auction": auction, "count": count});
        assert_eq!(
            q5::<_, Vec<Value>>(&events),
            [
                row(2000, 101, 1),
                row(4000, 101, 2),
                row(6000, 101, 2),
                row(6000, 102, 2),
                row(8000, 101, 2),
                row(8000, 102, 2),
                row(10_000, 101, 2),
                row(10_000, 102, 2),
                row(12_000, 102, 2),
                row(14_000, 102, 1),
                row(14_000, 103, 1),
                row(16_000, 103, 1),
                row(18_000, 103, 1),
                row(20_000, 103, 1),
            ]
        );
        // Input order does not matter.
        let mut reversed = events.to_vec();
        reversed.reverse();
        assert_eq!(q5::<_, Vec<Value>>(reversed), q5::<_, Vec<Value>>(&events));
    }

    #[test]
    fn q7_finds_the_highest_bid_per_tumbling_window() {
        let events = [
            bid(5, 1, 100, 1000),
            bid(3, 9, 300, 2000),
            bid(4, 2, 300, 9999),
            bid(3, 1, 300, 500), // tied on price with the two above: smallest (auction, bidder)
            bid(7, 7, 50, 10_000),
            bid(1, 1, 1, -1), // the window [-10 s, 0)
            auction(9, 1, 10, 3000),
        ];
        assert_eq!(
            q7::<_, Vec<Value>>(&events),
            [
                json!({"window_end": 0, "auction": 1, "bidder": 1, "price": 1}),
                json!({"window_end": 10_000, "auction": 3, "bidder": 1, "price": 300}),
                json!({"window_end": 20_000, "auction": 7, "bidder": 7, "price": 50}),
            ]
        );
    }

    #[test]
    fn q8_finds_persons_selling_in_the_window_they_joined() {
        let events = [
            person(1, "Ann", "OR", 1000),
            person(2, "Bob", "WA", 9000),
            auction(20, 3, 10, 19_999), // before its seller, same window: still counts
            person(3, "Cy", "CA", 12_000),
            auction(21, 1, 10, 5000),
            auction(22, 1, 11, 6000),   // Ann again: still one row
            auction(23, 2, 10, 10_000), // Bob sells in the next window: no row
            auction(24, 99, 10, 1000),  // unknown seller
            bid(21, 2, 100, 7000),
        ];
        assert_eq!(
            q8::<_, Vec<Value>>(&events),
            [
                json!({"id": 1, "name": "Ann", "window_start": 0}),
                json!({"id": 3, "name": "Cy", "window_start": 10_000})
            ]
        );
    }

    #[test]
    fn q11_splits_sessions_at_gaps_longer_than_10_s() {
        let events = [
            bid(1, 1, 10, 15_000), // 10 s after 5000: touches, same session
            bid(1, 2, 10, 100),
            bid(1, 1, 10, 0),
            bid(1, 1, 10, 25_001), // 10.001 s after 15 000: a new session
            person(1, "Ann", "OR", 50),
            bid(1, 1, 10, 5000),
        ];
        assert_eq!(
            q11::<_, Vec<Value>>(&events),
            [
                json!({"bidder": 1, "bids": 3, "start": 0, "end": 25_000}),
                json!({"bidder": 1, "bids": 1, "start": 25_001, "end": 35_001}),
                json!({"bidder": 2, "bids": 1, "start": 100, "end": 10_100}),
            ]
        );
    }

    #[test]
    fn generated_events_give_every_query_results() {
        // 20 s of event time.
        let config = NexmarkConfig { seed: 1, events: Some(200_000), ..NexmarkConfig::default() };
        let events: Vec<Event> = (0..200_000).map(|i| event(&config, i)).collect();
        let bids = 200_000 / 50 * 46;
        assert_eq!(q0::<_, Vec<Value>>(&events).len(), bids);
        assert_eq!(q1::<_, Vec<Value>>(&events).len(), bids);
        assert!(!q2::<_, Vec<Value>>(&events).is_empty());
        assert!(q3::<_, Vec<Value>>(&events).len() > 100);
        assert!(q5::<_, Vec<Value>>(&events).len() >= 10, "one row or more per 2 s");
        assert_eq!(q7::<_, Vec<Value>>(&events).len(), 2);
        assert!(q8::<_, Vec<Value>>(&events).len() > 10);
        let sessions = q11::<_, Vec<Value>>(&events);
        let total: u64 = sessions.iter().map(|s| s["bids"].as_u64().unwrap()).sum();
        assert_eq!(total, bids as u64);
    }
}
