//! The engine end to end: YAML pipelines planned, run on threads over credit-based channels with
//! the real Wasm guests, and compared with oracles computed another way.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use eddy_connectors::generator_event;
use eddy_engine::{Job, JobOptions, RunError};
use eddy_guest_artifacts as guests;
use eddy_plan::{PipelineSpec, SourceSpec};
use eddy_tests::{MemorySink, Received, runtime, thread_policies};
use proptest::prelude::*;
use serde_json::Value;

fn spec_in(dir: &Path, yaml: &str) -> PipelineSpec {
    std::fs::write(dir.join("pipeline.yaml"), yaml).expect("write spec");
    PipelineSpec::from_file(&dir.join("pipeline.yaml")).unwrap_or_else(|e| panic!("valid spec: {e}\n{yaml}"))
}

fn start(spec: &PipelineSpec, sink: MemorySink, options: JobOptions) -> Job {
    Job::start(spec, runtime(), JobOptions { sink: Some(Box::new(sink)), ..options }).expect("job starts")
}

fn run_to_end(spec: &PipelineSpec) -> Vec<(Option<String>, eddy_core::Record)> {
    let sink = MemorySink::default();
    let received = sink.received.clone();
    let summary = start(spec, sink, JobOptions::default()).wait().expect("job finishes");
    assert!(summary.finished);
    let out = received.lock().expect("lock").clone();
    assert_eq!(summary.metrics.sink_records, out.len() as u64, "metrics count what the sink got");
    out
}

fn json(bytes: &[u8]) -> Value {
    eddy_tests::value_json(bytes)
}

/// A deterministic text over a small vocabulary (many repeats per word).
fn text(lines: usize) -> String {
    const WORDS: [&str; 9] = ["the", "Quick", "brown", "fox", "jumps", "über", "a", "lazy", "dog"];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = String::new();
    for _ in 0..lines {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        for i in 0..(x >> 60) {
            out.push_str(WORDS[((x >> (8 * (i % 7))) % 9) as usize]);
            out.push_str(if i % 3 == 0 { ", " } else { " " });
        }
        out.push('\n');
    }
    out
}

#[test]
fn word_count_at_parallelism_1_and_4_equals_the_oracle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = text(3_000);
    std::fs::write(dir.path().join("input.txt"), &input).expect("write input");
    let mut oracle: BTreeMap<String, u64> = BTreeMap::new();
    for w in input.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        *oracle.entry(w.to_lowercase()).or_default() += 1;
    }
    let mut outputs = Vec::new();
    for p in [1, 4] {
        let yaml = format!(
            "name: wc\nbatch_size: 37\nsources: [{{type: file, name: lines, path: input.txt}}]\nsteps:\n  \
             - {{name: split, wasm: {}, parallelism: {p}}}\n  - {{name: count, wasm: {}, key_by: key, parallelism: {p}}}\n\
             sink: {{type: blackhole}}\n",
            guests::WORDCOUNT_SPLIT,
            guests::WORDCOUNT_COUNT
        );
        let out = run_to_end(&spec_in(dir.path(), &yaml));
        // Each word's counts arrive in order 1..=n (one key lives on one subtask and one channel).
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for (side, r) in &out {
            assert_eq!(side, &None);
            let word: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("word");
            let count = json(&r.value).as_u64().expect("count");
            let previous = last.insert(word.clone(), count).unwrap_or(0);
            assert_eq!(count, previous + 1, "counts of `{word}` in order at parallelism {p}");
        }
        assert_eq!(last, oracle, "final counts at parallelism {p}");
        let mut sorted: Vec<(Vec<u8>, Vec<u8>)> =
            out.into_iter().map(|(_, r)| (r.key.unwrap_or_default(), r.value)).collect();
        sorted.sort();
        outputs.push(sorted);
    }
    assert_eq!(outputs[0], outputs[1], "parallelism 1 and 4 emit the same records");
}

fn generator_yaml(seed: u64, events: u64, disorder: i64, bound: i64, window_parallelism: u32, window: &str) -> String {
    format!(
        "name: totals\nbatch_size: 50\nwatermarks: {{out_of_orderness_ms: {bound}}}\n\
         sources: [{{type: generator, name: purchases, seed: {seed}, events: {events}, keys: 17, key_field: user_id, \
         key_prefix: u, value_field: amount_cents, min_value: 1, max_value: 9999, interval_ms: 250, max_disorder_ms: {disorder}}}]\n\
         steps:\n  - {{name: totals, wasm: {}, key_by: /user_id, parallelism: {window_parallelism}, window: {window}}}\n\
         sink: {{type: blackhole}}\n",
        guests::PURCHASE_TOTALS
    )
}

