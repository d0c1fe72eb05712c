//! Window semantics through whole pipelines (file source, watermarks, key exchange, the
//! purchase-totals aggregate): the minimal cases of issue 10, item 8, whose outcome must not
//! depend on how the exchange between source and window batches records.

use std::path::Path;

use eddy_engine::{Job, JobOptions};
use eddy_guest_artifacts as guests;
use eddy_plan::PipelineSpec;
use eddy_tests::{MemorySink, runtime};
use serde_json::Value;

/// What the sink got: main results as (user, start, end, purchases), late records as
/// (user, ts), both in arrival order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outcome {
    results: Vec<(String, i64, i64, u64)>,
    late: Vec<(String, i64)>,
}

/// Runs `(user, ts)` purchases one record per batch through a window step `window` at
/// `parallelism`, with watermark bound 0.
fn run(dir: &Path, purchases: &[(&str, i64)], window: &str, parallelism: u32) -> Outcome {
    let lines: String = purchases
        .iter()
        .map(|(user, ts)| format!("{{\"user_id\": \"{user}\", \"amount_cents\": 1, \"ts\": {ts}}}\n"))
        .collect();
    std::fs::write(dir.join("purchases.jsonl"), lines).expect("write input");
    let yaml = format!(
        "name: windows\nbatch_size: 1\nwatermarks: {{out_of_orderness_ms: 0}}\n\
         sources: [{{type: file, name: purchases, path: purchases.jsonl, format: json_lines, timestamp: /ts}}]\n\
         steps:\n  - {{name: totals, wasm: {}, key_by: /user_id, parallelism: {parallelism}, window: {window}}}\nsink: {{type: blackhole}}\n",
        guests::PURCHASE_TOTALS
    );
    std::fs::write(dir.join("pipeline.yaml"), &yaml).expect("write spec");
    let spec = PipelineSpec::from_file(&dir.join("pipeline.yaml")).unwrap_or_else(|e| panic!("valid spec: {e}"));
    let sink = MemorySink::default();
    let received = sink.received.clone();
    let job = Job::start(&spec, runtime(), JobOptions { sink: Some(Box::new(sink)), ..JobOptions::default() })
        .expect("job starts");
    assert!(job.wait().expect("job finishes").finished);
    let mut outcome = Outcome::default();
    for (side, r) in received.lock().expect("lock").iter() {
        let user: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("user");
        let v: Value = eddy_tests::value_json(&r.value);
        match side.as_deref() {
            None => outcome.results.push((
                user,
                v["start"].as_i64().expect("start"),
                v["end"].as_i64().expect("end"),
                v["result"]["purchases"].as_u64().expect("purchases"),
            )),
            Some("late") => outcome.late.push((user, r.timestamp.expect("timestamp"))),
            Some(other) => panic!("unexpected output {other}"),
        }
    }
    outcome
}

fn results_of(outcome: &Outcome, user: &str) -> Vec<(i64, i64, u64)> {
    outcome.results.iter().filter(|r| r.0 == user).map(|r| (r.1, r.2, r.3)).collect()
}

#[test]
fn a_late_session_record_inside_an_open_session_joins_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for parallelism in [1, 2] {
        // Watermark 1300 when a@1050 arrives; a's session [1000, 1350) is still open.
        let purchases = [("a", 1000), ("a", 1150), ("b", 1301), ("a", 1050)];
        let outcome = run(dir.path(), &purchases, "{type: session, gap_ms: 200}", parallelism);
        assert!(outcome.late.is_empty(), "late at parallelism {parallelism}: {:?}", outcome.late);
        assert_eq!(results_of(&outcome, "a"), vec![(1000, 1350, 3)], "parallelism {parallelism}");
        assert_eq!(results_of(&outcome, "b"), vec![(1301, 1501, 1)], "parallelism {parallelism}");
    }
}

#[test]
fn every_late_but_allowed_record_refires_its_window_however_the_exchange_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    for parallelism in [1, 2] {
        // Watermarks after each record: 99, 999, 999, 999, 1000, 1000. [0, 1000) fires at 999
        // and is kept until 1999: a@200, a@300 and a@400 each re-fire it.
        let purchases = [("a", 100), ("b", 1000), ("a", 200), ("a", 300), ("b", 1001), ("a", 400)];
        let window = "{type: tumbling, size_ms: 1000, allowed_lateness_ms: 1000}";
        let outcome = run(dir.path(), &purchases, window, parallelism);
        assert!(outcome.late.is_empty(), "late at parallelism {parallelism}: {:?}", outcome.late);
        let a = vec![(0, 1000, 1), (0, 1000, 2), (0, 1000, 3), (0, 1000, 4)];
        assert_eq!(results_of(&outcome, "a"), a, "parallelism {parallelism}");
        assert_eq!(results_of(&outcome, "b"), vec![(1000, 2000, 2)], "parallelism {parallelism}");
    }
}
