//! Bounded state: a wrapper that refuses any write which would take one subtask's state past
//! a number of bytes or entries, so a guest writing new keys without end fails its job with a
//! clear error instead of taking the host's memory or disk.
//!
//! It sits directly on the storage backend (under TTL), because every change to what is
//! stored passes there: the guest's writes, the window operator's, TTL purges and a restore
//! (restored entries go to [`StateBackend::raw_mut`], which is this wrapper). Accounting in the
//! runtime's state imports would miss all but the first. Each write asks the inner backend for
//! the length of the value it replaces ([`StateBackend::value_len`]), so overwrites and deletes
//! are counted exactly; a prefix delete scans what it removes first.
//!
//! Bytes are counted in the inner backend's [`EntryMeasure`], what its limit protects: the
//! memory an entry holds on the heap, key plus value bytes in RocksDB.

use std::path::Path;

use crate::{BackendSnapshot, EntryCache, EntryMeasure, StateBackend, StateError, StateLimitExceeded};

/// How much state one subtask of one step may hold. Bytes are entries as stored (a TTL stamp
/// included) in the backend's [`EntryMeasure`]: on the heap the memory they hold, node
/// overhead and allocator rounding included (what the process may hold beyond it:
/// [`crate::heap_memory_bound_bytes`]); in RocksDB key plus value bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    /// Bytes of every entry, in the backend's measure.
    pub max_bytes: u64,
    /// Number of entries.
    pub max_entries: u64,
}

/// What a subtask's state holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateUsage {
    /// Bytes of every entry, in the backend's [`EntryMeasure`].
    pub bytes: u64,
    /// Number of entries.
    pub entries: u64,
}

/// A [`StateBackend`] that keeps its inner backend within [`StateLimits`].
///
/// A write that would grow the state past a limit fails with
/// [`StateError::LimitExceeded`] and changes nothing; writes that shrink it always pass, so
/// state over a lowered limit can still be cleaned up.
pub struct BoundedBackend {
    inner: Box<dyn StateBackend>,
    /// The inner backend's, asked once.
    measure: EntryMeasure,
    limits: StateLimits,
    how_to_raise: String,
    usage: StateUsage,
    /// On disk, the length of the value last written under each key, so a rewrite or a
    /// delete need not read the backend to learn what it replaces (every write to the inner
    /// backend passes through here, which keeps it exact). None on the heap: its lookups
    /// cost as much as the cache's, and its state is memory this count must hold to.
    lengths: Option<EntryCache<usize>>,
}

impl std::fmt::Debug for BoundedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedBackend")
            .field("measure", &self.measure)
            .field("limits", &self.limits)
            .field("usage", &self.usage)
            .finish_non_exhaustive()
    }
}

impl BoundedBackend {
    /// Wraps `inner`, counting what it already holds (one scan; nothing for a fresh backend).
    /// `how_to_raise` ends every limit error: the setting that raises the limit.
    pub fn new(
        inner: Box<dyn StateBackend>,
        limits: StateLimits,
        how_to_raise: impl Into<String>,
    ) -> Result<Self, StateError> {
        Self::with_usage(inner, limits, how_to_raise, None)
    }

    /// Wraps `inner`, taking its usage from `known` when given: what it held when it was
    /// checkpointed (its [`StateBackend::usage`] at the snapshot, counted in the same
    /// [`EntryMeasure`], which depends on the entries alone), so opening a large checkpointed
    /// database costs the open alone (a wrong count only moves where the quota bites). Without
    /// it, counts with one scan.
    pub fn with_usage(
        inner: Box<dyn StateBackend>,
        limits: StateLimits,
        how_to_raise: impl Into<String>,
        known: Option<StateUsage>,
    ) -> Result<Self, StateError> {
        let measure = inner.entry_measure();
        let usage = match known {
            Some(usage) => usage,
            None => {
                let mut usage = StateUsage::default();
                inner.scan_prefix(b"", &mut |k, v| {
                    usage.bytes += measure.bytes(k.len(), v.len());
                    usage.entries += 1;
                })?;
                usage
            }
        };
        let lengths = (measure == EntryMeasure::KeyValueBytes).then(|| EntryCache::new(crate::LENGTHS_CACHE_BYTES));
        Ok(Self { inner, measure, limits, how_to_raise: how_to_raise.into(), usage, lengths })
    }

