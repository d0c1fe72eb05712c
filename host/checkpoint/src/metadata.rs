//! What a completed checkpoint records, and how one is found again: `chk-<id>/_metadata`
//! (sealed JSON, written last and atomically, only after every subtask acknowledged) lists
//! every subtask's source position, sink transaction state, operator timers and state files
//! with their sizes and checksums. A checkpoint without metadata never completed; one whose
//! metadata or files fail their checks is skipped for the one before it.

use eddy_state::DeclaredState;
use serde::{Deserialize, Serialize};

use crate::format::{seal, unseal};
use crate::store::CheckpointStore;
use crate::{CheckpointError, CheckpointId, SourcePosition};

/// Version of the metadata and file formats, state keys included ([`eddy_state::StateKey`]):
/// 2 since state keys carry state ids and key hashes (issue 11).
pub const FORMAT_VERSION: u32 = 2;

/// The metadata file of checkpoint `id`.
pub fn metadata_path(id: CheckpointId) -> String {
    format!("chk-{id}/_metadata")
}

/// A file a checkpoint references.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// Path in the checkpoint store.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// CRC-32 of the whole file.
    pub crc32: u32,
}

/// How one operator's state was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredState {
    /// Entries in sealed files of a bounded size, in key order (heap backend).
    Entries(Vec<FileRef>),
    /// A RocksDB native checkpoint: each file by its name in the database directory.
    Rocksdb(Vec<(String, FileRef)>),
}

/// A pending timer of a Wasm operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerState {
    /// `true`: event time; `false`: processing time.
    pub event_time: bool,
    /// When it fires.
    pub timestamp: i64,
    /// Key group of its key.
    pub key_group: u16,
    /// The key.
    pub key: Vec<u8>,
}

/// One step's part of a subtask's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorState {
    /// The step's name in the pipeline (state follows the name across plan changes).
    pub step: String,
    /// Pending timers, inline: checkpoints written before timers went into files
    /// ([`OperatorState::timer_files`]); empty in newer ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timers: Vec<TimerState>,
    /// Pending timers, in sealed files ([`super::format::encode_timer`] entries), so that a
    /// subtask's part of the metadata (and the report a part sends the job master) stays small
    /// however many timers it holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timer_files: Vec<FileRef>,
    /// Its keyed state.
    pub state: StoredState,
    /// What the step's state quota counted in it: a subtask that opens this state as its
    /// own database starts its count here instead of scanning every entry. Absent in
    /// checkpoints written before it existed (such a restore counts by scanning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<StoredUsage>,
    /// The states the step declared (absent in checkpoints written before they were
    /// recorded: `eddy state` then names states by id and shows their bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<DeclaredState>,
    /// The row schemas the step declared, so its row values read by field name anywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<StoredSchema>,
    /// The digest of the Wasm artifact that goes on from this state (after a live swap at
    /// this checkpoint's barrier, the new one's), so a restore knows which code to run it
    /// with; absent for host operators and in older checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// The step read partial accumulators (a two-phase window), not records; absent (false)
    /// otherwise and in checkpoints from before two-phase windows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial_input: bool,
}

/// A row schema as a checkpoint stores it ([`eddy_wire::schema::Schema`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSchema {
    /// The record's name.
    pub name: String,
    /// Field names in slot order.
    pub fields: Vec<String>,
}

/// An operator's state quota count ([`eddy_state::StateUsage`]) as a checkpoint stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredUsage {
    /// Key plus value bytes of every entry.
    pub bytes: u64,
    /// Number of entries.
    pub entries: u64,
}

impl OperatorState {
    /// Whether the step held nothing (no timers, only empty state files): such state may be
    /// dropped when a non-keyed step changes parallelism.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
            && self.timer_files.is_empty()
            && match &self.state {
                StoredState::Entries(files) => files.iter().all(|f| f.bytes <= super::format::EMPTY_FILE_BYTES),
                StoredState::Rocksdb(_) => false,
            }
    }
}

/// One subtask's snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtaskState {
    /// Task index in the plan.
    pub task: usize,
    /// Subtask index.
    pub subtask: u32,
    /// The task's parallelism when the snapshot was taken.
    pub parallelism: u32,
    /// Whether the task's first step reads a hash exchange (its state is split by key group).
    pub keyed: bool,
    /// The source this subtask reads and where, if it is a source reader.
    pub source: Option<(String, SourcePosition)>,
    /// The sink's transaction state, if the sink is in this subtask.
    pub sink: Option<serde_json::Value>,
    /// The chain's stateful steps.
    pub operators: Vec<OperatorState>,
    /// Unaligned checkpoints: the records in flight on the subtask's input channels (sealed
    /// [`super::format::encode_in_flight`] files), replayed into the chain on restore before
    /// any new input. Absent in aligned checkpoints and in checkpoints written before
    /// unaligned mode existed, which therefore restore unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<FileRef>,
}