type WindowResults = BTreeMap<(String, i64, i64), (u64, i64)>;

/// (user, window start, end) -> (purchases, total) from the sink's window records.
fn window_results(out: &[(Option<String>, eddy_core::Record)]) -> WindowResults {
    let mut results = BTreeMap::new();
    for (side, r) in out.iter().filter(|(side, _)| side.is_none()) {
        assert_eq!(side, &None);
        let user: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("user");
        let v = json(&r.value);
        let (start, end) = (v["start"].as_i64().expect("start"), v["end"].as_i64().expect("end"));
        assert_eq!(r.timestamp, Some(end - 1), "a window result carries its window's last millisecond");
        let result = (v["result"]["purchases"].as_u64().expect("n"), v["result"]["total_cents"].as_i64().expect("t"));
        assert!(results.insert((user, start, end), result).is_none(), "one result per key and window");
    }
    results
}

/// The purchases of the generator spec as (user, amount, ts), in source order.
fn purchases(spec: &PipelineSpec, events: u64) -> Vec<(String, i64, i64)> {
    let SourceSpec::Generator(g) = &spec.sources[0] else { panic!("generator source") };
    (0..events)
        .map(|i| {
            let v = json(&generator_event(g, i).value);
            let user = v["user_id"].as_str().expect("user").to_string();
            (user, v["amount_cents"].as_i64().expect("amount"), v["ts"].as_i64().expect("ts"))
        })
        .collect()
}

/// Tumbling windows of `size` computed in batch over `events`.
fn tumbling_oracle(events: &[(String, i64, i64)], size: i64) -> WindowResults {
    let mut oracle: WindowResults = BTreeMap::new();
    for (user, amount, ts) in events {
        let start = ts - ts.rem_euclid(size);
        let e = oracle.entry((user.clone(), start, start + size)).or_default();
        e.0 += 1;
        e.1 += amount;
    }
    oracle
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]

    /// Disorder within the watermark bound: no record is late and the windows equal the batch
    /// computation, whatever the parallelism.
    #[test]
    fn tumbling_windows_within_the_bound_equal_the_batch_oracle(
        seed in any::<u64>(), disorder in 0i64..5_000, extra_bound in 0i64..2_000, parallelism in 1u32..5,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let events = 2_000;
        let yaml = generator_yaml(seed, events, disorder, disorder + extra_bound, parallelism, "{type: tumbling, size_ms: 60000}");
        let spec = spec_in(dir.path(), &yaml);
        let out = run_to_end(&spec);
        prop_assert!(out.iter().all(|(side, _)| side.is_none()), "no late output within the bound");
        prop_assert_eq!(window_results(&out), tumbling_oracle(&purchases(&spec, events), 60_000));
    }
}

#[test]
fn records_beyond_the_bound_go_exactly_to_the_late_output_and_the_rest_still_adds_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (events, bound, size) = (3_000u64, 1_000i64, 30_000i64);
    for parallelism in [1, 3] {
        let yaml = generator_yaml(7, events, 20_000, bound, parallelism, "{type: tumbling, size_ms: 30000}");
        let spec = spec_in(dir.path(), &yaml);
        let all = purchases(&spec, events);
        // The oracle replays the source: batches of 50, the watermark advancing after each batch.
        let mut watermark = i64::MIN;
        let mut max_seen = i64::MIN;
        let (mut late, mut on_time) = (Vec::new(), Vec::new());
        for chunk in all.chunks(50) {
            for e in chunk {
                let window_end = e.2 - e.2.rem_euclid(size) + size;
                if window_end - 1 <= watermark {
                    late.push(e.clone())
                } else {
                    on_time.push(e.clone())
                }
                max_seen = max_seen.max(e.2);
            }
            watermark = watermark.max(max_seen - bound - 1);
        }
        assert!(!late.is_empty() && !on_time.is_empty(), "the case must exercise both paths");

        let out = run_to_end(&spec);
        let mut got_late: Vec<(String, i64, i64)> = out
            .iter()
            .filter(|(side, _)| side.as_deref() == Some("late"))
            .map(|(_, r)| {
                let v = json(&r.value);
                (
                    v["user_id"].as_str().expect("user").to_string(),
                    v["amount_cents"].as_i64().expect("a"),
                    v["ts"].as_i64().expect("ts"),
                )
            })
            .collect();
        got_late.sort();
        late.sort();
        assert_eq!(got_late, late, "late output at parallelism {parallelism}");
        assert_eq!(
            window_results(&out),
            tumbling_oracle(&on_time, size),
            "on-time windows at parallelism {parallelism}"
        );
    }
}

