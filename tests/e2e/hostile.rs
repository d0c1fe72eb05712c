//! Hostile operators: each misbehaviour fails with its own error, the failing instance is
//! poisoned, and the same runtime keeps serving a healthy operator.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use eddy_core::HeapTimerService;
use eddy_guest_artifacts as guests;
use eddy_runtime::{
    CallError, CallErrorKind, Component, Fault, GuestErrorKind, OperatorInstance, Runtime, RuntimeConfig,
    SandboxLimits, Subtask, Violation, WasiGrants,
};
use eddy_state::{BoundedBackend, HeapStateBackend, StateBackend, StateError, StateLimits};
use eddy_tests::{decode, instantiate, json_batch, load, open_operator, runtime};

/// Limits small enough that every test runs fast; the defaults are tested in `sandbox_defaults`.
fn tight_limits() -> SandboxLimits {
    SandboxLimits {
        memory_bytes: 64 << 20,
        call_timeout_ms: 300,
        max_output_bytes_per_call: 8 << 20,
        ..SandboxLimits::default()
    }
}

fn hostile() -> &'static Component {
    static HOSTILE: OnceLock<Component> = OnceLock::new();
    HOSTILE.get_or_init(|| load("hostile", guests::HOSTILE).with_limits(tight_limits()))
}

/// Opens the hostile operator in `mode` and feeds it one record.
fn misbehave(mode: &str) -> (CallError, bool) {
    misbehave_in(hostile(), mode)
}

fn misbehave_in(component: &Component, mode: &str) -> (CallError, bool) {
    misbehave_with(component, &format!(r#"{{"mode": "{mode}"}}"#))
}

/// Opens the hostile operator with `config` (JSON) and feeds it one record.
fn misbehave_with(component: &Component, config: &str) -> (CallError, bool) {
    let mut op = open_operator(component, Subtask::single(128), config);
    let err = op.process(&json_batch(&[(Some("k"), "v")])).expect_err(config);
    assert_eq!(err.operator, "hostile");
    assert_eq!(err.call, "process");
    (err, op.is_poisoned())
}

/// A trap in `mode`: the failing instance is poisoned, and the same runtime still serves a
/// healthy operator afterwards.
fn contained_trap(mode: &str) -> CallError {
    contained_trap_in(hostile(), mode)
}

fn contained_trap_in(component: &Component, mode: &str) -> CallError {
    contained_trap_with(component, &format!(r#"{{"mode": "{mode}"}}"#))
}

fn contained_trap_with(component: &Component, config: &str) -> CallError {
    let (err, poisoned) = misbehave_with(component, config);
    assert!(poisoned, "a trap must poison the instance: {err}");
    a_healthy_operator_goes_on();
    err
}

/// The shared runtime still runs a well-behaved operator correctly.
fn a_healthy_operator_goes_on() {
    let count = load("count", guests::WORDCOUNT_COUNT);
    let mut op = open_operator(&count, Subtask::single(128), "null");
    let out = op.process(&json_batch(&[(Some("ok"), 1u64), (Some("ok"), 1)])).expect("healthy");
    assert_eq!(decode::<String, u64>(&out.main), vec![(Some("ok".into()), 1), (Some("ok".into()), 2)]);
}

#[test]
fn an_endless_loop_is_interrupted_by_the_call_deadline() {
    let err = contained_trap("loop");
    assert_eq!(err.kind, CallErrorKind::Timeout { timeout_ms: 300 }, "{err}");
    assert!(err.retryable());
}

#[test]
fn unbounded_allocation_hits_the_memory_cap() {
    let err = contained_trap("allocate");
    assert!(
        matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "linear memory bytes", limit, .. }) if limit == 64 << 20),
        "{err}"
    );
    assert!(err.to_string().contains("linear memory bytes"), "{err}");
}

#[test]
fn unbounded_recursion_overflows_the_stack() {
    let err = contained_trap("recurse");
    assert_eq!(err.kind, CallErrorKind::StackOverflow, "{err}");
}

#[test]
fn gigantic_output_is_cut_off() {
    // Copying megabytes is slow on a loaded machine: a generous deadline keeps this test about
    // the output limit, not about the clock.
    let patient =
        load("hostile", guests::HOSTILE).with_limits(SandboxLimits { call_timeout_ms: 20_000, ..tight_limits() });
    let err = contained_trap_in(&patient, "gigantic-output");
    assert!(
        matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "output bytes in one call", .. })),
        "{err}"
    );
}

