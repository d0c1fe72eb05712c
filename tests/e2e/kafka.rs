//! The Kafka source against a real Kafka-protocol broker (tansu, started per test): reads equal
//! what was produced, a restore at another parallelism reads every record once, an idle
//! partition does not hold back a window, topics found while running are read, and bad input
//! fails or goes aside as the spec says.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use eddy_engine::{Job, JobOptions};
use eddy_guest_artifacts as guests;
use eddy_plan::{PipelineSpec, StoreLocation};
use eddy_tests::{KafkaBroker, KafkaRecord, MemorySink, Received, runtime};
use serde_json::{Value, json};

type Produced = Vec<KafkaRecord>;

pub(crate) fn spec_in(dir: &Path, yaml: &str) -> PipelineSpec {
    std::fs::write(dir.join("pipeline.yaml"), yaml).expect("write spec");
    PipelineSpec::from_file(&dir.join("pipeline.yaml")).unwrap_or_else(|e| panic!("valid spec: {e}\n{yaml}"))
}

fn start(spec: &PipelineSpec, options: JobOptions) -> (Job, Received) {
    let sink = MemorySink::default();
    let received = sink.received.clone();
    let job = Job::start(spec, runtime(), JobOptions { sink: Some(Box::new(sink)), ..options }).expect("job starts");
    (job, received)
}

/// Waits until the sink holds `n` records of the main output.
fn wait_for(received: &Received, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = received.lock().expect("lock").iter().filter(|(side, _)| side.is_none()).count();
        if got >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {got} of {n} records after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Purchases `from..to`: user `u{i % 7}` (also the Kafka key, as JSON), to partition `i % partitions`.
pub(crate) fn purchases(from: u64, to: u64, partitions: i32) -> Produced {
    (from..to)
        .map(|i| {
            let user = format!("u{}", i % 7);
            let value = json!({"user_id": user, "amount_cents": i % 100, "ts": i * 100});
            let partition = i32::try_from(i).expect("small") % partitions;
            (partition, Some(serde_json::to_vec(&user).expect("key")), serde_json::to_vec(&value).expect("value"))
        })
        .collect()
}

/// Every `(user, count)` the running count emitted, counts per user sorted.
fn counts(received: &Received) -> BTreeMap<String, Vec<u64>> {
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (side, r) in received.lock().expect("lock").iter() {
        assert!(side.is_none(), "no side output expected");
        let user: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("user key");
        counts.entry(user).or_default().push(eddy_tests::value_json(&r.value));
    }
    counts.values_mut().for_each(|c| c.sort_unstable());
    counts
}

/// Every `(user, count)` written to a topic (the Kafka key is the user), counts per user sorted.
fn written_counts(written: &[eddy_tests::Consumed]) -> BTreeMap<String, Vec<u64>> {
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (key, value, output) in written {
        assert_eq!(output, &None, "main output only");
        let user: String =
            serde_json::from_slice(key.as_deref().expect("the record key is the Kafka key")).expect("key");
        counts.entry(user).or_default().push(serde_json::from_slice(value).expect("count"));
    }
    counts.values_mut().for_each(|c| c.sort_unstable());
    counts
}

/// What the running count must emit over `produced`: per user, 1 up to its number of records.
pub(crate) fn oracle(produced: &[KafkaRecord]) -> BTreeMap<String, Vec<u64>> {
    let mut n: BTreeMap<String, u64> = BTreeMap::new();
    for (_, _, value) in produced {
        let v: Value = serde_json::from_slice(value).expect("json");
        *n.entry(v["user_id"].as_str().expect("user").to_owned()).or_default() += 1;
    }
    n.into_iter().map(|(user, n)| (user, (1..=n).collect())).collect()
}

/// Kafka `purchases` (keyed by user, `end` as given) → running count (checkpointed) → `sink`.
pub(crate) fn counting_yaml(broker: &KafkaBroker, readers: u32, end: &str, sink: &str) -> String {
    format!(
        "name: kafka-count\nparallelism: {readers}\n\
         sources: [{{type: kafka, name: purchases, brokers: \"{}\", topics: [purchases], parallelism: {readers}, \
         key: true, end: {end}, timestamp: /ts}}]\n\
         steps: [{{name: count, wasm: {}, key_by: key}}]\n\
         checkpoints: {{dir: checkpoints, interval_ms: 100}}\nrestart: {{strategy: none}}\nsink: {sink}\n",
        broker.address,
        guests::RUNNING_COUNT
    )
}

/// A Kafka sink to `counts`, at least once.
fn to_counts(broker: &KafkaBroker) -> String {
    format!("{{type: kafka, brokers: \"{}\", topic: counts, delivery: at_least_once}}", broker.address)
}

#[test]
fn a_restore_at_three_readers_from_a_savepoint_of_two_reads_every_record_exactly_once() {
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 6);
    let dir = tempfile::tempdir().expect("tempdir");
    let first = purchases(0, 600, 6);
    broker.produce("purchases", &first);

    let spec = spec_in(dir.path(), &counting_yaml(&broker, 2, "unbounded", "{type: blackhole}"));
    let (job, received) = start(&spec, JobOptions::default());
    wait_for(&received, first.len(), "the first run");
    let savepoint = StoreLocation::Dir(dir.path().join("savepoint"));
    job.stop_with_savepoint(&savepoint, Duration::from_secs(30)).expect("savepoint");
    let before = counts(&received);
    assert_eq!(before, oracle(&first), "the first run counts what was there");

    let second = purchases(600, 1500, 6);
    broker.produce("purchases", &second);
    let spec = spec_in(dir.path(), &counting_yaml(&broker, 3, "at_start", "{type: blackhole}"));
    let (job, after) = start(&spec, JobOptions { restore_from: Some(savepoint), ..JobOptions::default() });
    let summary = job.wait().expect("the bounded run ends");
    assert!(summary.finished);
    let mut all = before;
    for (user, counts) in counts(&after) {
        all.entry(user).or_default().extend(counts);
    }
    all.values_mut().for_each(|c| c.sort_unstable());
    let everything: Produced = first.into_iter().chain(second).collect();
    assert_eq!(all, oracle(&everything), "every record counted once across the rescale, none twice");
}