    /// The length of the value under `key`, if this backend remembers it.
    fn known_len(&self, key: &[u8]) -> Option<usize> {
        self.lengths.as_ref().and_then(|l| l.get(key)).copied()
    }

    /// The usage after removing the entry under `key`, if there is one.
    fn without(&self, key: &[u8]) -> Result<StateUsage, StateError> {
        let len = match self.known_len(key) {
            Some(len) => Some(len),
            None => self.inner.value_len(key)?,
        };
        Ok(usage_without(self.measure, self.usage, key, len))
    }
}

/// `usage` less the entry under `key` whose value is `len` bytes long (if there is one).
fn usage_without(measure: EntryMeasure, usage: StateUsage, key: &[u8], len: Option<usize>) -> StateUsage {
    match len {
        Some(len) => StateUsage {
            bytes: usage.bytes.saturating_sub(measure.bytes(key.len(), len)),
            entries: usage.entries.saturating_sub(1),
        },
        None => usage,
    }
}

/// Refuses `next` if it grows a measure of `now` past its limit.
fn admit(now: StateUsage, limits: &StateLimits, how_to_raise: &str, next: StateUsage) -> Result<(), StateError> {
    let over = |what, limit, now, next| (next > limit && next > now).then_some((what, limit, next));
    let refused = over("bytes", limits.max_bytes, now.bytes, next.bytes)
        .or_else(|| over("entries", limits.max_entries, now.entries, next.entries));
    match refused {
        None => Ok(()),
        Some((what, limit, actual)) => Err(StateError::LimitExceeded(StateLimitExceeded {
            what,
            limit,
            actual,
            how_to_raise: how_to_raise.to_owned(),
        })),
    }
}