impl SubtaskState {
    /// Every file this subtask's snapshot references.
    pub fn files(&self) -> impl Iterator<Item = &FileRef> {
        self.operators
            .iter()
            .flat_map(|o| {
                let state: Vec<&FileRef> = match &o.state {
                    StoredState::Entries(files) => files.iter().collect(),
                    StoredState::Rocksdb(files) => files.iter().map(|(_, f)| f).collect(),
                };
                state.into_iter().chain(&o.timer_files)
            })
            .chain(&self.in_flight)
    }
}

/// Durations and sizes of one checkpoint (the slowest subtask's durations).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointStats {
    /// Longest time a subtask held channels back waiting for barriers, ms.
    pub alignment_ms: f64,
    /// Longest synchronous phase (the task stopped), ms.
    pub sync_ms: f64,
    /// Longest asynchronous phase (writing files while records flow), ms.
    pub async_ms: f64,
    /// Trigger to completion, ms.
    pub total_ms: f64,
    /// Bytes of every file the checkpoint references.
    pub full_bytes: u64,
    /// Bytes written for this checkpoint (files shared with earlier checkpoints not counted).
    pub incremental_bytes: u64,
    /// Bytes of in-flight records stored (unaligned checkpoints).
    #[serde(default)]
    pub in_flight_bytes: u64,
    /// Whether some subtask took its part unaligned (mode `unaligned`, or the aligned timeout).
    #[serde(default)]
    pub unaligned: bool,
    /// Longest time a subtask spent opening new code after its snapshot (a live swap), ms.
    #[serde(default)]
    pub swap_ms: f64,
}

impl CheckpointStats {
    /// Adds one subtask's part: durations are the slowest subtask's, bytes add up.
    pub fn merge(&mut self, part: &CheckpointStats) {
        self.alignment_ms = self.alignment_ms.max(part.alignment_ms);
        self.sync_ms = self.sync_ms.max(part.sync_ms);
        self.async_ms = self.async_ms.max(part.async_ms);
        self.incremental_bytes += part.incremental_bytes;
        self.in_flight_bytes += part.in_flight_bytes;
        self.unaligned |= part.unaligned;
        self.swap_ms = self.swap_ms.max(part.swap_ms);
    }
}

/// A completed checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// [`FORMAT_VERSION`].
    pub version: u32,
    /// The pipeline's name: a checkpoint directory belongs to one pipeline.
    pub job: String,
    /// Key groups the keyed state is split into; a restore needs the same number (`None`:
    /// written before this was recorded).
    #[serde(default)]
    pub max_parallelism: Option<u32>,
    /// The checkpoint.
    pub id: CheckpointId,
    /// Wall-clock completion time, ms since the epoch.
    pub completed_ms: i64,
    /// Written when the job ran to the end of its input: nothing is left to do.
    pub finished: bool,
    /// Every subtask's snapshot.
    pub subtasks: Vec<SubtaskState>,
    /// How it went.
    pub stats: CheckpointStats,
}

impl CheckpointMetadata {
    /// Every file the checkpoint references.
    pub fn files(&self) -> impl Iterator<Item = &FileRef> {
        self.subtasks.iter().flat_map(|s| s.files())
    }

    /// Writes the metadata (the commit point of the checkpoint).
    pub fn write(&self, store: &CheckpointStore) -> Result<(), CheckpointError> {
        let json = serde_json::to_vec(self).map_err(|e| CheckpointError::Corrupt {
            file: metadata_path(self.id),
            problem: format!("cannot encode: {e}"),
        })?;
        store.put(&metadata_path(self.id), seal(&json))
    }

    /// Reads checkpoint `id`'s metadata (sealed, parsed, of this format version); the files it
    /// references are not checked.
    pub fn read(store: &CheckpointStore, id: CheckpointId) -> Result<Self, CheckpointError> {
        let path = metadata_path(id);
        let bytes = store.get(&path)?;
        let json = unseal(&bytes, &path)?;
        let meta: CheckpointMetadata = serde_json::from_slice(json)
            .map_err(|e| CheckpointError::Corrupt { file: path.clone(), problem: e.to_string() })?;
        if meta.version != FORMAT_VERSION {
            return Err(CheckpointError::Corrupt {
                file: path,
                problem: format!(
                    "format version {} (this Eddy reads only {FORMAT_VERSION}; versions below 2 predate the state-key layout of \
                     version 2 and cannot be restored: start the job without it)",
                    meta.version
                ),
            });
        }
        if meta.id != id {
            return Err(CheckpointError::Corrupt { file: path, problem: format!("says it is checkpoint {}", meta.id) });
        }
        Ok(meta)
    }

