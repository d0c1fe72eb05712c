//! Live swaps of a step's code at a checkpoint barrier: a running count whose next version
//! adds two per record, swapped while the job runs. Every committed row must equal an oracle
//! computed from the generator's events and the swap's barrier position, which the swap's
//! checkpoint metadata records (records before it counted by the old code, after it by the new).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use eddy_checkpoint::metadata::CheckpointMetadata;
use eddy_checkpoint::{CheckpointStore, SourcePosition};
use eddy_connectors::generator_event;
use eddy_engine::{Job, JobOptions, SwapError};
use eddy_guest_artifacts as guests;
use eddy_plan::{PipelineSpec, SourceSpec};
use eddy_tests::runtime;
use serde_json::Value;

use crate::checkpoints::committed_counts;

/// Generated purchases by 30 users into the running count at parallelism 2, checkpoints every
/// 200 ms, exactly-once files; `config` is the count step's.
fn pipeline(dir: &Path, backend: &str, config: &str) -> PathBuf {
    let yaml = format!(
        "name: live-swap\nparallelism: 2\nsources:\n  - {{type: generator, name: purchases, seed: 7, events: 12000, \
         keys: 30, key_field: user_id, key_prefix: user-, value_field: amount_cents, min_value: 1, max_value: 100, \
         start_ms: 0, interval_ms: 5, rate_per_sec: 6000, parallelism: 1}}\nsteps:\n  - {{name: count, wasm: {count}, \
         key_by: /user_id, config: {config}}}\nstate: {{backend: {backend}, dir: {dir}/state}}\ncheckpoints: {{dir: \
         {dir}/checkpoints, interval_ms: 200, retained: 50}}\nrestart: {{strategy: none}}\nsink: {{type: files, dir: \
         {dir}/out}}\n",
        count = guests::RUNNING_COUNT,
        dir = dir.display(),
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write pipeline");
    path
}

/// Each user's running counts: +1 per event before index `swap_at`, +2 from it on.
fn oracle(spec: &PipelineSpec, swap_at: u64) -> Vec<(String, u64)> {
    let SourceSpec::Generator(g) = &spec.sources[0] else { panic!("generator source") };
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut rows = Vec::new();
    for i in 0..g.events.expect("bounded") {
        let value: Value = eddy_tests::value_json(&generator_event(g, i).value);
        let user = value["user_id"].as_str().expect("user").to_owned();
        let total = totals.entry(user.clone()).or_default();
        *total += if i < swap_at { 1 } else { 2 };
        rows.push((user, *total));
    }
    rows.sort();
    rows
}

fn start(path: &Path) -> (PipelineSpec, Job) {
    let spec = PipelineSpec::from_file(path).expect("spec");
    let job = Job::start(&spec, runtime(), JobOptions::default()).expect("start");
    (spec, job)
}

fn wait_for_records(job: &Job, records: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.metrics().tasks.first().map_or(0, |t| t.records_out) < records {
        assert!(Instant::now() < deadline, "the source read {records} records within a minute");
        assert!(!job.is_done(), "the job ended before {records} records");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_running_count_swapped_live_counts_by_the_new_code_from_the_swaps_barrier_on() {
    for backend in ["heap", "rocksdb"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (spec, job) = start(&pipeline(dir.path(), backend, "null"));
        wait_for_records(&job, 3_000);
        let v2 = runtime().load_file("count", guests::RUNNING_COUNT_V2.as_ref()).expect("load v2");
        let digest = v2.digest().to_owned();
        let done = job.swap_live("count", v2, Duration::from_secs(30)).expect("the swap completes");
        assert_eq!(done.subtasks, 2, "both subtasks of `count` went over");
        assert!(!job.is_done(), "the swap restarted nothing: the job still runs");
        // Read now: a finished job keeps only its final checkpoint.
        let store = CheckpointStore::open(spec.checkpoints.as_ref().expect("checkpoints")).expect("store");
        let meta = CheckpointMetadata::read(&store, done.checkpoint).expect("the swap's checkpoint");
        let summary = job.wait().expect("the job finishes");
        assert!(summary.finished);

        let swap_at = meta
            .subtasks
            .iter()
            .find_map(|s| match &s.source {
                Some((_, SourcePosition::Generator { next_index })) => Some(*next_index),
                _ => None,
            })
            .expect("the source's position at the swap's barrier");
        let artifacts: Vec<Option<&str>> =
            meta.subtasks.iter().flat_map(|s| &s.operators).map(|o| o.artifact.as_deref()).collect();
        assert_eq!(artifacts, vec![Some(digest.as_str()); 2], "the metadata names the new code for `count`");
        assert!(swap_at > 0 && swap_at < 12_000, "{backend}: the swap fell inside the input ({swap_at})");
        let got = committed_counts(&dir.path().join("out"));
        let expected = oracle(&spec, swap_at);
        eprintln!(
            "live swap ({backend}): at checkpoint {} (source at event {swap_at}), {} rows compared, longest swap {:.2} ms",
            done.checkpoint,
            expected.len(),
            done.longest_swap_ms
        );
        assert!(got == expected, "{backend}: the committed running counts differ from the oracle");
    }
}

#[test]
fn a_swap_whose_new_code_fails_is_refused_and_the_job_runs_on_with_the_old() {
    let cases = [
        (r#"{"trap_in_open": true}"#, "fails in `open`"),
        (r#"{"count_as_list": true}"#, "state `count` was Value and is now List"),
    ];
    for (config, problem) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let (spec, job) = start(&pipeline(dir.path(), "heap", config));
        wait_for_records(&job, 1_000);
        let v2 = runtime().load_file("count", guests::RUNNING_COUNT_V2.as_ref()).expect("load v2");
        let refused = job.swap_live("count", v2, Duration::from_secs(30)).expect_err("refused");
        assert!(refused.to_string().contains(problem), "{config}: {refused}");
        assert!(matches!(refused, SwapError::Open(_) | SwapError::Refused(_)), "{refused:?}");
        let wrong_step = runtime().load_file("count", guests::RUNNING_COUNT_V2.as_ref()).expect("load v2");
        let refused = job.swap_live("nope", wrong_step, Duration::from_secs(30)).expect_err("no such step");
        assert!(refused.to_string().contains("steps that can swap live: count"), "{refused}");
        job.wait().expect("the job finishes with the old code");
        assert_eq!(committed_counts(&dir.path().join("out")), oracle(&spec, u64::MAX), "{config}: old code throughout");
    }
}
