//! Value encodings measured side by side on Nexmark bids from Eddy's own generator: rows
//! ([`eddy_wire::row`], fixed slots), postcard (serde, varints, fields in sequence) and JSON
//! (today's format, borrowed strings). For each: encode, decode every field with borrowed
//! strings (strings checked UTF-8, nothing allocated), read one field (`price`), and bytes.
//!
//! Also rows through serde as the Rust SDK writes and reads them (`RowEncoder`, `RowDecoder`:
//! fields found by name through the schema, strings borrowed), decoding every field and only
//! the price.
//!
//! Run: `cargo bench -p eddy-wire --features serde --bench row_formats`. Prints medians of 15
//! samples over 100 000 bids, in ns per bid; ratios come from the same run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use eddy_nexmark::{Event, NexmarkConfig, event};
use eddy_wire::de::RowDecoder;
use eddy_wire::row::{RowRef, RowWriter};
use eddy_wire::schema::{Schema, Schemas};
use eddy_wire::ser::RowEncoder;
use serde::{Deserialize, Serialize};

const BIDS: usize = 100_000;
const SAMPLES: usize = 15;

/// A bid with borrowed strings, as a decoder hands it to an operator.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct BidRef<'a> {
    auction: u64,
    bidder: u64,
    price: u64,
    #[serde(borrow)]
    channel: &'a str,
    #[serde(borrow)]
    url: &'a str,
    date_time: i64,
    #[serde(borrow)]
    extra: &'a str,
}

/// Field indices of a bid row.
const AUCTION: usize = 0;
const BIDDER: usize = 1;
const PRICE: usize = 2;
const CHANNEL: usize = 3;
const URL: usize = 4;
const DATE_TIME: usize = 5;
const EXTRA: usize = 6;

/// Appends one bid to a reused buffer.
type Encode = fn(&BidRef<'_>, &mut Vec<u8>);
/// Reads every field of one bid, strings borrowed.
type Decode = fn(&[u8]) -> Option<BidRef<'_>>;
/// Reads the price of one bid.
type ReadPrice = fn(&[u8]) -> Option<u64>;
/// The three strings of a bid as unchecked bytes, with its other fields.
type BidBytes<'a> = (u64, u64, u64, &'a [u8], &'a [u8], i64, &'a [u8]);

fn write_row(bid: &BidRef<'_>, buf: &mut Vec<u8>) {
    let mut row = RowWriter::new(buf, 7, 0);
    row.u64(AUCTION, bid.auction);
    row.u64(BIDDER, bid.bidder);
    row.u64(PRICE, bid.price);
    row.str(CHANNEL, bid.channel);
    row.str(URL, bid.url);
    row.i64(DATE_TIME, bid.date_time);
    row.str(EXTRA, bid.extra);
    row.finish();
}

fn read_row(bytes: &[u8]) -> Option<BidRef<'_>> {
    let text = RowRef::new(bytes).ok()?.utf8().ok()?;
    let row = text.row();
    Some(BidRef {
        auction: row.u64(AUCTION).ok()?,
        bidder: row.u64(BIDDER).ok()?,
        price: row.u64(PRICE).ok()?,
        channel: text.str(CHANNEL).ok()??,
        url: text.str(URL).ok()??,
        date_time: row.i64(DATE_TIME).ok()?,
        extra: text.str(EXTRA).ok()??,
    })
}

/// The same with one UTF-8 pass per string field instead of one over the variable region.
fn read_row_per_field(bytes: &[u8]) -> Option<BidRef<'_>> {
    let row = RowRef::new(bytes).ok()?;
    Some(BidRef {
        auction: row.u64(AUCTION).ok()?,
        bidder: row.u64(BIDDER).ok()?,
        price: row.u64(PRICE).ok()?,
        channel: row.str(CHANNEL).ok()??,
        url: row.str(URL).ok()??,
        date_time: row.i64(DATE_TIME).ok()?,
        extra: row.str(EXTRA).ok()??,
    })
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Median ns per bid of `f` over all bids.
fn per_bid(mut f: impl FnMut()) -> f64 {
    f();
    let samples = (0..SAMPLES)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    median(samples).as_nanos() as f64 / BIDS as f64
}

/// Encoded bids back to back, with the offset where each starts.
struct Encoded {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

impl Encoded {
    fn of(bids: &[BidRef<'_>], mut encode: impl FnMut(&BidRef<'_>, &mut Vec<u8>)) -> Self {
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(bids.len() + 1);
        for bid in bids {
            starts.push(bytes.len());
            encode(bid, &mut bytes);
        }
        starts.push(bytes.len());
        Self { bytes, starts }
    }

