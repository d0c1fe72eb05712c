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

/// `window-row` flattens a window's result into the query's row: a result that is a row
/// becomes a row (its slots copied), any other through a JSON object. Both must read as the
/// object written here by hand, a result already holding a bound's name is refused by name on
/// either path, and a result of a shape the host does not know is a clear error.
#[test]
fn window_row_flattens_row_and_json_results_alike_and_refuses_a_clash() {
    use eddy_core::RecordBatch;
    use eddy_runtime::Subtask;
    use eddy_tests::{load, open_operator};
    use eddy_wire::row::{Kind, RowFrame};
    use eddy_wire::schema::Schema;
    use serde_json::json;

    let window_row = load("window-row", eddy_guest_artifacts::NEXMARK_WINDOW_ROW);
    let mut op = open_operator(&window_row, Subtask::single(128), r#"{"start": "from", "end": "to"}"#);
    let schema = |fields: &[&str]| eddy_runtime::schemas().declare(&Schema::new("Count", fields)).expect("declares");
    let counted = schema(&["bidder", "bids", "note", "gone"]);
    let mut result = Vec::new();
    let frame = RowFrame::begin(&mut result, 4, counted);
    frame.u64(&mut result, 0, 7);
    frame.i64(&mut result, 1, -3);
    frame.variable(&mut result, 2, Kind::Str, "é".as_bytes());
    frame.null(&mut result, 3);
    let as_json = serde_json::to_vec(
        &json!({"start": 0, "end": 10_000, "result": {"bidder": 7, "bids": -3, "note": "é", "gone": null}}),
    )
    .expect("json");
    let mut batch = RecordBatch::default();
    batch.push(Some(b"7"), &eddy_connectors::values::window_row(0, 10_000, &result), Some(9_999));
    batch.push(Some(b"7"), &as_json, Some(9_999));
    let out = op.process(&batch).expect("flattens");
    let expected = json!({"bidder": 7, "bids": -3, "note": "é", "gone": null, "from": 0, "to": 10_000});
    let rows: Vec<(Value, Option<i64>)> =
        out.main.iter().map(|r| (eddy_tests::value_json(r.value), r.timestamp)).collect();
    assert_eq!(rows, vec![(expected.clone(), Some(9_999)), (expected, Some(9_999))]);
    assert!(out.main.iter().all(|r| r.key == Some(&b"7"[..])), "the key stays");
    assert!(eddy_wire::row::is_row(out.main.iter().next().expect("a row").value), "a row result stays a row");

    let clash = schema(&["bidder", "to"]);
    let mut result = Vec::new();
    let frame = RowFrame::begin(&mut result, 2, clash);
    frame.u64(&mut result, 0, 1);
    frame.u64(&mut result, 1, 2);
    for value in [
        eddy_connectors::values::window_row(0, 10_000, &result),
        serde_json::to_vec(&json!({"start": 0, "end": 10_000, "result": {"bidder": 1, "to": 2}})).expect("json"),
    ] {
        let mut batch = RecordBatch::default();
        batch.push(Some(b"1"), &value, Some(9_999));
        let err = op.process(&batch).expect_err("a clash");
        assert!(err.to_string().contains("already has a field `to`"), "{err}");
    }

    let mut unknown = Vec::new();
    RowFrame::begin(&mut unknown, 1, 0x5EED_0001).u64(&mut unknown, 0, 1);
    let mut batch = RecordBatch::default();
    batch.push(Some(b"1"), &eddy_connectors::values::window_row(0, 10_000, &unknown), Some(9_999));
    let err = op.process(&batch).expect_err("an unknown schema");
    assert!(err.to_string().contains("does not know"), "{err}");
}