impl StateBackend for BoundedBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.inner.get(key)
    }

    fn read_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StateError> {
        self.inner.read_into(key, out)
    }

    fn value_len(&self, key: &[u8]) -> Result<Option<usize>, StateError> {
        self.inner.value_len(key)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        let known = self.known_len(key);
        let Self { inner, measure, limits, how_to_raise, usage, lengths } = self;
        let mut next = *usage;
        let mut check = |old| {
            let rest = usage_without(*measure, *usage, key, old);
            next = StateUsage { bytes: rest.bytes + measure.bytes(key.len(), value.len()), entries: rest.entries + 1 };
            admit(*usage, limits, how_to_raise, next)
        };
        match known {
            Some(old) => {
                check(Some(old))?;
                inner.put(key, value)?;
            }
            None => inner.put_admitted(key, value, &mut check)?,
        }
        self.usage = next;
        if let Some(lengths) = lengths {
            lengths.write(key, |len| *len = value.len(), || value.len());
        }
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        let next = self.without(key)?;
        self.inner.delete(key)?;
        self.usage = next;
        if let Some(lengths) = &mut self.lengths {
            lengths.remove(key);
        }
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        self.inner.scan_prefix(prefix, visit)
    }

    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        self.inner.scan_from(from, visit)
    }

    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        let (mut removed, measure) = (StateUsage::default(), self.measure);
        self.inner.scan_prefix(prefix, &mut |k, v| {
            removed.bytes += measure.bytes(k.len(), v.len());
            removed.entries += 1;
        })?;
        self.inner.delete_prefix(prefix)?;
        if let Some(lengths) = &mut self.lengths {
            lengths.clear();
        }
        self.usage.bytes = self.usage.bytes.saturating_sub(removed.bytes);
        self.usage.entries = self.usage.entries.saturating_sub(removed.entries);
        Ok(())
    }

    fn approximate_len(&self) -> usize {
        self.usage.entries as usize
    }

    fn purge_expired(&mut self) -> Result<usize, StateError> {
        // Whatever the inner backend reclaims on its own is outside this count; a storage
        // backend (the only thing this wraps) expires nothing itself.
        let purged = self.inner.purge_expired()?;
        if purged > 0
            && let Some(lengths) = &mut self.lengths
        {
            lengths.clear();
        }
        Ok(purged)
    }

    fn snapshot(&mut self, staging: &Path) -> Result<BackendSnapshot, StateError> {
        self.inner.snapshot(staging)
    }

    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        // Restored entries are stored as given: they go through the count like any write.
        self
    }

    fn usage(&self) -> Option<StateUsage> {
        Some(self.usage)
    }

    fn entry_measure(&self) -> EntryMeasure {
        self.measure
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::test_ops::{Op, op};
    use crate::{HeapStateBackend, RocksDbBackend, RocksDbConfig};

    fn bounded(limits: StateLimits) -> BoundedBackend {
        BoundedBackend::new(Box::new(HeapStateBackend::default()), limits, "raise it").expect("empty backend")
    }

    /// A bounded RocksDB backend (key plus value bytes) in `dir`, holding `entries` already.
    fn on_disk(dir: &tempfile::TempDir, entries: &[(&[u8], &[u8])], limits: StateLimits) -> BoundedBackend {
        let mut db = RocksDbBackend::open(dir.path(), RocksDbConfig::default()).expect("open");
        for (k, v) in entries {
            db.put(k, v).expect("put");
        }
        BoundedBackend::new(Box::new(db), limits, "raise it").expect("bounded")
    }

    const UNLIMITED: StateLimits = StateLimits { max_bytes: u64::MAX, max_entries: u64::MAX };

    /// Usage recomputed from a plain map in `measure`: the oracle of the bookkeeping (what the
    /// heap's measure itself is worth, `tests/heap_memory.rs` measures).
    fn usage_of(measure: EntryMeasure, map: &BTreeMap<Vec<u8>, Vec<u8>>) -> StateUsage {
        let bytes = map.iter().map(|(k, v)| measure.bytes(k.len(), v.len())).sum();
        StateUsage { bytes, entries: map.len() as u64 }
    }

    proptest! {
        /// Overwrites, deletes and prefix deletes keep the count equal to what is stored, and
        /// a refused write changes nothing: on the heap, and on RocksDB, where the count takes
        /// replaced lengths from its cache of what it wrote. Limits up to about seven small
        /// heap entries.
        #[test]
        fn usage_is_what_is_stored(ops in proptest::collection::vec(op(), 0..60), max_bytes in 0u64..1_600, max_entries in 0u64..12, disk in any::<bool>()) {
            let limits = StateLimits { max_bytes, max_entries };
            let dir = tempfile::tempdir().unwrap();
            let (mut backend, measure) = match disk {
                true => (on_disk(&dir, &[], limits), EntryMeasure::KeyValueBytes),
                false => (bounded(limits), EntryMeasure::HeapMemory),
            };
            let counted = |map: &BTreeMap<Vec<u8>, Vec<u8>>| usage_of(measure, map);
            let mut oracle: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Put(k, v) => {
                        let mut next = oracle.clone();
                        next.insert(k.clone(), v.clone());
                        let (now, after) = (counted(&oracle), counted(&next));
                        let grows_past = (after.bytes > max_bytes && after.bytes > now.bytes)
                            || (after.entries > max_entries && after.entries > now.entries);
                        match backend.put(&k, &v) {
                            Ok(()) => { prop_assert!(!grows_past); oracle = next; }
                            Err(StateError::LimitExceeded(e)) => {
                                prop_assert!(grows_past, "refused {e}");
                            }
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    Op::Delete(k) => { backend.delete(&k).unwrap(); oracle.remove(&k); }
                    Op::DeletePrefix(p) => { backend.delete_prefix(&p).unwrap(); oracle.retain(|k, _| !k.starts_with(&p)); }
                }
                prop_assert_eq!(backend.usage(), Some(counted(&oracle)));
                let mut stored = BTreeMap::new();
                backend.scan_prefix(b"", &mut |k, v| { stored.insert(k.to_vec(), v.to_vec()); }).unwrap();
                prop_assert_eq!(&stored, &oracle);
            }
        }
    }

    #[test]
    fn on_disk_rewrites_and_deletes_count_the_length_last_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut backend = on_disk(&dir, &[(b"old", b"12345")], UNLIMITED);
        // (key, value written or none for a delete, bytes counted after it): key plus value
        // bytes of what is stored.
        type Step = (&'static [u8], Option<&'static [u8]>, u64);
        let steps: [Step; 6] = [
            (b"k", Some(b"ab"), 8 + 3),
            (b"k", Some(b"abcde"), 8 + 6),
            (b"k", Some(b"a"), 8 + 2),
            (b"old", Some(b"1"), 4 + 2),
            (b"k", None, 4),
            (b"old", None, 0),
        ];
        for (i, (key, value, bytes)) in steps.into_iter().enumerate() {
            match value {
                Some(v) => backend.put(key, v).unwrap(),
                None => backend.delete(key).unwrap(),
            }
            assert_eq!(backend.usage().map(|u| u.bytes), Some(bytes), "after step {i}");
        }
    }

    #[test]
    fn a_write_past_the_limit_is_refused_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut backend = on_disk(&dir, &[], StateLimits { max_bytes: 10, max_entries: 100 });
        backend.put(b"ab", b"cdefgh").unwrap();
        let err = backend.put(b"x", b"yz").unwrap_err();
        assert_eq!(err.to_string(), "the subtask's state would hold 11 bytes, over its limit of 10 bytes; raise it");
        assert_eq!(backend.get(b"x").unwrap(), None, "a refused write changes nothing");
        // Overwriting with fewer bytes, and deleting, always pass.
        backend.put(b"ab", b"c").unwrap();
        backend.put(b"x", b"yz").unwrap();
        assert_eq!(backend.usage(), Some(StateUsage { bytes: 6, entries: 2 }));
    }

    /// The case: what fits 50 entries of 20 key and value bytes on disk fits 4 on the
    /// heap, where each holds about 230 bytes (measured by `tests/heap_memory.rs`).
    #[test]
    fn a_heap_entry_counts_the_memory_it_holds_not_its_bytes() {
        let limits = StateLimits { max_bytes: 1_000, max_entries: 100 };
        let (dir, mut heap) = (tempfile::tempdir().unwrap(), bounded(limits));
        let mut disk = on_disk(&dir, &[], limits);
        let fitting = |backend: &mut BoundedBackend| {
            (0u32..).take_while(|i| backend.put(format!("key-{i:06}").as_bytes(), b"0123456789").is_ok()).count()
        };
        assert_eq!((fitting(&mut disk), fitting(&mut heap)), (50, 4));
        let heap_bytes = heap.usage().unwrap().bytes;
        assert!((4 * 200..=4 * 250).contains(&heap_bytes), "{heap_bytes}");
        assert_eq!(heap.entry_measure(), EntryMeasure::HeapMemory);
        assert_eq!(disk.entry_measure(), EntryMeasure::KeyValueBytes);
    }

    #[test]
    fn state_already_in_the_backend_and_restored_state_count() {
        let dir = tempfile::tempdir().unwrap();
        let mut backend = on_disk(&dir, &[(b"old", b"12345")], StateLimits { max_bytes: 100, max_entries: 2 });
        assert_eq!(backend.usage(), Some(StateUsage { bytes: 8, entries: 1 }));
        // A restore writes through `raw_mut`.
        backend.raw_mut().put(b"restored", b"1").unwrap();
        assert_eq!(backend.usage(), Some(StateUsage { bytes: 17, entries: 2 }));
        let err = backend.raw_mut().put(b"third", b"").unwrap_err();
        assert!(err.to_string().contains("3 entries, over its limit of 2 entries"), "{err}");
    }

    #[test]
    fn a_carried_count_is_trusted_without_a_scan() {
        let mut inner = HeapStateBackend::default();
        inner.put(b"a", b"1").unwrap();
        let limits = StateLimits { max_bytes: 10_000, max_entries: 2 };
        let known = Some(StateUsage { bytes: 2, entries: 1 });
        let mut backend = BoundedBackend::with_usage(Box::new(inner), limits, "raise it", known).unwrap();
        backend.put(b"b", b"2").unwrap();
        let err = backend.put(b"c", b"3").unwrap_err();
        assert!(err.to_string().contains("3 entries, over its limit of 2 entries"), "{err}");
        // `b` came in at what `a` goes out at: the carried 2 bytes remain.
        backend.delete(b"a").unwrap();
        assert_eq!(backend.usage(), Some(StateUsage { bytes: 2, entries: 1 }));
    }

    #[test]
    fn unlimited_counts_without_refusing() {
        let mut backend = bounded(UNLIMITED);
        for i in 0..1_000u32 {
            backend.put(&i.to_be_bytes(), b"v").unwrap();
        }
        let bytes = 1_000 * EntryMeasure::HeapMemory.bytes(4, 1);
        assert_eq!(backend.usage(), Some(StateUsage { bytes, entries: 1_000 }));
        assert_eq!(backend.approximate_len(), 1_000);
    }
}
