//! `eddy bench checkpoint`: what a checkpoint costs as keyed state grows, heap against RocksDB.
//!
//! The model is one subtask: a writer updating random keys as fast as it can (the task
//! thread), which stops for the synchronous phase of a checkpoint and then keeps writing
//! while another thread writes the snapshot to a local checkpoint store (the checkpoint
//! thread). Reported per backend and state size: fill rate, the synchronous pause, the
//! asynchronous phase, the writer's throughput before and during the asynchronous phase, the
//! checkpoint's full size, the bytes a second checkpoint writes after 1% of the keys
//! changed (incremental for RocksDB, a full copy for the heap), and what restoring the second
//! checkpoint into a fresh backend costs (the part of a failover that grows with the state):
//! fetching its files from the store, then loading the subtask's key groups the way a task
//! does (for RocksDB at an unchanged key-group range, opening the fetched database) and
//! counting them for the state quota.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use eddy_checkpoint::CheckpointStore;
use eddy_checkpoint::OperatorSnapshot;
use eddy_checkpoint::upload::{TakenSnapshot, Uploader};
use eddy_state::{
    BoundedBackend, HashedKey, HeapStateBackend, RocksDbBackend, RocksDbConfig, StateBackend, StateKey, StateLimits,
    state_id,
};
use serde::Serialize;

/// One row of the table.
#[derive(Debug, Serialize)]
pub struct CheckpointRow {
    backend: String,
    keys: u64,
    fill_per_sec: f64,
    sync_ms: f64,
    async_ms: f64,
    writes_per_sec_before: f64,
    writes_per_sec_during: f64,
    full_bytes: u64,
    second_checkpoint_bytes: u64,
    restore_fetch_ms: f64,
    restore_load_ms: f64,
}

struct Writer {
    backend: Box<dyn StateBackend>,
    key: StateKey,
    rng: u64,
    keys: u64,
    value: Vec<u8>,
}

impl Writer {
    fn put(&mut self, i: u64) -> Result<()> {
        let user = format!("\"user-{i}\"");
        self.value[..8].copy_from_slice(&self.rng.to_le_bytes());
        let entry = self.key.encode(HashedKey::new(user.as_bytes(), MAX_PARALLELISM), state_id("total"), b"");
        self.backend.put(entry, &self.value)?;
        Ok(())
    }

    fn random_put(&mut self) -> Result<()> {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.put(self.rng % self.keys)
    }

    /// Random updates for `duration`; returns updates per second.
    fn write_for(&mut self, duration: Duration) -> Result<f64> {
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < duration {
            for _ in 0..1024 {
                self.random_put()?;
            }
            n += 1024;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64())
    }

    /// Random updates until `done` says stop; returns updates per second.
    fn write_while<T>(&mut self, running: &std::thread::JoinHandle<T>) -> Result<f64> {
        let started = Instant::now();
        let mut n = 0u64;
        while !running.is_finished() {
            for _ in 0..256 {
                self.random_put()?;
            }
            n += 256;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64().max(1e-9))
    }
}

/// What one checkpoint cost.
struct Taken {
    sync_ms: f64,
    async_ms: f64,
    written_bytes: u64,
    writes_per_sec_during: f64,
    state: eddy_checkpoint::metadata::SubtaskState,
}

/// Takes a checkpoint of `writer`'s state while it keeps writing.
fn checkpoint(
    writer: &mut Writer,
    store: &std::sync::Arc<CheckpointStore>,
    uploader: &std::sync::Arc<std::sync::Mutex<Uploader>>,
    staging_root: &Path,
    id: u64,
) -> Result<Taken> {
    let staging = tempfile::tempdir_in(staging_root)?;
    let sync_started = Instant::now();
    let usage = writer.backend.usage();
    let state = writer.backend.snapshot(staging.path())?;
    let sync_ms = sync_started.elapsed().as_secs_f64() * 1e3;
    let operators = vec![(
        "totals".into(),
        OperatorSnapshot {
            timers: Vec::new(),
            state,
            usage,
            states: Vec::new(),
            schemas: Vec::new(),
            artifact: None,
            partial_input: false,
        },
    )];
    let taken = TakenSnapshot { sync_ms, staging: Some(staging), ..TakenSnapshot::of_keyed_subtask(0, 1, operators) };
    let (store, uploader) = (store.clone(), uploader.clone());
    let upload = std::thread::spawn(move || -> Result<(eddy_checkpoint::upload::Uploaded, f64)> {
        let started = Instant::now();
        let mut uploader = uploader.lock().map_err(|_| anyhow::anyhow!("uploader lock poisoned"))?;
        let done = uploader.upload(&store, Some(id), taken)?;
        Ok((done, started.elapsed().as_secs_f64() * 1e3))
    });
    let writes_per_sec_during = writer.write_while(&upload)?;
    let (done, async_ms) = upload.join().map_err(|_| anyhow::anyhow!("upload thread panicked"))??;
    Ok(Taken { sync_ms, async_ms, written_bytes: done.written_bytes, writes_per_sec_during, state: done.state })
}

