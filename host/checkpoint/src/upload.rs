//! The asynchronous phase: turning a subtask's synchronous snapshot into files in the store.
//!
//! Heap state becomes one sealed entries file. A RocksDB checkpoint directory is uploaded file
//! by file; SST files are immutable, so each is stored once under its content hash in
//! `shared/` and later checkpoints reference it again (incremental checkpoints): only SSTs
//! written since the last checkpoint cost an upload.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use eddy_core::TimeDomain;
use eddy_state::BackendSnapshot;
use sha2::{Digest, Sha256};

use crate::format::{InFlightBatch, encode_chunks, encode_in_flight, encode_timer, seal};
use crate::metadata::{
    CheckpointStats, FileRef, OperatorState, StoredSchema, StoredState, StoredUsage, SubtaskState, TimerState,
};
use crate::store::CheckpointStore;
use crate::{CheckpointError, CheckpointId, OperatorSnapshot, SourcePosition};

/// Heap state is written in files of about this size, so it is never encoded into memory whole.
const STATE_FILE_BYTES: usize = 64 << 20;

/// A subtask's synchronous snapshot, waiting to be written.
#[derive(Debug)]
pub struct TakenSnapshot {
    /// Index of the subtask among all of the job's subtasks.
    pub participant: usize,
    /// Task index in the plan.
    pub task: usize,
    /// Subtask index.
    pub subtask: u32,
    /// The task's parallelism.
    pub parallelism: u32,
    /// Whether the task's first step reads a hash exchange.
    pub keyed: bool,
    /// Source name and position, for a source reader.
    pub source: Option<(String, SourcePosition)>,
    /// The sink's transaction state, if the sink is here.
    pub sink: Option<serde_json::Value>,
    /// (step name, its snapshot) for each step of the chain.
    pub operators: Vec<(String, OperatorSnapshot)>,
    /// Time spent holding channels back for alignment, ms.
    pub alignment_ms: f64,
    /// Duration of the synchronous phase, ms.
    pub sync_ms: f64,
    /// Of that, the time a live swap spent opening new code after the snapshot, ms.
    pub swap_ms: f64,
    /// Directory the disk backends' native checkpoints were written to (removed afterwards).
    pub staging: Option<tempfile::TempDir>,
    /// Unaligned: the records in flight on the input channels, in arrival order.
    pub in_flight: Vec<InFlightBatch>,
    /// Whether the snapshot was taken unaligned.
    pub unaligned: bool,
}

impl TakenSnapshot {
    /// Subtask `subtask` of `parallelism` of a keyed task 0, reading no source and holding no
    /// sink, with `operators`' snapshots: the shape tests and benchmarks of the upload need.
    pub fn of_keyed_subtask(subtask: u32, parallelism: u32, operators: Vec<(String, OperatorSnapshot)>) -> Self {
        Self {
            participant: subtask as usize,
            task: 0,
            subtask,
            parallelism,
            keyed: true,
            source: None,
            sink: None,
            operators,
            alignment_ms: 0.0,
            sync_ms: 0.0,
            swap_ms: 0.0,
            staging: None,
            in_flight: Vec::new(),
            unaligned: false,
        }
    }
}

/// Remembers which shared files are already in the store, so each is uploaded once.
#[derive(Debug, Default)]
pub struct Uploader {
    shared: HashSet<String>,
    /// What each SST file of each database hashed to. RocksDB never reuses a file number in a
    /// database and a run opens each subtask's database once, so a name seen before is the
    /// same immutable file (its size is checked as well): a checkpoint then reads only the
    /// files that are new since the last one, not the whole state.
    hashed: HashMap<(Database, String), Hashed>,
    /// The run whose finished subtasks' files this uploader writes (`final/run-<n>/…`): a
    /// retained checkpoint may reference an earlier run's final files, which must never be
    /// overwritten.
    run: CheckpointId,
}

/// One subtask's database of one step: (task, subtask, the step's position in the chain).
type Database = (usize, u32, usize);

/// A shared file's identity in the store.
#[derive(Debug, Clone)]
struct Hashed {
    size: u64,
    crc32: u32,
    key: String,
}

/// What an upload wrote.
#[derive(Debug)]
pub struct Uploaded {
    /// The subtask's part of the metadata.
    pub state: SubtaskState,
    /// Bytes written now (shared files already present not counted).
    pub written_bytes: u64,
    /// Of which in-flight records.
    pub in_flight_bytes: u64,
}

