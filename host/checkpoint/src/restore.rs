//! Restoring from a checkpoint: find the newest one that passes its checks, fetch and verify
//! its files, and hand each new subtask its part. Keyed state follows key groups, so a job may
//! restore at another parallelism: a subtask takes the entries of its key-group range from
//! every old subtask (one contiguous range scan each, thanks to the key layout).

use std::path::{Path, PathBuf};

use eddy_core::KeyGroupRange;
use eddy_state::{RocksDbBackend, StateBackend, StateError, StateUsage};

use crate::format::{InFlightBatch, decode_entries, decode_in_flight, decode_timer, unseal};
use crate::metadata::{CheckpointMetadata, FileRef, StoredState, SubtaskState, TimerState, completed_ids};
use crate::store::CheckpointStore;
use crate::{CheckpointError, CheckpointId, KafkaPartition, SourcePosition};

/// Checkpoints passed over on the way to a valid one, with the reason.
pub type Skipped = Vec<(CheckpointId, CheckpointError)>;

/// A verified checkpoint with its files fetched to a local directory.
#[derive(Debug)]
pub struct RestorePoint {
    meta: CheckpointMetadata,
    local: tempfile::TempDir,
}

/// What receives a checkpoint's state entries, as stored (key, value).
pub type EntryVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StateError> + 'a;

/// Which part of the old state a new subtask takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Keyed state of these key groups, from every old subtask.
    KeyGroups(KeyGroupRange),
    /// Everything of the old subtask with this index (non-keyed tasks; needs equal parallelism).
    Subtask {
        /// The index.
        index: u32,
        /// The new parallelism.
        parallelism: u32,
    },
}

fn local_path(root: &Path, state: &SubtaskState, operator: usize) -> PathBuf {
    root.join(format!("t{}-s{}-op{operator}", state.task, state.subtask))
}

/// Where a fetched operator's `n`th timer file is (beside its state, in its directory).
fn timers_path(operator_dir: &Path, n: usize) -> PathBuf {
    operator_dir.join(format!("timers.{n}"))
}

fn in_flight_path(root: &Path, state: &SubtaskState, n: usize) -> PathBuf {
    root.join(format!("t{}-s{}-in-flight-{n}", state.task, state.subtask))
}

/// The bytes of `file`, checked against its recorded size and checksum.
pub(super) fn fetch_verified(store: &CheckpointStore, file: &FileRef) -> Result<Vec<u8>, CheckpointError> {
    let bytes = store.get(&file.path)?;
    if bytes.len() as u64 != file.bytes || crc32fast::hash(&bytes) != file.crc32 {
        return Err(CheckpointError::Corrupt {
            file: file.path.clone(),
            problem: "size or checksum differs from the checkpoint's record".into(),
        });
    }
    Ok(bytes)
}

/// A fetched RocksDB checkpoint a new subtask opens as its database
/// ([`RestorePoint::own_database`]).
#[derive(Debug, Clone)]
pub struct OwnDatabase {
    /// The fetched checkpoint directory.
    pub path: PathBuf,
    /// What the state quota counted in it, if the checkpoint recorded that.
    pub usage: Option<StateUsage>,
}

impl RestorePoint {
    /// Fetches every file of `meta` into a new directory under `local` and checks it against
    /// the recorded size and checksum. `local` is the run's own directory, beside its
    /// databases: a restore's files are then hard-linked rather than copied into them, and a
    /// killed run's are swept with the rest of its directory.
    pub fn fetch(store: &CheckpointStore, meta: CheckpointMetadata, local: &Path) -> Result<Self, CheckpointError> {
        Self::fetch_only(store, meta, local, None)
    }

    /// Fetches, as [`RestorePoint::fetch`] does, only the files of step `step` (its state and
    /// timers, no records in flight): what a reader of one step's state needs.
    pub fn fetch_step(
        store: &CheckpointStore,
        meta: CheckpointMetadata,
        local: &Path,
        step: &str,
    ) -> Result<Self, CheckpointError> {
        Self::fetch_only(store, meta, local, Some(step))
    }