#[test]
fn a_panic_becomes_a_trap_carrying_the_guest_message() {
    let err = contained_trap("panic");
    assert!(matches!(err.kind, CallErrorKind::Trap { .. }), "{err}");
    let said = err.guest_message.clone().unwrap_or_default();
    assert!(said.contains("hostile operator gave up on purpose"), "guest message: {said:?}");
    assert_eq!(err.fault(), Fault::UserOperator);
}

#[test]
fn an_oversized_state_key_is_refused() {
    let err = contained_trap("oversized-key");
    assert!(
        matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "map key bytes", limit, .. }) if limit == 64 << 10),
        "{err}"
    );
}

#[test]
fn a_key_handle_outside_the_call_cannot_reach_other_keys() {
    let (err, _) = misbehave("foreign-key");
    assert_eq!(err.kind, CallErrorKind::Violation(Violation::BadKeyHandle { handle: 1_000, records: 1 }), "{err}");
}

#[test]
fn a_torn_output_table_is_refused() {
    let err = contained_trap("torn-output");
    assert!(
        matches!(err.kind, CallErrorKind::Violation(Violation::MalformedTable(t)) if t.len == 33 && t.row_bytes == 32),
        "{err}"
    );
}

#[test]
fn a_value_write_outside_its_buffer_is_refused() {
    let err = contained_trap("stray-write");
    assert_eq!(err.kind, CallErrorKind::Violation(Violation::BadSpan { what: "value write", index: 0 }), "{err}");
}