impl Uploader {
    /// An uploader that knows the shared files `retained` checkpoints reference (after a
    /// restore those need no upload either). `run` is the run's first checkpoint id, unique
    /// per run because ids never repeat in a store.
    pub fn knowing<'a>(retained: impl IntoIterator<Item = &'a FileRef>, run: CheckpointId) -> Self {
        Self {
            shared: retained.into_iter().filter(|f| f.path.starts_with("shared/")).map(|f| f.path.clone()).collect(),
            hashed: HashMap::new(),
            run,
        }
    }

    /// Writes `taken` under `chk-<id>/` (or `final/run-<run>/` for a finished subtask,
    /// `id: None`) and returns its metadata part.
    pub fn upload(
        &mut self,
        store: &CheckpointStore,
        id: Option<CheckpointId>,
        taken: TakenSnapshot,
    ) -> Result<Uploaded, CheckpointError> {
        let dir = match id {
            Some(id) => format!("chk-{id}/t{}-s{}", taken.task, taken.subtask),
            None => format!("final/run-{}/t{}-s{}", self.run, taken.task, taken.subtask),
        };
        let mut written_bytes = 0;
        let mut operators = Vec::with_capacity(taken.operators.len());
        for (index, (step, snapshot)) in taken.operators.into_iter().enumerate() {
            // Timers go into files like state: a million of them would otherwise make the
            // subtask's part of the metadata (and a part's report) hundreds of MiB.
            let mut timer_files = Vec::new();
            let mut chunk = Vec::new();
            let timers = snapshot.timers.len();
            for (n, t) in snapshot.timers.into_iter().enumerate() {
                let timer = TimerState {
                    event_time: t.domain == TimeDomain::EventTime,
                    timestamp: t.timestamp,
                    key_group: t.key_group,
                    key: t.key,
                };
                encode_timer(&mut chunk, &timer);
                if chunk.len() >= STATE_FILE_BYTES || n + 1 == timers {
                    let file = put(store, format!("{dir}/op{index}.timers.{}", timer_files.len()), seal(&chunk))?;
                    chunk.clear();
                    written_bytes += file.bytes;
                    timer_files.push(file);
                }
            }
            let state = match snapshot.state {
                BackendSnapshot::Frozen(entries) => {
                    let mut files = Vec::new();
                    encode_chunks(entries.as_ref(), STATE_FILE_BYTES, &mut |payload| {
                        let file = put(store, format!("{dir}/op{index}.state.{}", files.len()), seal(&payload))?;
                        written_bytes += file.bytes;
                        files.push(file);
                        Ok(())
                    })?;
                    StoredState::Entries(files)
                }
                BackendSnapshot::Directory(path) => {
                    let database = (taken.task, taken.subtask, index);
                    let (files, written) =
                        self.upload_directory(store, &path, &format!("{dir}/op{index}"), database)?;
                    written_bytes += written;
                    StoredState::Rocksdb(files)
                }
            };
            let usage = snapshot.usage.map(|u| StoredUsage { bytes: u.bytes, entries: u.entries });
            let schemas =
                snapshot.schemas.into_iter().map(|s| StoredSchema { name: s.name, fields: s.fields }).collect();
            operators.push(OperatorState {
                step,
                timers: Vec::new(),
                timer_files,
                state,
                usage,
                states: snapshot.states,
                schemas,
                artifact: snapshot.artifact,
                partial_input: snapshot.partial_input,
            });
        }
        drop(taken.staging);
        let mut in_flight = Vec::new();
        let mut in_flight_bytes = 0;
        if !taken.in_flight.is_empty() {
            let file = put(store, format!("{dir}/in-flight"), seal(&encode_in_flight(&taken.in_flight)))?;
            in_flight_bytes = file.bytes;
            written_bytes += file.bytes;
            in_flight.push(file);
        }
        let state = SubtaskState {
            task: taken.task,
            subtask: taken.subtask,
            parallelism: taken.parallelism,
            keyed: taken.keyed,
            source: taken.source,
            sink: taken.sink,
            operators,
            in_flight,
        };
        Ok(Uploaded { state, written_bytes, in_flight_bytes })
    }

    fn upload_directory(
        &mut self,
        store: &CheckpointStore,
        path: &Path,
        private: &str,
        database: Database,
    ) -> Result<(Vec<(String, FileRef)>, u64), CheckpointError> {
        let local = |e: std::io::Error| CheckpointError::Storage {
            what: format!("reading the local checkpoint {}", path.display()),
            problem: e.to_string(),
        };
        let mut names: Vec<String> = std::fs::read_dir(path)
            .map_err(local)?
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut files = Vec::with_capacity(names.len());
        let mut written = 0;
        // Files compacted away since the last checkpoint are forgotten.
        self.hashed.retain(|(db, name), _| *db != database || names.binary_search(name).is_ok());
        for name in names {
            let file = if name.ends_with(".sst") {
                let size = std::fs::metadata(path.join(&name)).map_err(local)?.len();
                let known = self.hashed.get(&(database, name.clone())).filter(|h| h.size == size).cloned();
                let (hashed, mut bytes) = match known {
                    Some(hashed) => (hashed, None),
                    None => {
                        let bytes = std::fs::read(path.join(&name)).map_err(local)?;
                        let key = format!("shared/{:x}.sst", Sha256::digest(&bytes));
                        let hashed = Hashed { size: bytes.len() as u64, crc32: crc32fast::hash(&bytes), key };
                        self.hashed.insert((database, name.clone()), hashed.clone());
                        (hashed, Some(bytes))
                    }
                };
                // Known only once the write succeeded: a failed put must be retried by the
                // next checkpoint that needs the file, not assumed present.
                if !self.shared.contains(&hashed.key) {
                    let bytes = match bytes.take() {
                        Some(bytes) => bytes,
                        None => std::fs::read(path.join(&name)).map_err(local)?,
                    };
                    store.put(&hashed.key, bytes)?;
                    self.shared.insert(hashed.key.clone());
                    written += hashed.size;
                }
                FileRef { path: hashed.key, bytes: hashed.size, crc32: hashed.crc32 }
            } else {
                let file = put(store, format!("{private}/{name}"), std::fs::read(path.join(&name)).map_err(local)?)?;
                written += file.bytes;
                file
            };
            files.push((name, file));
        }
        Ok((files, written))
    }

    /// Forgets shared files that were garbage-collected.
    pub fn retain(&mut self, still_there: &HashSet<String>) {
        self.shared.retain(|p| still_there.contains(p));
    }
}