    fn fetch_only(
        store: &CheckpointStore,
        meta: CheckpointMetadata,
        local: &Path,
        step: Option<&str>,
    ) -> Result<Self, CheckpointError> {
        let local = tempfile::Builder::new().prefix("restore-").tempdir_in(local).map_err(|e| {
            CheckpointError::Storage { what: "creating a local restore directory".into(), problem: e.to_string() }
        })?;
        let write = |path: &Path, bytes: &[u8]| {
            std::fs::write(path, bytes).map_err(|e| CheckpointError::Storage {
                what: format!("writing {}", path.display()),
                problem: e.to_string(),
            })
        };
        for state in &meta.subtasks {
            for (n, file) in state.in_flight.iter().enumerate().filter(|_| step.is_none()) {
                let bytes = fetch_verified(store, file)?;
                unseal(&bytes, &file.path)?;
                write(&in_flight_path(local.path(), state, n), &bytes)?;
            }
            for (i, op) in state.operators.iter().enumerate().filter(|(_, o)| step.is_none_or(|s| o.step == s)) {
                let path = local_path(local.path(), state, i);
                std::fs::create_dir_all(&path).map_err(|e| CheckpointError::Storage {
                    what: format!("creating {}", path.display()),
                    problem: e.to_string(),
                })?;
                for (n, file) in op.timer_files.iter().enumerate() {
                    let bytes = fetch_verified(store, file)?;
                    unseal(&bytes, &file.path)?;
                    write(&timers_path(&path, n), &bytes)?;
                }
                match &op.state {
                    StoredState::Entries(files) => {
                        for (n, file) in files.iter().enumerate() {
                            let bytes = fetch_verified(store, file)?;
                            unseal(&bytes, &file.path)?;
                            write(&path.join(n.to_string()), &bytes)?;
                        }
                    }
                    StoredState::Rocksdb(files) => {
                        for (name, file) in files {
                            if name.contains('/') || name.starts_with('.') {
                                return Err(CheckpointError::Corrupt {
                                    file: file.path.clone(),
                                    problem: format!("bad database file name `{name}`"),
                                });
                            }
                            write(&path.join(name), &fetch_verified(store, file)?)?;
                        }
                    }
                }
            }
        }
        Ok(Self { meta, local })
    }

    /// The newest checkpoint in `store` that passes every check, and the newer ones skipped
    /// as damaged (with the reason) on the way. A checkpoint that could not be read is not
    /// skipped: that failure is the error. Fetched into the system's temporary directory (a
    /// check or a copy, not a task's restore).
    pub fn latest(store: &CheckpointStore) -> Result<(Option<RestorePoint>, Skipped), CheckpointError> {
        let mut skipped = Vec::new();
        let local = std::env::temp_dir();
        for id in completed_ids(store)? {
            match CheckpointMetadata::read_verified(store, id).and_then(|m| Self::fetch(store, m, &local)) {
                Ok(point) => return Ok((Some(point), skipped)),
                Err(e @ CheckpointError::Corrupt { .. }) => skipped.push((id, e)),
                Err(e) => return Err(e),
            }
        }
        Ok((None, skipped))
    }

    /// The checkpoint's metadata.
    pub fn metadata(&self) -> &CheckpointMetadata {
        &self.meta
    }

    /// The checkpoint id.
    pub fn id(&self) -> CheckpointId {
        self.meta.id
    }

    /// Where reader `reader` of `readers` of source `name` was.
    ///
    /// A source whose splits are Kafka partitions may change its parallelism: every reader is
    /// handed the partitions of all readers in the checkpoint and keeps those it owns now.
    /// Other sources read by index (a generator) or are one split (a file), so their
    /// parallelism must stay the same.
    pub fn source_position(
        &self,
        name: &str,
        reader: u32,
        readers: u32,
    ) -> Result<Option<SourcePosition>, CheckpointError> {
        let old: Vec<&SubtaskState> =
            self.meta.subtasks.iter().filter(|s| s.source.as_ref().is_some_and(|(n, _)| n == name)).collect();
        let positions = || old.iter().filter_map(|s| s.source.as_ref().map(|(_, p)| p));
        if !old.is_empty() && positions().all(|p| matches!(p, SourcePosition::Kafka { .. })) {
            let mut partitions: Vec<KafkaPartition> = positions()
                .flat_map(|p| match p {
                    SourcePosition::Kafka { partitions } => partitions.clone(),
                    _ => Vec::new(),
                })
                .collect();
            partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
            return Ok(Some(SourcePosition::Kafka { partitions }));
        }
        if let Some(first) = old.first()
            && first.parallelism != readers
        {
            return Err(CheckpointError::Incompatible(format!(
                "source `{name}` had {} readers in checkpoint {} and has {readers} now; a source's parallelism \
                 cannot change across a restore",
                first.parallelism, self.meta.id
            )));
        }
        Ok(old.iter().find(|s| s.subtask == reader).and_then(|s| s.source.as_ref().map(|(_, p)| p.clone())))
    }