#[test]
fn state_without_a_current_key_is_refused() {
    let mut op = instantiate(hostile(), Subtask::single(128));
    let err = op.open(r#"{"mode": "state-in-open"}"#).expect_err("no key in open");
    assert_eq!(err.kind, CallErrorKind::Violation(Violation::NoKey { call: "open", record: None }), "{err}");
}

#[test]
fn an_operator_error_is_not_a_trap_and_the_instance_goes_on() {
    let mut op = open_operator(hostile(), Subtask::single(128), r#"{"mode": "error"}"#);
    for _ in 0..2 {
        let err = op.process(&json_batch(&[(Some("k"), "v")])).expect_err("error");
        assert_eq!(
            err.kind,
            CallErrorKind::Operator {
                kind: GuestErrorKind::BadRecord,
                message: "hostile operator rejects every record".into()
            }
        );
        assert!(!op.is_poisoned());
    }
}

#[test]
fn bad_config_is_reported_as_such() {
    let mut op = instantiate(hostile(), Subtask::single(128));
    let err = op.open(r#"{"mood": "loop"}"#).expect_err("bad config");
    assert!(
        matches!(err.kind, CallErrorKind::Operator { kind: GuestErrorKind::BadConfig, ref message } if message.contains("mode")),
        "{err}"
    );
}

#[test]
fn a_poisoned_instance_refuses_further_calls() {
    let mut op = open_operator(hostile(), Subtask::single(128), r#"{"mode": "panic"}"#);
    assert!(op.process(&json_batch(&[(Some("k"), "v")])).is_err());
    let err = op.process(&json_batch(&[(Some("k"), "v")])).expect_err("poisoned");
    assert_eq!(err.kind, CallErrorKind::Poisoned);
}

fn probe(component: &Component) -> serde_json::Value {
    let mut op = open_operator(component, Subtask::single(128), r#"{"mode": "probe"}"#);
    let out = op.process(&json_batch(&[(Some("k"), "v")])).expect("probe");
    decode::<(), serde_json::Value>(&out.main).pop().expect("one report").1
}

#[test]
fn the_sandbox_grants_nothing_by_default() {
    let report = probe(&load("hostile", guests::HOSTILE));
    assert_eq!(report["env"], serde_json::json!([]), "{report}");
    assert_eq!(report["file"], false, "{report}");
    assert_eq!(report["clock_ms"], 0, "clocks are frozen: {report}");
    assert_eq!(report["network"], false, "{report}");
}

#[test]
fn granted_access_is_visible_and_only_that() {
    let grants = WasiGrants { env: vec![("EDDY_REGION".into(), "eu".into())], clocks: true, ..WasiGrants::default() };
    let report = probe(&load("hostile", guests::HOSTILE).with_grants(grants));
    assert_eq!(report["env"], serde_json::json!(["EDDY_REGION"]), "{report}");
    assert!(report["clock_ms"].as_u64().unwrap_or(0) > 1_600_000_000_000, "real clock: {report}");
    assert_eq!(report["file"], false, "{report}");
    assert_eq!(report["network"], false, "{report}");
}

#[test]
fn fuel_bounds_a_loop_deterministically() {
    static FUELED: OnceLock<Runtime> = OnceLock::new();
    let runtime = FUELED.get_or_init(|| {
        let limits =
            SandboxLimits { fuel_per_call: Some(50_000_000), call_timeout_ms: 60_000, ..SandboxLimits::default() };
        Runtime::new(RuntimeConfig { limits, ..RuntimeConfig::default() }).expect("runtime")
    });
    let component = runtime.load_file("hostile", guests::HOSTILE.as_ref()).expect("load");
    let mut op = open_operator(&component, Subtask::single(128), r#"{"mode": "loop"}"#);
    let err = op.process(&json_batch(&[(Some("k"), "v")])).expect_err("out of fuel");
    assert_eq!(err.kind, CallErrorKind::OutOfFuel, "{err}");
    // The same fuel budget is plenty for real work.
    let count = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");
    let mut ok = open_operator(&count, Subtask::single(128), "null");
    assert_eq!(ok.process(&json_batch(&[(Some("w"), 1u64)])).expect("healthy").main.len(), 1);
}

#[test]
fn sandbox_defaults_are_bounded() {
    let limits = runtime().config().limits.clone();
    assert!(limits.memory_bytes <= 1 << 30 && limits.call_timeout_ms <= 60_000);
    assert!(
        limits.max_key_bytes < limits.max_value_bytes && limits.max_value_bytes <= limits.max_output_bytes_per_call
    );
}

// State: bounded per subtask, lists appended without re-encoding, whole-state reads bounded.

/// A heap backend that counts the bytes (key and value) every `put` hands it.
struct CountingBackend {
    inner: HeapStateBackend,
    written: Arc<AtomicU64>,
}

impl StateBackend for CountingBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.inner.get(key)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.written.fetch_add((key.len() + value.len()) as u64, Ordering::Relaxed);
        self.inner.put(key, value)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
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

fn operator_over(component: &Component, backend: Box<dyn StateBackend>, mode: &str) -> OperatorInstance {
    let mut op = component
        .instantiate_operator(Subtask::single(128), backend, Box::new(HeapTimerService::default()))
        .expect("instantiate");
    op.open(&format!(r#"{{"mode": "{mode}"}}"#)).expect("open");
    op
}

#[test]
fn appending_to_a_list_writes_the_same_bytes_however_long_the_list() {
    let written = Arc::new(AtomicU64::new(0));
    let backend = CountingBackend { inner: HeapStateBackend::default(), written: written.clone() };
    let mut op = operator_over(hostile(), Box::new(backend), "list-append");
    let mut per_append = Vec::new();
    for i in 0..2_000 {
        let before = written.load(Ordering::Relaxed);
        op.process(&json_batch(&[(Some("k"), format!("item-{i:05}"))])).expect("append");
        per_append.push(written.load(Ordering::Relaxed) - before);
    }
    let first = per_append[0];
    assert!(
        per_append.iter().all(|&b| b == first),
        "bytes written per append: first {first}, 1000th {}, last {}",
        per_append[999],
        per_append[1_999]
    );
}

#[test]
fn a_state_flood_stops_at_the_subtask_state_limit() {
    for (limits, what, limit) in [
        (StateLimits { max_bytes: 1 << 20, max_entries: u64::MAX }, "bytes", 1 << 20),
        (StateLimits { max_bytes: u64::MAX, max_entries: 500 }, "entries", 500),
    ] {
        let backend = BoundedBackend::new(Box::new(HeapStateBackend::default()), limits, "raise `state_max_bytes`")
            .expect("bounded");
        let mut op = operator_over(hostile(), Box::new(backend), "state-flood");
        let err = op.process(&json_batch(&[(Some("k"), "v")])).expect_err("flood");
        assert!(op.is_poisoned(), "{err}");
        assert!(
            matches!(&err.kind, CallErrorKind::Violation(Violation::StateLimit(e)) if e.what == what && e.limit == limit),
            "{err}"
        );
        assert!(err.to_string().contains("raise `state_max_bytes`"), "says how to raise it: {err}");
        assert!(!err.retryable(), "a limit recurs on restart: {err}");
        assert!(op.state_backend().approximate_len() as u64 <= limits.max_entries);
        a_healthy_operator_goes_on();
    }
}

#[test]
fn reading_a_map_larger_than_the_read_bound_is_refused() {
    let patient =
        load("hostile", guests::HOSTILE).with_limits(SandboxLimits { call_timeout_ms: 20_000, ..tight_limits() });
    let err = contained_trap_in(&patient, "huge-map");
    assert!(
        matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "map-entries result bytes", limit, .. }) if limit == 16 << 20),
        "{err}"
    );
}

// ---- Output, timers and logs a guest controls (issue 10, items 5 and 7) ----

fn limit_of(err: &CallError) -> Option<(&'static str, usize, usize)> {
    match err.kind {
        CallErrorKind::Violation(Violation::Limit { what, limit, actual }) => Some((what, limit, actual)),
        _ => None,
    }
}

#[test]
fn emitted_rows_are_charged_for_every_byte_copied_even_when_they_alias_one_value() {
    // 100 rows, each pointing at the same 1 MiB: 1 MiB sent, 100 MiB to copy, 8 MiB allowed.
    let err = contained_trap_with(hostile(), r#"{"mode": "aliased-emit", "count": 100}"#);
    let (what, limit, actual) = limit_of(&err).unwrap_or_else(|| panic!("a limit, got {err}"));
    assert_eq!((what, limit), ("output bytes in one call", 8 << 20), "{err}");
    assert!(actual > 8 << 20, "{err}");
    assert!(err.to_string().contains("output bytes in one call") && err.to_string().contains(&(8 << 20).to_string()));
}

/// Runs `yaml` (a pipeline over `dir`) on the shared runtime to its end or first failure.
fn run_job(dir: &std::path::Path, yaml: &str) -> Result<eddy_engine::RunSummary, eddy_engine::RunError> {
    std::fs::write(dir.join("pipeline.yaml"), yaml).expect("write spec");
    let spec = eddy_plan::PipelineSpec::from_file(&dir.join("pipeline.yaml")).expect("valid spec");
    let sink = eddy_tests::MemorySink::default();
    let options = eddy_engine::JobOptions { sink: Some(Box::new(sink)), ..eddy_engine::JobOptions::default() };
    eddy_engine::Job::start(&spec, runtime(), options).expect("job starts").wait()
}

#[test]
fn a_job_emitting_aliased_rows_fails_alone_naming_the_output_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("in.jsonl"), "\"a\"\n\"b\"\n").expect("input");
    std::fs::write(dir.path().join("words.txt"), "the fox\nthe dog\n".repeat(200)).expect("input");
    let hostile = format!(
        "name: aliased\nsources: [{{type: file, name: in, path: in.jsonl, format: json_lines}}]\nsteps:\n  \
         - {{name: flood, wasm: {}, config: {{mode: aliased-emit}}}}\nsink: {{type: blackhole}}\n",
        guests::HOSTILE
    );
    let healthy = format!(
        "name: wc\nsources: [{{type: file, name: lines, path: words.txt}}]\nsteps:\n  \
         - {{name: split, wasm: {}}}\n  - {{name: count, wasm: {}, key_by: key}}\nsink: {{type: blackhole}}\n",
        guests::WORDCOUNT_SPLIT,
        guests::WORDCOUNT_COUNT
    );
    let hostile_dir = dir.path().join("hostile");
    let healthy_dir = dir.path().join("healthy");
    for d in [&hostile_dir, &healthy_dir] {
        std::fs::create_dir(d).expect("dir");
    }
    std::fs::rename(dir.path().join("in.jsonl"), hostile_dir.join("in.jsonl")).expect("move");
    std::fs::rename(dir.path().join("words.txt"), healthy_dir.join("words.txt")).expect("move");
    let (failed, finished) = std::thread::scope(|s| {
        let h = s.spawn(|| run_job(&hostile_dir, &hostile));
        let ok = run_job(&healthy_dir, &healthy);
        (h.join().expect("hostile job thread"), ok)
    });
    let err = failed.expect_err("the aliased rows must fail the job").to_string();
    assert!(err.contains("flood") && err.contains("output bytes in one call"), "{err}");
    assert!(err.contains(&(64usize << 20).to_string()), "names the limit: {err}");
    let summary = finished.expect("the healthy job on the same runtime finishes");
    assert!(summary.finished);
    assert_eq!(summary.metrics.sink_records, 800, "one count per word");
}

#[test]
fn endless_timers_on_one_key_stop_at_the_per_key_limit() {
    let err = contained_trap("timer-flood");
    let (what, limit, _) = limit_of(&err).unwrap_or_else(|| panic!("a limit, got {err}"));
    assert_eq!((what, limit), ("registered timers of one key", SandboxLimits::default().max_timers_per_key), "{err}");
}

#[test]
fn endless_timers_stop_at_the_per_instance_limit() {
    let few = load("hostile", guests::HOSTILE).with_limits(SandboxLimits {
        max_timers: 5_000,
        max_timers_per_key: usize::MAX,
        ..tight_limits()
    });
    let err = contained_trap_in(&few, "timer-flood");
    let (what, limit, _) = limit_of(&err).unwrap_or_else(|| panic!("a limit, got {err}"));
    assert_eq!((what, limit), ("registered timers", 5_000), "{err}");
    assert!(err.to_string().contains("5000"), "{err}");
}

#[test]
fn a_burst_of_due_timers_reaches_the_guest_in_bounded_batches() {
    // 100 keys of 1 KiB, 1 000 timers each, all due at one watermark: 100 MiB of keys, more
    // than the guest's 64 MiB of memory if they came in one `on-timer` call.
    let patient =
        load("hostile", guests::HOSTILE).with_limits(SandboxLimits { call_timeout_ms: 20_000, ..tight_limits() });
    let mut op = open_operator(&patient, Subtask::single(128), r#"{"mode": "timer-burst", "count": 1000}"#);
    let keys: Vec<(Option<String>, &str)> = (0..100).map(|i| (Some(format!("{i:0>1024}")), "v")).collect();
    assert!(op.process(&json_batch(&keys)).expect("register").main.is_empty());
    assert_eq!(op.timer_service().len(), 100_000);
    let fired = op.timer_service().advance_watermark(i64::MAX);
    let out = op.on_timers(&fired).unwrap_or_else(|e| panic!("every timer delivered: {e}"));
    let mut per_timestamp = std::collections::BTreeMap::<i64, usize>::new();
    for (_, t) in decode::<(), i64>(&out.main) {
        *per_timestamp.entry(t).or_default() += 1;
    }
    let expected: std::collections::BTreeMap<i64, usize> = (1..=1_000).map(|t| (t, 100)).collect();
    assert_eq!(per_timestamp, expected, "each timer fired once");
    assert!(!op.is_poisoned());
    a_healthy_operator_goes_on();
}

#[test]
fn a_log_flood_is_throttled_and_cut_before_it_leaves_the_guest() {
    let patient =
        load("hostile", guests::HOSTILE).with_limits(SandboxLimits { call_timeout_ms: 20_000, ..tight_limits() });
    let limits = SandboxLimits::default();
    let mut op = open_operator(&patient, Subtask::single(128), r#"{"mode": "log-flood", "count": 200000}"#);
    op.process(&json_batch(&[(Some("k"), "v")])).expect("logging never fails a call");
    let stats = op.log_stats();
    assert_eq!(stats.written + stats.dropped, 200_001, "{stats:?}");
    // The burst, plus what the rate refills while the flood runs (generously: a minute).
    let bound = u64::from(limits.log_burst_lines) + 60 * u64::from(limits.log_lines_per_second);
    assert!(stats.written <= bound, "{stats:?}");
    assert_eq!(stats.truncated, 1, "the 1 MiB line: {stats:?}");
    // The instance goes on, and so does a healthy operator on the same runtime.
    assert!(!op.is_poisoned());
    a_healthy_operator_goes_on();
}

#[test]
fn state_outside_a_record_is_not_blamed_on_a_missing_key_by() {
    let mut op = instantiate(hostile(), Subtask::single(128));
    let err = op.open(r#"{"mode": "state-in-open"}"#).expect_err("no key in open").to_string();
    assert!(err.contains("open") && !err.contains("key_by"), "{err}");
    assert!(err.contains("process") || err.contains("on-timer"), "says where state works: {err}");

    let mut op = open_operator(hostile(), Subtask::single(128), r#"{"mode": "raw-state"}"#);
    let err = op.process(&json_batch(&[(None::<&str>, "v")])).expect_err("record without key").to_string();
    assert!(err.contains("has no key") && err.contains("add key_by"), "{err}");
}

#[test]
fn a_state_flood_fails_its_job_naming_the_step_the_limit_and_the_setting() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("in.jsonl"), "\"a\"\n\"b\"\n").expect("input");
    let yaml = format!(
        "name: state-flood\nsources: [{{type: file, name: in, path: in.jsonl, format: json_lines}}]\nsteps:\n  \
         - {{name: hoard, wasm: {}, key_by: value, config: {{mode: state-flood}}, state_max_bytes: 1048576}}\n\
         sink: {{type: blackhole}}\n",
        guests::HOSTILE
    );
    let err = run_job(dir.path(), &yaml).expect_err("the flood must fail the job").to_string();
    for needle in ["`hoard`", "over its limit of 1048576 bytes", "state_max_bytes"] {
        assert!(err.contains(needle), "{needle:?} missing from: {err}");
    }
}

/// The `list-map` mode (per key a list and a map, echoed after each record) stopped with a
/// savepoint at parallelism 2 and resumed at 3: every list moves with its key group, item by
/// item, and keeps growing where it stopped.
#[test]
fn list_state_continues_after_a_savepoint_resumed_at_another_parallelism() {
    use crate::checkpoints::{start_wordcount as start, wait_for};
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = |p: u32| {
        format!(
            "name: lists\nbatch_size: 8\nsources: [{{type: file, name: in, path: in.jsonl, format: json_lines, follow: true}}]\n\
             steps:\n  - {{name: lists, wasm: {}, key_by: value, parallelism: {p}, config: {{mode: list-map}}}}\n\
             checkpoints: {{dir: checkpoints, interval_ms: 50}}\nsink: {{type: print}}\n",
            guests::HOSTILE
        )
    };
    let words: Vec<String> = (0..20).map(|i| format!("\"w{i}\"\n")).collect();
    let (first, second) = (words.concat().repeat(5), words.concat().repeat(3));
    std::fs::write(dir.path().join("in.jsonl"), &first).expect("input");
    let (job, received) = start(dir.path(), &yaml(2), None);
    wait_for(&received, 100);
    let savepoint = dir.path().join("savepoint");
    job.stop_with_savepoint(&eddy_plan::StoreLocation::Dir(savepoint.clone()), std::time::Duration::from_secs(30))
        .expect("savepoint");
    std::fs::write(dir.path().join("in.jsonl"), first + &second).expect("more input");
    std::fs::remove_dir_all(dir.path().join("checkpoints")).expect("fresh checkpoint dir");
    let (job, received) = start(dir.path(), &yaml(3), Some(savepoint));
    wait_for(&received, 60);
    job.cancel();
    job.wait().expect("second run");
    let mut last = std::collections::BTreeMap::new();
    for (_, r) in received.lock().expect("lock").iter() {
        let key: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("key");
        last.insert(key, eddy_tests::value_json::<serde_json::Value>(&r.value));
    }
    assert_eq!(last.len(), 20, "every key seen again");
    for (key, summary) in last {
        let expected = serde_json::json!({ "list": vec![key.clone(); 8], "map": [[key, 8]] });
        assert_eq!(summary, expected);
    }
}

/// The Python probes (tests/guests/python-hostile): the same sandbox holds for an operator in
/// Python, and what the interpreter catches itself (deep recursion, an unknown exception) is
/// an operator error carrying Python's message, never a bare trap.
mod python {
    use super::*;

    fn limits() -> SandboxLimits {
        // The interpreter itself takes tens of MiB; the deadline leaves room for a slow machine.
        SandboxLimits { memory_bytes: 256 << 20, call_timeout_ms: 2_000, ..SandboxLimits::default() }
    }

    fn hostile() -> &'static Component {
        static HOSTILE: OnceLock<Component> = OnceLock::new();
        HOSTILE.get_or_init(|| load("hostile", guests::PYTHON_HOSTILE).with_limits(limits()))
    }

    #[test]
    fn the_sandbox_grants_a_python_operator_nothing_and_its_randomness_is_a_fixed_sequence() {
        let first = probe(hostile());
        assert_eq!(first["env"], serde_json::json!([]), "{first}");
        assert_eq!(first["file"], false, "{first}");
        assert_eq!(first["clock_ms"], 0, "clocks are frozen: {first}");
        assert_eq!(first["network"], false, "{first}");
        // A second instance draws the same bytes and reads the same times: randomness and the
        // monotonic clock are virtual.
        let second = probe(hostile());
        assert_eq!(first["random"], second["random"], "virtual randomness repeats");
        let monotonic = first["monotonic_ns"].as_u64().unwrap_or(0);
        assert!(monotonic > 0, "a monotonic clock never reads zero: {first}");
        assert_eq!(first["monotonic_ns"], second["monotonic_ns"], "virtual time repeats");
        // Granted, it is real: another instance draws other bytes.
        let grants = WasiGrants { random: true, ..WasiGrants::default() };
        let real = load("hostile", guests::PYTHON_HOSTILE).with_limits(limits()).with_grants(grants);
        let (a, b) = (probe(&real), probe(&real));
        assert_ne!(a["random"], b["random"], "granted randomness is real: {a} {b}");
    }

    #[test]
    fn python_allocation_without_end_hits_the_memory_cap() {
        let err = contained_trap_in(hostile(), "allocate");
        assert!(
            matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "linear memory bytes", .. })),
            "{err}"
        );
    }

    #[test]
    fn a_python_loop_is_interrupted_by_the_call_deadline() {
        let err = contained_trap_in(hostile(), "loop");
        assert_eq!(err.kind, CallErrorKind::Timeout { timeout_ms: 2_000 }, "{err}");
    }

    #[test]
    fn python_errors_are_operator_errors_with_their_message() {
        for (mode, said) in [("recurse", "RecursionError"), ("raise", "KeyError: 'no such thing'")] {
            let (err, _) = misbehave_in(hostile(), mode);
            match &err.kind {
                CallErrorKind::Operator { kind, message } => {
                    assert_eq!(*kind, GuestErrorKind::Failed, "{err}");
                    assert!(message.contains(said), "{mode}: {message}");
                }
                other => panic!("{mode}: expected an operator error, got {other:?} ({err})"),
            }
        }
    }
}

/// The same probes in JavaScript (QuickJS, as `eddy build` makes it): a component that imports
/// nothing but Eddy's WIT, bounded in memory and time, and whose errors arrive as operator
/// errors with the JavaScript message.
mod js {
    use super::*;

    fn limits() -> SandboxLimits {
        SandboxLimits { memory_bytes: 128 << 20, call_timeout_ms: 1_000, ..SandboxLimits::default() }
    }

    fn hostile() -> &'static Component {
        static HOSTILE: OnceLock<Component> = OnceLock::new();
        HOSTILE.get_or_init(|| load("hostile", guests::JS_HOSTILE).with_limits(limits()))
    }

    #[test]
    fn the_sandbox_grants_a_javascript_operator_nothing_and_its_clock_is_the_hosts() {
        let seen = probe(hostile());
        assert_eq!(seen["env"], serde_json::json!([]), "{seen}");
        assert_eq!(seen["fetch"], "undefined", "no network API: {seen}");
        assert_eq!(seen["require"], "undefined", "no modules to load: {seen}");
        // Date.now() is the host's processing time, which this test harness keeps at 0.
        assert_eq!(seen["clock_ms"], 0, "{seen}");
        // Math.random is seeded when the component is built: every instance draws the same.
        assert_eq!(seen["random"], probe(hostile())["random"], "{seen}");
        assert_ne!(seen["random"][0], seen["random"][1], "{seen}");
    }

    #[test]
    fn javascript_allocation_without_end_hits_the_memory_cap() {
        let err = contained_trap_in(hostile(), "allocate");
        assert!(
            matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "linear memory bytes", .. })),
            "{err}"
        );
    }

    #[test]
    fn a_javascript_loop_is_interrupted_by_the_call_deadline() {
        let err = contained_trap_in(hostile(), "loop");
        assert_eq!(err.kind, CallErrorKind::Timeout { timeout_ms: 1_000 }, "{err}");
    }

    #[test]
    fn a_javascript_error_is_an_operator_error_with_its_message() {
        let (err, _) = misbehave_in(hostile(), "throw");
        match &err.kind {
            CallErrorKind::Operator { kind, message } => {
                assert_eq!(*kind, GuestErrorKind::Failed, "{err}");
                assert_eq!(message, "RangeError: no such thing", "{err}");
            }
            other => panic!("expected an operator error, got {other:?} ({err})"),
        }
    }

    /// QuickJS recurses on the WebAssembly stack, which runs out before its own depth check
    /// (tried with stacks of 0.5 to 2 MiB, the most wasmtime allows without async stacks): the
    /// trap is contained and says what it was, not a JavaScript RangeError.
    #[test]
    fn unbounded_javascript_recursion_is_a_contained_stack_overflow() {
        let err = contained_trap_in(hostile(), "recurse");
        assert_eq!(err.kind, CallErrorKind::StackOverflow, "{err}");
        assert!(err.to_string().contains("unbounded recursion"), "{err}");
    }
}

