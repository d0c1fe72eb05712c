//! The shipped example pipelines (`examples/*/pipeline.yaml`, what `eddy run` runs) produce
//! what an independent computation over their input files says they must.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use eddy_engine::{Job, JobOptions};
use eddy_plan::PipelineSpec;
use eddy_tests::{MemorySink, runtime};
use serde_json::Value;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name)
}

/// The pipeline files of an example, one per language its operators are written in: the
/// same job, which must meet the same oracle in every language.
const LANGUAGES: &[&str] =
    &["pipeline.yaml", "pipeline-python.yaml", "pipeline-js.yaml", "pipeline-ts.yaml", "pipeline-go.yaml"];

/// Runs one of an example's pipeline files into memory: (side output, key JSON, value JSON).
fn run_pipeline(name: &str, file: &str) -> Vec<(Option<String>, Value, Value)> {
    let spec = PipelineSpec::from_file(&example(name).join(file)).expect("example spec is valid");
    let sink = MemorySink::default();
    let received = sink.received.clone();
    let options = JobOptions { sink: Some(Box::new(sink)), ..JobOptions::default() };
    let summary = Job::start(&spec, runtime(), options).expect("starts").wait().expect("runs");
    assert!(summary.finished);
    let out = received.lock().expect("lock").clone();
    out.into_iter()
        .map(|(side, r)| {
            let key = r.key.map_or(Value::Null, |k| serde_json::from_slice(&k).expect("key JSON"));
            (side, key, eddy_tests::value_json(&r.value))
        })
        .collect()
}

fn input(name: &str, file: &str) -> Vec<Value> {
    std::fs::read_to_string(example(name).join(file))
        .expect("example input")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("input JSON"))
        .collect()
}

#[test]
fn word_count_example() {
    let text = std::fs::read_to_string(example("wordcount").join("input.txt")).expect("input");
    let mut oracle: BTreeMap<String, u64> = BTreeMap::new();
    for w in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        *oracle.entry(w.to_lowercase()).or_default() += 1;
    }
    for file in LANGUAGES {
        let mut last = BTreeMap::new();
        for (_, key, value) in run_pipeline("wordcount", file) {
            last.insert(key.as_str().expect("word").to_string(), value.as_u64().expect("count"));
        }
        assert_eq!(last, oracle, "{file}");
    }
}

#[test]
fn hourly_purchase_totals_example() {
    const HOUR: i64 = 3_600_000;
    const BOUND: i64 = 5_000;
    // One record per batch: the watermark trails the largest time seen so far by the bound.
    let (mut max_seen, mut late, mut totals) = (i64::MIN, BTreeSet::new(), BTreeMap::new());
    for p in input("purchase-totals", "purchases.jsonl") {
        let (user, amount, ts) = (
            p["user_id"].as_str().expect("user").to_string(),
            p["amount_cents"].as_i64().expect("amount"),
            p["ts"].as_i64().expect("ts"),
        );
        let watermark = max_seen.saturating_sub(BOUND + 1);
        let start = ts - ts.rem_euclid(HOUR);
        if start + HOUR - 1 <= watermark {
            late.insert((user, amount, ts));
        } else {
            let e: &mut (u64, i64) = totals.entry((user, start)).or_default();
            e.0 += 1;
            e.1 += amount;
        }
        max_seen = max_seen.max(ts);
    }
    assert_eq!(late.len(), 1, "the example shows one late purchase");
    for file in LANGUAGES {
        let (got_late, got_totals) = purchase_totals_of(run_pipeline("purchase-totals", file));
        assert_eq!(got_late, late, "{file}");
        assert_eq!(got_totals, totals, "{file}");
    }
}

type Late = BTreeSet<(String, i64, i64)>;
type Hourly = BTreeMap<(String, i64), (u64, i64)>;

/// The late purchases and the (user, hour) totals a purchase-totals run emitted.
fn purchase_totals_of(out: Vec<(Option<String>, Value, Value)>) -> (Late, Hourly) {
    let (mut got_late, mut got_totals) = (BTreeSet::new(), BTreeMap::new());
    for (side, key, v) in out {
        match side.as_deref() {
            Some("late") => {
                got_late.insert((
                    v["user_id"].as_str().expect("u").to_string(),
                    v["amount_cents"].as_i64().expect("a"),
                    v["ts"].as_i64().expect("t"),
                ));
            }
            None => {
                let k = (key.as_str().expect("user").to_string(), v["start"].as_i64().expect("start"));
                let r =
                    (v["result"]["purchases"].as_u64().expect("n"), v["result"]["total_cents"].as_i64().expect("t"));
                assert!(got_totals.insert(k, r).is_none(), "one result per user and hour");
            }
            Some(other) => panic!("unexpected side output {other}"),
        }
    }
    (got_late, got_totals)
}

#[test]
fn fraud_detection_example() {
    // The rule, directly: a small transaction flags the account; the next transaction clears
    // the flag and alerts if it is large.
    let mut flagged: BTreeSet<u64> = BTreeSet::new();
    let mut oracle = Vec::new();
    for tx in input("fraud-detector", "transactions.jsonl") {
        let (account, amount) =
            (tx["account_id"].as_u64().expect("account"), tx["amount_cents"].as_i64().expect("amount"));
        if flagged.remove(&account) && amount > 50_000 {
            oracle.push((account, amount));
        }
        if amount < 100 {
            flagged.insert(account);
        }
    }
    assert!(!oracle.is_empty(), "the example raises alerts");
    oracle.sort();
    for file in LANGUAGES {
        let mut got: Vec<(u64, i64)> = run_pipeline("fraud-detector", file)
            .into_iter()
            .map(|(_, _, v)| (v["account_id"].as_u64().expect("account"), v["amount_cents"].as_i64().expect("amount")))
            .collect();
        got.sort();
        assert_eq!(got, oracle, "{file}");
    }
}

