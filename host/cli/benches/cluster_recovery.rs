//! Recovery from a worker SIGKILL with about 1 GB of RocksDB state: `cargo bench -p eddy-cli
//! --bench cluster_recovery`. A coordinator (checkpoints in a directory, as a shared mount)
//! and one worker with one slot run a running count per user, every event a new user whose
//! name is 200 characters long, so the state grows by ~225 bytes an event. Once a completed
//! checkpoint holds `EDDY_BENCH_BYTES` of state (default 1 GB), the worker is killed with SIGKILL
//! and started again at once (as a supervisor restarts a pod), three times. Each time the
//! bench measures from the kill to the new process's `job started` line, logged when the
//! attempt has been scheduled, the checkpoint fetched and every subtask's state opened, just
//! before its sources emit again (the goal: records flowing again within 2 s for
//! 1 GB). The state's size is the quota's count in the newest checkpoint's metadata.
#![allow(clippy::unwrap_used, reason = "a bench driver: a failed step should stop it loudly")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::fleet::{Worker, eventually, names};
use common::{Server, expect, job, submit, tenant, upload};
use eddy_checkpoint::CheckpointStore;
use eddy_checkpoint::metadata::CheckpointMetadata;

/// The job: a running count per user, RocksDB state, unbounded input whose users are drawn
/// from 2^64 (so each is new), checkpointed every second, restarted at once after a failure.
fn job_spec() -> String {
    let prefix = "u".repeat(190);
    let keys = u64::MAX;
    format!(
        "name: big-state\nparallelism: 1\nsources:\n  - {{type: generator, name: g, seed: 7, keys: {keys}, \
         key_field: user, key_prefix: {prefix}-, value_field: v, min_value: 1, max_value: 9, start_ms: 0, \
         interval_ms: 1}}\nsteps:\n  - {{name: count, wasm: count@1, key_by: /user}}\nstate: {{backend: rocksdb}}\n\
         checkpoints: {{interval_ms: 1000}}\nrestart: {{strategy: fixed_delay, attempts: 1000, delay_ms: 0}}\n\
         sink: {{type: blackhole}}\n"
    )
}

/// The newest completed checkpoint under `root`: (its id, the bytes and entries the state
/// quota counted in it).
fn newest_checkpoint(root: &Path) -> Option<(u64, u64, u64)> {
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            match name.strip_prefix("chk-").and_then(|id| id.parse::<u64>().ok()) {
                Some(id) if path.join("_metadata").exists() => found.push((id, dir.clone())),
                Some(_) => {}
                None if path.is_dir() => dirs.push(path),
                None => {}
            }
        }
    }
    let (id, at) = found.into_iter().max()?;
    let meta = CheckpointMetadata::read(&CheckpointStore::local(&at).ok()?, id).ok()?;
    let usage = meta.subtasks.iter().flat_map(|s| &s.operators).filter_map(|o| o.usage);
    let (bytes, entries) = usage.fold((0, 0), |(b, e), u| (b + u.bytes, e + u.entries));
    Some((id, bytes, entries))
}

/// Waits until `log` grows a line containing `needle` past byte `from`.
fn wait_for_line(log: &Path, from: u64, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = std::fs::read(log).unwrap_or_default();
        if text.len() as u64 > from && String::from_utf8_lossy(&text[from as usize..]).contains(needle) {
            return;
        }
        assert!(Instant::now() < deadline, "no `{needle}` in {}", log.display());
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let target: u64 = std::env::var("EDDY_BENCH_BYTES").ok().and_then(|k| k.parse().ok()).unwrap_or(1_000_000_000);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("checkpoints");
    let flags = ["--heartbeat-timeout-ms", "2000", "--checkpoint-store", store.to_str().unwrap()];
    let coordinator = Server::start_as("coordinator", &dir.path().join("coordinator"), &flags);
    let mut worker = Worker::start_with_slots(&coordinator, "worker-1", dir.path(), "1");
    eventually("the worker", || names(&coordinator).len() == 1);
    let (_, token) = tenant(&coordinator, "bench");
    expect(upload(&coordinator, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let id = expect(submit(&coordinator, &token, &job_spec()), 201)["id"].as_str().unwrap().to_owned();

    let filling = Instant::now();
    let newest = loop {
        std::thread::sleep(Duration::from_secs(2));
        let j = job(&coordinator, &token, &id);
        assert!(["created", "running"].contains(&j["status"].as_str().unwrap()), "the job stopped: {j}");
        let newest = newest_checkpoint(&store);
        let (_, bytes, entries) = newest.unwrap_or_default();
        eprintln!("filling: {entries} users checkpointed ({:.2} of {:.2} GB)", bytes as f64 / 1e9, target as f64 / 1e9);
        if bytes >= target {
            break newest.unwrap();
        }
    };
    eprintln!("{} bytes of state checkpointed {:.0} s after the submission", newest.1, filling.elapsed().as_secs_f64());

    let mut recoveries = Vec::new();
    let mut last = newest.0;
    for kill in 1..=3 {
        // A checkpoint of the running attempt (so it restores from the full state).
        let deadline = Instant::now() + Duration::from_secs(300);
        let (checkpoint, bytes, entries) = loop {
            match newest_checkpoint(&store) {
                Some(newest) if newest.0 > last => break newest,
                _ => assert!(Instant::now() < deadline, "no checkpoint completed"),
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = worker.log.clone();
        let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        worker.kill_9();
        let killed = Instant::now();
        worker = Worker::start_with_slots(&coordinator, "worker-1", dir.path(), "1");
        wait_for_line(&log, from, "job started");
        let took = killed.elapsed().as_secs_f64();
        let text = std::fs::read(&log).unwrap();
        for line in String::from_utf8_lossy(&text[from as usize..]).lines() {
            if ["registered", "running job", "job started"].iter().any(|n| line.contains(n)) {
                eprintln!("  {line}");
            }
        }
        last = checkpoint;
        println!(
            "kill {kill}: restored and running {took:.2} s after the SIGKILL (newest checkpoint {checkpoint}: \
             {entries} entries, {:.2} GB)",
            bytes as f64 / 1e9
        );
        recoveries.push(took);
    }
    let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
    let restored = log.lines().filter(|l| l.contains("job started") && !l.contains("restored_from=None")).count();
    assert!(restored >= 3, "every restart restored from a checkpoint:\n{log}");
    println!(
        "SIGKILL to restored and running: median {:.2} s over {} kills",
        median(recoveries.clone()),
        recoveries.len()
    );
}