/// The Go probes (tests/guests/go-hostile): Go's runtime starts on the virtual clock and
/// randomness, sees no files, environment or network, and what it cannot catch itself
/// (allocation, endless loops and recursion) is a contained, named trap; a panic is an
/// operator error carrying its message.
mod go {
    use super::*;

    fn limits() -> SandboxLimits {
        SandboxLimits { memory_bytes: 128 << 20, call_timeout_ms: 1_000, ..SandboxLimits::default() }
    }

    fn hostile() -> &'static Component {
        static HOSTILE: OnceLock<Component> = OnceLock::new();
        HOSTILE.get_or_init(|| load("hostile", guests::GO_HOSTILE).with_limits(limits()))
    }

    #[test]
    fn the_sandbox_grants_a_go_operator_nothing_and_its_time_and_randomness_are_virtual() {
        let first = probe(hostile());
        assert_eq!(first["env"], serde_json::json!([]), "{first}");
        assert_eq!(first["file"], false, "{first}");
        assert_eq!(first["network"], false, "{first}");
        assert_eq!(first["clock_ms"], 0, "the wall clock is frozen at the epoch: {first}");
        assert!(first["monotonic_ns"].as_i64().unwrap_or(0) > 0, "virtual time moves per read: {first}");
        let second = probe(hostile());
        assert_eq!(first["random"], second["random"], "virtual randomness repeats");
        assert_eq!(first["monotonic_ns"], second["monotonic_ns"], "virtual time repeats");
        let grants = WasiGrants { random: true, clocks: true, ..WasiGrants::default() };
        let real = load("hostile", guests::GO_HOSTILE).with_limits(limits()).with_grants(grants);
        let (a, b) = (probe(&real), probe(&real));
        assert_ne!(a["random"], b["random"], "granted randomness is real: {a} {b}");
        assert!(a["clock_ms"].as_i64().unwrap_or(0) > 1_600_000_000_000, "granted clocks are real: {a}");
    }

    #[test]
    fn go_allocation_without_end_hits_the_memory_cap() {
        let err = contained_trap_in(hostile(), "allocate");
        assert!(
            matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "linear memory bytes", .. })),
            "{err}"
        );
    }

    #[test]
    fn a_go_loop_is_interrupted_by_the_call_deadline() {
        let err = contained_trap_in(hostile(), "loop");
        assert_eq!(err.kind, CallErrorKind::Timeout { timeout_ms: 1_000 }, "{err}");
    }

    /// Go grows a goroutine's stack on its heap, so endless recursion ends at the memory cap.
    #[test]
    fn unbounded_go_recursion_is_a_contained_trap() {
        let err = contained_trap_in(hostile(), "recurse");
        assert!(
            matches!(err.kind, CallErrorKind::Violation(Violation::Limit { what: "linear memory bytes", .. }))
                || err.kind == CallErrorKind::StackOverflow,
            "{err}"
        );
    }

    #[test]
    fn a_go_panic_is_an_operator_error_with_its_message() {
        for (mode, wanted) in [
            ("panic", "panic: no such thing"),
            ("nil", "panic: runtime error: invalid memory address or nil pointer dereference"),
        ] {
            let (err, poisoned) = misbehave_in(hostile(), mode);
            assert!(!poisoned, "a recovered panic leaves the instance usable: {err}");
            match &err.kind {
                CallErrorKind::Operator { kind, message } => {
                    assert_eq!(*kind, GuestErrorKind::Failed, "{err}");
                    assert_eq!(message, wanted, "{err}");
                }
                other => panic!("{mode}: expected an operator error, got {other:?} ({err})"),
            }
        }
    }
}