#[test]
fn sliding_and_session_windows_equal_batch_computations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = 1_500;
    let sliding = spec_in(
        dir.path(),
        &generator_yaml(3, events, 2_000, 2_000, 2, "{type: sliding, size_ms: 20000, slide_ms: 5000}"),
    );
    let all = purchases(&sliding, events);
    let mut oracle: WindowResults = BTreeMap::new();
    for (user, amount, ts) in &all {
        let last_start = ts - ts.rem_euclid(5_000);
        for k in 0..4 {
            let start = last_start - k * 5_000;
            let e = oracle.entry((user.clone(), start, start + 20_000)).or_default();
            e.0 += 1;
            e.1 += amount;
        }
    }
    assert_eq!(window_results(&run_to_end(&sliding)), oracle, "sliding");

    // Sessions: a sparse key space so that gaps occur; sessions computed from sorted times.
    let yaml =
        generator_yaml(4, events, 2_000, 2_000, 3, "{type: session, gap_ms: 4000}").replace("keys: 17", "keys: 400");
    let sessions = spec_in(dir.path(), &yaml);
    let all = purchases(&sessions, events);
    let mut per_user: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for (user, amount, ts) in all {
        per_user.entry(user).or_default().push((ts, amount));
    }
    let mut oracle: WindowResults = BTreeMap::new();
    for (user, mut list) in per_user {
        list.sort();
        let mut current: Option<(i64, i64, u64, i64)> = None; // start, end, n, total
        for (ts, amount) in list {
            current = match current {
                Some((s, e, n, t)) if ts <= e => Some((s, e.max(ts + 4_000), n + 1, t + amount)),
                Some((s, e, n, t)) => {
                    oracle.insert((user.clone(), s, e), (n, t));
                    Some((ts, ts + 4_000, 1, amount))
                }
                None => Some((ts, ts + 4_000, 1, amount)),
            };
        }
        if let Some((s, e, n, t)) = current {
            oracle.insert((user.clone(), s, e), (n, t));
        }
    }
    assert_eq!(window_results(&run_to_end(&sessions)), oracle, "sessions");
}

/// Two inputs into one window: a generator that finishes, and a followed file nobody writes.
fn stalled_yaml(idleness: &str) -> String {
    format!(
        "name: stall\n{idleness}\
         sources:\n  - {{type: generator, name: busy, seed: 1, events: 400, keys: 3, key_field: user_id, value_field: amount_cents, interval_ms: 1000}}\n  \
         - {{type: file, name: quiet, path: quiet.jsonl, format: json_lines, timestamp: /ts, follow: true}}\n\
         steps:\n  - {{name: totals, wasm: {}, key_by: /user_id, window: {{type: tumbling, size_ms: 60000}}}}\nsink: {{type: blackhole}}\n",
        guests::PURCHASE_TOTALS
    )
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stalled_input_stalls_windows_without_idleness_and_not_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("quiet.jsonl"), "").expect("quiet input");
    for (idleness, expect_windows) in [("", false), ("watermarks: {idleness_ms: 200}\n", true)] {
        let spec = spec_in(dir.path(), &stalled_yaml(idleness));
        let sink = MemorySink::default();
        let received: Received = sink.received.clone();
        let job = start(&spec, sink, JobOptions::default());
        wait_for("the busy source", Duration::from_secs(30), || job.metrics().source_records == 400);
        if expect_windows {
            // 400 events one second apart fill 7 one-minute windows for each of 3 users.
            wait_for("windows to fire", Duration::from_secs(30), || received.lock().expect("lock").len() == 21);
        } else {
            // Well past the idleness timeout of the other run: still nothing may fire.
            std::thread::sleep(Duration::from_millis(800));
            assert_eq!(received.lock().expect("lock").len(), 0, "no window fires while an input is silent");
            assert!(!job.is_done(), "the followed file keeps the job running");
        }
        job.cancel();
        let summary = job.wait().expect("cancelled cleanly");
        assert!(!summary.finished);
    }
}