#[test]
fn an_idle_partition_does_not_hold_back_a_window() {
    let broker = KafkaBroker::start();
    broker.create_topic("clicks", 2);
    let dir = tempfile::tempdir().expect("tempdir");
    // Partition 1 stays empty; partition 0 spans five 10 s windows.
    let produced: Produced = (0..50u64)
        .map(|i| {
            let value = json!({"user_id": "u1", "amount_cents": i, "ts": i * 1_000});
            (0, None, serde_json::to_vec(&value).expect("value"))
        })
        .collect();
    broker.produce("clicks", &produced);
    let yaml = format!(
        "name: idle\n\
         sources: [{{type: kafka, name: clicks, brokers: \"{}\", topics: [clicks], timestamp: /ts, \
         watermarks: {{out_of_orderness_ms: 0, idleness_ms: 300}}}}]\n\
         steps: [{{name: totals, wasm: {}, key_by: /user_id, window: {{type: tumbling, size_ms: 10000}}}}]\n\
         sink: {{type: blackhole}}\n",
        broker.address,
        guests::PURCHASE_TOTALS
    );
    let (job, received) = start(&spec_in(dir.path(), &yaml), JobOptions::default());
    // The stream is unbounded: only the partition watermark, with the empty partition idle,
    // can fire these windows.
    wait_for(&received, 4, "windows behind an idle partition");
    job.cancel();
    let _ = job.wait();
    let fired: Vec<(i64, u64, i64)> = received
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, r)| {
            let v: Value = eddy_tests::value_json(&r.value);
            let result = &v["result"];
            (
                v["start"].as_i64().expect("start"),
                result["purchases"].as_u64().expect("n"),
                result["total_cents"].as_i64().expect("total"),
            )
        })
        .collect();
    for (start, n, total) in fired {
        let first = u64::try_from(start / 1_000).expect("positive");
        assert_eq!((n, total), (10, i64::try_from((first..first + 10).sum::<u64>()).expect("small")), "window {start}");
    }
}

