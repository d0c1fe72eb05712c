//! The Nexmark generator's own throughput on one core: events made (`event_ref`, text borrowed
//! from reused buffers), events made and written as rows (what the `nexmark` source does per
//! event), and owned events (`event`, a `String` per text field) for comparison.
//!
//! Run: `cargo bench -p eddy-nexmark --bench generator`. Prints the median of 9 samples of
//! 2 000 000 events each, in M events/s.

use std::hint::black_box;
use std::time::Instant;

use eddy_nexmark::{NexmarkConfig, Scratch, event, event_ref, write_row};

const EVENTS: u64 = 2_000_000;
const SAMPLES: usize = 9;

fn median_rate(mut run: impl FnMut(u64)) -> f64 {
    let mut rates: Vec<f64> = (0..SAMPLES)
        .map(|sample| {
            let start = Instant::now();
            let first = sample as u64 * EVENTS;
            for i in first..first + EVENTS {
                run(i);
            }
            EVENTS as f64 / start.elapsed().as_secs_f64() / 1e6
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[SAMPLES / 2]
}

fn main() {
    let config = NexmarkConfig::default();
    let mut scratch = Scratch::default();
    let made = median_rate(|i| {
        // The whole event: `event_ref` is inlined, and with one field used the compiler would
        // drop the work for the others.
        black_box(event_ref(&config, i, &mut scratch));
    });
    let mut row = Vec::with_capacity(512);
    let rows = median_rate(|i| {
        let e = event_ref(&config, i, &mut scratch);
        row.clear();
        write_row(&e, &mut row);
        black_box(&row);
    });
    let owned = median_rate(|i| {
        black_box(event(&config, i));
    });
    println!("nexmark generator, one core, median of {SAMPLES} x {EVENTS} events:");
    println!("| what | M events/s |\n|---|---:|");
    println!("| event_ref (text borrowed, buffers reused) | {made:.1} |");
    println!("| event_ref + write_row (the nexmark source's work per event) | {rows:.1} |");
    println!("| event (owned strings) | {owned:.1} |");
}