    /// The transaction state of every sink subtask in the checkpoint.
    pub fn sink_states(&self) -> Vec<&serde_json::Value> {
        self.meta.subtasks.iter().filter_map(|s| s.sink.as_ref()).collect()
    }

    /// Where the records in flight of `state` were going: the first step of its chain (`None`:
    /// a chain without steps, the sink's own task). Task indices may shift when a plan changes
    /// its chaining; the step behind the exchange does not.
    fn entry_step(state: &SubtaskState) -> Option<&str> {
        state.operators.first().map(|o| o.step.as_str())
    }

    /// The chains (by their first step, `None` for the sink's own task) that had records in
    /// flight at the checkpoint: each must read an exchange again after a restore.
    pub fn in_flight_entries(&self) -> Vec<Option<&str>> {
        let mut entries: Vec<Option<&str>> =
            self.meta.subtasks.iter().filter(|s| !s.in_flight.is_empty()).map(Self::entry_step).collect();
        entries.sort_unstable();
        entries.dedup();
        entries
    }

    /// The records that were in flight into the chain starting at step `entry` (`None`: the
    /// sink's own task) at the checkpoint, for the new subtask taking `share`, in the order
    /// they arrived: replayed into its chain before any new input. A keyed task's records
    /// follow their key groups (so parallelism may change); a non-keyed task's stay with their
    /// subtask index and need equal parallelism.
    pub fn in_flight(&self, entry: Option<&str>, share: Share) -> Result<Vec<InFlightBatch>, CheckpointError> {
        // 128: the default, for metadata from before it was recorded.
        let max_parallelism = self.meta.max_parallelism.unwrap_or(128);
        let mut out = Vec::new();
        let into = |s: &&SubtaskState| Self::entry_step(s) == entry && !s.in_flight.is_empty();
        let task = entry.map_or_else(|| "the sink".to_string(), |step| format!("step `{step}`"));
        for state in self.meta.subtasks.iter().filter(into) {
            let range = match share {
                Share::KeyGroups(range) => Some(range),
                Share::Subtask { index, parallelism } if state.parallelism == parallelism => {
                    if state.subtask != index {
                        continue;
                    }
                    None
                }
                Share::Subtask { parallelism, .. } => {
                    return Err(CheckpointError::Incompatible(format!(
                        "{task} is not behind a key_by and had records in flight in unaligned checkpoint {}, so \
                         they belong to subtasks, and its parallelism changed from {} to {parallelism}",
                        self.meta.id, state.parallelism
                    )));
                }
            };
            for (n, file) in state.in_flight.iter().enumerate() {
                let local = in_flight_path(self.local.path(), state, n);
                let bytes = std::fs::read(&local).map_err(|e| CheckpointError::Storage {
                    what: format!("reading {}", local.display()),
                    problem: e.to_string(),
                })?;
                for batch in decode_in_flight(unseal(&bytes, &file.path)?, &file.path)? {
                    let Some(range) = range else {
                        out.push(batch);
                        continue;
                    };
                    // Keyless records (side outputs) go to the subtask owning key group 0.
                    let mine = |key: Option<&[u8]>| match key {
                        Some(k) => range.contains(eddy_core::key_group_of(k, max_parallelism)),
                        None => range.contains(0),
                    };
                    let mut part = eddy_core::RecordBatch::default();
                    for r in batch.batch.iter().filter(|r| mine(r.key)) {
                        part.push_view(&r);
                    }
                    if !part.is_empty() {
                        out.push(InFlightBatch { batch: part, ..batch });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Puts step `step`'s entries of `share` into `target` (as stored) and hands its timers
    /// of `share` to `timer`. A step the checkpoint does not know starts empty.
    pub fn restore_operator(
        &self,
        step: &str,
        share: Share,
        target: &mut dyn StateBackend,
        timer: &mut dyn FnMut(&TimerState),
    ) -> Result<(), CheckpointError> {
        self.restore(step, share, Some(&mut |k, v| target.put(k, v)), timer)
    }

    /// Hands step `step`'s entries of `share` to `entry` (as stored, in key order within each
    /// old subtask's part) and its timers to `timer`, without a backend: a reader's way in.
    pub fn visit_operator(
        &self,
        step: &str,
        share: Share,
        entry: &mut EntryVisitor<'_>,
        timer: &mut dyn FnMut(&TimerState),
    ) -> Result<(), CheckpointError> {
        self.restore(step, share, Some(entry), timer)
    }

    /// The fetched RocksDB database of step `step` that the new subtask of `share` may open as
    /// its own: one old subtask owned exactly the key groups of `share` (a restart at the same
    /// parallelism, as after a failover), so its database holds exactly the entries to restore
    /// and nothing needs re-putting. `None`: restore entry by entry.
    pub fn own_database(&self, step: &str, share: Share) -> Option<OwnDatabase> {
        let Share::KeyGroups(range) = share else { return None };
        let max = self.meta.max_parallelism?;
        self.meta.subtasks.iter().find_map(|state| {
            let (i, op) = state.operators.iter().enumerate().find(|(_, o)| o.step == step)?;
            let sane = (1..=max).contains(&state.parallelism) && state.subtask < state.parallelism;
            let owned = sane && KeyGroupRange::for_subtask(max, state.parallelism, state.subtask) == range;
            (owned && matches!(op.state, StoredState::Rocksdb(_))).then(|| OwnDatabase {
                path: local_path(self.local.path(), state, i),
                usage: op.usage.map(|u| StateUsage { bytes: u.bytes, entries: u.entries }),
            })
        })
    }

    /// Hands step `step`'s timers of `share` to `timer`, and none of its entries (a subtask
    /// that opened [`RestorePoint::own_database`] has them already).
    pub fn restore_timers(
        &self,
        step: &str,
        share: Share,
        timer: &mut dyn FnMut(&TimerState),
    ) -> Result<(), CheckpointError> {
        self.restore(step, share, None, timer)
    }

    /// [`RestorePoint::restore_operator`], the entries only to `target` if given.
    fn restore(
        &self,
        step: &str,
        share: Share,
        mut target: Option<&mut EntryVisitor<'_>>,
        timer: &mut dyn FnMut(&TimerState),
    ) -> Result<(), CheckpointError> {
        for state in &self.meta.subtasks {
            for (i, op) in state.operators.iter().enumerate().filter(|(_, o)| o.step == step) {
                let range = match share {
                    Share::KeyGroups(range) => Some(range),
                    Share::Subtask { index, parallelism } => {
                        if state.subtask != index && state.parallelism == parallelism {
                            continue;
                        }
                        if state.parallelism != parallelism && op.is_empty() {
                            // A stateless step at a new parallelism: nothing to hand out.
                            continue;
                        }
                        if state.parallelism != parallelism {
                            return Err(CheckpointError::Incompatible(format!(
                                "step `{step}` is not behind a key_by, so its state belongs to subtasks, and its \
                                 parallelism changed from {} to {parallelism}",
                                state.parallelism
                            )));
                        }
                        None
                    }
                };
                let in_range = |group: u16| range.is_none_or(|r| r.contains(group));
                for t in op.timers.iter().filter(|t| in_range(t.key_group)) {
                    timer(t);
                }
                let path = local_path(self.local.path(), state, i);
                for (n, file) in op.timer_files.iter().enumerate() {
                    let local = timers_path(&path, n);
                    let bytes = std::fs::read(&local).map_err(|e| CheckpointError::Storage {
                        what: format!("reading {}", local.display()),
                        problem: e.to_string(),
                    })?;
                    let mut bad = None;
                    decode_entries(unseal(&bytes, &file.path)?, &file.path, &mut |k, v| match decode_timer(k, v) {
                        Ok(t) if in_range(t.key_group) => timer(&t),
                        Ok(_) => {}
                        Err(problem) => bad = bad.take().or(Some(problem)),
                    })?;
                    if let Some(problem) = bad {
                        return Err(CheckpointError::Corrupt { file: file.path.clone(), problem });
                    }
                }
                let Some(target) = target.as_deref_mut() else { continue };
                let mut failed = None;
                let mut put = |k: &[u8], v: &[u8]| {
                    let group = k.get(..2).map_or(0, |g| u16::from_be_bytes([g[0], g[1]]));
                    if failed.is_none() && in_range(group) {
                        failed = target(k, v).err();
                    }
                };
                match &op.state {
                    StoredState::Entries(files) => {
                        for (n, file) in files.iter().enumerate() {
                            let local = path.join(n.to_string());
                            let bytes = std::fs::read(&local).map_err(|e| CheckpointError::Storage {
                                what: format!("reading {}", local.display()),
                                problem: e.to_string(),
                            })?;
                            decode_entries(unseal(&bytes, &file.path)?, &file.path, &mut put)?;
                        }
                    }
                    StoredState::Rocksdb(_) => {
                        let db = RocksDbBackend::open_read_only(&path).map_err(|e| CheckpointError::Corrupt {
                            file: format!("RocksDB checkpoint of step `{step}`"),
                            problem: e.to_string(),
                        })?;
                        let (from, to) = match range {
                            Some(r) => {
                                (r.start.to_be_bytes().to_vec(), r.end.checked_add(1).map(|e| e.to_be_bytes().to_vec()))
                            }
                            None => (Vec::new(), None),
                        };
                        db.scan_range(&from, to.as_deref(), &mut put).map_err(|e| CheckpointError::Corrupt {
                            file: format!("RocksDB checkpoint of step `{step}`"),
                            problem: e.to_string(),
                        })?;
                    }
                }
                if let Some(e) = failed {
                    return Err(CheckpointError::Storage {
                        what: format!("restoring step `{step}` into its state backend"),
                        problem: e.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use eddy_state::{BackendSnapshot, HashedKey, HeapStateBackend, StateKey, state_id};

    use super::*;
    use crate::OperatorSnapshot;
    use crate::metadata::{CheckpointStats, FORMAT_VERSION};
    use crate::upload::{TakenSnapshot, Uploader};

    const MAX_P: u32 = 128;

    /// A subtask's snapshot: per step, its keys (value = the key); non-keyed or keyed.
    fn taken(subtask: u32, parallelism: u32, keyed: bool, steps: &[(&str, &[&str])]) -> TakenSnapshot {
        let operators = steps
            .iter()
            .map(|(step, keys)| {
                let mut entries = Vec::new();
                let mut layout = StateKey::default();
                for k in *keys {
                    let key = HashedKey::new(k.as_bytes(), MAX_P);
                    entries.push((layout.encode(key, state_id("s"), b"").to_vec(), k.as_bytes().to_vec()));
                }
                entries.sort();
                let state = BackendSnapshot::Frozen(Box::new(entries));
                (
                    step.to_string(),
                    OperatorSnapshot {
                        timers: Vec::new(),
                        partial_input: false,
                        state,
                        usage: None,
                        states: Vec::new(),
                        schemas: Vec::new(),
                        artifact: None,
                    },
                )
            })
            .collect();
        TakenSnapshot { keyed, ..TakenSnapshot::of_keyed_subtask(subtask, parallelism, operators) }
    }

    fn checkpoint(snapshots: Vec<TakenSnapshot>) -> (tempfile::TempDir, RestorePoint) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::local(dir.path()).expect("store");
        let mut uploader = Uploader::default();
        let subtasks =
            snapshots.into_iter().map(|t| uploader.upload(&store, Some(1), t).expect("upload").state).collect();
        let meta = CheckpointMetadata {
            version: FORMAT_VERSION,
            job: "j".into(),
            max_parallelism: Some(MAX_P),
            id: 1,
            completed_ms: 0,
            finished: false,
            subtasks,
            stats: CheckpointStats::default(),
        };
        meta.write(&store).expect("metadata");
        let (point, skipped) = RestorePoint::latest(&store).expect("latest");
        assert!(skipped.is_empty());
        (dir, point.expect("a checkpoint"))
    }

    #[test]
    fn kafka_readers_are_handed_every_partition_at_any_parallelism_and_other_sources_only_their_own() {
        let partition = |topic: &str, partition, next| crate::KafkaPartition {
            topic: topic.into(),
            partition,
            next_offset: next,
            end_offset: None,
        };
        let reader = |subtask, source: &str, position| TakenSnapshot {
            source: Some((source.to_string(), position)),
            ..taken(subtask, 2, false, &[])
        };
        let (_dir, point) = checkpoint(vec![
            reader(0, "k", SourcePosition::Kafka { partitions: vec![partition("t", 2, 7), partition("t", 0, 5)] }),
            reader(1, "k", SourcePosition::Kafka { partitions: vec![partition("t", 1, 9)] }),
        ]);
        let all = SourcePosition::Kafka {
            partitions: vec![partition("t", 0, 5), partition("t", 1, 9), partition("t", 2, 7)],
        };
        for (r, readers) in [(0, 3), (2, 3), (0, 1), (1, 2)] {
            assert_eq!(point.source_position("k", r, readers).expect("kafka"), Some(all.clone()), "{r} of {readers}");
        }
        let (_dir, point) = checkpoint(vec![
            reader(0, "g", SourcePosition::Generator { next_index: 4 }),
            reader(1, "g", SourcePosition::Generator { next_index: 5 }),
        ]);
        assert_eq!(point.source_position("g", 1, 2).expect("same"), Some(SourcePosition::Generator { next_index: 5 }));
        let err = point.source_position("g", 0, 3).expect_err("a generator keeps its parallelism").to_string();
        assert!(err.contains("had 2 readers"), "{err}");
    }

    fn restored(point: &RestorePoint, step: &str, share: Share) -> Result<Vec<String>, CheckpointError> {
        let mut backend = HeapStateBackend::default();
        point.restore_operator(step, share, &mut backend, &mut |_| {})?;
        let mut values = Vec::new();
        backend.scan_prefix(b"", &mut |_, v| values.push(String::from_utf8_lossy(v).into_owned())).expect("scan");
        values.sort();
        Ok(values)
    }

    #[test]
    fn records_in_flight_go_to_the_new_subtask_owning_their_key_group_or_their_index() {
        use crate::format::InFlightBatch;
        let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        let in_flight = |subtask: u32, keys: &[String]| {
            let mut batch = eddy_core::RecordBatch::default();
            for k in keys {
                batch.push(Some(k.as_bytes()), k.as_bytes(), Some(1));
            }
            vec![InFlightBatch { channel: subtask, side: None, batch }]
        };
        let with = |subtask: u32, keyed: bool, keys: &[String]| TakenSnapshot {
            in_flight: in_flight(subtask, keys),
            ..taken(subtask, 2, keyed, &[("count", &[])])
        };
        let (_dir, point) = checkpoint(vec![with(0, true, &keys[..20]), with(1, true, &keys[20..])]);
        let mut all = Vec::new();
        for index in 0..3 {
            let range = KeyGroupRange::for_subtask(MAX_P, 3, index);
            for b in point.in_flight(Some("count"), Share::KeyGroups(range)).expect("in flight") {
                for r in b.batch.iter() {
                    assert!(range.contains(eddy_core::key_group_of(r.key.expect("keyed"), MAX_P)));
                    all.push(String::from_utf8(r.value.to_vec()).expect("utf8"));
                }
            }
        }
        all.sort();
        let mut expected = keys.clone();
        expected.sort();
        assert_eq!(all, expected, "every record in flight exactly once at parallelism 3");
        assert!(point.in_flight(Some("other"), Share::KeyGroups(KeyGroupRange::all(MAX_P))).expect("none").is_empty());
        assert_eq!(point.in_flight_entries(), [Some("count")]);

        let (_dir, point) = checkpoint(vec![with(0, false, &keys[..2]), with(1, false, &keys[2..3])]);
        let one =
            point.in_flight(Some("count"), Share::Subtask { index: 1, parallelism: 2 }).expect("same parallelism");
        assert_eq!(one, in_flight(1, &keys[2..3]), "a non-keyed subtask gets its own records back");
        let err = point.in_flight(Some("count"), Share::Subtask { index: 0, parallelism: 3 }).expect_err("rescaled");
        assert!(err.to_string().contains("parallelism changed from 2 to 3"), "{err}");
    }

    use eddy_core::TimeDomain;

    /// Many timers go into the checkpoint's files, not into its metadata (which a part sends
    /// the job master whole), and come back at restore, split by key group like state.
    #[test]
    fn timers_are_kept_in_files_and_restored_by_key_group() {
        let mut snapshot = taken(0, 1, true, &[("count", &["a"])]);
        let timers: Vec<eddy_core::FiredTimer> = (0..50_000i64)
            .map(|i| {
                let key = format!("key-{i}").into_bytes();
                let key_group = eddy_core::key_group_of(&key, MAX_P);
                let domain = if i % 3 == 0 { TimeDomain::ProcessingTime } else { TimeDomain::EventTime };
                eddy_core::FiredTimer { domain, timestamp: i - 7, key_group, key }
            })
            .collect();
        snapshot.operators[0].1.timers = timers.clone();
        let (_dir, point) = checkpoint(vec![snapshot]);
        let op = &point.metadata().subtasks[0].operators[0];
        assert!(op.timers.is_empty() && !op.timer_files.is_empty(), "{} inline", op.timers.len());
        let part = serde_json::to_vec(&point.metadata().subtasks[0]).expect("json");
        assert!(part.len() < 4 << 10, "a subtask's part of the metadata is {} bytes", part.len());
        // Two new subtasks share the key groups: each gets its own timers, together all.
        let mut seen = Vec::new();
        for subtask in 0..2 {
            let range = eddy_core::KeyGroupRange::for_subtask(MAX_P, 2, subtask);
            let mut backend = HeapStateBackend::default();
            point
                .restore_operator("count", Share::KeyGroups(range), &mut backend, &mut |t| {
                    assert!(range.contains(t.key_group), "a timer of another subtask's key group");
                    seen.push((t.event_time, t.timestamp, t.key_group, t.key.clone()));
                })
                .expect("restore");
        }
        let mut expected: Vec<_> = timers
            .iter()
            .map(|t| (t.domain == TimeDomain::EventTime, t.timestamp, t.key_group, t.key.clone()))
            .collect();
        expected.sort();
        seen.sort();
        assert_eq!(seen, expected);
    }

    #[test]
    fn keyed_state_is_split_by_key_group_at_any_new_parallelism() {
        let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (_dir, point) = checkpoint(vec![
            taken(0, 2, true, &[("count", &refs[..120])]),
            taken(1, 2, true, &[("count", &refs[120..])]),
        ]);
        for parallelism in [1, 3, 5] {
            let mut all = Vec::new();
            for index in 0..parallelism {
                let range = KeyGroupRange::for_subtask(MAX_P, parallelism, index);
                let part = restored(&point, "count", Share::KeyGroups(range)).expect("restore");
                for k in &part {
                    assert!(range.contains(eddy_core::key_group_of(k.as_bytes(), MAX_P)), "{k} outside {range:?}");
                }
                all.extend(part);
            }
            all.sort();
            let mut expected = keys.clone();
            expected.sort();
            assert_eq!(all, expected, "every key exactly once at parallelism {parallelism}");
        }
        assert!(restored(&point, "other-step", Share::KeyGroups(KeyGroupRange::all(MAX_P))).expect("ok").is_empty());
    }

    #[test]
    fn non_keyed_state_stays_with_its_subtask_and_only_stateless_steps_change_parallelism() {
        let (_dir, point) = checkpoint(vec![
            taken(0, 2, false, &[("buffer", &["a"]), ("stateless", &[])]),
            taken(1, 2, false, &[("buffer", &["b"]), ("stateless", &[])]),
        ]);
        assert_eq!(restored(&point, "buffer", Share::Subtask { index: 1, parallelism: 2 }).expect("same"), ["b"]);
        let err = restored(&point, "buffer", Share::Subtask { index: 0, parallelism: 3 }).expect_err("stateful");
        assert!(err.to_string().contains("parallelism changed from 2 to 3"), "{err}");
        assert!(restored(&point, "stateless", Share::Subtask { index: 2, parallelism: 3 }).expect("fine").is_empty());
    }
}