#[test]
fn a_topic_created_while_running_that_matches_the_pattern_is_read() {
    let broker = KafkaBroker::start();
    broker.create_topic("events-a", 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let first = purchases(0, 40, 2);
    broker.produce("events-a", &first);
    let yaml = format!(
        "name: discover\n\
         sources: [{{type: kafka, name: events, brokers: \"{}\", topic_pattern: 'events-.*', discovery_interval_ms: 200}}]\n\
         steps: [{{name: count, wasm: {}, key_by: /user_id}}]\nsink: {{type: blackhole}}\n",
        broker.address,
        guests::RUNNING_COUNT
    );
    let (job, received) = start(&spec_in(dir.path(), &yaml), JobOptions::default());
    wait_for(&received, 40, "the first topic");
    broker.create_topic("events-b", 3);
    let second = purchases(40, 100, 3);
    broker.produce("events-b", &second);
    wait_for(&received, 100, "the topic created while running");
    job.cancel();
    let _ = job.wait();
    let everything: Produced = first.into_iter().chain(second).collect();
    assert_eq!(counts(&received), oracle(&everything));
}

fn decoding_yaml(broker: &KafkaBroker, on_error: &str) -> String {
    format!(
        "name: decoding\n\
         sources: [{{type: kafka, name: raw, brokers: \"{}\", topics: [mixed], end: at_start, on_error: {on_error}}}]\n\
         steps: [{{name: count, wasm: {}, key_by: /user_id}}]\nsink: {{type: blackhole}}\n",
        broker.address,
        guests::RUNNING_COUNT
    )
}

#[test]
fn a_record_that_is_not_json_fails_the_job_naming_it_or_goes_to_the_side_output_asked_for() {
    let broker = KafkaBroker::start();
    broker.create_topic("mixed", 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let good = |i: u64| serde_json::to_vec(&json!({"user_id": format!("u{i}")})).expect("value");
    broker.produce("mixed", &[(0, None, good(1)), (0, None, b"{not json".to_vec()), (0, None, good(2))]);

    let (job, _) = start(&spec_in(dir.path(), &decoding_yaml(&broker, "fail")), JobOptions::default());
    let err = job.wait().expect_err("an undecodable record fails the job").to_string();
    assert!(err.contains("`mixed` partition 0 offset 1") && err.contains("not JSON"), "{err}");

    let (job, received) =
        start(&spec_in(dir.path(), &decoding_yaml(&broker, "{side_output: rejected}")), JobOptions::default());
    job.wait().expect("the bad record goes aside and the job ends");
    let received = received.lock().expect("lock").clone();
    let main = received.iter().filter(|(side, _)| side.is_none()).count();
    let rejected: Vec<Value> = received
        .iter()
        .filter(|(side, _)| side.as_deref() == Some("rejected"))
        .map(|(_, r)| eddy_tests::value_json(&r.value))
        .collect();
    assert_eq!(main, 2, "both good records are counted");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(
        (&rejected[0]["topic"], &rejected[0]["offset"], &rejected[0]["value"]),
        (&json!("mixed"), &json!(1), &json!("{not json"))
    );
}

#[test]
fn a_missing_topic_is_named() {
    let broker = KafkaBroker::start();
    broker.create_topic("present", 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "name: missing\nsources: [{{type: kafka, name: s, brokers: \"{}\", topics: [present, absent]}}]\n\
         steps: [{{name: count, wasm: {}, key_by: /user_id}}]\nsink: {{type: blackhole}}\n",
        broker.address,
        guests::RUNNING_COUNT
    );
    let err = match Job::start(&spec_in(dir.path(), &yaml), runtime(), JobOptions::default()) {
        Err(e) => e.to_string(),
        Ok(job) => job.wait().expect_err("a missing topic fails the job").to_string(),
    };
    assert!(err.contains("topic `absent` does not exist") && err.contains(&broker.address), "{err}");
}

/// With no failure, either guarantee writes every count once (read `read_committed`).
#[test]
fn a_keyed_count_written_to_kafka_holds_every_count_once_at_least_and_exactly_once() {
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 3);
    let produced = purchases(0, 700, 3);
    broker.produce("purchases", &produced);
    for delivery in ["at_least_once", "exactly_once"] {
        let topic = format!("counts-{delivery}").replace('_', "-");
        broker.create_topic(&topic, 2);
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = format!("{{type: kafka, brokers: \"{}\", topic: {topic}, delivery: {delivery}}}", broker.address);
        let summary = Job::start(
            &spec_in(dir.path(), &counting_yaml(&broker, 2, "at_start", &sink)),
            runtime(),
            JobOptions::default(),
        )
        .expect("job starts")
        .wait()
        .expect("job ends");
        assert!(summary.finished);
        // Which side a shortfall is on: what the job read and handed its sink, then the topic.
        let n = produced.len() as u64;
        assert_eq!((summary.metrics.source_records, summary.metrics.sink_records), (n, n), "{delivery}: read, sunk");
        let written = broker.consume(&topic, produced.len());
        let (expected, got) = (oracle(&produced), written_counts(&written));
        let short: Vec<String> = expected
            .iter()
            .filter_map(|(user, want)| {
                let have = got.get(user).map_or(0, Vec::len);
                (have < want.len()).then(|| format!("{user}: {have} of {}", want.len()))
            })
            .collect();
        assert!(short.is_empty(), "{delivery}: counts missing from the topic, per user: {short:?}");
        assert_eq!(written.len(), produced.len(), "{delivery}: no count twice");
        assert_eq!(got, expected, "{delivery}");
    }
}

/// Kafka → running count → Kafka at least once, in a child process killed with SIGKILL at
/// random moments (30 times; `EDDY_CRASH_SEED` repeats a run) and restarted from its newest
/// checkpoint each time: every count the oracle expects is in the output topic, duplicates
/// (allowed at least once) are counted and reported.
#[test]
fn sigkill_at_random_moments_loses_no_record_written_to_kafka_at_least_once() {
    use crate::checkpoints::{CHILD_CPU_SHARE, crash_settings, seeded_draws, start_child, start_child_with};
    let (seed, kills) = crash_settings();
    let kills = kills.max(30);
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 4);
    broker.create_topic("counts", 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let produced = purchases(0, 20_000, 4);
    broker.produce("purchases", &produced);
    let yaml = counting_yaml(&broker, 2, "at_start", &to_counts(&broker));
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write spec");
    let draw = seeded_draws(seed);
    let mut finished_early = false;
    for _ in 0..kills {
        // Throttled to a twentieth of a core, so the kills land while the job runs.
        let mut child = start_child_with(&path, &[(CHILD_CPU_SHARE, "0.05")]);
        std::thread::sleep(Duration::from_millis(150 + draw(500)));
        if child.try_wait().expect("poll child").is_some_and(|s| s.success()) {
            finished_early = true;
            break;
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }
    let status = start_child(&path).wait().expect("final run");
    assert!(status.success(), "seed {seed}: the final run failed");
    let written = broker.consume("counts", produced.len());
    let mut counts = written_counts(&written);
    for c in counts.values_mut() {
        c.dedup();
    }
    let duplicates = written.len() - counts.values().map(Vec::len).sum::<usize>();
    eprintln!(
        "kafka crash test: seed {seed}, {kills} kills{}, {} records written for {} expected: {duplicates} duplicates",
        if finished_early { " (finished early)" } else { "" },
        written.len(),
        produced.len()
    );
    assert_eq!(counts, oracle(&produced), "seed {seed}: every count present, none invented");
}

/// A Kafka sink exactly once to `counts`.
fn to_counts_exactly_once(brokers: &str) -> String {
    format!("{{type: kafka, brokers: \"{brokers}\", topic: counts, delivery: exactly_once}}")
}

/// Exactly once through deaths exactly between a checkpoint's completion and the sink's
/// commit (the records staged in the completed checkpoint, none sent yet): each next start
/// produces what the restored checkpoint staged and its marker does not cover, and the topic
/// ends with every count once. (SIGKILLs at random moments can land inside a commit, leaving an
/// aborted transaction, which tansu shows to `read_committed` consumers: that loop runs against
/// `EDDY_TEST_KAFKA` below; for the same reason the sink here has one subtask, since a death
/// at one subtask's commit point can cut another's commit short.)
#[test]
fn deaths_between_completion_and_commit_lose_and_repeat_no_record_exactly_once() {
    use crate::checkpoints::die_before_commits;
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 4);
    broker.create_topic("counts", 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let produced = purchases(0, 20_000, 4);
    broker.produce("purchases", &produced);
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, counting_yaml(&broker, 1, "at_start", &to_counts_exactly_once(&broker.address)))
        .expect("write spec");
    let deaths = die_before_commits(&path, 0, 3, &mut || true);
    assert!(deaths > 0, "no run died before a commit");
    let written = broker.consume("counts", produced.len());
    eprintln!("kafka exactly once: {deaths} deaths before a commit, {} records for {}", written.len(), produced.len());
    assert_eq!(written.len(), produced.len(), "no count twice");
    assert_eq!(written_counts(&written), oracle(&produced));
}

/// The broker named by `EDDY_TEST_KAFKA` (`host:port`, a Kafka with transactions that hides
/// aborted ones and fences), or why the test is skipped.
fn real_kafka() -> Option<String> {
    let found = std::env::var("EDDY_TEST_KAFKA").ok().filter(|b| !b.is_empty());
    if found.is_none() {
        eprintln!(
            "skipped: set EDDY_TEST_KAFKA=host:port to a Kafka broker (tansu shows aborted transactions to \
             read_committed consumers and answers a fenced producer with a timeout)"
        );
    }
    found
}

/// Against a real Kafka: 30 SIGKILLs at random moments, some inside a commit (an aborted
/// transaction), and every count once in the topic, read `read_committed`.
#[test]
fn sigkill_at_random_moments_writes_every_count_once_to_a_real_kafka() {
    use crate::checkpoints::{crash_repeatedly, crash_settings};
    let Some(brokers) = real_kafka() else { return };
    let (seed, kills) = crash_settings();
    let suffix = format!("{seed:x}");
    let (input, output) = (format!("purchases-{suffix}"), format!("counts-{suffix}"));
    let admin = KafkaBroker::external(&brokers);
    admin.create_topic(&input, 4);
    admin.create_topic(&output, 2);
    let produced = purchases(0, 20_000, 4);
    admin.produce(&input, &produced);
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = format!("{{type: kafka, brokers: \"{brokers}\", topic: {output}, delivery: exactly_once}}");
    let yaml =
        counting_yaml(&admin, 2, "at_start", &sink).replace("topics: [purchases]", &format!("topics: [{input}]"));
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write spec");
    crash_repeatedly(&path, seed, kills.max(30), true, Some("0.01"), &mut || {});
    let written = admin.consume(&output, produced.len());
    assert_eq!(written.len(), produced.len(), "seed {seed}: no count twice");
    assert_eq!(written_counts(&written), oracle(&produced), "seed {seed}");
}

/// Against a real Kafka: a second sink instance of the same subtask fences the first, whose
/// commit then fails instead of writing alongside the new one.
#[test]
fn a_new_instance_of_a_sink_subtask_fences_the_old_one_on_a_real_kafka() {
    let Some(brokers) = real_kafka() else { return };
    let topic = format!("fenced-{}", std::process::id());
    KafkaBroker::external(&brokers).create_topic(&topic, 1);
    let spec = eddy_plan::PipelineSpec::from_yaml(&format!(
        "name: f\nsources: [{{type: generator, name: g}}]\nsteps: [{{name: a, wasm: a.wasm}}]\nsink: {{type: kafka, \
         brokers: \"{brokers}\", topic: {topic}, delivery: exactly_once}}"
    ))
    .expect("spec");
    let eddy_plan::SinkSpec::Kafka(k) = &spec.sink else { panic!("kafka sink") };
    use eddy_connectors::Sink;
    let mut old = eddy_connectors::KafkaSink::open(k, "fenced", 0).expect("old instance");
    old.write(None, &eddy_tests::json_batch(&[(Some("k"), 1)])).expect("staged");
    old.pre_commit(1).expect("pre-commit");
    let _new = eddy_connectors::KafkaSink::open(k, "fenced", 0).expect("new instance");
    let err = old.notify_complete(1).expect_err("the old instance is fenced").to_string();
    assert!(err.to_lowercase().contains("fenced"), "{err}");
}