/// `watermarks.interval_ms`: the watermark after a reader's first batch goes on at once, the
/// next is held for the interval: a record behind it that arrives meanwhile is on time. The
/// followed file then goes quiet, so only the reader's idle polls can pass the held one on,
/// and the window fires while the job runs.
#[test]
fn a_watermark_interval_holds_the_newest_watermark_until_a_later_poll_passes_it_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = |user: &str, ts: i64| format!("{{\"user_id\": \"{user}\", \"amount_cents\": 1, \"ts\": {ts}}}\n");
    // a@1500 is behind the watermark b@5000 makes (4999), and on time only while that is held.
    let lines = [record("a", 1000), record("b", 5000), record("a", 1500)].concat();
    std::fs::write(dir.path().join("in.jsonl"), lines).expect("input");
    let yaml = |interval: i64| {
        format!(
            "name: interval\nbatch_size: 1\nwatermarks: {{out_of_orderness_ms: 0, interval_ms: {interval}}}\n\
             sources:\n  - {{type: file, name: in, path: in.jsonl, format: json_lines, timestamp: /ts, follow: true}}\n\
             steps:\n  - {{name: totals, wasm: {}, key_by: /user_id, window: {{type: tumbling, size_ms: 1000}}}}\n\
             sink: {{type: blackhole}}\n",
            guests::PURCHASE_TOTALS
        )
    };
    // (interval, purchases in a's window [1000, 2000), late records)
    for (interval, purchases, late) in [(0, 1, 1), (400, 2, 0)] {
        let spec = spec_in(dir.path(), &yaml(interval));
        let sink = MemorySink::default();
        let received: Received = sink.received.clone();
        let job = start(&spec, sink, JobOptions::default());
        let a_window = || {
            received.lock().expect("lock").iter().find_map(|(side, r)| {
                let v: serde_json::Value = eddy_tests::value_json(&r.value);
                (side.is_none() && v["start"] == 1000).then(|| v["result"]["purchases"].as_u64())
            })
        };
        let lates =
            || received.lock().expect("lock").iter().filter(|(side, _)| side.as_deref() == Some("late")).count();
        // Each record comes before the watermark after it, so once the window fired (and, at
        // interval 0, the late record went by) nothing of it is still on its way.
        wait_for("a's window to fire while the job runs", Duration::from_secs(30), || {
            a_window().is_some() && lates() == late
        });
        assert_eq!(a_window(), Some(Some(purchases)), "interval {interval}");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(lates(), late, "late records, interval {interval}");
        assert!(!job.is_done(), "the followed file keeps the job running");
        job.cancel();
        job.wait().expect("cancelled cleanly");
    }
}

#[test]
fn task_threads_run_under_sched_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("quiet.jsonl"), "").expect("quiet input");
    let spec = spec_in(dir.path(), &stalled_yaml(""));
    let job = start(&spec, MemorySink::default(), JobOptions::default());
    // Other tests' jobs may be starting threads too: wait until every task thread has entered
    // the policy (a thread is named before its first instruction runs).
    wait_for("every task thread under SCHED_BATCH", Duration::from_secs(30), || {
        let threads = thread_policies("self", "eddy-t");
        !threads.is_empty() && threads.iter().all(|(_, policy)| *policy == eddy_tests::SCHED_BATCH)
    });
    job.cancel();
    job.wait().expect("cancelled cleanly");
}

#[test]
fn a_slow_sink_slows_the_source_with_bounded_records_in_flight_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = 20_000u64;
    let lines: String = (0..events).map(|i| format!("w{}\n", i % 50)).collect();
    std::fs::write(dir.path().join("words.txt"), lines).expect("input");
    let yaml = format!(
        "name: slow\nbatch_size: 20\nsources: [{{type: file, name: words, path: words.txt}}]\n\
         steps:\n  - {{name: split, wasm: {}, parallelism: 2}}\nsink: {{type: blackhole}}\n",
        guests::WORDCOUNT_SPLIT
    );
    let spec = spec_in(dir.path(), &yaml);
    let sink = MemorySink { delay: Duration::from_millis(1), ..MemorySink::default() };
    let received = sink.received.clone();
    let options = JobOptions { buffer_bytes: 256, ..JobOptions::default() };
    let channel = options.channel;
    let job = start(&spec, sink, options);
    let mut max_gap = 0;
    while !job.is_done() {
        let m = job.metrics();
        max_gap = max_gap.max(m.source_records.saturating_sub(received.lock().expect("lock").len() as u64));
        std::thread::sleep(Duration::from_millis(2));
    }
    let summary = job.wait().expect("finishes");
    // Records that can be between source and sink: every channel full (credits + queue), one
    // batch inside each subtask, one buffer under construction per channel; a buffer holds at
    // most ~256 bytes of ~4-byte words (<= 64 records), a source batch 20.
    let channels = 2 + 2; // source -> split (rebalance 1x2), split -> sink (2x1)
    let per_message = 64 + 1;
    let bound = (channels * (channel.max_in_flight() + 1) + 4) as u64 * per_message;
    assert!(max_gap <= bound, "records in flight peaked at {max_gap}, bound {bound}");
    assert!(max_gap > 0);
    assert_eq!(received.lock().expect("lock").len() as u64, events, "nothing lost");
    let source_blocked = summary.metrics.tasks[0].blocked_ns;
    assert!(source_blocked > 100_000_000, "the source waited for credit: {source_blocked} ns");
}

