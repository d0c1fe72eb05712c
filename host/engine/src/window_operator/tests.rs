//! Window operator tests: batch oracles under bounded and unbounded disorder (property tests),
//! allowed lateness and purging, session merging across batches, restore from the backend,
//! and the real Wasm purchase-totals aggregate.

use std::collections::{BTreeMap, BTreeSet};

use eddy_core::BoundedOutOfOrderness;
use eddy_state::{HashedKey, HeapStateBackend, StateKey, state_id};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

mod differential;
mod reference;
mod two_phase;

fn test_error(problem: String) -> OperatorError {
    OperatorError::BadRecord { operator: "test-aggregate".into(), problem }
}

fn json_of(bytes: &[u8]) -> Result<Value, OperatorError> {
    serde_json::from_slice(&eddy_connectors::values::json_text(bytes)).map_err(|e| test_error(format!("not JSON: {e}")))
}

/// How often a test aggregate's `add` was called (Wasm crossings) and how many groups those
/// calls folded in total.
#[derive(Debug, Default)]
struct Adds {
    calls: usize,
    groups: usize,
}

impl Adds {
    /// Folds each update's record values into its accumulator with `add_one`.
    fn fold(
        &mut self,
        batch: &RecordBatch,
        updates: &[AccumulatorUpdate<'_>],
        add_one: impl Fn(&[u8], &[&[u8]]) -> Result<Vec<u8>, OperatorError>,
    ) -> Result<Items, OperatorError> {
        self.calls += 1;
        self.groups += updates.len();
        updates
            .iter()
            .map(|u| {
                let values = u
                    .records
                    .iter()
                    .map(|&i| {
                        batch.get(i as usize).map(|r| r.value).ok_or_else(|| test_error(format!("no record {i}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                add_one(u.accumulator, &values)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|accs| accs.iter().map(Vec::as_slice).collect())
    }
}

/// Count and sum of the integer `v` of JSON values `{"v": n}`; the accumulator and the
/// result are `{"count": c, "sum": s}`.
#[derive(Debug, Default)]
struct SumCount {
    adds: Adds,
}

fn sum_count(acc: &[u8]) -> Result<(i64, i64), OperatorError> {
    let v = json_of(acc)?;
    match (v["count"].as_i64(), v["sum"].as_i64()) {
        (Some(c), Some(s)) => Ok((c, s)),
        _ => Err(test_error(format!("bad accumulator {v}"))),
    }
}

fn sum_count_bytes(count: i64, sum: i64) -> Vec<u8> {
    json!({"count": count, "sum": sum}).to_string().into_bytes()
}

impl AggregateFn for SumCount {
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        Ok(sum_count_bytes(0, 0))
    }

    fn add(&mut self, batch: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError> {
        self.adds.fold(batch, updates, |acc, values| {
            let (mut count, mut sum) = sum_count(acc)?;
            for value in values {
                sum += json_of(value)?["v"].as_i64().ok_or_else(|| test_error("no `v`".into()))?;
                count += 1;
            }
            Ok(sum_count_bytes(count, sum))
        })
    }

    fn merge(&mut self, a: &[u8], b: &[u8]) -> Result<Vec<u8>, OperatorError> {
        let ((ca, sa), (cb, sb)) = (sum_count(a)?, sum_count(b)?);
        Ok(sum_count_bytes(ca + cb, sa + sb))
    }

    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError> {
        Ok(accs.clone())
    }
}

/// The `v`s in the order they were added: shows record order within a group.
#[derive(Debug, Default)]
struct Concat {
    adds: Adds,
}

impl AggregateFn for Concat {
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        Ok(b"[]".to_vec())
    }

    fn add(&mut self, batch: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError> {
        self.adds.fold(batch, updates, |acc, values| {
            let mut list: Vec<Value> = serde_json::from_slice(acc).map_err(|e| test_error(e.to_string()))?;
            for value in values {
                list.push(json_of(value)?["v"].clone());
            }
            Ok(Value::from(list).to_string().into_bytes())
        })
    }

    fn merge(&mut self, a: &[u8], b: &[u8]) -> Result<Vec<u8>, OperatorError> {
        let mut a: Vec<Value> = serde_json::from_slice(a).map_err(|e| test_error(e.to_string()))?;
        let b: Vec<Value> = serde_json::from_slice(b).map_err(|e| test_error(e.to_string()))?;
        a.extend(b);
        Ok(Value::from(a).to_string().into_bytes())
    }

    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError> {
        Ok(accs.clone())
    }
}

/// Returns fixed bytes as the result (to check how results are embedded).
#[derive(Debug)]
struct Fixed(&'static [u8]);

impl AggregateFn for Fixed {
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        Ok(Vec::new())
    }
    fn add(&mut self, _: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError> {
        Ok(updates.iter().map(|u| u.accumulator).collect())
    }
    fn merge(&mut self, a: &[u8], _: &[u8]) -> Result<Vec<u8>, OperatorError> {
        Ok(a.to_vec())
    }
    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError> {
        Ok(accs.iter().map(|_| self.0).collect())
    }
}

const LATE: &str = "late";

fn config(kind: WindowKind, allowed_lateness_ms: i64) -> WindowConfig {
    WindowConfig {
        kind,
        allowed_lateness_ms,
        late_data: LateData::SideOutput(LATE.into()),
        max_parallelism: 128,
        partial_input: false,
    }
}

fn operator<A: AggregateFn>(kind: WindowKind, allowed_lateness_ms: i64, aggregate: A) -> WindowOperator<A> {
    WindowOperator::new("win", config(kind, allowed_lateness_ms), aggregate, Box::new(HeapStateBackend::default()))
}

/// A heap backend that counts the writes and deletes that reach it.
#[derive(Debug, Default)]
struct Counted {
    inner: HeapStateBackend,
    tally: Tally,
}

/// What reached a [`Counted`] backend so far.
#[derive(Debug, Default, Clone)]
struct Tally {
    puts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    deletes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Tally {
    /// (puts, deletes).
    fn now(&self) -> (usize, usize) {
        let load = |c: &std::sync::atomic::AtomicUsize| c.load(std::sync::atomic::Ordering::Relaxed);
        (load(&self.puts), load(&self.deletes))
    }

    /// Point reads so far.
    fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A window operator over a [`Counted`] backend, and its tally.
fn counted_operator(kind: WindowKind) -> (WindowOperator<SumCount>, Tally) {
    let backend = Counted::default();
    let tally = backend.tally.clone();
    (WindowOperator::new("win", config(kind, 0), SumCount::default(), Box::new(backend)), tally)
}

impl StateBackend for Counted {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.tally.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.tally.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.tally.deletes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.delete(key)
    }
    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        self.inner.scan_prefix(prefix, visit)
    }
    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        self.inner.delete_prefix(prefix)
    }
    fn approximate_len(&self) -> usize {
        self.inner.approximate_len()
    }
    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self
    }
}

/// One event: key `k{key}`, event time, value `{"v": v}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ev {
    key: u8,
    ts: i64,
    v: i64,
}

fn key_bytes(key: u8) -> Vec<u8> {
    format!("\"k{key}\"").into_bytes()
}

fn batch(events: &[Ev]) -> RecordBatch {
    let mut b = RecordBatch::default();
    for e in events {
        b.push(Some(&key_bytes(e.key)), json!({"v": e.v}).to_string().as_bytes(), Some(e.ts));
    }
    b
}

fn decode_events(batch: &RecordBatch) -> Vec<Ev> {
    batch
        .iter()
        .map(|r| {
            let key = std::str::from_utf8(r.key.expect("late records keep their key")).expect("utf8");
            let key = key.trim_matches('"').trim_start_matches('k').parse().expect("key k<n>");
            let v = serde_json::from_slice::<Value>(r.value).expect("json")["v"].as_i64().expect("v");
            Ev { key, ts: r.timestamp.expect("late records keep their timestamp"), v }
        })
        .collect()
}

/// One emitted window result of [`SumCount`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Emitted {
    key: String,
    window: Window,
    count: i64,
    sum: i64,
}

/// Decodes results and checks the record shape: key, timestamp `end - 1`, JSON value.
fn emitted(batch: &RecordBatch) -> Vec<Emitted> {
    batch
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(r.value).expect("result is JSON");
            let window = Window { start: v["start"].as_i64().expect("start"), end: v["end"].as_i64().expect("end") };
            assert_eq!(r.timestamp, Some(window.max_timestamp()), "result timestamp is end - 1");
            Emitted {
                key: String::from_utf8(r.key.expect("results are keyed").to_vec()).expect("utf8"),
                window,
                count: v["result"]["count"].as_i64().expect("count"),
                sum: v["result"]["sum"].as_i64().expect("sum"),
            }
        })
        .collect()
}

fn single(count: i64, sum: i64, key: u8, start: i64, end: i64) -> Emitted {
    Emitted { key: format!("\"k{key}\""), window: Window { start, end }, count, sum }
}

// ---------------------------------------------------------------------------------------------
// Oracles, computed from scratch (they do not use `WindowKind::assign` or `SessionWindows`).

/// The windows of a fixed (tumbling or sliding) assigner containing `ts`.
fn oracle_windows(kind: WindowKind, ts: i64) -> Vec<Window> {
    let (size, slide) = match kind {
        WindowKind::Tumbling { size_ms } => (size_ms, size_ms),
        WindowKind::Sliding { size_ms, slide_ms } => (size_ms, slide_ms),
        WindowKind::Session { .. } => unreachable!("sessions have their own oracle"),
    };
    let mut windows = Vec::new();
    let mut start = ts.div_euclid(slide) * slide;
    while start + size > ts {
        windows.push(Window { start, end: start + size });
        start -= slide;
    }
    windows
}

/// When a window stops taking records (with allowed lateness 0): the watermark at which it
/// fires (sessions at `end`, see the module docs).
fn oracle_fire_time(kind: WindowKind, w: &Window) -> i64 {
    match kind {
        WindowKind::Session { .. } => w.end,
        _ => w.max_timestamp(),
    }
}

/// Group all events by key and window and sum them, as a batch job would.
fn batch_oracle(kind: WindowKind, events: &[Ev]) -> Vec<Emitted> {
    let mut acc: BTreeMap<(u8, Window), (i64, i64)> = BTreeMap::new();
    match kind {
        WindowKind::Session { gap_ms } => {
            let mut by_key: BTreeMap<u8, Vec<Ev>> = BTreeMap::new();
            for e in events {
                by_key.entry(e.key).or_default().push(*e);
            }
            for (key, mut evs) in by_key {
                evs.sort_by_key(|e| e.ts);
                let mut current: Option<(Window, i64, i64)> = None;
                for e in evs {
                    current = match current {
                        // Within `gap` of the session's end: the same session.
                        Some((w, c, s)) if e.ts <= w.end => {
                            Some((Window { start: w.start, end: w.end.max(e.ts + gap_ms) }, c + 1, s + e.v))
                        }
                        other => {
                            if let Some((w, c, s)) = other {
                                acc.insert((key, w), (c, s));
                            }
                            Some((Window { start: e.ts, end: e.ts + gap_ms }, 1, e.v))
                        }
                    };
                }
                if let Some((w, c, s)) = current {
                    acc.insert((key, w), (c, s));
                }
            }
        }
        _ => {
            for e in events {
                for w in oracle_windows(kind, e.ts) {
                    let entry = acc.entry((e.key, w)).or_default();
                    entry.0 += 1;
                    entry.1 += e.v;
                }
            }
        }
    }
    acc.into_iter().map(|((key, w), (c, s))| single(c, s, key, w.start, w.end)).collect()
}

// ---------------------------------------------------------------------------------------------
// The driver: arrival order, small batches, BoundedOutOfOrderness watermarks.

/// What a run produced.
#[derive(Debug)]
struct Run {
    /// Every result, sorted.
    results: Vec<Emitted>,
    /// Every result, in emission order.
    in_order: Vec<Emitted>,
    /// The late side output, in emission order.
    late: Vec<Ev>,
    /// The operator's watermark when each event (in arrival order) was processed.
    watermark_at_arrival: Vec<i64>,
    late_count: u64,
    state_entries_after: usize,
}

/// In-order event times with bounded random delays, sorted by arrival.
fn arrivals(start: i64, raw: &[(u8, i64, i64, i64, u8)], max_delay: i64) -> Vec<Ev> {
    let mut ts = start;
    let mut timed: Vec<((i64, u8), Ev)> = raw
        .iter()
        .map(|&(key, step, v, delay, tie)| {
            ts += step;
            // Most events take no delay or the longest allowed: the edge cases live there.
            let delay = match delay % 3 {
                0 => 0,
                1 => max_delay,
                _ => delay.rem_euclid(max_delay + 1),
            };
            ((ts + delay, tie), Ev { key, ts, v })
        })
        .collect();
    // Events arriving at the same moment may come in any order: an event exactly `max_delay`
    // behind the newest one seen is still within the bound.
    timed.sort_by_key(|(arrival, _)| *arrival);
    timed.into_iter().map(|(_, e)| e).collect()
}

fn drive(kind: WindowKind, lateness: i64, bound: i64, events: &[Ev], chunks: &[usize]) -> Run {
    drive_with(None, kind, lateness, bound, events, chunks)
}

/// How a run treats the window store's write-back buffer: its budget, and every how many
/// batches the operator is rebuilt from its backend (a snapshot and a restore).
#[derive(Debug, Clone, Copy)]
struct Restarts {
    budget: usize,
    every: usize,
}

/// [`drive`], restarted as `restarts` says.
fn drive_with(
    restarts: Option<Restarts>,
    kind: WindowKind,
    lateness: i64,
    bound: i64,
    events: &[Ev],
    chunks: &[usize],
) -> Run {
    let new = |state: Box<dyn StateBackend>| {
        let op = WindowOperator::new("win", config(kind, lateness), SumCount::default(), state);
        match restarts {
            Some(r) => op.with_write_back_budget(r.budget),
            None => op,
        }
    };
    let mut op = new(Box::<HeapStateBackend>::default());
    let mut batches = 0;
    let mut generator = BoundedOutOfOrderness::new(bound);
    let mut in_order = Vec::new();
    let mut late = Vec::new();
    let mut watermark_at_arrival = Vec::new();
    let mut rest = events;
    let mut sizes = chunks.iter().copied().cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(1).clamp(1, rest.len());
        let (now, later) = rest.split_at(n);
        rest = later;
        watermark_at_arrival.extend(std::iter::repeat_n(op.current_watermark(), now.len()));
        let out = op.process(&batch(now)).expect("process");
        let (running, recounted) = op.store.recount();
        assert_eq!(running, recounted, "the buffer's running count of its memory drifted");
        in_order.extend(emitted(&out.main));
        late.extend(decode_events(out.side(LATE).expect("the late output is declared")));
        for e in now {
            generator.on_event(e.ts);
        }
        let out = op.on_watermark(generator.current()).expect("watermark");
        assert!(out.side(LATE).is_some_and(RecordBatch::is_empty), "watermarks emit no late records");
        check_firing_order(kind, &out.main);
        in_order.extend(emitted(&out.main));
        batches += 1;
        if let Some(r) = restarts
            && batches % r.every == 0
        {
            op = new(op.into_state().expect("written back"));
            // The engine's next watermark; what fired before the restart must not fire again.
            let out = op.on_watermark(generator.current()).expect("watermark after a restore");
            assert!(out.main.is_empty(), "a restored operator re-fired {:?}", emitted(&out.main));
        }
    }
    let out = op.on_watermark(i64::MAX).expect("final watermark");
    check_firing_order(kind, &out.main);
    in_order.extend(emitted(&out.main));
    let finished = op.finish().expect("finish");
    assert!(finished.main.is_empty(), "finish emits nothing after the final watermark");
    let mut results = in_order.clone();
    results.sort();
    Run {
        results,
        in_order,
        late,
        watermark_at_arrival,
        late_count: op.late_records(),
        state_entries_after: op.state().expect("written back").approximate_len(),
    }
}

/// A watermark emits its windows in (firing time, key) order.
fn check_firing_order(kind: WindowKind, main: &RecordBatch) {
    let order: Vec<(i64, Vec<u8>)> =
        emitted(main).into_iter().map(|e| (oracle_fire_time(kind, &e.window), e.key.into_bytes())).collect();
    assert!(order.windows(2).all(|p| p[0] <= p[1]), "not in (firing time, key) order: {order:?}");
}

fn no_duplicates(results: &[Emitted]) -> bool {
    results.windows(2).all(|p| (&p[0].key, p[0].window) != (&p[1].key, p[1].window))
}

fn fixed_window_kind() -> impl Strategy<Value = WindowKind> {
    prop_oneof![
        (1i64..60).prop_map(|size_ms| WindowKind::Tumbling { size_ms }),
        (1i64..25, 1i64..5).prop_map(|(slide_ms, n)| WindowKind::Sliding { size_ms: slide_ms * n, slide_ms }),
    ]
}

fn window_kind() -> impl Strategy<Value = WindowKind> {
    prop_oneof![fixed_window_kind(), (1i64..40).prop_map(|gap_ms| WindowKind::Session { gap_ms })]
}

/// (key, step to the next event time, value, raw delay, tie-break among equal arrivals).
fn raw_events() -> impl Strategy<Value = Vec<(u8, i64, i64, i64, u8)>> {
    proptest::collection::vec((0u8..4, 0i64..9, -50i64..50, 0i64..10_000, any::<u8>()), 0..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Disorder within the watermark's bound: nothing is late, every (key, window) fires
    /// exactly once, the results equal a batch computation, and all state is purged.
    #[test]
    fn within_the_bound_results_equal_the_batch_oracle(
        kind in window_kind(),
        start in -500i64..500,
        raw in raw_events(),
        bound in prop_oneof![0i64..4, 0i64..40],
        lateness in prop_oneof![Just(0i64), 0i64..100],
        chunks in proptest::collection::vec(1usize..8, 1..20),
    ) {
        let events = arrivals(start, &raw, bound);
        let run = drive(kind, lateness, bound, &events, &chunks);
        prop_assert_eq!(run.late_count, 0);
        prop_assert!(run.late.is_empty());
        prop_assert!(no_duplicates(&run.results), "a window fired twice: {:?}", run.results);
        prop_assert_eq!(&run.results, &batch_oracle(kind, &events));
        prop_assert_eq!(run.state_entries_after, 0, "state left after the final watermark");
    }

    /// Disorder beyond the bound, no allowed lateness: the late output holds exactly the
    /// records whose every window had closed when they arrived (in arrival order), and the
    /// results count exactly the (record, window) pairs whose window was still open. (Sessions,
    /// where lateness depends on the sessions a record would join, are checked against the
    /// reference in `differential`.)
    #[test]
    fn beyond_the_bound_late_records_are_exactly_the_oracles(
        kind in fixed_window_kind(),
        start in -500i64..500,
        raw in raw_events(),
        bound in 0i64..20,
        extra in 1i64..150,
        chunks in proptest::collection::vec(1usize..8, 1..20),
    ) {
        let events = arrivals(start, &raw, bound + extra);
        let run = drive(kind, 0, bound, &events, &chunks);
        // Oracle: replay arrivals against the watermark each one met.
        let mut expected_late = Vec::new();
        let mut on_time = Vec::new();
        for (e, &wm) in events.iter().zip(&run.watermark_at_arrival) {
            if oracle_windows(kind, e.ts).iter().all(|w| w.max_timestamp() <= wm) {
                expected_late.push(*e);
            } else {
                on_time.push((*e, wm));
            }
        }
        prop_assert_eq!(&run.late, &expected_late);
        prop_assert_eq!(run.late_count, expected_late.len() as u64);
        prop_assert_eq!(run.state_entries_after, 0);
        let mut acc: BTreeMap<(u8, Window), (i64, i64)> = BTreeMap::new();
        for (e, wm) in on_time {
            for w in oracle_windows(kind, e.ts).into_iter().filter(|w| w.max_timestamp() > wm) {
                let entry = acc.entry((e.key, w)).or_default();
                entry.0 += 1;
                entry.1 += e.v;
            }
        }
        let expected: Vec<Emitted> =
            acc.into_iter().map(|((key, w), (c, s))| single(c, s, key, w.start, w.end)).collect();
        prop_assert!(no_duplicates(&run.results));
        prop_assert_eq!(&run.results, &expected);
    }

    /// A batch costs one `add` call that folds one update per (key, window) group.
    #[test]
    fn one_add_per_batch_with_one_update_per_key_and_window(
        raw in proptest::collection::vec((0u8..3, 0i64..30), 1..60),
    ) {
        let events: Vec<Ev> = raw.iter().map(|&(key, ts)| Ev { key, ts, v: ts }).collect();
        let mut op = operator(WindowKind::Tumbling { size_ms: 10 }, 0, SumCount::default());
        op.process(&batch(&events)).expect("process");
        let groups: BTreeSet<(u8, i64)> = events.iter().map(|e| (e.key, e.ts.div_euclid(10))).collect();
        prop_assert_eq!(op.aggregate().adds.calls, 1);
        prop_assert_eq!(op.aggregate().adds.groups, groups.len());
    }

    /// Each (key, window) folds exactly its records in arrival order, however the batch mixes
    /// times across panes (the oracle lists each record under every window holding it, in
    /// arrival order), batch by batch.
    #[test]
    fn every_window_folds_its_records_in_arrival_order(
        kind in fixed_window_kind(),
        raw in proptest::collection::vec((0u8..3, -30i64..30), 1..80),
        chunks in proptest::collection::vec(1usize..40, 1..6),
    ) {
        let events: Vec<Ev> = raw.iter().enumerate().map(|(v, &(key, ts))| Ev { key, ts, v: v as i64 }).collect();
        let mut op = operator(kind, 0, Concat::default());
        let mut rest = &events[..];
        for &n in chunks.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (now, later) = rest.split_at(n.min(rest.len()));
            op.process(&batch(now)).expect("process");
            rest = later;
        }
        let out = op.on_watermark(i64::MAX).expect("final watermark");
        let mut expected: BTreeMap<(String, Window), Vec<i64>> = BTreeMap::new();
        for e in &events {
            for w in oracle_windows(kind, e.ts) {
                expected.entry((format!("\"k{}\"", e.key), w)).or_default().push(e.v);
            }
        }
        let got: BTreeMap<(String, Window), Vec<i64>> = out
            .main
            .iter()
            .map(|r| {
                let v = json_of(r.value).expect("json");
                let window = Window { start: v["start"].as_i64().expect("start"), end: v["end"].as_i64().expect("end") };
                let values = v["result"].as_array().expect("list").iter().map(|x| x.as_i64().expect("v")).collect();
                ((String::from_utf8(r.key.expect("key").to_vec()).expect("utf8"), window), values)
            })
            .collect();
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn windows_encode_in_order(a in any::<(i64, i64)>(), b in any::<(i64, i64)>()) {
        let wa = Window { start: a.0.min(a.1), end: a.0.max(a.1) };
        let wb = Window { start: b.0.min(b.1), end: b.0.max(b.1) };
        prop_assert_eq!(wa.cmp(&wb), encode_window(&wa).cmp(&encode_window(&wb)));
        if wa.start < wa.end {
            prop_assert_eq!(decode_window(&encode_window(&wa)).expect("decodes"), wa);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Allowed lateness and purging.

fn ev(key: u8, ts: i64, v: i64) -> Ev {
    Ev { key, ts, v }
}

#[test]
fn a_record_within_the_allowed_lateness_refires_and_one_after_it_is_late() {
    let mut op = operator(WindowKind::Tumbling { size_ms: 10 }, 5, SumCount::default());
    op.process(&batch(&[ev(0, 1, 1), ev(0, 3, 2), ev(1, 12, 7)])).expect("process");
    assert!(emitted(&op.on_watermark(8).expect("wm").main).is_empty(), "[0, 10) fires at 9, not before");
    let out = op.on_watermark(9).expect("wm");
    assert_eq!(emitted(&out.main), vec![single(2, 3, 0, 0, 10)]);

    // Late but allowed (9 + 5 > 9): updates the accumulator and re-fires from `process`.
    let out = op.process(&batch(&[ev(0, 5, 10)])).expect("process");
    assert_eq!(emitted(&out.main), vec![single(3, 13, 0, 0, 10)]);
    assert!(out.side(LATE).is_some_and(RecordBatch::is_empty));
    assert_eq!(op.late_records(), 0);
    let out = op.process(&batch(&[ev(0, 9, 100), ev(0, 2, 1000)])).expect("process");
    assert_eq!(emitted(&out.main), vec![single(4, 113, 0, 0, 10), single(5, 1113, 0, 0, 10)], "one re-fire per record");

    // The window is purged at 9 + 5 = 14; [10, 20) of key 1 stays until it fires.
    assert_eq!(op.state().expect("written back").approximate_len(), 2);
    assert!(emitted(&op.on_watermark(13).expect("wm").main).is_empty());
    assert_eq!(op.state().expect("written back").approximate_len(), 2);
    assert!(emitted(&op.on_watermark(14).expect("wm").main).is_empty(), "purging emits nothing");
    assert_eq!(op.state().expect("written back").approximate_len(), 1);

    let out = op.process(&batch(&[ev(0, 6, 1), ev(1, 13, 1)])).expect("process");
    assert_eq!(decode_events(out.side(LATE).expect("declared")), vec![ev(0, 6, 1)]);
    assert!(emitted(&out.main).is_empty(), "a late record changes no result");
    assert_eq!(op.late_records(), 1);

    let out = op.on_watermark(i64::MAX).expect("final");
    assert_eq!(emitted(&out.main), vec![single(2, 8, 1, 10, 20)]);
    assert_eq!(op.state().expect("written back").approximate_len(), 0, "everything purged after the final watermark");
}

#[test]
fn windows_fired_and_purged_between_snapshots_never_reach_the_backend_and_a_snapshot_holds_the_rest() {
    let kind = WindowKind::Tumbling { size_ms: 10 };
    let (mut op, tally) = counted_operator(kind);
    op.process(&batch(&[ev(0, 1, 1), ev(1, 2, 2)])).expect("process");
    op.process(&batch(&[ev(0, 3, 4)])).expect("process");
    let out = op.on_watermark(9).expect("wm");
    assert_eq!(emitted(&out.main), vec![single(2, 5, 0, 0, 10), single(1, 2, 1, 0, 10)]);
    assert_eq!(tally.now(), (0, 0), "updated, fired and purged in the buffer");

    op.process(&batch(&[ev(0, 11, 8), ev(1, 12, 16)])).expect("process");
    let staging = std::env::temp_dir();
    let snapshot = op.snapshot(&staging).expect("snapshot");
    assert_eq!(tally.now().0, 2, "the barrier wrote the two open windows back");
    op.process(&batch(&[ev(0, 13, 32)])).expect("process");
    assert_eq!(tally.now().0, 2, "an update after the snapshot waits for the next");
    let out = op.on_watermark(19).expect("wm");
    assert_eq!(emitted(&out.main), vec![single(2, 40, 0, 10, 20), single(1, 16, 1, 10, 20)]);
    assert_eq!(tally.now().1, 2, "a purged window the backend had is deleted from it");
    drop(snapshot);

    // Past its budget the buffer is written back between calls, and what it held stays right.
    let mut op = operator(kind, 0, SumCount::default()).with_write_back_budget(0);
    op.process(&batch(&[ev(0, 21, 1)])).expect("process");
    assert_eq!(op.store.backend.approximate_len(), 1, "written back at once");
    op.process(&batch(&[ev(0, 22, 2)])).expect("process");
    assert_eq!(emitted(&op.on_watermark(29).expect("wm").main), vec![single(2, 3, 0, 20, 30)]);
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
}

#[test]
fn small_values_live_in_their_entry_and_large_ones_are_counted_as_their_allocation() {
    let mut store = store::WindowStore::new(Box::<HeapStateBackend>::default(), "win".into(), 128);
    let window = Window { start: 0, end: 10 };
    let mut put = |len: usize| {
        store.key(b"k").put_acc(&window, false, &vec![7; len]);
        let (running, recounted) = store.recount();
        assert_eq!(running, recounted, "the running count drifted at a value of {len} bytes");
        running
    };
    let small = put(8);
    // The flag byte and 50 bytes: still inside the entry.
    assert_eq!(put(50), small, "values within the inline size count the same");
    let large = put(200);
    assert!(large >= small + 201, "a 201-byte value is an allocation of at least that: {small} -> {large}");
    assert_eq!(put(8), large, "the allocation stays with the entry, and stays counted");
}

/// Sliding windows (10 ms, every 5 ms) of two keys over batches with a snapshot between them:
/// a backend that holds only what the buffer holds is never read, before the snapshot and
/// after it (when it holds the windows written back); one with state the buffer lacks (a
/// restore, a buffer emptied past its budget) is read, and every result is the same.
#[test]
fn a_backend_holding_only_what_the_buffer_holds_is_never_read_and_results_stay_the_same() {
    let kind = WindowKind::Sliding { size_ms: 10, slide_ms: 5 };
    let first = [ev(0, 1, 1), ev(1, 2, 2), ev(0, 6, 4)];
    let second = [ev(0, 8, 8), ev(1, 11, 16), ev(0, 13, 32)];
    // Windows [-5, 5), [0, 10), [5, 15), [10, 20) by key: k0 sums 1 | 1+4+8 | 4+8+32 | 32,
    // k1 sums 2 | 2 | 16 | 16; all fire by watermark 19.
    let expected = {
        let mut e = vec![
            single(1, 1, 0, -5, 5),
            single(3, 13, 0, 0, 10),
            single(3, 44, 0, 5, 15),
            single(1, 32, 0, 10, 20),
            single(1, 2, 1, -5, 5),
            single(1, 2, 1, 0, 10),
            single(1, 16, 1, 5, 15),
            single(1, 16, 1, 10, 20),
        ];
        e.sort();
        e
    };
    let run = |op: &mut WindowOperator<SumCount>| {
        let mut out = Vec::new();
        op.process(&batch(&first)).expect("process");
        drop(op.snapshot(&std::env::temp_dir()).expect("snapshot"));
        op.process(&batch(&second)).expect("process");
        out.extend(emitted(&op.on_watermark(19).expect("wm").main));
        out.sort();
        out
    };

    let (mut op, tally) = counted_operator(kind);
    assert_eq!(run(&mut op), expected);
    assert_eq!(tally.reads(), 0, "every window new to the buffer is new to the backend");

    // Restored: the backend starts with the state of the first batch, the buffer empty.
    let (mut op, _) = counted_operator(kind);
    op.process(&batch(&first)).expect("process");
    let restored = op.into_state().expect("state");
    let backend = Counted { inner: HeapStateBackend::default(), tally: Tally::default() };
    let tally = backend.tally.clone();
    let mut op = WindowOperator::new("win", config(kind, 0), SumCount::default(), Box::new(backend));
    let mut entries = Vec::new();
    restored.scan_prefix(b"", &mut |k, v| entries.push((k.to_vec(), v.to_vec()))).expect("scan");
    assert!(!entries.is_empty(), "the first batch left open windows");
    for (key, value) in entries {
        op.store.backend.put(&key, &value).expect("put");
    }
    op.process(&batch(&second)).expect("process");
    let mut out = emitted(&op.on_watermark(19).expect("wm").main);
    out.sort();
    assert_eq!(out, expected, "the restored windows are read back and go on");
    assert!(tally.reads() > 0, "a backend with state the buffer lacks is read");

    // Emptied past its budget after every call: read again, still right.
    let backend = Counted::default();
    let tally = backend.tally.clone();
    let mut op =
        WindowOperator::new("win", config(kind, 0), SumCount::default(), Box::new(backend)).with_write_back_budget(0);
    assert_eq!(run(&mut op), expected);
    assert!(tally.reads() > 0, "an emptied buffer reads what it wrote back");
}

#[test]
fn sessions_merged_in_the_buffer_delete_nothing_from_the_backend_and_ones_it_got_are_deleted() {
    let (mut op, tally) = counted_operator(WindowKind::Session { gap_ms: 10 });
    // [1, 11) and [5, 15) merge; [20, 30) stays apart until 14 bridges them: [1, 30).
    for e in [ev(0, 1, 1), ev(0, 5, 1), ev(0, 20, 1), ev(0, 14, 1)] {
        op.process(&batch(&[e])).expect("process");
    }
    assert_eq!(tally.now(), (0, 0), "every merge stayed in the buffer");
    let staging = std::env::temp_dir();
    drop(op.snapshot(&staging).expect("snapshot"));
    assert_eq!(tally.now().0, 2, "the session's accumulator and the key's session set");
    op.process(&batch(&[ev(0, 29, 1)])).expect("process");
    assert_eq!(tally.now().1, 1, "[1, 30), which the backend got, merged into [1, 39)");
    let out = op.on_watermark(i64::MAX).expect("wm");
    assert_eq!(emitted(&out.main), vec![single(5, 5, 0, 1, 39)]);
    assert_eq!(tally.now().1, 2, "and the emptied session set; [1, 39) never reached the backend");
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
}

/// A hostile aggregate: every accumulator it returns is 64 KiB.
struct Bloat;

impl AggregateFn for Bloat {
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        Ok(Vec::new())
    }
    fn add(&mut self, _: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError> {
        let big = vec![7u8; 64 << 10];
        Ok(updates.iter().map(|_| big.as_slice()).collect())
    }
    fn merge(&mut self, a: &[u8], _: &[u8]) -> Result<Vec<u8>, OperatorError> {
        Ok(a.to_vec())
    }
    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError> {
        Ok(accs.iter().collect())
    }
}

#[test]
fn accumulators_past_the_state_limit_fail_the_step_when_written_back_and_the_buffer_stays_bounded() {
    let limits = eddy_state::StateLimits { max_bytes: 1 << 20, max_entries: u64::MAX };
    let bounded = || {
        let heap = Box::<HeapStateBackend>::default();
        Box::new(eddy_state::BoundedBackend::new(heap, limits, "raise `state_max_bytes`").expect("an empty backend"))
    };
    let kind = WindowKind::Tumbling { size_ms: 10 };
    // At a snapshot: 20 windows of 64 KiB (1.25 MiB) sit in the buffer until the barrier.
    let mut op = WindowOperator::new("win", config(kind, 0), Bloat, bounded());
    let events: Vec<Ev> = (0..20).map(|k| ev(k, 1, 1)).collect();
    op.process(&batch(&events)).expect("within the buffer's budget");
    let err = op.snapshot(&std::env::temp_dir()).expect_err("over the state limit");
    assert!(err.to_string().contains("raise `state_max_bytes`"), "says how to raise it: {err}");
    // Without a barrier: past its 8 MiB the buffer is written back within the call, so it
    // never holds more than its budget and one call's windows.
    let mut op = WindowOperator::new("win", config(kind, 0), Bloat, bounded());
    let events: Vec<Ev> = (0..=200).map(|k| ev(k as u8, 1, 1)).collect();
    let err = op.process(&batch(&events)).expect_err("over the state limit");
    assert!(err.to_string().contains("raise `state_max_bytes`"), "{err}");
}

#[test]
fn without_allowed_lateness_state_is_purged_when_the_window_fires() {
    let mut op = operator(WindowKind::Sliding { size_ms: 20, slide_ms: 10 }, 0, SumCount::default());
    op.process(&batch(&[ev(0, 15, 1)])).expect("process");
    assert_eq!(op.state().expect("written back").approximate_len(), 2, "[0, 20) and [10, 30)");
    let out = op.on_watermark(19).expect("wm");
    assert_eq!(emitted(&out.main), vec![single(1, 1, 0, 0, 20)]);
    assert_eq!(op.state().expect("written back").approximate_len(), 1);
    // 15 is still in the open [10, 30): not late, and the closed [0, 20) is skipped.
    let out = op.process(&batch(&[ev(0, 15, 2)])).expect("process");
    assert!(out.main.is_empty() && out.side(LATE).is_some_and(RecordBatch::is_empty));
    // 5 belongs to closed windows only.
    let out = op.process(&batch(&[ev(0, 5, 4)])).expect("process");
    assert_eq!(decode_events(out.side(LATE).expect("declared")), vec![ev(0, 5, 4)]);
    assert_eq!(emitted(&op.on_watermark(29).expect("wm").main), vec![single(2, 3, 0, 10, 30)]);
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
}

#[test]
fn dropped_late_records_are_counted_and_no_side_output_is_declared() {
    let mut op = WindowOperator::new(
        "win",
        WindowConfig {
            kind: WindowKind::Tumbling { size_ms: 10 },
            allowed_lateness_ms: 0,
            late_data: LateData::Drop,
            max_parallelism: 128,
            partial_input: false,
        },
        SumCount::default(),
        Box::new(HeapStateBackend::default()),
    );
    op.on_watermark(100).expect("wm");
    let out = op.process(&batch(&[ev(0, 5, 1), ev(0, 50, 1), ev(0, 150, 1)])).expect("process");
    assert!(out.side.is_empty() && out.main.is_empty());
    assert_eq!(op.late_records(), 2);
    assert_eq!(emitted(&op.on_watermark(i64::MAX).expect("wm").main), vec![single(1, 1, 0, 150, 160)]);
}

// ---------------------------------------------------------------------------------------------
// Sessions.

#[test]
fn sessions_merge_across_batches_and_absorbed_sessions_never_fire_alone() {
    let mut op = operator(WindowKind::Session { gap_ms: 10 }, 0, SumCount::default());
    op.process(&batch(&[ev(0, 0, 1), ev(0, 30, 2), ev(1, 0, 100)])).expect("process");
    op.process(&batch(&[ev(0, 15, 4)])).expect("process");
    // [0,10) [15,25) [30,40) for key 0; 10 touches [0,10) and overlaps [15,25).
    op.process(&batch(&[ev(0, 10, 8)])).expect("process");
    assert_eq!(
        op.state().expect("written back").approximate_len(),
        2 + 1 + 2,
        "two sessions of key 0, one of key 1, two sets"
    );
    // Key 1's [0, 10) fires at 10 (a record at 10 could still extend it); key 0's [0,10) was
    // absorbed into [0, 25) and must not fire on its old timer.
    assert!(emitted(&op.on_watermark(9).expect("wm").main).is_empty());
    assert_eq!(emitted(&op.on_watermark(10).expect("wm").main), vec![single(1, 100, 1, 0, 10)]);
    // 25 touches [0, 25) and overlaps [30, 40): everything is one session now.
    op.process(&batch(&[ev(0, 25, 16)])).expect("process");
    assert!(emitted(&op.on_watermark(39).expect("wm").main).is_empty());
    assert_eq!(emitted(&op.on_watermark(40).expect("wm").main), vec![single(5, 31, 0, 0, 40)]);
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
}

#[test]
fn a_record_at_a_sessions_end_still_extends_it() {
    let mut op = operator(WindowKind::Session { gap_ms: 10 }, 0, SumCount::default());
    op.process(&batch(&[ev(0, 0, 1)])).expect("process");
    // Watermark 9: times up to 9 are complete, but a record at 10 touches [0, 10).
    assert!(emitted(&op.on_watermark(9).expect("wm").main).is_empty());
    op.process(&batch(&[ev(0, 10, 2)])).expect("process");
    assert_eq!(emitted(&op.on_watermark(i64::MAX).expect("wm").main), vec![single(2, 3, 0, 0, 20)]);
}

#[test]
fn a_late_but_allowed_record_merges_fired_sessions_and_refires_the_merged_one() {
    let mut op = operator(WindowKind::Session { gap_ms: 10 }, 100, SumCount::default());
    op.process(&batch(&[ev(0, 0, 1), ev(0, 20, 2)])).expect("process");
    let out = op.on_watermark(30).expect("wm");
    assert_eq!(emitted(&out.main), vec![single(1, 1, 0, 0, 10), single(1, 2, 0, 20, 30)]);
    // [10, 20) touches both fired sessions: one merged result, fired at once.
    let out = op.process(&batch(&[ev(0, 10, 4)])).expect("process");
    assert_eq!(emitted(&out.main), vec![single(3, 7, 0, 0, 30)]);
    assert_eq!(op.state().expect("written back").approximate_len(), 2, "one accumulator and the session set");
    // The absorbed sessions' cleanups (110, 130) are replaced by the merged one's (130).
    assert!(emitted(&op.on_watermark(129).expect("wm").main).is_empty());
    assert_eq!(op.state().expect("written back").approximate_len(), 2);
    op.on_watermark(130).expect("wm");
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
    let out = op.process(&batch(&[ev(0, 5, 1)])).expect("process");
    assert_eq!(decode_events(out.side(LATE).expect("declared")), vec![ev(0, 5, 1)]);
}

// ---------------------------------------------------------------------------------------------
// The minimal cases of issue 10 (item 8), with the watermark `max - bound - 1` of each batch.

#[test]
fn a_session_record_behind_the_watermark_joins_an_open_session_instead_of_going_late() {
    // gap 200, bound 0, lateness 0, one record per batch: a@1000, a@1150, b@1301, a@1050.
    let (a, b) = (0, 1);
    let events = [ev(a, 1000, 1), ev(a, 1150, 2), ev(b, 1301, 4), ev(a, 1050, 8)];
    let run = drive(WindowKind::Session { gap_ms: 200 }, 0, 0, &events, &[1]);
    // Watermarks met: none yet, then 1000-1, 1150-1, 1301-1.
    assert_eq!(run.watermark_at_arrival, vec![WATERMARK_MIN, 999, 1149, 1300]);
    // a@1050's own [1050, 1250) is behind 1300, but it lies inside a's open [1000, 1350).
    assert!(run.late.is_empty(), "late: {:?}", run.late);
    assert_eq!(run.results, vec![single(3, 11, a, 1000, 1350), single(1, 4, b, 1301, 1501)]);
}

#[test]
fn each_late_but_allowed_record_refires_its_window_at_batch_size_1() {
    // Tumbling 1000, bound 0, lateness 1000, one record per batch.
    let (a, b) = (0, 1);
    let events = [ev(a, 100, 1), ev(b, 1000, 1), ev(a, 200, 1), ev(a, 300, 1), ev(b, 1001, 1), ev(a, 400, 1)];
    let run = drive(WindowKind::Tumbling { size_ms: 1000 }, 1000, 0, &events, &[1]);
    // By hand:  record   watermark met   emitted
    //           a@100    MIN             -            then watermark 99
    //           b@1000   99              -            then watermark 999: a [0,1000) = 1
    //           a@200    999             a [0,1000) = 2 (late, allowed: 999 + 1000 > 999)
    //           a@300    999             a [0,1000) = 3
    //           b@1001   999             -            then watermark 1000
    //           a@400    1000            a [0,1000) = 4 (1000 < 1999)
    //           end      i64::MAX        b [1000,2000) = 2
    assert_eq!(run.watermark_at_arrival, vec![WATERMARK_MIN, 99, 999, 999, 999, 1000]);
    let w = |start: i64| Window { start, end: start + 1000 };
    let table: Vec<(String, Window, i64)> = run.in_order.iter().map(|e| (e.key.clone(), e.window, e.count)).collect();
    let k = |key: u8| String::from_utf8(key_bytes(key)).expect("utf8");
    assert_eq!(table, vec![(k(a), w(0), 1), (k(a), w(0), 2), (k(a), w(0), 3), (k(a), w(0), 4), (k(b), w(1000), 2)]);
    assert!(run.late.is_empty());
}

#[test]
fn late_but_allowed_records_in_one_batch_each_refire_their_window() {
    // Tumbling: a fired window re-fires once per late record, whatever the batching.
    let mut op = operator(WindowKind::Tumbling { size_ms: 1000 }, 1000, SumCount::default());
    op.process(&batch(&[ev(0, 100, 1), ev(1, 1000, 1)])).expect("process");
    assert_eq!(emitted(&op.on_watermark(999).expect("wm").main), vec![single(1, 1, 0, 0, 1000)]);
    let out = op.process(&batch(&[ev(0, 200, 2), ev(1, 1001, 1), ev(0, 300, 4)])).expect("process");
    assert_eq!(emitted(&out.main), vec![single(2, 3, 0, 0, 1000), single(3, 7, 0, 0, 1000)]);

    // Sliding: a record re-fires every fired window it belongs to.
    let mut op = operator(WindowKind::Sliding { size_ms: 20, slide_ms: 10 }, 100, SumCount::default());
    op.process(&batch(&[ev(0, 15, 1)])).expect("process");
    assert_eq!(emitted(&op.on_watermark(40).expect("wm").main), vec![single(1, 1, 0, 0, 20), single(1, 1, 0, 10, 30)]);
    let out = op.process(&batch(&[ev(0, 12, 2), ev(0, 18, 4)])).expect("process");
    assert_eq!(
        emitted(&out.main),
        vec![single(2, 3, 0, 0, 20), single(2, 3, 0, 10, 30), single(3, 7, 0, 0, 20), single(3, 7, 0, 10, 30),]
    );

    // Sessions: each record re-fires the session it made, with the shape it had then.
    let mut op = operator(WindowKind::Session { gap_ms: 10 }, 100, SumCount::default());
    op.process(&batch(&[ev(0, 0, 1), ev(0, 20, 2)])).expect("process");
    assert_eq!(emitted(&op.on_watermark(30).expect("wm").main), vec![single(1, 1, 0, 0, 10), single(1, 2, 0, 20, 30)]);
    let out = op.process(&batch(&[ev(0, 5, 4), ev(0, 15, 8)])).expect("process");
    assert_eq!(emitted(&out.main), vec![single(2, 5, 0, 0, 15), single(4, 15, 0, 0, 30)]);
    assert!(emitted(&op.on_watermark(i64::MAX).expect("wm").main).is_empty());
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
}

/// Small windows of each kind, for the edges of time.
const ONE_OF_EACH: [WindowKind; 3] = [
    WindowKind::Tumbling { size_ms: 10 },
    WindowKind::Sliding { size_ms: 20, slide_ms: 10 },
    WindowKind::Session { gap_ms: 10 },
];

#[test]
fn a_record_whose_window_would_leave_i64_goes_to_the_late_output() {
    for kind in ONE_OF_EACH {
        let mut op = operator(kind, 0, SumCount::default());
        let extreme = [ev(0, i64::MAX - 3, 1), ev(1, i64::MIN + 3, 2), ev(2, i64::MAX, 4)];
        let late: Vec<Ev> = match kind {
            // A session starts at its record: [MIN + 3, MIN + 13) fits.
            WindowKind::Session { .. } => vec![extreme[0], extreme[2]],
            _ => extreme.to_vec(),
        };
        let mut records = extreme.to_vec();
        records.insert(1, ev(3, 5, 8));
        let out = op.process(&batch(&records)).expect("an extreme timestamp does not fail the job");
        assert_eq!(decode_events(out.side(LATE).expect("declared")), late, "{kind:?}");
        assert_eq!(op.late_records(), late.len() as u64, "{kind:?}");
        let results = emitted(&op.on_watermark(i64::MAX).expect("wm").main);
        assert!(results.iter().any(|r| r.key == "\"k3\"" && r.sum == 8), "{kind:?}: {results:?}");
        assert_eq!(op.state().expect("written back").approximate_len(), 0, "{kind:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Grouping, result shape, restore, bad input, limits.

#[test]
fn records_are_added_once_per_key_and_window_in_arrival_order() {
    let mut op = operator(WindowKind::Tumbling { size_ms: 10 }, 0, Concat::default());
    op.process(&batch(&[ev(0, 1, 1), ev(1, 2, 2), ev(0, 3, 3), ev(0, 15, 4), ev(1, 4, 5), ev(0, 5, 6)]))
        .expect("process");
    assert_eq!((op.aggregate().adds.calls, op.aggregate().adds.groups), (1, 3));
    let out = op.on_watermark(i64::MAX).expect("wm");
    let results: Vec<(Vec<u8>, Value)> =
        out.main.iter().map(|r| (r.key.expect("key").to_vec(), json_of(r.value).expect("json"))).collect();
    assert_eq!(
        results,
        vec![
            (key_bytes(0), json!({"start": 0, "end": 10, "result": [1, 3, 6]})),
            (key_bytes(1), json!({"start": 0, "end": 10, "result": [2, 5]})),
            (key_bytes(0), json!({"start": 10, "end": 20, "result": [4]})),
        ]
    );

    let mut sessions = operator(WindowKind::Session { gap_ms: 10 }, 0, Concat::default());
    sessions.process(&batch(&[ev(0, 0, 1), ev(0, 20, 2), ev(0, 5, 3), ev(0, 12, 4)])).expect("process");
    assert_eq!(sessions.aggregate().adds.groups, 1, "the batch's sessions merge before the one add");
    let out = sessions.on_watermark(i64::MAX).expect("wm");
    assert_eq!(json_of(out.main.get(0).expect("one").value).expect("json")["result"], json!([1, 2, 3, 4]));
}

/// Remembers each `add`'s updates as (first record, record count, whether the update reuses
/// the run of the one before it: the same slice).
#[derive(Debug, Default)]
struct Runs(Vec<Vec<(u32, usize, bool)>>);

impl AggregateFn for Runs {
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        Ok(Vec::new())
    }
    fn add(&mut self, _: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError> {
        let mut before: Option<&[u32]> = None;
        let runs = updates
            .iter()
            .map(|u| {
                let shared = before.is_some_and(|b| std::ptr::eq(b, u.records));
                before = Some(u.records);
                (u.records.first().copied().unwrap_or(u32::MAX), u.records.len(), shared)
            })
            .collect();
        self.0.push(runs);
        Ok(updates.iter().map(|u| u.accumulator).collect())
    }
    fn merge(&mut self, a: &[u8], _: &[u8]) -> Result<Vec<u8>, OperatorError> {
        Ok(a.to_vec())
    }
    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError> {
        Ok(accs.clone())
    }
}

/// A key's sliding windows covering the same panes of a batch get one run of records: records
/// at 1 and 3 (panes [0, 2) and [2, 4) of 10 ms windows sliding by 2) give six windows, the
/// first holding only the first pane, four both, the last only the second.
#[test]
fn sliding_windows_covering_the_same_panes_share_one_run() {
    let mut op = operator(WindowKind::Sliding { size_ms: 10, slide_ms: 2 }, 0, Runs::default());
    op.process(&batch(&[ev(0, 3, 0), ev(0, 1, 1)])).expect("process");
    let expected = vec![(1, 1, false), (0, 2, false), (0, 2, true), (0, 2, true), (0, 2, true), (0, 1, false)];
    assert_eq!(op.aggregate().0, vec![expected]);
}

#[test]
fn results_are_embedded_as_json_or_as_a_string() {
    let cases: [(&'static [u8], Value); 5] = [
        (b" {\"a\": [1, 2]} ", json!({"a": [1, 2]})),
        (b"42", json!(42)),
        (b"not json", json!("not json")),
        (b"", json!("")),
        (b"\xff\"x", json!("\u{fffd}\"x")),
    ];
    for (result, expected) in cases {
        let mut op = operator(WindowKind::Tumbling { size_ms: 10 }, 0, Fixed(result));
        op.process(&batch(&[ev(0, -3, 0)])).expect("process");
        let out = op.on_watermark(i64::MAX).expect("wm");
        let record = out.main.get(0).expect("one result");
        assert_eq!(record.timestamp, Some(-1));
        assert_eq!(json_of(record.value).expect("JSON"), json!({"start": -10, "end": 0, "result": expected}));
    }
}

#[test]
fn a_restored_operator_fires_what_was_pending_and_not_what_already_fired() {
    let kind = WindowKind::Tumbling { size_ms: 10 };
    let mut op = operator(kind, 50, SumCount::default());
    op.process(&batch(&[ev(0, 1, 1), ev(0, 11, 2), ev(1, 25, 3)])).expect("process");
    assert_eq!(emitted(&op.on_watermark(9).expect("wm").main), vec![single(1, 1, 0, 0, 10)]);
    let state = op.into_state().expect("written back");

    let mut restored = WindowOperator::new("win", config(kind, 50), SumCount::default(), state);
    let out = restored.on_watermark(i64::MAX).expect("wm");
    assert_eq!(emitted(&out.main), vec![single(1, 2, 0, 10, 20), single(1, 3, 1, 20, 30)]);
    assert_eq!(
        restored.state().expect("written back").approximate_len(),
        0,
        "the fired window's cleanup was restored too"
    );
}

/// Without allowed lateness one timer queue serves firing and purging; a window restored
/// from a run that had lateness, and already fired, is then only purged.
#[test]
fn a_fired_window_restored_without_lateness_is_purged_and_not_fired_again() {
    for kind in [WindowKind::Tumbling { size_ms: 10 }, WindowKind::Session { gap_ms: 10 }] {
        let mut op = operator(kind, 50, SumCount::default());
        op.process(&batch(&[ev(0, 1, 1), ev(1, 30, 2)])).expect("process");
        assert_eq!(emitted(&op.on_watermark(12).expect("wm").main).len(), 1, "{kind:?}: key 0's window fired");
        let state = op.into_state().expect("written back");

        let mut restored = WindowOperator::new("win", config(kind, 0), SumCount::default(), state);
        let out = restored.on_watermark(i64::MAX).expect("wm");
        let fired = emitted(&out.main);
        assert_eq!(fired.len(), 1, "{kind:?}: only key 1's pending window fires: {fired:?}");
        assert_eq!(restored.state().expect("written back").approximate_len(), 0, "{kind:?}: both purged");
    }
}

#[test]
fn records_without_key_or_timestamp_are_rejected_naming_the_operator_and_the_fix() {
    let mut op = operator(WindowKind::Tumbling { size_ms: 10 }, 0, SumCount::default());
    let mut no_key = batch(&[ev(0, 1, 1)]);
    no_key.push(None, b"{\"v\":1}", Some(2));
    let err = op.process(&no_key).expect_err("no key");
    let text = err.to_string();
    assert!(matches!(&err, OperatorError::BadRecord { operator, .. } if operator == "win"), "{err:?}");
    assert!(text.contains("`win`") && text.contains("record 1") && text.contains("key_by"), "{text}");

    let mut no_ts = RecordBatch::default();
    no_ts.push(Some(b"\"k0\""), b"{\"v\":1}", None);
    let err = op.process(&no_ts).expect_err("no timestamp");
    let text = err.to_string();
    assert!(matches!(&err, OperatorError::BadRecord { operator, .. } if operator == "win"), "{err:?}");
    assert!(text.contains("record 0") && text.contains("timestamp") && text.contains("source"), "{text}");

    // A rejected batch changes nothing, not even its valid records.
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
    assert!(op.on_watermark(i64::MAX).expect("wm").main.is_empty());
}

#[test]
fn the_final_watermark_fires_windows_at_the_end_of_time_without_overflow() {
    for kind in ONE_OF_EACH {
        let mut op = operator(kind, i64::MAX, SumCount::default());
        // The extreme timestamps whose windows still fit in i64.
        let reach = match kind {
            WindowKind::Tumbling { size_ms } | WindowKind::Sliding { size_ms, .. } => size_ms,
            WindowKind::Session { gap_ms } => gap_ms,
        };
        let (high, low) = (i64::MAX - reach, i64::MIN + reach);
        op.process(&batch(&[ev(0, high, 1), ev(0, low, 2)])).expect("process");
        let mut results = emitted(&op.on_watermark(i64::MAX - 1).expect("wm").main);
        results.extend(emitted(&op.on_watermark(i64::MAX).expect("final watermark").main));
        for t in [high, low] {
            assert!(results.iter().any(|r| r.window.start <= t && t < r.window.end), "{kind:?} {t}: {results:?}");
        }
        assert_eq!(op.state().expect("written back").approximate_len(), 0, "{kind:?}");
        assert!(op.finish().expect("finish").main.is_empty());
        assert!(op.on_processing_time(i64::MAX).expect("tick").main.is_empty());
    }
}

/// Answers every `add` with one accumulator too few.
#[derive(Debug)]
struct OneShort;

impl AggregateFn for OneShort {
    fn create_accumulator(&mut self) -> Result<Vec<u8>, OperatorError> {
        Ok(Vec::new())
    }
    fn add(&mut self, _: &RecordBatch, updates: &[AccumulatorUpdate<'_>]) -> Result<Items, OperatorError> {
        Ok(updates.iter().skip(1).map(|u| u.accumulator).collect())
    }
    fn merge(&mut self, a: &[u8], _: &[u8]) -> Result<Vec<u8>, OperatorError> {
        Ok(a.to_vec())
    }
    fn results(&mut self, accs: &Items) -> Result<Items, OperatorError> {
        Ok(accs.clone())
    }
}

#[test]
fn an_aggregate_answering_too_few_accumulators_fails_the_step_naming_it() {
    let mut op = operator(WindowKind::Tumbling { size_ms: 10 }, 0, OneShort);
    let err = op.process(&batch(&[Ev { key: 1, ts: 1, v: 1 }, Ev { key: 2, ts: 2, v: 1 }])).expect_err("one short");
    assert!(err.to_string().contains("returned 1 accumulators for 2 windows"), "{err}");
}

#[test]
fn damaged_state_is_an_error_not_a_panic() {
    let mut backend = HeapStateBackend::default();
    let mut keys = StateKey::default();
    backend.put(keys.encode(HashedKey::new(b"\"k0\"", 128), state_id(ACC_STATE), b"short"), b"\x01{}").expect("put");
    let mut op = WindowOperator::new(
        "win",
        config(WindowKind::Tumbling { size_ms: 10 }, 0),
        SumCount::default(),
        Box::new(backend),
    );
    let err = op.on_watermark(5).expect_err("damaged");
    assert!(matches!(&err, OperatorError::State { operator, .. } if operator == "win"), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// The real Wasm aggregate.

fn runtime() -> &'static eddy_runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<eddy_runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        let cache = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/eddy-test-cache");
        eddy_runtime::Runtime::new(eddy_runtime::RuntimeConfig {
            cache_dir: Some(cache),
            ..eddy_runtime::RuntimeConfig::default()
        })
        .expect("runtime")
    })
}

fn purchase_totals() -> AggregateInstance {
    let component = runtime()
        .load_file("purchase-totals", std::path::Path::new(eddy_guest_artifacts::PURCHASE_TOTALS))
        .expect("load purchase-totals");
    let mut instance = component.instantiate_aggregate().expect("instantiate");
    instance.open("null").expect("open");
    instance
}

#[test]
fn hourly_purchase_totals_through_the_wasm_aggregate_equal_a_hand_sum() {
    const HOUR: i64 = 3_600_000;
    let mut op = WindowOperator::new(
        "hourly-totals",
        config(WindowKind::Tumbling { size_ms: HOUR }, 0),
        purchase_totals(),
        Box::new(HeapStateBackend::default()),
    );
    // (user, minute of the day, cents), slightly out of order.
    let purchases: [(&str, i64, i64); 9] = [
        ("alice", 5, 1_250),
        ("bob", 12, 999),
        ("alice", 59, 100),
        ("alice", 61, 5_000),
        ("bob", 3, 1),
        ("carol", 119, 42),
        ("alice", 70, 250),
        ("bob", 118, 10_000),
        ("alice", 30, 7),
    ];
    let mut records = RecordBatch::default();
    for (user, minute, cents) in purchases {
        let key = serde_json::to_vec(user).expect("key");
        let value = json!({"user_id": user, "amount_cents": cents}).to_string();
        records.push(Some(&key), value.as_bytes(), Some(minute * 60_000));
    }
    assert!(op.process(&records).expect("process").main.is_empty());
    let first_hour = op.on_watermark(HOUR - 1).expect("first hour").main;
    let mut results: Vec<(String, i64, Value)> = Vec::new();
    for batch in [first_hour, op.on_watermark(i64::MAX).expect("final").main] {
        for r in batch.iter() {
            let v = json_of(r.value).expect("json");
            let user: String = serde_json::from_slice(r.key.expect("key")).expect("key is JSON");
            results.push((user, v["start"].as_i64().expect("start") / HOUR, v["result"].clone()));
        }
    }
    // By hand: hour 0: alice 1250+100+7, bob 999+1; hour 1: alice 5000+250, bob 10000, carol 42.
    assert_eq!(
        results,
        vec![
            ("alice".into(), 0, json!({"purchases": 3, "total_cents": 1_357})),
            ("bob".into(), 0, json!({"purchases": 2, "total_cents": 1_000})),
            ("alice".into(), 1, json!({"purchases": 2, "total_cents": 5_250})),
            ("bob".into(), 1, json!({"purchases": 1, "total_cents": 10_000})),
            ("carol".into(), 1, json!({"purchases": 1, "total_cents": 42})),
        ]
    );
    assert_eq!(op.state().expect("written back").approximate_len(), 0);
}

#[test]
fn a_wasm_aggregate_error_surfaces_as_a_call_error() {
    let mut op = operator(WindowKind::Tumbling { size_ms: 10 }, 0, purchase_totals());
    let mut records = RecordBatch::default();
    records.push(Some(b"\"u\""), br#"{"user_id": "u"}"#, Some(1));
    let err = op.process(&records).expect_err("no amount_cents");
    assert!(matches!(err, OperatorError::Call(_)), "{err:?}");
    assert!(err.to_string().contains("amount_cents"), "{err}");
}
