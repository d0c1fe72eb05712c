//! The window operator against [`Reference`] over seeded random inputs: 400 records over 4
//! keys, about a tenth of them delayed past the watermark bound, tumbling / sliding / session
//! windows, allowed lateness 0 and 500, batches of 1, 7 and 64 records. Every result (re-fires
//! included, per key and window in emission order), every late record and the purge of all
//! state must agree, also when the operator's write-back buffer is small enough to be written
//! back after most calls and the operator is rebuilt from its backend every few batches (a
//! snapshot and a restore). A failure prints the seed and the configuration to replay.

use std::collections::BTreeMap;

use super::reference::Reference;
use super::two_phase::drive_two_phase;
use super::{Emitted, Ev, Restarts, Run, drive, drive_with};
use eddy_plan::window::{Window, WindowKind};

const RECORDS: usize = 400;
const KEYS: u64 = 4;
const BOUND_MS: i64 = 50;
const SEEDS: u64 = 8;

/// splitmix64: a seeded stream of numbers, the same on every machine.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> i64 {
        (self.next() % n) as i64
    }
}

/// Event times rising by 0-39 ms (now and then a pause of 300-800 ms, so sessions end), each
/// arriving within the bound, or one time in ten up to 1.5 s after it.
fn arrivals(seed: u64) -> Vec<Ev> {
    let mut rng = Seeded(seed);
    let mut ts = 10_000;
    let mut timed: Vec<(i64, usize, Ev)> = (0..RECORDS)
        .map(|i| {
            ts += if rng.below(20) == 0 { 300 + rng.below(500) } else { rng.below(40) };
            let delay =
                if rng.below(10) == 0 { BOUND_MS + 1 + rng.below(1_500) } else { rng.below(BOUND_MS as u64 + 1) };
            let e = Ev { key: rng.below(KEYS) as u8, ts, v: rng.below(100) - 50 };
            (ts + delay, i, e)
        })
        .collect();
    timed.sort_by_key(|&(arrival, i, _)| (arrival, i));
    timed.into_iter().map(|(_, _, e)| e).collect()
}

/// The reference over the same arrivals, batches and watermarks (`max - bound - 1` after each
/// batch, computed here) as [`drive`].
fn reference(kind: WindowKind, lateness: i64, events: &[Ev], batch_size: usize) -> Reference {
    let mut reference = Reference::new(kind, lateness);
    let mut max_seen = i64::MIN;
    for batch in events.chunks(batch_size) {
        for e in batch {
            reference.on_record(*e);
            max_seen = max_seen.max(e.ts);
        }
        reference.on_watermark(max_seen - BOUND_MS - 1);
    }
    reference.on_watermark(i64::MAX);
    reference
}

/// Results per (key, window), each list in emission order: re-fires are compared one by one,
/// while the order across windows of one batch is left to the operator.
fn per_window(results: &[Emitted]) -> BTreeMap<(String, Window), Vec<(i64, i64)>> {
    let mut out: BTreeMap<(String, Window), Vec<(i64, i64)>> = BTreeMap::new();
    for r in results {
        out.entry((r.key.clone(), r.window)).or_default().push((r.count, r.sum));
    }
    out
}

#[test]
fn the_window_operator_equals_the_reference_over_seeded_random_inputs() {
    let kinds = [
        WindowKind::Tumbling { size_ms: 1_000 },
        WindowKind::Sliding { size_ms: 1_000, slide_ms: 250 },
        WindowKind::Session { gap_ms: 200 },
    ];
    // What the inputs exercised, summed over seeds, so a generator change cannot quietly make
    // the test trivial.
    let mut late = 0;
    let mut fired_by_a_record = 0;
    let mut rescued_by_a_session = 0;
    for kind in kinds {
        for lateness in [0, 500] {
            for batch_size in [1, 7, 64] {
                for seed in 0..SEEDS {
                    let events = arrivals(seed);
                    let expected = reference(kind, lateness, &events, batch_size);
                    let run: Run = drive(kind, lateness, BOUND_MS, &events, &[batch_size]);
                    let case = format!("seed {seed}, {kind:?}, lateness {lateness}, batch size {batch_size}");
                    let restarts = Some(Restarts { budget: 2_048, every: 3 });
                    let restarted = drive_with(restarts, kind, lateness, BOUND_MS, &events, &[batch_size]);
                    let in_order = per_window(&restarted.in_order);
                    assert_eq!(in_order, per_window(&expected.emitted), "results, restarted, {case}");
                    assert_eq!(restarted.late, expected.late, "late records, restarted, {case}");
                    assert_eq!(restarted.state_entries_after, 0, "state left, restarted, {case}");
                    assert_eq!(run.late, expected.late, "late records, {case}");
                    assert_eq!(run.late_count, expected.late.len() as u64, "late count, {case}");
                    assert_eq!(per_window(&run.in_order), per_window(&expected.emitted), "results, {case}");
                    assert_eq!(run.state_entries_after, 0, "state left, {case}");
                    assert!(expected.is_empty(), "the reference kept windows, {case}");
                    late += expected.late.len();
                    fired_by_a_record += expected.fired_by_a_record;
                    rescued_by_a_session += expected.rescued_by_a_session;
                }
            }
        }
    }
    assert!(late > 0, "no late records generated");
    assert!(fired_by_a_record > 0, "no re-fires generated");
    assert!(rescued_by_a_session > 0, "no late session record joined an open session");
}

#[test]
fn a_two_phase_window_equals_the_reference_over_seeded_random_inputs() {
    let kinds = [WindowKind::Tumbling { size_ms: 1_000 }, WindowKind::Sliding { size_ms: 1_000, slide_ms: 250 }];
    let mut late = 0;
    for kind in kinds {
        for batch_size in [1, 7, 64] {
            // The window gets the partials of one or of three first-phase batches at a time
            // (a channel buffer holds several): those of one (key, window) merge in one call.
            for gather in [1, 3] {
                for seed in 0..SEEDS {
                    let events = arrivals(seed);
                    // Watermarks come after each window batch, so the reference's batches
                    // are as long.
                    let expected = reference(kind, 0, &events, batch_size * gather);
                    let case = format!("seed {seed}, {kind:?}, batch size {batch_size}, gathered {gather}");
                    let (results, late_partials, left) =
                        drive_two_phase(kind, BOUND_MS, &events, batch_size, gather, 3);
                    assert_eq!(per_window(&results), per_window(&expected.emitted), "results, {case}");
                    assert_eq!(left, 0, "state left, {case}");
                    assert_eq!(late_partials > 0, !expected.late.is_empty(), "late partials, {case}");
                    late += expected.late.len();
                }
            }
        }
    }
    assert!(late > 0, "no late records generated");
}
