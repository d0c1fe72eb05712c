//! Nexmark: every query pipeline shipped in `examples/nexmark/` (Wasm guests on the engine)
//! produces exactly the rows of the native Rust baseline over the same generated events.

use std::path::Path;
use std::sync::{Arc, Mutex};

use eddy_engine::{Job, JobOptions, SinkFactory};
use eddy_plan::{PipelineSpec, SinkSpec, SourceSpec};
use eddy_tests::{MemorySink, runtime};
use serde_json::Value;

/// Small enough for CI, large enough for every query to produce rows (10 s of event time at
/// the examples' 1 000 events/s, across several windows and sessions).
const EVENTS: u64 = 12_000;

fn query_spec(query: &str) -> PipelineSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/nexmark/{query}.yaml"));
    let mut spec = PipelineSpec::from_file(&path).expect("query spec is valid");
    let SourceSpec::Nexmark(source) = &mut spec.sources[0] else { panic!("{query} reads the nexmark source") };
    source.events = Some(EVENTS);
    spec
}

/// A query's native baseline over the generated events.
type Baseline = fn(Vec<eddy_nexmark::Event>) -> Vec<Value>;

fn sorted(mut rows: Vec<Value>) -> Vec<Value> {
    rows.sort_by_key(|v| v.to_string());
    rows
}

fn check(query: &str, native: Baseline) {
    check_with(query, native, false, None);
}

/// [`check`], with `per_subtask`: the spec's sink a blackhole (which runs at its input's
/// parallelism) replaced by one memory sink per subtask, all of which must be made; with
/// `rocksdb`, state in RocksDB databases under that directory.
fn check_with(query: &str, native: Baseline, per_subtask: bool, rocksdb: Option<&Path>) {
    let mut spec = query_spec(query);
    if let Some(dir) = rocksdb {
        spec.state.backend = eddy_plan::StateBackendKind::Rocksdb;
        spec.state.dir = Some(dir.to_path_buf());
    }
    let SourceSpec::Nexmark(source) = &spec.sources[0] else { unreachable!() };
    let events: Vec<eddy_nexmark::Event> = eddy_nexmark::events(&source.config()).collect();
    assert_eq!(events.len() as u64, EVENTS);
    let expected = sorted(native(events));
    assert!(!expected.is_empty(), "{query}: the baseline must produce rows for the comparison to mean anything");

    let sink = MemorySink::default();
    let received = sink.received.clone();
    let made = Arc::new(Mutex::new(Vec::new()));
    let options = if per_subtask {
        spec.sink = SinkSpec::Blackhole;
        let (received, made) = (received.clone(), made.clone());
        let sinks: SinkFactory = Box::new(move |subtask| {
            made.lock().expect("lock").push(subtask);
            Box::new(MemorySink { received: received.clone(), ..MemorySink::default() })
        });
        JobOptions { sink_per_subtask: Some(sinks), ..JobOptions::default() }
    } else {
        JobOptions { sink: Some(Box::new(sink)), ..JobOptions::default() }
    };
    let summary =
        Job::start(&spec, runtime(), options).expect("starts").wait().unwrap_or_else(|e| panic!("{query} runs: {e}"));
    assert!(summary.finished);
    let out = received.lock().expect("lock").clone();
    assert!(out.iter().all(|(side, _)| side.is_none()), "{query}: nothing late or on a side output");
    let got = sorted(out.iter().map(|(_, r)| eddy_tests::value_json(&r.value)).collect());
    assert_eq!(got.len(), expected.len(), "{query}: row count");
    assert!(got == expected, "{query}: rows differ from the native baseline");
    if per_subtask {
        let mut made = made.lock().expect("lock").clone();
        made.sort_unstable();
        assert_eq!(made, (0..spec.parallelism).collect::<Vec<_>>(), "{query}: one sink per subtask of the last step");
    }
}

#[test]
fn q0_pass_through() {
    check("q0", eddy_nexmark::native::q0);
}

