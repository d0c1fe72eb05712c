//! Unaligned checkpoints under heavy backpressure: a sink so slow that every channel in front
//! of it stays full. Aligned barriers wait behind every queued buffer; unaligned ones overtake
//! them (the overtaken records are stored with the snapshot), so their checkpoints complete in
//! a fraction of the time. Durations are the engine's own (`CompletedCheckpoint::stats`), and
//! only their relation is asserted: these machines are noisy.
//!
//! Exactly-once in unaligned mode is tested with the crash tests of `checkpoints.rs`, run in
//! both modes, and here by stopping a backpressured job whose newest checkpoint holds records
//! in flight and resuming it: the committed output must equal the oracle computed from the
//! generator.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eddy_checkpoint::{CheckpointMetadata, CheckpointStore};
use eddy_engine::{CompletedCheckpoint, Job, JobOptions};
use eddy_plan::PipelineSpec;
use eddy_tests::runtime;
use eddy_transport::channel::ChannelConfig;

use crate::checkpoints::{Setup, assert_exactly_once, committed, run_with, write_pipeline};

/// Sleeps `delay` per batch written: the bottleneck of the pipeline.
struct SlowSink {
    delay: Duration,
    records: Arc<Mutex<usize>>,
}

impl eddy_connectors::Sink for SlowSink {
    fn write(&mut self, _: Option<&str>, batch: &eddy_core::RecordBatch) -> std::io::Result<()> {
        std::thread::sleep(self.delay);
        *self.records.lock().expect("count") += batch.len();
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Unbounded fast generators into a keyed running count at parallelism 2, into a slow sink;
/// `checkpoints` is the `checkpoints:` mapping's extra fields.
fn backpressured_run(checkpoints: &str, wanted: usize) -> Vec<CompletedCheckpoint> {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "name: backpressure\nparallelism: 2\nbatch_size: 64\nsources:\n  - {{type: generator, name: events, seed: 5, \
         keys: 50, key_field: user_id, value_field: v, rate_per_sec: 1000000}}\nsteps:\n  - {{name: count, wasm: \
         {wasm}, key_by: /user_id}}\ncheckpoints: {{dir: checkpoints, interval_ms: 100, timeout_ms: 60000, \
         {checkpoints}}}\nrestart: {{strategy: none}}\nsink: {{type: print}}\n",
        wasm = eddy_guest_artifacts::RUNNING_COUNT,
    );
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("spec");
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let records = Arc::new(Mutex::new(0));
    let sink = SlowSink { delay: Duration::from_millis(40), records: records.clone() };
    let options = JobOptions {
        sink: Some(Box::new(sink)),
        // Deep channels: much data queued in front of the sink, as on a real network.
        channel: ChannelConfig { capacity: 16, max_queued: 1 },
        ..JobOptions::default()
    };
    let job = Job::start(&spec, runtime(), options).expect("starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while job.completed_checkpoints().len() < wanted && Instant::now() < deadline && !job.is_done() {
        std::thread::sleep(Duration::from_millis(10));
    }
    job.cancel();
    let summary = job.wait().expect("no failure");
    assert!(
        summary.checkpoints.len() >= wanted,
        "{checkpoints}: only {} checkpoints completed",
        summary.checkpoints.len()
    );
    summary.checkpoints
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn durations(checkpoints: &[CompletedCheckpoint]) -> Vec<f64> {
    // The first checkpoint starts before the channels filled up: not under backpressure yet.
    checkpoints.iter().skip(1).map(|c| c.stats.total_ms).collect()
}

#[test]
fn under_backpressure_unaligned_checkpoints_complete_far_sooner_than_aligned_ones() {
    let aligned = backpressured_run("mode: aligned", 5);
    let switched = backpressured_run("mode: aligned, aligned_timeout_ms: 100", 5);
    let unaligned = backpressured_run("mode: unaligned", 5);
    let (a, s, u) = (median(durations(&aligned)), median(durations(&switched)), median(durations(&unaligned)));
    let show = |c: &[CompletedCheckpoint]| {
        c.iter()
            .map(|c| format!("{:.0}ms/{}B", c.stats.total_ms, c.stats.in_flight_bytes))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!("checkpoint durations under backpressure (total/in-flight bytes):");
    eprintln!("  aligned:                  median {a:.0} ms: {}", show(&aligned));
    eprintln!("  aligned, timeout 100 ms:  median {s:.0} ms: {}", show(&switched));
    eprintln!("  unaligned:                median {u:.0} ms: {}", show(&unaligned));
    assert!(
        aligned.iter().all(|c| !c.stats.unaligned && c.stats.in_flight_bytes == 0),
        "aligned stores nothing in flight"
    );
    assert!(
        a > 100.0,
        "aligned checkpoints wait behind the queues, longer than the 100 ms alignment timeout: {a:.0} ms"
    );
    assert!(u * 2.0 < a, "unaligned median {u:.0} ms is not well below aligned median {a:.0} ms");
    assert!(unaligned.iter().all(|c| c.stats.unaligned), "every unaligned checkpoint says so");
    assert!(
        unaligned.iter().any(|c| c.stats.in_flight_bytes > 0),
        "barriers overtook queued records, which were stored with the snapshots"
    );
    assert!(switched.iter().any(|c| c.stats.unaligned), "alignment took longer than 100 ms and switched");
    assert!(s < a, "switching after the alignment timeout beats staying aligned: {s:.0} vs {a:.0} ms");
}

/// Reads the metadata of the newest completed checkpoint in `dir`.
fn newest_checkpoint(dir: &Path) -> CheckpointMetadata {
    let store = CheckpointStore::local(dir).expect("store");
    let ids = eddy_checkpoint::metadata::completed_ids(&store).expect("list");
    CheckpointMetadata::read(&store, ids[0]).expect("metadata")
}

#[test]
fn a_job_stopped_with_records_in_flight_resumes_from_them_exactly_once() {
    resume_with_records_in_flight(2);
}

/// As above, resuming the keyed window step at parallelism 3: the records in flight follow
/// their key groups to the new subtasks like the keyed state does.
#[test]
fn records_in_flight_follow_their_key_groups_to_another_parallelism() {
    resume_with_records_in_flight(3);
}

fn resume_with_records_in_flight(parallelism: u32) {
    let dir = tempfile::tempdir().expect("tempdir");
    // The window job of the crash tests, unaligned, with its operators throttled to a sliver
    // of a core: the sources outrun the window step, so its input channels stay full and
    // checkpoints' barriers overtake records. The throttled run lasts several checkpoints: on a
    // loaded machine the first barrier can pass before the sources have filled the channels,
    // and a run over by the second checkpoint would never stop midway.
    let setup = Setup { events: 30_000, rate: 1_000_000, mode: "unaligned", min_pause_ms: 300, ..Setup::default() };
    let path = write_pipeline(dir.path(), &setup);
    let options = JobOptions {
        cpu_share: Some(Arc::new(eddy_runtime::CpuShare::new(0.002, Duration::from_millis(10)))),
        ..JobOptions::default()
    };
    // Stop right after a checkpoint that stored records in flight (the minimum pause keeps the
    // next one from completing before the stop).
    let first =
        run_with(&path, options, |job| job.completed_checkpoints().last().is_some_and(|c| c.stats.in_flight_bytes > 0))
            .expect("first run");
    assert!(!first.finished, "stopped midway");
    let newest = newest_checkpoint(&dir.path().join("checkpoints"));
    assert!(newest.stats.unaligned);
    let in_flight: Vec<_> = newest.subtasks.iter().filter(|s| !s.in_flight.is_empty()).collect();
    assert!(!in_flight.is_empty(), "checkpoint {} holds records in flight", newest.id);
    assert!(in_flight.iter().all(|s| s.task > 0), "only tasks with inputs have records in flight");
    let partial = committed(&dir.path().join("out")).len();
    let text = std::fs::read_to_string(&path).expect("read");
    std::fs::write(&path, text.replace("parallelism: 2", &format!("parallelism: {parallelism}"))).expect("write");

    let second = run_with(&path, JobOptions::default(), |_| false).expect("second run");
    assert!(second.finished, "ran to the end");
    assert_eq!(second.restored_from, Some(newest.id), "resumed from the checkpoint with records in flight");
    assert!(partial < committed(&dir.path().join("out")).len());
    assert_exactly_once(&path, "resumed from an unaligned checkpoint with records in flight");
}
