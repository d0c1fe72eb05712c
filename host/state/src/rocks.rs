//! State in RocksDB: larger than memory, bounded native memory, native checkpoints.
//!
//! One database per subtask (and per stateful step), in a directory the engine owns. The
//! write-ahead log is off: state is made durable by checkpoints, not by the log, and a
//! restarted task restores from the last checkpoint anyway. Native memory is bounded by the
//! configured block cache (shared by index and filter blocks, which are charged to it) plus
//! `write_buffer_bytes * max_write_buffers` of memtables (their bloom filters included).
//!
//! A snapshot is RocksDB's native checkpoint: the memtable is flushed and every live SST file
//! is hard-linked into the staging directory, so the synchronous phase costs a flush and some
//! links, and files unchanged since the last checkpoint are the same files (the engine uploads
//! each SST once and references it from later checkpoints).

use std::path::{Path, PathBuf};

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, DB, Direction, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteOptions,
};

use crate::{BackendSnapshot, StateBackend, StateError};

/// Memory and file knobs of a RocksDB backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocksDbConfig {
    /// Block cache (data, index and filter blocks), bytes.
    pub block_cache_bytes: usize,
    /// One memtable, bytes.
    pub write_buffer_bytes: usize,
    /// Memtables at most (one active, the rest flushing).
    pub max_write_buffers: i32,
}

impl Default for RocksDbConfig {
    fn default() -> Self {
        Self { block_cache_bytes: 64 << 20, write_buffer_bytes: 16 << 20, max_write_buffers: 2 }
    }
}

/// A whole-key bloom filter in each memtable, this share of its size (allocated in the
/// memtable's arena, so inside `write_buffer_bytes`): a lookup of a key the memtable lacks
/// (a new key, the state quota asking what a write replaces) skips the skip-list search.
/// Joins keyed by new ids look such keys up for most records: `eddy bench nexmark --query q3
/// --events 3000000 --parallelism 2 --state-backend rocksdb --checkpoint-ms 1000`, 5
/// alternating pairs, medians: 0.60 -> 0.41 CPU s per M events; q8 0.78 -> 0.73; q5 and q11
/// level.
const MEMTABLE_BLOOM_RATIO: f64 = 0.05;

fn storage(e: rocksdb::Error) -> StateError {
    StateError::Storage(format!("rocksdb: {e}"))
}

/// A [`StateBackend`] in a RocksDB database (see the module docs).
pub struct RocksDbBackend {
    db: DB,
    path: PathBuf,
    write: WriteOptions,
}

impl std::fmt::Debug for RocksDbBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbBackend").field("path", &self.path).finish_non_exhaustive()
    }
}

impl RocksDbBackend {
    /// Opens (creating if needed) the database in `path`.
    pub fn open(path: &Path, config: RocksDbConfig) -> Result<Self, StateError> {
        let cache = Cache::new_lru_cache(config.block_cache_bytes).map_err(storage)?;
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_bloom_filter(10.0, false);
        // Partitioned index and filters (Flink's `partitioned-index-filters`): a large SST's
        // whole filter outgrows one shard of the block cache (64 MiB is 64 shards of 1 MiB),
        // so it was read from disk and checksummed on every lookup, and the state quota looks
        // up every written key: at 2 M keys writes fell to 18 k/s. Partitions of 4 KiB cache
        // like data blocks; only the small top level is pinned.
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_block_based_table_factory(&table);
        options.set_write_buffer_size(config.write_buffer_bytes);
        options.set_max_write_buffer_number(config.max_write_buffers.max(2));
        options.set_max_open_files(256);
        options.set_max_background_jobs(4);
        // Keys are `key group | ...`: prefix bloom filters would need a fixed-length prefix
        // of key group + key, which is variable, so whole-key blooms it is.
        options.set_memtable_whole_key_filtering(true);
        options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
        let db = DB::open(&options, path).map_err(storage)?;
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        Ok(Self { db, path: path.to_path_buf(), write })
    }

    /// Opens (creating if needed) a database whose writes go through the write-ahead log, for
    /// data that must survive a crash on its own (a sink's table); [`Self::sync`] makes every
    /// write so far durable.
    pub fn open_durable(path: &Path, config: RocksDbConfig) -> Result<Self, StateError> {
        let mut backend = Self::open(path, config)?;
        backend.write = WriteOptions::default();
        Ok(backend)
    }

    /// Makes every write so far durable (syncs the write-ahead log).
    pub fn sync(&self) -> Result<(), StateError> {
        self.db.flush_wal(true).map_err(storage)
    }

