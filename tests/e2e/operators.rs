//! The example operators against oracles computed another way: plain Rust over the same input.

use std::collections::{BTreeMap, HashMap};

use eddy_core::{KeyGroupRange, RecordBatch, TimeDomain, key_group_of};
use eddy_guest_artifacts as guests;
use eddy_runtime::{AccumulatorUpdate, AggregateInstance, CallError, CallErrorKind, OperatorInstance, Subtask};
use eddy_tests::{decode, json_batch, load, open_operator};
use proptest::prelude::*;
use serde_json::json;

const MAX_PARALLELISM: u32 = 128;

/// The word-count oracle: its own tokenizer, not the guest's.
fn oracle_counts(lines: &[String]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in lines {
        let mut word = String::new();
        for c in line.chars().chain(std::iter::once(' ')) {
            if c.is_alphanumeric() {
                word.extend(c.to_lowercase());
            } else if !word.is_empty() {
                *counts.entry(std::mem::take(&mut word)).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// Runs split, then key_by word into `parallelism` counter subtasks; returns the last count
/// each word reached.
fn word_count(lines: &[String], parallelism: u32, batch_size: usize) -> BTreeMap<String, u64> {
    let split = load("split", guests::WORDCOUNT_SPLIT);
    let count = load("count", guests::WORDCOUNT_COUNT);
    let mut splitter = open_operator(&split, Subtask::single(MAX_PARALLELISM), "null");
    let mut counters: Vec<OperatorInstance> = (0..parallelism)
        .map(|index| open_operator(&count, Subtask { index, parallelism, max_parallelism: MAX_PARALLELISM }, "null"))
        .collect();
    let mut last = BTreeMap::new();
    for chunk in lines.chunks(batch_size.max(1)) {
        let input = json_batch(&chunk.iter().map(|l| (None::<()>, l)).collect::<Vec<_>>());
        let words = splitter.process(&input).expect("split");
        // key_by: route each record to the subtask owning its key group.
        let mut routed = vec![RecordBatch::default(); parallelism as usize];
        for r in words.main.iter() {
            let group = key_group_of(r.key.expect("split emits keyed records"), MAX_PARALLELISM);
            routed[KeyGroupRange::subtask_of(group, MAX_PARALLELISM, parallelism) as usize].push_view(&r);
        }
        for (counter, batch) in counters.iter_mut().zip(&routed) {
            for (word, n) in decode::<String, u64>(&counter.process(batch).expect("count").main) {
                last.insert(word.expect("keyed"), n);
            }
        }
    }
    last
}

fn text() -> impl Strategy<Value = Vec<String>> {
    let word = prop_oneof![Just("the"), Just("Quick"), Just("brown"), Just("fox"), Just("ÉTÉ"), Just("x1"), Just("a")];
    let sep = prop_oneof![Just(" "), Just(", "), Just("-"), Just("\t"), Just("!? ")];
    proptest::collection::vec(proptest::collection::vec((word, sep), 0..12), 0..40)
        .prop_map(|lines| lines.into_iter().map(|l| l.into_iter().map(|(w, s)| format!("{w}{s}")).collect()).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn word_count_matches_the_oracle_at_parallelism_1_and_4(lines in text(), batch_size in 1usize..50) {
        let expected = oracle_counts(&lines);
        prop_assert_eq!(word_count(&lines, 1, batch_size), expected.clone());
        prop_assert_eq!(word_count(&lines, 4, batch_size), expected);
    }
}

#[test]
fn a_record_of_a_foreign_key_group_never_reaches_the_guest() {
    let count = load("count", guests::WORDCOUNT_COUNT);
    let mut subtask0 =
        open_operator(&count, Subtask { index: 0, parallelism: 2, max_parallelism: MAX_PARALLELISM }, "null");
    let foreign = (0..1000)
        .map(|i| format!("w{i}"))
        .find(|w| {
            let key = serde_json::to_vec(w).expect("json");
            !Subtask { index: 0, parallelism: 2, max_parallelism: MAX_PARALLELISM }
                .key_groups()
                .contains(key_group_of(&key, MAX_PARALLELISM))
        })
        .expect("some key lands on subtask 1");
    let err = subtask0.process(&json_batch(&[(Some(foreign), 1u64)])).expect_err("misrouted");
    assert!(matches!(err.kind, CallErrorKind::Internal(ref m) if m.contains("outside this subtask's range")), "{err}");
    assert_eq!(subtask0.state_backend().approximate_len(), 0, "nothing was written");
}

#[test]
fn state_is_scoped_per_key_and_survives_across_batches() {
    let count = load("count", guests::WORDCOUNT_COUNT);
    let mut op = open_operator(&count, Subtask::single(MAX_PARALLELISM), "null");
    let out1 = op.process(&json_batch(&[(Some("a"), 2u64), (Some("b"), 1), (Some("a"), 3)])).expect("batch 1");
    let out2 = op.process(&json_batch(&[(Some("b"), 10u64)])).expect("batch 2");
    let got: Vec<_> = decode::<String, u64>(&out1.main).into_iter().chain(decode(&out2.main)).collect();
    let want = [("a", 2), ("b", 1), ("a", 5), ("b", 11)].map(|(k, v)| (Some(k.to_owned()), v));
    assert_eq!(got, want);
    assert_eq!(op.state_backend().approximate_len(), 2, "one value-state entry per key");
}

#[test]
fn list_and_map_state_behave_like_their_oracles() {
    let guest = load("list-map", guests::HOSTILE);
    let mut op = open_operator(&guest, Subtask::single(MAX_PARALLELISM), r#"{"mode": "list-map"}"#);
    let input = [("k1", "x"), ("k2", "y"), ("k1", "y"), ("k1", "x"), ("k2", "clear"), ("k2", "z")];
    let mut lists: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut counts: HashMap<&str, BTreeMap<String, u64>> = HashMap::new();
    for (key, value) in input {
        let out = op.process(&json_batch(&[(Some(key), value)])).expect("process");
        if value == "clear" {
            lists.remove(key);
            counts.remove(key);
        } else {
            lists.entry(key).or_default().push(value);
            *counts.entry(key).or_default().entry(serde_json::to_string(value).expect("json")).or_default() += 1;
        }
        let map: Vec<_> = counts
            .get(key)
            .into_iter()
            .flatten()
            .map(|(k, n)| json!([serde_json::from_str::<String>(k).expect("json"), n]))
            .collect();
        let expected = json!({ "list": lists.get(key).cloned().unwrap_or_default(), "map": map });
        assert_eq!(
            decode::<String, serde_json::Value>(&out.main),
            vec![(Some(key.to_owned()), expected)],
            "after {key}={value}"
        );
    }
}

/// One update over all of `batch`'s records.
fn add_all(agg: &mut AggregateInstance, acc: &[u8], batch: &RecordBatch) -> Result<Vec<u8>, CallError> {
    let records: Vec<u32> = (0..batch.len() as u32).collect();
    let accs = agg.add(batch, &[AccumulatorUpdate { accumulator: acc, records: &records }])?;
    Ok(accs.get(0).expect("the runtime checks: one accumulator per update").to_vec())
}

fn purchase_batch(amounts: &[i64]) -> RecordBatch {
    json_batch(&amounts.iter().map(|c| (Some("u1"), json!({"user_id": "u1", "amount_cents": c}))).collect::<Vec<_>>())
}

#[test]
fn purchase_totals_equal_a_batch_sum_however_records_are_grouped_and_merged() {
    let totals = load("totals", guests::PURCHASE_TOTALS);
    let mut agg = totals.instantiate_aggregate().expect("instantiate");
    agg.open("null").expect("open");
    let purchases: Vec<i64> = (0..200).map(|i| (i * 7919 % 10_007) - 300).collect();
    let empty = agg.create_accumulator().expect("create");
    // Three partial accumulators built from different groupings, then merged: the window
    // operator folds many windows per call, pre-aggregates panes and merges sessions.
    let mut left = empty.clone();
    for chunk in purchases[..77].chunks(13) {
        left = add_all(&mut agg, &left, &purchase_batch(chunk)).expect("add");
    }
    // One call, three interleaved groups of one batch.
    let middle_batch = purchase_batch(&purchases[77..150]);
    let groups: Vec<Vec<u32>> =
        (0..3u32).map(|g| (0..middle_batch.len() as u32).filter(|i| i % 3 == g).collect()).collect();
    let updates: Vec<AccumulatorUpdate<'_>> =
        groups.iter().map(|records| AccumulatorUpdate { accumulator: &empty, records }).collect();
    let middle = agg.add(&middle_batch, &updates).expect("add");
    assert_eq!(middle.len(), 3, "one accumulator per update");
    let right = add_all(&mut agg, &empty, &purchase_batch(&purchases[150..])).expect("add");
    let mut merged = agg.merge(&right, &left).expect("merge");
    for part in middle.iter() {
        merged = agg.merge(&merged, part).expect("merge");
    }
    let results = agg.results(&[&merged[..], &empty].into_iter().collect()).expect("results");
    let results: Vec<serde_json::Value> = results.iter().map(eddy_tests::value_json).collect();
    assert_eq!(
        results,
        vec![
            json!({"purchases": purchases.len(), "total_cents": purchases.iter().sum::<i64>()}),
            json!({"purchases": 0, "total_cents": 0}),
        ]
    );
}

#[test]
fn an_aggregate_rejects_a_malformed_record_with_an_operator_error() {
    let totals = load("totals", guests::PURCHASE_TOTALS);
    let mut agg = totals.instantiate_aggregate().expect("instantiate");
    agg.open("null").expect("open");
    let acc = agg.create_accumulator().expect("create");
    let err = add_all(&mut agg, &acc, &json_batch(&[(Some("u1"), json!({"user_id": "u1"}))])).expect_err("bad record");
    assert!(matches!(err.kind, CallErrorKind::Operator { .. }), "{err}");
    assert!(err.to_string().contains("amount_cents"), "names the missing field: {err}");
}

/// One transaction of the fraud scenario: (processing time ms, account, amount in cents).
type Tx = (i64, u64, i64);

/// The fraud rule, computed directly.
fn oracle_alerts(txs: &[Tx]) -> Vec<(u64, i64)> {
    let mut flagged_until: HashMap<u64, i64> = HashMap::new();
    let mut alerts = Vec::new();
    for &(now, account, amount) in txs {
        if flagged_until.get(&account).is_some_and(|&until| until <= now) {
            flagged_until.remove(&account); // the clearing timer fired
        }
        if flagged_until.remove(&account).is_some() && amount > 50_000 {
            alerts.push((account, amount));
        }
        if amount < 100 {
            flagged_until.insert(account, now + 60_000);
        }
    }
    alerts
}

/// Drives the detector like the engine would: advance processing time, fire due timers, then
/// process the record.
fn run_detector(txs: &[Tx]) -> Vec<(u64, i64)> {
    let detector = load("fraud", guests::FRAUD_DETECTOR);
    let mut op = open_operator(&detector, Subtask::single(MAX_PARALLELISM), "null");
    let mut alerts = Vec::new();
    for &(now, account, amount) in txs {
        let fired = op.timer_service().advance_processing_time(now);
        assert!(fired.iter().all(|t| t.domain == TimeDomain::ProcessingTime));
        if !fired.is_empty() {
            assert!(op.on_timers(&fired).expect("on_timer").main.is_empty());
        }
        let out = op
            .process(&json_batch(&[(Some(account), json!({"account_id": account, "amount_cents": amount}))]))
            .expect("process");
        for (_, alert) in decode::<u64, serde_json::Value>(&out.main) {
            alerts.push((alert["account_id"].as_u64().expect("id"), alert["amount_cents"].as_i64().expect("amount")));
        }
    }
    alerts
}

#[test]
fn fraud_detector_flags_small_then_large_within_a_minute_only() {
    let txs = [
        (1_000, 1, 50),      // small: account 1 flagged until 61_000
        (30_000, 1, 90_000), // large within the minute: alert
        (31_000, 2, 10),     // small: account 2 flagged until 91_000
        (95_000, 2, 90_000), // too late: the timer cleared the flag at 91_000
        (96_000, 3, 90_000), // large without a small one first
    ];
    assert_eq!(run_detector(&txs), vec![(1, 90_000)]);
    assert_eq!(oracle_alerts(&txs), vec![(1, 90_000)]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn fraud_detector_matches_the_oracle(steps in proptest::collection::vec((0i64..40_000, 0u64..4, prop_oneof![0i64..100, 100i64..60_000, 50_001i64..100_000]), 1..60)) {
        let mut now = 0;
        let txs: Vec<Tx> = steps.into_iter().map(|(dt, account, amount)| { now += dt; (now, account, amount) }).collect();
        prop_assert_eq!(run_detector(&txs), oracle_alerts(&txs));
    }
}