    fn each(&self) -> impl Iterator<Item = &[u8]> {
        self.starts.windows(2).map(|w| &self.bytes[w[0]..w[1]])
    }
}

fn main() {
    let config = NexmarkConfig::default();
    let owned: Vec<_> = (0..)
        .map(|i| event(&config, i))
        .filter_map(|e| match e {
            Event::Bid(b) => Some(b),
            _ => None,
        })
        .take(BIDS)
        .collect();
    let bids: Vec<BidRef<'_>> = owned
        .iter()
        .map(|b| BidRef {
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            channel: &b.channel,
            url: &b.url,
            date_time: b.date_time,
            extra: &b.extra,
        })
        .collect();

    let encoders: [(&str, Encode); 3] = [
        ("row", write_row),
        ("postcard", |b, buf| {
            // `to_extend` appends to the reused buffer.
            let taken = std::mem::take(buf);
            *buf = postcard::to_extend(b, taken).expect("postcard encodes");
        }),
        ("json", |b, buf| serde_json::to_writer(buf, b).expect("json encodes")),
    ];
    let decoders: [Decode; 3] = [read_row, |b| postcard::from_bytes(b).ok(), |b| serde_json::from_slice(b).ok()];
    let prices: [ReadPrice; 3] = [
        |b| RowRef::new(b).ok()?.u64(PRICE).ok(),
        |b| postcard::from_bytes::<BidRef<'_>>(b).ok().map(|bid| bid.price),
        |b| serde_json::from_slice::<BidRef<'_>>(b).ok().map(|bid| bid.price),
    ];

    println!("{BIDS} Nexmark bids, medians of {SAMPLES} samples, ns per bid");
    println!("{:<10} {:>10} {:>14} {:>14} {:>12}", "format", "encode", "decode (all)", "read price", "bytes/bid");
    for ((name, encode), (decode, price)) in encoders.iter().zip(decoders.iter().zip(prices.iter())) {
        let encoded = Encoded::of(&bids, encode);
        for (got, want) in encoded.each().zip(&bids) {
            assert_eq!(decode(got).as_ref(), Some(want), "{name} round trip");
        }
        let mut scratch = Vec::with_capacity(encoded.bytes.len());
        let encode_ns = per_bid(|| {
            scratch.clear();
            for bid in &bids {
                encode(black_box(bid), &mut scratch);
            }
            black_box(&scratch);
        });
        let decode_ns = per_bid(|| {
            for bytes in encoded.each() {
                black_box(decode(black_box(bytes)));
            }
        });
        let price_ns = per_bid(|| {
            for bytes in encoded.each() {
                black_box(price(black_box(bytes)));
            }
        });
        let size = encoded.bytes.len() as f64 / BIDS as f64;
        println!("{name:<10} {encode_ns:>10.1} {decode_ns:>14.1} {price_ns:>12.1} {size:>12.1}");
    }
    // What the UTF-8 checks of the three strings cost in a row decode: the same fields with
    // the strings left as bytes.
    let rows = Encoded::of(&bids, write_row);
    let as_bytes_ns = per_bid(|| {
        for bytes in rows.each() {
            black_box(read_row_bytes(black_box(bytes)));
        }
    });
    let per_field_ns = per_bid(|| {
        for bytes in rows.each() {
            black_box(read_row_per_field(black_box(bytes)));
        }
    });
    println!(
        "row decode (all), strings checked one by one: {per_field_ns:.1}; left as unchecked bytes: {as_bytes_ns:.1}"
    );
    serde_rows(&bids);
}

/// The one schema of these rows, as the host's registry would answer for it.
struct OneSchema(std::sync::Arc<Schema>);

impl Schemas for OneSchema {
    fn get(&self, id: u32) -> Option<std::sync::Arc<Schema>> {
        (id == self.0.id()).then(|| self.0.clone())
    }
}

/// Only the price, read through serde by name.
#[derive(Deserialize)]
struct PriceOnly {
    price: u64,
}

/// Rows the way the SDK makes and reads them: serde by field name.
fn serde_rows(bids: &[BidRef<'_>]) {
    let mut encoder = RowEncoder::new();
    let mut declared: Option<Schema> = None;
    let mut declare = |s: &Schema| {
        declared = Some(s.clone());
        s.id()
    };
    let rows = Encoded::of(bids, |b, buf| encoder.encode(b, buf, &mut declare).expect("a struct"));
    let schema = OneSchema(std::sync::Arc::new(declared.expect("one schema")));
    let mut decoder = RowDecoder::new();
    for (got, want) in rows.each().zip(bids) {
        assert_eq!(&decoder.decode::<BidRef<'_>>(got, &schema).expect("decodes"), want, "serde row round trip");
    }
    let mut scratch = Vec::with_capacity(rows.bytes.len());
    let mut encoder = RowEncoder::new();
    let mut declare = |s: &Schema| s.id();
    let encode_ns = per_bid(|| {
        scratch.clear();
        for bid in bids {
            encoder.encode(black_box(bid), &mut scratch, &mut declare).expect("a struct");
        }
        black_box(&scratch);
    });
    let decode_ns = per_bid(|| {
        for bytes in rows.each() {
            black_box(decoder.decode::<BidRef<'_>>(black_box(bytes), &schema).ok());
        }
    });
    let price_ns = per_bid(|| {
        for bytes in rows.each() {
            black_box(decoder.decode::<PriceOnly>(black_box(bytes), &schema).ok().map(|p| p.price));
        }
    });
    let size = rows.bytes.len() as f64 / bids.len() as f64;
    println!("{:<10} {encode_ns:>10.1} {decode_ns:>14.1} {price_ns:>12.1} {size:>12.1}", "row/serde");
}

fn read_row_bytes(bytes: &[u8]) -> Option<BidBytes<'_>> {
    let row = RowRef::new(bytes).ok()?;
    Some((
        row.u64(AUCTION).ok()?,
        row.u64(BIDDER).ok()?,
        row.u64(PRICE).ok()?,
        row.bytes(CHANNEL).ok()??,
        row.bytes(URL).ok()??,
        row.i64(DATE_TIME).ok()?,
        row.bytes(EXTRA).ok()??,
    ))
}