    /// Reads and checks checkpoint `id`: the metadata, and that every file it references is
    /// present with its recorded size (contents are checked when fetched).
    pub fn read_verified(store: &CheckpointStore, id: CheckpointId) -> Result<Self, CheckpointError> {
        let meta = Self::read(store, id)?;
        let sizes: std::collections::HashMap<String, u64> = store.list("")?.into_iter().collect();
        for file in meta.files() {
            match sizes.get(&file.path) {
                Some(&size) if size == file.bytes => {}
                Some(&size) => {
                    return Err(CheckpointError::Corrupt {
                        file: file.path.clone(),
                        problem: format!("{size} bytes, the checkpoint recorded {}", file.bytes),
                    });
                }
                None => {
                    return Err(CheckpointError::Corrupt { file: file.path.clone(), problem: "missing".into() });
                }
            }
        }
        Ok(meta)
    }
}

/// Checkpoint ids with metadata in the store, newest first.
pub fn completed_ids(store: &CheckpointStore) -> Result<Vec<CheckpointId>, CheckpointError> {
    let mut ids: Vec<CheckpointId> = store
        .list("")?
        .into_iter()
        .filter_map(|(path, _)| path.strip_prefix("chk-")?.strip_suffix("/_metadata")?.parse().ok())
        .collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    Ok(ids)
}

/// When garbage is collected: while the job runs, or once at start-up after a restore point
/// was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// A checkpoint newer than the newest retained one may be in flight: keep it.
    Running,
    /// As [`Sweep::Running`], in the master part of a spread job: another part may have
    /// uploaded a final snapshot (and shared files for it) whose report is still on its way,
    /// so every final and shared file stays until the job ends.
    RunningWithParts,
    /// Nothing is in flight: a newer checkpoint without metadata was cut short by a crash.
    Startup,
}

/// What a path in the checkpoint store is, if this job wrote it.
enum Owned {
    Checkpoint(CheckpointId),
    Final,
    Shared,
}

fn owned(path: &str) -> Option<Owned> {
    if let Some(rest) = path.strip_prefix("chk-") {
        let (id, _) = rest.split_once('/')?;
        return id.parse().ok().map(Owned::Checkpoint);
    }
    if path.starts_with("final/") {
        return Some(Owned::Final);
    }
    path.strip_prefix("shared/").filter(|name| !name.contains('/')).map(|_| Owned::Shared)
}

/// Checkpoint ids with a directory in a store listing (completed or not), for choosing ids that
/// never reuse a directory still present.
pub fn checkpoint_dirs(listing: &[(String, u64)]) -> impl Iterator<Item = CheckpointId> + '_ {
    listing.iter().filter_map(|(path, _)| match owned(path) {
        Some(Owned::Checkpoint(id)) => Some(id),
        _ => None,
    })
}