/// State TTL through the [`TtlClock`] seam: the test moves processing time itself, so nothing
/// depends on how fast a loaded machine runs. The word counter keeps one count per word under a
/// TTL of 1 500 ms, restarted by every write.
#[test]
fn state_expires_after_its_ttl() {
    use eddy_core::HeapTimerService;
    use eddy_runtime::Subtask;
    use eddy_state::{HeapStateBackend, TtlBackend, TtlClock};

    let (clock, hand) = TtlClock::manual(1_000);
    let backend = TtlBackend::new(Box::new(HeapStateBackend::default()), 1_500, clock);
    let count = eddy_tests::load("count", guests::WORDCOUNT_COUNT);
    let mut op = count
        .instantiate_operator(Subtask::single(128), Box::new(backend), Box::new(HeapTimerService::default()))
        .expect("instantiate");
    op.open("").expect("open");
    let mut add_one = || -> Vec<u64> {
        let out = op.process(&eddy_tests::json_batch(&[(Some("a"), 1u64)])).expect("process");
        eddy_tests::decode::<String, u64>(&out.main).into_iter().map(|(_, n)| n).collect()
    };
    assert_eq!([add_one(), add_one()], [[1], [2]]);
    // The last write (at 1 000) keeps the count until 2 500; this one restarts it, to 3 999.
    hand.advance_to(2_499);
    assert_eq!(add_one(), [3]);
    hand.advance_to(3_998);
    assert_eq!(add_one(), [4], "the write at 2 499 restarted the TTL");
    // Nothing written from 3 998 for the TTL: the count is gone and starts over.
    hand.advance_to(3_998 + 1_500);
    assert_eq!(add_one(), [1]);
    // Expired state is reclaimed by purge steps, not only hidden.
    hand.advance_to(10_000);
    let state = op.state_backend_mut();
    assert_eq!(state.approximate_len(), 1);
    assert_eq!(state.purge_expired().expect("purge"), 1);
    assert_eq!(state.approximate_len(), 0);
}

#[test]
fn failures_name_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("in.jsonl"), "\"ok\"\n{not json\n").expect("input");
    let base = format!(
        "name: bad\nsources: [{{type: file, name: in, path: in.jsonl, format: json_lines}}]\nsteps:\n  - {{name: split, wasm: {}}}\nsink: {{type: blackhole}}\n",
        guests::WORDCOUNT_SPLIT
    );
    let err =
        start(&spec_in(dir.path(), &base), MemorySink::default(), JobOptions::default()).wait().expect_err("bad line");
    let text = err.to_string();
    assert!(text.contains("line 2") && text.contains("in.jsonl"), "{text}");

    let window_over_operator = base
        .replace("{name: split, wasm:", "{name: split, key_by: value, window: {type: tumbling, size_ms: 10}, wasm:");
    let err = Job::start(&spec_in(dir.path(), &window_over_operator), runtime(), JobOptions::default())
        .expect_err("an operator is not an aggregate");
    assert!(matches!(err, RunError::WrongKind { .. }) && err.to_string().contains("window aggregate"), "{err}");

    std::fs::write(dir.path().join("ok.jsonl"), "\"ok\"\n").expect("input");
    let no_key =
        base.replace("in.jsonl", "ok.jsonl").replace("{name: split, wasm:", "{name: split, key_by: key, wasm:");
    let err = start(&spec_in(dir.path(), &no_key), MemorySink::default(), JobOptions::default())
        .wait()
        .expect_err("no key to key by");
    assert!(err.to_string().contains("has no key"), "{err}");
}