/// Restores checkpoint `id` (one subtask, `state`) from `store` into a fresh `backend` under
/// `dir`, as a failover at the same parallelism does: returns (fetch ms, load ms).
fn restore(
    backend: &str,
    store: &CheckpointStore,
    id: u64,
    state: eddy_checkpoint::metadata::SubtaskState,
    dir: &Path,
) -> Result<(f64, f64)> {
    use eddy_checkpoint::metadata::{CheckpointMetadata, FORMAT_VERSION};
    use eddy_checkpoint::restore::{RestorePoint, Share};
    let meta = CheckpointMetadata {
        version: FORMAT_VERSION,
        job: "bench".into(),
        max_parallelism: Some(MAX_PARALLELISM),
        id,
        completed_ms: 0,
        finished: false,
        subtasks: vec![state],
        stats: Default::default(),
    };
    let started = Instant::now();
    let point = RestorePoint::fetch(store, meta, dir)?;
    let fetch_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let all = Share::KeyGroups(eddy_core::KeyGroupRange::all(MAX_PARALLELISM));
    let into = dir.join("restored");
    // As a task does: a RocksDB subtask restarting at its key-group range opens its
    // checkpointed database with the state quota's count carried in the checkpoint; anything
    // else is loaded entry by entry through the quota.
    let restored = match point.own_database("totals", all) {
        Some(own) => {
            let db = Box::new(RocksDbBackend::open_checkpoint(&own.path, &into, RocksDbConfig::default())?);
            BoundedBackend::with_usage(db, UNLIMITED, "", own.usage)?
        }
        None => {
            let mut target = BoundedBackend::new(open_backend(backend, &into)?, UNLIMITED, "")?;
            point.restore_operator("totals", all, target.raw_mut(), &mut |_| {})?;
            target
        }
    };
    drop(restored);
    Ok((fetch_ms, started.elapsed().as_secs_f64() * 1e3))
}

/// The bench measures the state quota's bookkeeping, not its refusals.
const UNLIMITED: StateLimits = StateLimits { max_bytes: u64::MAX, max_entries: u64::MAX };

/// Key groups of the bench's keys.
const MAX_PARALLELISM: u32 = 128;

fn open_backend(backend: &str, dir: &Path) -> Result<Box<dyn StateBackend>> {
    Ok(match backend {
        "heap" => Box::new(HeapStateBackend::default()),
        "rocksdb" => Box::new(RocksDbBackend::open(dir, RocksDbConfig::default())?),
        other => anyhow::bail!("no backend `{other}` (heap, rocksdb)"),
    })
}

/// Measures one backend at one state size.
fn measure(backend: &str, keys: u64, work: &Path) -> Result<CheckpointRow> {
    let dir = tempfile::tempdir_in(work)?;
    // Bounded as a task's state is, so the checkpoint carries the quota's count.
    let state = Box::new(BoundedBackend::new(open_backend(backend, &dir.path().join("db"))?, UNLIMITED, "")?);
    let mut writer =
        Writer { backend: state, key: StateKey::default(), rng: 0x9E37_79B9_7F4A_7C15, keys, value: vec![7u8; 64] };
    let started = Instant::now();
    for i in 0..keys {
        writer.put(i)?;
    }
    let fill_per_sec = keys as f64 / started.elapsed().as_secs_f64();
    let before = writer.write_for(Duration::from_secs(1))?;
    let store = std::sync::Arc::new(CheckpointStore::local(&dir.path().join("checkpoints"))?);
    let uploader = std::sync::Arc::new(std::sync::Mutex::new(Uploader::default()));
    let first = checkpoint(&mut writer, &store, &uploader, dir.path(), 1)?;
    for _ in 0..keys / 100 {
        writer.random_put()?;
    }
    let second = checkpoint(&mut writer, &store, &uploader, dir.path(), 2)?;
    drop(writer);
    let (restore_fetch_ms, restore_load_ms) = restore(backend, &store, 2, second.state, dir.path())?;
    Ok(CheckpointRow {
        backend: backend.to_owned(),
        keys,
        fill_per_sec,
        sync_ms: first.sync_ms,
        async_ms: first.async_ms,
        writes_per_sec_before: before,
        writes_per_sec_during: first.writes_per_sec_during,
        full_bytes: first.written_bytes,
        second_checkpoint_bytes: second.written_bytes,
        restore_fetch_ms,
        restore_load_ms,
    })
}

/// Runs every (backend, size) pair, prints the table and writes the JSON report.
pub fn run(backends: &[String], keys: &[u64], work: &Path, report: &Path) -> Result<()> {
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let mut rows = Vec::new();
    for &n in keys {
        for backend in backends {
            eprintln!("checkpoint bench: {backend}, {n} keys ...");
            let row = measure(backend, n, work)?;
            eprintln!("  {row:?}");
            rows.push(row);
        }
    }
    println!(
        "| backend | keys | fill keys/s | sync pause ms | async ms | writes/s before | writes/s during async | checkpoint MiB | 2nd checkpoint MiB (1% changed) | restore: fetch ms | restore: load ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} | {:.0} |",
            r.backend,
            r.keys,
            r.fill_per_sec,
            r.sync_ms,
            r.async_ms,
            r.writes_per_sec_before,
            r.writes_per_sec_during,
            mib(r.full_bytes),
            mib(r.second_checkpoint_bytes),
            r.restore_fetch_ms,
            r.restore_load_ms
        );
    }
    std::fs::write(report, serde_json::to_vec_pretty(&rows)?)
        .with_context(|| format!("writing {}", report.display()))?;
    eprintln!("report written to {}", report.display());
    Ok(())
}