#[test]
fn surge_pricing_example() {
    const SIZE: i64 = 300_000;
    const SLIDE: i64 = 60_000;
    // Requests per zone and sliding window, in batch.
    let mut counts: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for ride in input("surge-pricing", "rides.jsonl") {
        let (zone, ts) = (ride["zone"].as_str().expect("zone").to_string(), ride["ts"].as_i64().expect("ts"));
        let last_start = ts - ts.rem_euclid(SLIDE);
        for k in 0..SIZE / SLIDE {
            *counts.entry((zone.clone(), last_start - k * SLIDE + SIZE)).or_default() += 1;
        }
    }
    // Each zone's windows in order of end: multiplier from the count, previous = the window before.
    let mut oracle = BTreeSet::new();
    let mut previous: BTreeMap<String, u64> = BTreeMap::new();
    for ((zone, end), requests) in &counts {
        let multiplier = ((*requests as f64 / 10.0).clamp(1.0, 3.0) * 10.0).round() / 10.0;
        let prev = previous.insert(zone.clone(), *requests);
        oracle.insert((zone.clone(), *end, *requests, prev, (multiplier * 10.0) as i64));
    }
    assert!(oracle.iter().any(|o| o.4 > 10), "the example surges somewhere");
    let got: BTreeSet<_> = run_pipeline("surge-pricing", "pipeline.yaml")
        .into_iter()
        .map(|(side, _, v)| {
            assert_eq!(side, None, "no ride is late");
            (
                v["zone"].as_str().expect("zone").to_string(),
                v["window_end"].as_i64().expect("end"),
                v["requests"].as_u64().expect("requests"),
                v["previous_requests"].as_u64(),
                (v["multiplier"].as_f64().expect("multiplier") * 10.0).round() as i64,
            )
        })
        .collect();
    assert_eq!(got, oracle);
}

/// The Kafka-to-PostgreSQL example against a broker and a server of the test's own (its
/// addresses and checkpoint directory swapped in): the table holds each user's hourly totals
/// as a grouping of the input file says.
#[test]
fn kafka_to_postgres_example() {
    const HOUR: i64 = 3_600_000;
    let broker = eddy_tests::KafkaBroker::start();
    broker.create_topic("purchases", 2);
    let purchases = input("kafka-to-postgres", "purchases.jsonl");
    let records: Vec<eddy_tests::KafkaRecord> =
        purchases.iter().enumerate().map(|(i, p)| (i32::from(i % 2 == 1), None, p.to_string().into_bytes())).collect();
    broker.produce("purchases", &records);
    let pg = eddy_tests::PgServer::start();
    let checkpoints = tempfile::tempdir().expect("tempdir");
    let mut spec =
        PipelineSpec::from_file(&example("kafka-to-postgres").join("pipeline.yaml")).expect("example spec is valid");
    let eddy_plan::SourceSpec::Kafka(source) = &mut spec.sources[0] else { panic!("a kafka source") };
    source.brokers = broker.address.clone();
    let eddy_plan::SinkSpec::Postgres(sink) = &mut spec.sink else { panic!("a postgres sink") };
    sink.url = Some(pg.url.clone());
    spec.checkpoints.as_mut().expect("checkpoints").dir = Some(checkpoints.path().to_path_buf());
    let summary = Job::start(&spec, runtime(), JobOptions::default()).expect("starts").wait().expect("runs");
    assert!(summary.finished);

    let mut oracle: BTreeMap<(String, i64), (i64, i64)> = BTreeMap::new();
    for p in &purchases {
        let ts = p["ts"].as_i64().expect("ts");
        let total =
            oracle.entry((p["user_id"].as_str().expect("user").to_string(), ts - ts.rem_euclid(HOUR))).or_default();
        total.0 += 1;
        total.1 += p["amount_cents"].as_i64().expect("amount");
    }
    let rows = pg
        .rows("SELECT user_id, (extract(epoch FROM window_start) * 1000)::bigint, purchases, total_cents FROM totals");
    let got: BTreeMap<(String, i64), (i64, i64)> = rows
        .into_iter()
        .map(|r| {
            let n = |i: usize| r[i].clone().expect("not null");
            ((n(0), n(1).parse().expect("ms")), (n(2).parse().expect("n"), n(3).parse().expect("total")))
        })
        .collect();
    assert_eq!(got, oracle);
}

/// The polyglot pipeline (TypeScript parse, Python enrich, Rust window, Go alert)
/// against the same computation done plainly over the generator's events
/// ([`eddy_tests::polyglot_alerts`]).
#[test]
fn polyglot_example() {
    let spec = PipelineSpec::from_file(&example("polyglot").join("pipeline.yaml")).expect("spec");
    let oracle = eddy_tests::polyglot_alerts(&spec);
    assert!(oracle.len() > 10 && oracle.len() < 90, "the threshold picks some windows: {}", oracle.len());
    let got: BTreeSet<eddy_tests::Alert> = run_pipeline("polyglot", "pipeline.yaml")
        .into_iter()
        .map(|(_, key, v)| {
            assert_eq!(key, v["user_id"], "keyed by the user");
            eddy_tests::alert_of(&v)
        })
        .collect();
    assert_eq!(got, oracle);
}