    /// Opens, in `path`, a copy of the database checkpoint in `checkpoint` (one fetched from a
    /// checkpoint store): its immutable SST files hard-linked where the file system allows
    /// (copied otherwise), the small rest copied, since the opened database rewrites those.
    /// What a restore at an unchanged key-group range does instead of re-putting every entry.
    pub fn open_checkpoint(checkpoint: &Path, path: &Path, config: RocksDbConfig) -> Result<Self, StateError> {
        let io =
            |e: std::io::Error| StateError::Storage(format!("copying the checkpoint {}: {e}", checkpoint.display()));
        std::fs::create_dir_all(path).map_err(io)?;
        for entry in std::fs::read_dir(checkpoint).map_err(io)? {
            let entry = entry.map_err(io)?;
            let target = path.join(entry.file_name());
            let immutable = entry.path().extension().is_some_and(|e| e == "sst");
            if !(immutable && std::fs::hard_link(entry.path(), &target).is_ok()) {
                std::fs::copy(entry.path(), &target).map_err(io)?;
            }
        }
        Self::open(path, config)
    }

    /// Opens a database read-only (a downloaded checkpoint being restored from).
    pub fn open_read_only(path: &Path) -> Result<Self, StateError> {
        let db = DB::open_for_read_only(&Options::default(), path, false).map_err(storage)?;
        Ok(Self { db, path: path.to_path_buf(), write: WriteOptions::default() })
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Visits the entries with `from <= key < to` (`to = None`: to the end), in key order.
    pub fn scan_range(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), StateError> {
        let mut read = ReadOptions::default();
        if let Some(to) = to {
            read.set_iterate_upper_bound(to.to_vec());
        }
        read.fill_cache(false);
        for item in self.db.iterator_opt(IteratorMode::From(from, Direction::Forward), read) {
            let (k, v) = item.map_err(storage)?;
            visit(&k, &v);
        }
        Ok(())
    }
}

/// The smallest key greater than every key starting with `prefix` (`None`: no bound).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl StateBackend for RocksDbBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db.get(key).map_err(storage)
    }

    fn read_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StateError> {
        let value = self.db.get_pinned(key).map_err(storage)?;
        if let Some(v) = &value {
            out.extend_from_slice(v);
        }
        Ok(value.is_some())
    }

    fn value_len(&self, key: &[u8]) -> Result<Option<usize>, StateError> {
        Ok(self.db.get_pinned(key).map_err(storage)?.map(|v| v.len()))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.db.put_opt(key, value, &self.write).map_err(storage)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.db.delete_opt(key, &self.write).map_err(storage)
    }

    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        self.scan_range(prefix, prefix_end(prefix).as_deref(), visit)
    }

    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        let mut read = ReadOptions::default();
        read.fill_cache(false);
        for item in self.db.iterator_opt(IteratorMode::From(from, Direction::Forward), read) {
            let (k, v) = item.map_err(storage)?;
            if !visit(&k, &v) {
                break;
            }
        }
        Ok(())
    }

    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        self.scan_prefix(prefix, &mut |k, _| batch.delete(k))?;
        self.db.write_opt(batch, &self.write).map_err(storage)
    }

    fn approximate_len(&self) -> usize {
        self.db.property_int_value("rocksdb.estimate-num-keys").ok().flatten().unwrap_or(0) as usize
    }

    fn snapshot(&mut self, staging: &Path) -> Result<BackendSnapshot, StateError> {
        // The checkpoint directory must not exist yet; RocksDB creates it.
        let target = staging.join("db");
        Checkpoint::new(&self.db).and_then(|c| c.create_checkpoint(&target)).map_err(storage)?;
        Ok(BackendSnapshot::Directory(target))
    }

    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn small() -> RocksDbConfig {
        RocksDbConfig { block_cache_bytes: 1 << 20, write_buffer_bytes: 256 << 10, max_write_buffers: 2 }
    }

    /// A database under `dir` holding keys 0..1000 (big-endian u32) as `before`, and its
    /// native checkpoint.
    fn checkpointed(dir: &Path) -> (RocksDbBackend, PathBuf) {
        let mut db = RocksDbBackend::open(&dir.join("db"), small()).expect("open");
        for i in 0..1_000u32 {
            db.put(&i.to_be_bytes(), b"before").expect("put");
        }
        let staging = dir.join("staging");
        std::fs::create_dir_all(&staging).expect("staging");
        let BackendSnapshot::Directory(checkpoint) = db.snapshot(&staging).expect("snapshot") else {
            panic!("RocksDB snapshots a directory")
        };
        (db, checkpoint)
    }

    #[test]
    fn a_checkpoint_opens_as_a_database_of_its_own_and_stays_as_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_db, checkpoint) = checkpointed(dir.path());
        let mut restored =
            RocksDbBackend::open_checkpoint(&checkpoint, &dir.path().join("restored"), small()).expect("adopt");
        assert_eq!(restored.get(&7u32.to_be_bytes()).expect("get").as_deref(), Some(&b"before"[..]));
        restored.put(&7u32.to_be_bytes(), b"after").expect("put");
        drop(restored);
        // The restored copy's writes never reach the checkpoint it came from.
        let again = RocksDbBackend::open_read_only(&checkpoint).expect("reopen");
        assert_eq!(again.get(&7u32.to_be_bytes()).expect("get").as_deref(), Some(&b"before"[..]));
        let mut n = 0;
        again.scan_prefix(b"", &mut |_, _| n += 1).expect("scan");
        assert_eq!(n, 1_000);
    }

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix_range() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 255]), Some(vec![2]));
        assert_eq!(prefix_end(&[255, 255]), None);
        assert_eq!(prefix_end(b""), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Puts, deletes and prefix deletes leave RocksDB holding what an ordered map holds,
        /// and prefix scans agree with the map's.
        #[test]
        fn behaves_like_an_ordered_map(
            ops in proptest::collection::vec(
                (0u8..3, proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(255)], 0..4), any::<u8>()),
                1..120,
            ),
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut db = RocksDbBackend::open(dir.path(), small()).expect("open");
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for (op, key, value) in ops {
                match op {
                    0 => {
                        db.put(&key, &[value]).expect("put");
                        model.insert(key, vec![value]);
                    }
                    1 => {
                        db.delete(&key).expect("delete");
                        model.remove(&key);
                    }
                    _ => {
                        db.delete_prefix(&key).expect("delete prefix");
                        model.retain(|k, _| !k.starts_with(&key));
                    }
                }
            }
            for key in [vec![], vec![0], vec![1], vec![255], vec![0, 1]] {
                let mut appended = b"before".to_vec();
                prop_assert_eq!(db.read_into(&key, &mut appended).expect("read"), model.contains_key(&key));
                prop_assert_eq!(&appended[6..], model.get(&key).map_or(&[][..], Vec::as_slice));
            }
            for prefix in [vec![], vec![0], vec![1], vec![255], vec![255, 255]] {
                let mut seen = Vec::new();
                db.scan_prefix(&prefix, &mut |k, v| seen.push((k.to_vec(), v.to_vec()))).expect("scan");
                let expected: Vec<_> =
                    model.iter().filter(|(k, _)| k.starts_with(&prefix)).map(|(k, v)| (k.clone(), v.clone())).collect();
                prop_assert_eq!(seen, expected);
            }
        }
    }

    #[test]
    fn state_far_larger_than_the_cache_and_memtables_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut db = RocksDbBackend::open(dir.path(), small()).expect("open");
        // ~24 MiB of values against a 1 MiB cache and 512 KiB of memtables.
        let value = |i: u32| format!("{i:08}").repeat(60).into_bytes();
        for i in 0..50_000u32 {
            db.put(&i.to_be_bytes(), &value(i)).expect("put");
        }
        for i in (0..50_000u32).step_by(997) {
            assert_eq!(db.get(&i.to_be_bytes()).expect("get"), Some(value(i)));
        }
        let mut count = 0;
        db.scan_prefix(b"", &mut |_, _| count += 1).expect("scan");
        assert_eq!(count, 50_000);
        let ssts = std::fs::read_dir(dir.path()).expect("dir").filter_map(Result::ok);
        assert!(ssts.filter(|e| e.path().extension().is_some_and(|x| x == "sst")).count() > 1, "spilled to disk");
    }

    fn memtable_bytes(db: &RocksDbBackend, property: &str) -> u64 {
        db.db.property_int_value(property).expect("property").expect("a memtable property")
    }

    #[test]
    fn memtables_hold_their_bloom_filter_inside_the_write_buffer_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = small();
        let mut db = RocksDbBackend::open(dir.path(), config).expect("open");
        let budget = config.write_buffer_bytes as u64;
        // RocksDB counts a memtable's size as of its last write.
        db.put(b"k", b"v").expect("put");
        let bloom = (budget as f64 * MEMTABLE_BLOOM_RATIO) as u64;
        let first = memtable_bytes(&db, "rocksdb.cur-size-active-mem-table");
        assert!(first >= bloom, "a memtable of one entry holds {first} bytes: no {bloom}-byte bloom filter in it");
        let mut most = 0;
        for i in 0..40_000u32 {
            db.put(&i.to_be_bytes(), &[7; 40]).expect("put");
            most = most.max(memtable_bytes(&db, "rocksdb.size-all-mem-tables"));
        }
        // A memtable flushes once its arena passes its budget, so it may hold up to one more
        // arena block (an eighth of the budget).
        let bound = budget * config.max_write_buffers as u64 * 9 / 8;
        assert!(most <= bound, "memtables held {most} bytes, over {bound}");
        assert!(most > budget, "the writes never filled a memtable ({most} bytes)");
    }

    #[test]
    fn a_native_checkpoint_reopens_with_exactly_the_entries_at_snapshot_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut db, snap) = checkpointed(dir.path());
        db.put(&5u32.to_be_bytes(), b"after").expect("put");
        db.delete(&6u32.to_be_bytes()).expect("delete");
        let restored = RocksDbBackend::open_read_only(&snap).expect("reopen");
        assert_eq!(restored.get(&5u32.to_be_bytes()).expect("get"), Some(b"before".to_vec()));
        assert_eq!(restored.get(&6u32.to_be_bytes()).expect("get"), Some(b"before".to_vec()));
        let mut in_range = 0;
        restored
            .scan_range(&100u32.to_be_bytes(), Some(&200u32.to_be_bytes()), &mut |_, _| in_range += 1)
            .expect("scan");
        assert_eq!(in_range, 100);
    }
}