/// A value of rows nested 100 000 deep (3 MiB, within a value's 16 MiB) reaches a sink that
/// renders rows as JSON: each line says the row is unreadable and why, and the process lives
/// on. Walking such a row a level per stack frame overflowed the sink thread's stack, which
/// aborts the whole process (every tenant's jobs with it).
#[test]
fn a_row_nested_past_the_limit_is_written_as_unreadable_and_the_process_lives_on() {
    use eddy_engine::{Job, JobOptions};
    use eddy_plan::PipelineSpec;

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("input.txt"), "a\nb\n").expect("input");
    let yaml = format!(
        "name: deep-rows\nsources: [{{type: file, name: lines, path: input.txt}}]\nsteps:\n  - {{name: deep, wasm: {}, \
         config: {{mode: deep-row}}}}\nsink: {{type: file, path: out.jsonl}}\n",
        guests::HOSTILE
    );
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("spec");
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let job = Job::start(&spec, runtime(), JobOptions::default()).expect("starts");
    let summary = job.wait().expect("the job ends without failing");
    assert!(summary.finished);
    let out = std::fs::read_to_string(dir.path().join("out.jsonl")).expect("output");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(lines.len(), 2, "{out}");
    for line in lines {
        let value = line["value"].as_str().unwrap_or_default();
        assert!(value.contains("unreadable row: rows nested more than 100 deep"), "{line}");
    }
}