fn put(store: &CheckpointStore, path: String, bytes: Vec<u8>) -> Result<FileRef, CheckpointError> {
    let crc32 = crc32fast::hash(&bytes);
    let size = bytes.len() as u64;
    store.put(&path, bytes)?;
    Ok(FileRef { path, bytes: size, crc32 })
}

/// The asynchronous phase of one snapshot (`id: None` for a finished subtask): its files
/// written, its part of the metadata and of the checkpoint's stats.
pub fn upload_snapshot(
    store: &CheckpointStore,
    uploader: &mut Uploader,
    id: Option<CheckpointId>,
    snapshot: TakenSnapshot,
) -> Result<(SubtaskState, CheckpointStats), CheckpointError> {
    let mut stats = CheckpointStats {
        alignment_ms: snapshot.alignment_ms,
        sync_ms: snapshot.sync_ms,
        swap_ms: snapshot.swap_ms,
        unaligned: snapshot.unaligned,
        ..CheckpointStats::default()
    };
    let started = std::time::Instant::now();
    let uploaded = uploader.upload(store, id, snapshot)?;
    stats.async_ms = started.elapsed().as_secs_f64() * 1e3;
    stats.incremental_bytes = uploaded.written_bytes;
    stats.in_flight_bytes = uploaded.in_flight_bytes;
    Ok((uploaded.state, stats))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::metadata::{CheckpointMetadata, CheckpointStats, FORMAT_VERSION};
    use crate::store::StoreOp;

    /// A subtask snapshot that is a RocksDB-style directory of the given files.
    fn directory_snapshot(root: &Path, files: &[(&str, &[u8])]) -> TakenSnapshot {
        let dir = tempfile::tempdir_in(root).expect("tempdir");
        for (name, bytes) in files {
            std::fs::write(dir.path().join(name), bytes).expect("write");
        }
        let snapshot = crate::OperatorSnapshot {
            timers: Vec::new(),
            partial_input: false,
            state: BackendSnapshot::Directory(dir.path().to_path_buf()),
            usage: None,
            states: Vec::new(),
            schemas: Vec::new(),
            artifact: None,
        };
        TakenSnapshot { staging: Some(dir), ..TakenSnapshot::of_keyed_subtask(0, 1, vec![("count".into(), snapshot)]) }
    }

    #[test]
    fn a_shared_file_whose_upload_failed_is_uploaded_again_by_the_next_checkpoint() {
        let root = tempfile::tempdir().expect("tempdir");
        let fail_next_shared = Arc::new(AtomicBool::new(true));
        let flag = fail_next_shared.clone();
        let store = CheckpointStore::local(&root.path().join("checkpoints")).expect("store").with_faults(Arc::new(
            move |op: StoreOp, path: &str| {
                if op == StoreOp::Put && path.starts_with("shared/") && flag.swap(false, Ordering::SeqCst) {
                    return Err("injected failure".into());
                }
                Ok(())
            },
        ));
        let files: &[(&str, &[u8])] = &[("000007.sst", b"immutable table"), ("MANIFEST-000001", b"manifest")];
        let mut uploader = Uploader::default();
        let first = uploader.upload(&store, Some(1), directory_snapshot(root.path(), files));
        assert!(first.is_err(), "checkpoint 1 must fail with its SST unwritten");
        assert!(!fail_next_shared.load(Ordering::SeqCst), "the fault fired");

        let second = uploader.upload(&store, Some(2), directory_snapshot(root.path(), files)).expect("checkpoint 2");
        let meta = CheckpointMetadata {
            version: FORMAT_VERSION,
            job: "j".into(),
            max_parallelism: Some(128),
            id: 2,
            completed_ms: 0,
            finished: false,
            subtasks: vec![second.state],
            stats: CheckpointStats::default(),
        };
        meta.write(&store).expect("metadata");
        CheckpointMetadata::read_verified(&store, 2).expect("checkpoint 2 references only files that exist");
        let sst = meta.files().find(|f| f.path.starts_with("shared/")).expect("the SST is shared");
        assert_eq!(store.get(&sst.path).expect("read"), b"immutable table");
    }

    /// The SST files of a snapshot, by name.
    fn ssts(uploaded: &Uploaded) -> BTreeMap<String, FileRef> {
        let StoredState::Rocksdb(files) = &uploaded.state.operators[0].state else { panic!("not a directory") };
        files.iter().filter(|(n, _)| n.ends_with(".sst")).cloned().collect()
    }

    /// A later checkpoint of the same database reads only the SST files new since the last
    /// one: a name and size seen before is RocksDB's same immutable file. (Here its bytes
    /// differ, which RocksDB never does, to show that they are not read again.) A file of
    /// another size is read and hashed.
    #[test]
    fn a_checkpoint_reads_only_the_sst_files_new_since_the_last_one() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::local(&root.path().join("checkpoints")).expect("store");
        let mut uploader = Uploader::default();
        let first: &[(&str, &[u8])] = &[("000007.sst", b"table seven"), ("MANIFEST-000001", b"m1")];
        let first = uploader.upload(&store, Some(1), directory_snapshot(root.path(), first)).expect("checkpoint 1");
        let second: &[(&str, &[u8])] =
            &[("000007.sst", b"TABLE SEVEN"), ("000009.sst", b"table nine"), ("MANIFEST-000001", b"m2")];
        let second = uploader.upload(&store, Some(2), directory_snapshot(root.path(), second)).expect("checkpoint 2");
        assert_eq!(ssts(&second)["000007.sst"], ssts(&first)["000007.sst"], "file 7 is referenced, not re-read");
        assert_eq!(second.written_bytes, (b"table nine".len() + b"m2".len()) as u64, "only file 9 and the manifest");
        let grown: &[(&str, &[u8])] = &[("000009.sst", b"table nine, rewritten")];
        let third = uploader.upload(&store, Some(3), directory_snapshot(root.path(), grown)).expect("checkpoint 3");
        assert_ne!(ssts(&third)["000009.sst"], ssts(&second)["000009.sst"], "another size is read again");
        let stored = store.get(&ssts(&third)["000009.sst"].path).expect("uploaded");
        assert_eq!(stored, b"table nine, rewritten");
    }
}