#[test]
fn q1_currency_conversion() {
    check("q1", eddy_nexmark::native::q1);
}

#[test]
fn q1_currency_conversion_in_python() {
    check("q1-python", eddy_nexmark::native::q1);
}

#[test]
fn q1_currency_conversion_in_javascript() {
    check("q1-js", eddy_nexmark::native::q1);
}

#[test]
fn q1_currency_conversion_in_go() {
    check("q1-go", eddy_nexmark::native::q1);
}

#[test]
fn q2_selection() {
    check("q2", eddy_nexmark::native::q2);
}

#[test]
fn q3_local_item_suggestion() {
    check("q3", eddy_nexmark::native::q3);
}

#[test]
fn q5_hot_items() {
    check("q5", eddy_nexmark::native::q5);
}

#[test]
fn q5_into_a_sink_per_subtask_at_parallelism_2() {
    assert_eq!(query_spec("q5").parallelism, 2, "the example runs at parallelism 2");
    check_with("q5", eddy_nexmark::native::q5, true, None);
}

/// Every subtask opens a RocksDB database of its own, also for a step that is not right
/// behind a hash exchange (q0's select after the source, q11's row step chained after its
/// session window), which runs over every key group whatever its subtask: such steps of both
/// subtasks once shared one directory, and the second failed on RocksDB's lock.
#[test]
fn queries_on_rocksdb_at_parallelism_2_equal_the_baseline() {
    let queries: [(&str, Baseline); 3] =
        [("q0", eddy_nexmark::native::q0), ("q5", eddy_nexmark::native::q5), ("q11", eddy_nexmark::native::q11)];
    for (query, native) in queries {
        assert_eq!(query_spec(query).parallelism, 2, "{query} runs at parallelism 2");
        let dir = tempfile::tempdir().expect("tempdir");
        check_with(query, native, false, Some(dir.path()));
    }
}

#[test]
fn q7_highest_bid() {
    check("q7", eddy_nexmark::native::q7);
}

#[test]
fn q8_new_users() {
    check("q8", eddy_nexmark::native::q8);
}

#[test]
fn q11_user_sessions() {
    check("q11", eddy_nexmark::native::q11);
}

/// `select` probes each event for its type and the fields its routes key by, skipping the
/// rest: keys must equal the JSON of the field however deep the pointer and wherever the
/// field sits in the object, other types are dropped, and a missing field is named.
#[test]
fn select_keys_by_any_pointer_and_names_a_missing_field() {
    use eddy_runtime::{CallErrorKind, Subtask};
    use eddy_tests::{decode, json_batch, load, open_operator};
    use serde_json::json;

    let select = load("select", eddy_guest_artifacts::NEXMARK_SELECT);
    let config = json!({
        "bid": {"key": "/x/a~1b/1"},
        "person": {"key": "/id"},
        "auction": {"constant_key": "all"},
    });
    let mut op = open_operator(&select, Subtask::single(128), &config.to_string());
    let events = [
        json!({"x": {"a/b": [0, {"deep": true}]}, "extra": "ignored", "type": "bid"}),
        json!({"type": "person", "name": {"nested": [1, 2]}, "id": 1001}),
        json!({"type": "auction", "id": 5}),
        json!({"type": "other", "id": 7}),
    ];
    let input: Vec<(Option<Value>, Value)> = events.iter().map(|e| (None, e.clone())).collect();
    let out = op.process(&json_batch(&input)).expect("process");
    assert_eq!(
        decode::<Value, Value>(&out.main),
        vec![
            (Some(json!({"deep": true})), events[0].clone()),
            (Some(json!(1001)), events[1].clone()),
            (Some(json!("all")), events[2].clone()),
        ]
    );

    let err = op.process(&json_batch(&[(None::<Value>, json!({"type": "person", "name": "n"}))])).expect_err("no id");
    assert!(matches!(err.kind, CallErrorKind::Operator { .. }), "{err}");
    assert!(err.to_string().contains("no field at `/id`"), "names the pointer: {err}");
}