/// Deletes what this job wrote and no longer needs, and nothing else:
///
/// - `chk-<n>/…` of a checkpoint that is not retained and older than the newest retained one
///   (superseded, aborted, or damaged and passed over); at [`Sweep::Startup`] also a newer one
///   without metadata (cut short by a crash). A newer one with metadata (damaged: restore
///   passed over it) stays for inspection until newer checkpoints supersede it.
/// - `final/…` and `shared/…` files that neither a retained checkpoint nor `live` (files of
///   finished subtasks not yet in a completed checkpoint) references. Shared files are swept
///   only when every checkpoint left in place has readable metadata: one that cannot be read
///   may reference any of them.
///
/// Objects under the root that Eddy did not name (another tool's files in a shared bucket
/// prefix) are never touched. Returns how many files were deleted.
pub fn collect_garbage(
    store: &CheckpointStore,
    retained: &[CheckpointMetadata],
    live: &std::collections::HashSet<String>,
    sweep: Sweep,
) -> Result<usize, CheckpointError> {
    use std::collections::HashSet;
    let listing = store.list("")?;
    let retained_ids: HashSet<CheckpointId> = retained.iter().map(|m| m.id).collect();
    let newest = retained.iter().map(|m| m.id).max();
    let with_metadata: HashSet<CheckpointId> = listing
        .iter()
        .filter_map(|(path, _)| path.strip_prefix("chk-")?.strip_suffix("/_metadata")?.parse().ok())
        .collect();
    let keep_checkpoint = |id: CheckpointId| {
        retained_ids.contains(&id)
            || (newest.is_none_or(|newest| id > newest) && (with_metadata.contains(&id) || sweep != Sweep::Startup))
    };
    let mut referenced: HashSet<&str> = retained.iter().flat_map(|m| m.files().map(|f| f.path.as_str())).collect();
    referenced.extend(live.iter().map(String::as_str));
    // Checkpoints left in place that are not retained still reference shared files.
    let mut kept_others = Vec::new();
    let mut unreadable_kept = false;
    for &id in with_metadata.iter().filter(|id| !retained_ids.contains(id) && keep_checkpoint(**id)) {
        match CheckpointMetadata::read(store, id) {
            Ok(meta) => kept_others.push(meta),
            Err(_) => unreadable_kept = true,
        }
    }
    referenced.extend(kept_others.iter().flat_map(|m| m.files().map(|f| f.path.as_str())));
    let mut deleted = 0;
    for (path, _) in &listing {
        let delete = match owned(path) {
            Some(Owned::Checkpoint(id)) => !keep_checkpoint(id) && !referenced.contains(path.as_str()),
            Some(Owned::Final | Owned::Shared) if sweep == Sweep::RunningWithParts => false,
            Some(Owned::Final) => !referenced.contains(path.as_str()),
            Some(Owned::Shared) => !unreadable_kept && !referenced.contains(path.as_str()),
            None => false,
        };
        if delete {
            store.delete(path)?;
            deleted += 1;
        }
    }
    // Another part may be creating a directory for its upload right now, and removing its
    // still-empty parent would fail that upload: with parts running, empty directories wait
    // for the job's final sweep.
    if sweep != Sweep::RunningWithParts {
        store.prune_empty_dirs();
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(version: u32) -> CheckpointMetadata {
        CheckpointMetadata {
            version,
            job: "j".into(),
            max_parallelism: Some(128),
            id: 3,
            completed_ms: 0,
            finished: false,
            subtasks: Vec::new(),
            stats: CheckpointStats::default(),
        }
    }

    #[test]
    fn with_parts_running_a_sweep_leaves_empty_directories_where_a_part_may_be_uploading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::local(dir.path()).expect("store");
        // A part has just created the directory of its upload and not yet written the file.
        let uploading = dir.path().join("final").join("run-7");
        std::fs::create_dir_all(&uploading).expect("dir");
        let none = std::collections::HashSet::new();
        collect_garbage(&store, &[], &none, Sweep::RunningWithParts).expect("sweep");
        assert!(uploading.is_dir(), "pruned under a part's upload");
        collect_garbage(&store, &[], &none, Sweep::Running).expect("sweep");
        assert!(!uploading.exists(), "alone, the job prunes what its deletions left empty");
    }

    #[test]
    fn metadata_without_in_flight_records_reads_as_an_aligned_checkpoint_and_aligned_ones_write_none() {
        let mut meta = metadata(FORMAT_VERSION);
        meta.subtasks.push(SubtaskState {
            task: 1,
            subtask: 0,
            parallelism: 1,
            keyed: false,
            source: None,
            sink: None,
            operators: Vec::new(),
            in_flight: Vec::new(),
        });
        let mut json = serde_json::to_value(&meta).expect("encode");
        assert!(json["subtasks"][0].get("in_flight").is_none(), "aligned checkpoints write no in_flight field");
        // As written before unaligned checkpoints existed.
        json["stats"].as_object_mut().expect("stats").retain(|k, _| k != "in_flight_bytes" && k != "unaligned");
        let old: CheckpointMetadata = serde_json::from_value(json).expect("old metadata still reads");
        assert_eq!(old, meta);
        let file = FileRef { path: "chk-3/t1-s0/in-flight".into(), bytes: 30, crc32: 7 };
        meta.subtasks[0].in_flight.push(file.clone());
        assert_eq!(meta.files().collect::<Vec<_>>(), [&file], "in-flight files are the checkpoint's files");
    }

    #[test]
    fn a_checkpoint_of_the_old_state_key_layout_is_refused_naming_its_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::local(dir.path()).expect("store");
        metadata(1).write(&store).expect("write");
        let err = CheckpointMetadata::read(&store, 3).expect_err("version 1");
        let text = err.to_string();
        assert!(text.contains("format version 1") && text.contains("reads only 2"), "{text}");
        metadata(FORMAT_VERSION).write(&store).expect("write");
        assert_eq!(CheckpointMetadata::read(&store, 3).expect("current version"), metadata(FORMAT_VERSION));
    }
}
