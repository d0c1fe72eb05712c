//! A write-back buffer in front of a disk backend, for a guest's keyed state.
//!
//! A guest that reads and rewrites a key's value per record (Nexmark q8's join did, keeping
//! each person's open windows in one value) paid RocksDB's write path per record: a memtable insert per
//! write and per delete, and a lookup through the memtable and the files per read, half of
//! q8's CPU. Here writes land in a map and reach the backend only when a snapshot is taken
//! (the barrier: the snapshot is taken after the write-back, so state stays exactly once), when
//! the map passes its budget, or before a scan; a value written and deleted between two of
//! those never reaches the backend. What the map loses on a failure is after the last
//! snapshot, which is what a restore starts from anyway. The window operator keeps its own
//! buffer, held per key (`eddy_engine`'s `window_operator::store`); this one is for every other
//! step on disk.
//!
//! Reads of a key the map holds never reach the backend. Nor do reads of any other key while
//! the map is *complete*: it holds every key the backend holds, which is true of a backend
//! that started empty until the map is first emptied past its budget (a key the map lacks is
//! then known absent). Otherwise a miss reads through.
//!
//! It sits under [`crate::BoundedBackend`], so the state quota still judges every write when
//! it is made, and over the storage backend alone. Scans (list and map state, TTL purges)
//! write everything back first and then read the backend: one write per buffered change at
//! most, as without the buffer. Its memory is counted as the heap's is (slots, keys and values
//! as malloc sizes them) and stays within [`STATE_WRITE_BACK_BYTES`] but for one entry, which
//! a job's memory demand reserves per step subtask on disk ([`crate::entry_caches_bytes`]).

use std::cell::RefCell;
use std::path::Path;

use crate::entry_cache::entry_cost;
use crate::{BackendSnapshot, EntryMeasure, StateBackend, StateError, allocation_bytes};

/// Host memory of the write-back buffer of a step subtask's keyed state on disk.
pub const STATE_WRITE_BACK_BYTES: usize = 4 << 20;

/// Held keys a prefix delete checks one by one at most (see `delete_prefix`).
const CHECKED_PER_PREFIX_DELETE: usize = 64;

/// One key as the buffer holds it.
#[derive(Debug)]
struct Held {
    /// The value, or `None` for a delete not yet written back.
    value: Option<Vec<u8>>,
    /// The backend lacks this (value or delete).
    dirty: bool,
    /// The backend may hold a value under the key (so a delete must reach it).
    stored: bool,
}

impl Held {
    fn heap_bytes(&self) -> usize {
        self.value.as_ref().map_or(0, |v| allocation_bytes(v.capacity()) as usize)
    }
}

/// The buffer: what the state holds beyond (or instead of) the backend.
#[derive(Debug, Default)]
struct Buffer {
    held: foldhash::HashMap<Box<[u8]>, Held>,
    /// The keys made dirty since the last write-back (some may be clean or gone again), so
    /// that a write-back before each scan costs what changed, not what is held: q3 scans a
    /// list per person.
    pending: Vec<Box<[u8]>>,
    /// Memory `held` and `pending` take, as [`entry_cost`] and [`pending_cost`] count it.
    used: usize,
    /// The backend holds no key `held` lacks.
    complete: bool,
}

/// What a key in [`Buffer::pending`] costs: its copy, and its slot twice over (the list
/// doubles as it grows).
fn pending_cost(key_len: usize) -> usize {
    allocation_bytes(key_len) as usize + 2 * size_of::<Box<[u8]>>()
}

impl Buffer {
    /// Marks `entry` (of `key`) dirty, and `key` pending if it was clean.
    fn dirtied(pending: &mut Vec<Box<[u8]>>, used: &mut usize, key: &[u8], entry: &mut Held) {
        if !entry.dirty {
            entry.dirty = true;
            pending.push(key.into());
            *used += pending_cost(key.len());
        }
    }

    /// Writes every dirty entry to `backend`; deletes written back leave the buffer (the
    /// backend now answers for them as the buffer would).
    /// A write the backend refuses leaves that key and the ones after it pending.
    fn write_back(&mut self, backend: &mut dyn StateBackend) -> Result<(), StateError> {
        let mut keys = std::mem::take(&mut self.pending);
        // In key order: RocksDB's memtable starts each insert from where the last one went, so
        // ordered inserts skip most of the skip list's descent (q3's write-backs at checkpoints
        // spent more in that descent than in the rest of RocksDB's write path).
        keys.sort_unstable();
        for (i, key) in keys.iter().enumerate() {
            if let Err(e) = self.write_one(backend, key) {
                self.pending = keys[i..].to_vec();
                return Err(e);
            }
            self.used = self.used.saturating_sub(pending_cost(key.len()));
        }
        Ok(())
    }

    /// Writes `key`'s entry to `backend` if it is dirty.
    fn write_one(&mut self, backend: &mut dyn StateBackend, key: &[u8]) -> Result<(), StateError> {
        let Some(entry) = self.held.get_mut(key).filter(|e| e.dirty) else { return Ok(()) };
        match &entry.value {
            Some(value) => {
                backend.put(key, value)?;
                entry.dirty = false;
                entry.stored = true;
            }
            None => {
                backend.delete(key)?;
                if let Some(gone) = self.held.remove(key) {
                    self.used = self.used.saturating_sub(entry_cost::<Held>(key.len(), gone.heap_bytes()));
                }
            }
        }
        Ok(())
    }
}

/// A [`StateBackend`] that buffers writes to its inner backend (see the module docs).
pub struct WriteBackBackend {
    /// In cells so that scans, which take `&self`, can write back first.
    inner: RefCell<Box<dyn StateBackend>>,
    buffer: RefCell<Buffer>,
    budget: usize,
}

impl std::fmt::Debug for WriteBackBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let buffer = self.buffer.borrow();
        f.debug_struct("WriteBackBackend")
            .field("held", &buffer.held.len())
            .field("used", &buffer.used)
            .field("pending", &buffer.pending.len())
            .field("complete", &buffer.complete)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl WriteBackBackend {
    /// Buffers up to `budget` bytes of writes to `inner`; complete while `inner` is empty.
    pub fn new(inner: Box<dyn StateBackend>, budget: usize) -> Result<Self, StateError> {
        let mut empty = true;
        inner.scan_from(b"", &mut |_, _| {
            empty = false;
            false
        })?;
        let buffer = Buffer { complete: empty, ..Buffer::default() };
        Ok(Self { inner: RefCell::new(inner), buffer: RefCell::new(buffer), budget })
    }

    /// Writes every buffered change to the backend.
    fn write_back(&self) -> Result<(), StateError> {
        self.buffer.borrow_mut().write_back(self.inner.borrow_mut().as_mut())
    }

    /// Writes back and empties the buffer once it passes its budget.
    fn keep_within_budget(&mut self) -> Result<(), StateError> {
        let buffer = self.buffer.get_mut();
        if buffer.used > self.budget {
            buffer.write_back(self.inner.get_mut().as_mut())?;
            *buffer = Buffer::default();
        }
        Ok(())
    }

    /// What the buffer says of `key`: `Some(value or none)` if it knows, `None` if the backend
    /// must be asked.
    fn known<R>(&self, key: &[u8], answer: impl FnOnce(Option<&[u8]>) -> R) -> Option<R> {
        let buffer = self.buffer.borrow();
        match buffer.held.get(key) {
            Some(held) => Some(answer(held.value.as_deref())),
            None if buffer.complete => Some(answer(None)),
            None => None,
        }
    }

    /// Memory the buffer holds, counted as it goes and afresh (tests compare the two).
    #[cfg(test)]
    fn recount(&self) -> (usize, usize) {
        let buffer = self.buffer.borrow();
        let held: usize = buffer.held.iter().map(|(k, h)| entry_cost::<Held>(k.len(), h.heap_bytes())).sum();
        let pending: usize = buffer.pending.iter().map(|k| pending_cost(k.len())).sum();
        (buffer.used, held + pending)
    }
}

impl StateBackend for WriteBackBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        match self.known(key, |v| v.map(<[u8]>::to_vec)) {
            Some(value) => Ok(value),
            None => self.inner.borrow().get(key),
        }
    }

    fn read_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StateError> {
        let found = self.known(key, |v| {
            if let Some(v) = v {
                out.extend_from_slice(v);
            }
            v.is_some()
        });
        match found {
            Some(found) => Ok(found),
            None => self.inner.borrow().read_into(key, out),
        }
    }

    fn value_len(&self, key: &[u8]) -> Result<Option<usize>, StateError> {
        match self.known(key, |v| v.map(<[u8]>::len)) {
            Some(len) => Ok(len),
            None => self.inner.borrow().value_len(key),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        let Buffer { held, pending, used, complete } = self.buffer.get_mut();
        match held.get_mut(key) {
            Some(entry) => {
                let before = entry.heap_bytes();
                let slot = entry.value.get_or_insert_with(Vec::new);
                slot.clear();
                slot.extend_from_slice(value);
                *used = used.saturating_sub(before) + entry.heap_bytes();
                Buffer::dirtied(pending, used, key, entry);
            }
            None => {
                // Not held: while complete, known absent from the backend; otherwise maybe there.
                let mut entry = Held { value: Some(value.to_vec()), dirty: false, stored: !*complete };
                *used += entry_cost::<Held>(key.len(), entry.heap_bytes());
                Buffer::dirtied(pending, used, key, &mut entry);
                held.insert(key.into(), entry);
            }
        }
        self.keep_within_budget()
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        let Buffer { held, pending, used, complete } = self.buffer.get_mut();
        match held.get_mut(key) {
            // The backend never got it: forgetting it is the whole delete (its pending key, if
            // any, finds nothing at the write-back).
            Some(entry) if !entry.stored => {
                if let Some((key, entry)) = held.remove_entry(key) {
                    *used = used.saturating_sub(entry_cost::<Held>(key.len(), entry.heap_bytes()));
                }
            }
            Some(entry) => {
                let before = entry.heap_bytes();
                entry.value = None;
                *used = used.saturating_sub(before);
                Buffer::dirtied(pending, used, key, entry);
            }
            None if *complete => {}
            None => {
                let mut entry = Held { value: None, dirty: false, stored: true };
                *used += entry_cost::<Held>(key.len(), 0);
                Buffer::dirtied(pending, used, key, &mut entry);
                held.insert(key.into(), entry);
            }
        }
        self.keep_within_budget()
    }

    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        self.write_back()?;
        self.inner.borrow().scan_prefix(prefix, visit)
    }

    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        self.write_back()?;
        self.inner.borrow().scan_from(from, visit)
    }

    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        let buffer = self.buffer.get_mut();
        buffer.write_back(self.inner.get_mut().as_mut())?;
        self.inner.get_mut().delete_prefix(prefix)?;
        // Written back, every entry left is clean, so those under the prefix may simply go. A
        // few are checked one by one; past that the buffer is emptied instead, which drops each
        // entry once, where checking every held key per prefix delete cost q3 (a list cleared
        // per person) a quarter of its CPU.
        if buffer.held.len() > CHECKED_PER_PREFIX_DELETE {
            *buffer = Buffer::default();
            return Ok(());
        }
        let Buffer { held, used, .. } = buffer;
        held.retain(|key, entry| {
            let keep = !key.starts_with(prefix);
            if !keep {
                *used = used.saturating_sub(entry_cost::<Held>(key.len(), entry.heap_bytes()));
            }
            keep
        });
        Ok(())
    }

    fn approximate_len(&self) -> usize {
        // An estimate: the backend's, give or take what is buffered.
        self.inner.borrow().approximate_len()
    }

    fn purge_expired(&mut self) -> Result<usize, StateError> {
        self.write_back()?;
        self.inner.get_mut().purge_expired()
    }

    fn snapshot(&mut self, staging: &Path) -> Result<BackendSnapshot, StateError> {
        self.write_back()?;
        self.inner.get_mut().snapshot(staging)
    }

    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self
    }

    fn usage(&self) -> Option<crate::StateUsage> {
        self.inner.borrow().usage()
    }

    fn entry_measure(&self) -> EntryMeasure {
        self.inner.borrow().entry_measure()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::test_ops::{Op, Watched, op, small_bytes};
    use crate::{HeapStateBackend, RocksDbBackend, RocksDbConfig};

    /// What a test does to the buffer besides writes.
    #[derive(Debug, Clone)]
    enum Step {
        Write(Op),
        /// Reads a key every way the trait offers.
        Read(Vec<u8>),
        /// Scans a prefix (writing everything back first).
        Scan(Vec<u8>),
        /// A snapshot's write-back.
        Snapshot,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => op().prop_map(Step::Write),
            2 => small_bytes().prop_map(Step::Read),
            1 => small_bytes().prop_map(Step::Scan),
            1 => Just(Step::Snapshot),
        ]
    }

    fn backend(disk: bool, dir: &tempfile::TempDir, start: &BTreeMap<Vec<u8>, Vec<u8>>) -> Box<dyn StateBackend> {
        let mut inner: Box<dyn StateBackend> = match disk {
            true => Box::new(RocksDbBackend::open(dir.path(), RocksDbConfig::default()).expect("open")),
            false => Box::new(HeapStateBackend::default()),
        };
        for (k, v) in start {
            inner.put(k, v).expect("put");
        }
        inner
    }

    fn contents(backend: &dyn StateBackend) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut all = BTreeMap::new();
        backend.scan_prefix(b"", &mut |k, v| drop(all.insert(k.to_vec(), v.to_vec()))).expect("scan");
        all
    }

    proptest! {
        /// Every read and scan answers what a plain map given the same writes holds, whatever
        /// the backend held before and however often the budget empties the buffer; the
        /// memory count stays what the buffer holds; and a snapshot's write-back leaves the
        /// backend alone holding exactly that map.
        #[test]
        fn reads_scans_and_snapshots_see_every_write(
            start in proptest::collection::btree_map(small_bytes(), small_bytes(), 0..6),
            steps in proptest::collection::vec(step(), 0..80),
            budget in prop_oneof![Just(usize::MAX), 0usize..2_000],
            disk in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut buffered = WriteBackBackend::new(backend(disk, &dir, &start), budget).unwrap();
            let mut oracle = start.clone();
            for step in steps {
                match step {
                    Step::Write(Op::Put(k, v)) => { buffered.put(&k, &v).unwrap(); oracle.insert(k, v); }
                    Step::Write(Op::Delete(k)) => { buffered.delete(&k).unwrap(); oracle.remove(&k); }
                    Step::Write(Op::DeletePrefix(p)) => {
                        buffered.delete_prefix(&p).unwrap();
                        oracle.retain(|k, _| !k.starts_with(&p));
                    }
                    Step::Read(k) => {
                        let want = oracle.get(&k).cloned();
                        prop_assert_eq!(buffered.get(&k).unwrap(), want.clone());
                        prop_assert_eq!(buffered.value_len(&k).unwrap(), want.as_ref().map(Vec::len));
                        let mut out = b"x".to_vec();
                        prop_assert_eq!(buffered.read_into(&k, &mut out).unwrap(), want.is_some());
                        let read = want.unwrap_or_default();
                        prop_assert_eq!(&out[1..], read.as_slice());
                    }
                    Step::Scan(p) => {
                        let mut seen = Vec::new();
                        buffered.scan_prefix(&p, &mut |k, v| seen.push((k.to_vec(), v.to_vec()))).unwrap();
                        let want: Vec<_> =
                            oracle.iter().filter(|(k, _)| k.starts_with(&p)).map(|(k, v)| (k.clone(), v.clone())).collect();
                        prop_assert_eq!(seen, want);
                    }
                    Step::Snapshot => {
                        buffered.write_back().unwrap();
                        prop_assert_eq!(&contents(buffered.inner.borrow().as_ref()), &oracle);
                    }
                }
                let (counted, fresh) = buffered.recount();
                prop_assert_eq!(counted, fresh);
                prop_assert!(budget == usize::MAX || counted <= budget, "{counted} held past a budget of {budget}");
            }
            buffered.write_back().unwrap();
            prop_assert_eq!(&contents(buffered.inner.borrow().as_ref()), &oracle);
        }
    }

    /// A prefix delete over a large buffer empties it (no check per held key); what the
    /// buffer held is then read from the backend, and what the prefix covered is gone.
    #[test]
    fn a_prefix_delete_over_many_held_keys_empties_the_buffer_and_reads_go_through() {
        let mut buffered = WriteBackBackend::new(Box::new(HeapStateBackend::default()), usize::MAX).unwrap();
        let keys: Vec<[u8; 2]> = (0..2 * CHECKED_PER_PREFIX_DELETE as u8).map(|i| [i % 2, i]).collect();
        for key in &keys {
            buffered.put(key, key).unwrap();
        }
        buffered.delete_prefix(&[0]).unwrap();
        assert_eq!(buffered.buffer.borrow().held.len(), 0, "emptied");
        for key in &keys {
            let want = (key[0] == 1).then(|| key.to_vec());
            assert_eq!(buffered.get(key).unwrap(), want, "{key:?}");
        }
        buffered.put(&[0, 0], b"again").unwrap();
        assert_eq!(buffered.get(&[0, 0]).unwrap(), Some(b"again".to_vec()));
        assert_eq!(buffered.get(&[0, 2]).unwrap(), None, "not held, read from the backend: deleted");
    }

    /// The point of the buffer: rewrites and a write then delete between two snapshots cost
    /// the backend nothing until the snapshot, and a key never written is known absent without
    /// a read while the buffer holds everything.
    #[test]
    fn writes_reach_the_backend_only_at_the_write_back_and_a_short_lived_key_never() {
        let mut buffered = WriteBackBackend::new(Box::new(HeapStateBackend::default()), usize::MAX).unwrap();
        for round in 0..3u8 {
            buffered.put(b"kept", &[round]).unwrap();
        }
        buffered.put(b"brief", b"1").unwrap();
        buffered.delete(b"brief").unwrap();
        assert_eq!(buffered.inner.borrow().approximate_len(), 0, "nothing written before the snapshot");
        assert_eq!(buffered.get(b"kept").unwrap(), Some(vec![2]));
        let staging = tempfile::tempdir().unwrap();
        buffered.snapshot(staging.path()).unwrap();
        assert_eq!(contents(buffered.inner.borrow().as_ref()), BTreeMap::from([(b"kept".to_vec(), vec![2])]));
        // Held clean after the write-back: a delete now must reach the backend.
        buffered.delete(b"kept").unwrap();
        buffered.snapshot(staging.path()).unwrap();
        assert!(contents(buffered.inner.borrow().as_ref()).is_empty(), "the delete reached the backend");
    }

    /// A write-back reaches the backend in key order, whatever order the keys were written in
    /// (RocksDB's memtable inserts ordered keys cheaply), each dirty key once; a key written and
    /// deleted in between never.
    #[test]
    fn a_write_back_writes_in_key_order() {
        let watched = Watched::default();
        let watch = watched.watch.clone();
        let mut buffered = WriteBackBackend::new(Box::new(watched), usize::MAX).unwrap();
        for key in [b"m", b"c", b"x", b"a", b"c", b"q"] {
            buffered.put(key, b"v").unwrap();
        }
        buffered.delete(b"x").unwrap();
        buffered.write_back().unwrap();
        let expected: Vec<Vec<u8>> = [b"a", b"c", b"m", b"q"].iter().map(|k| k.to_vec()).collect();
        assert_eq!(watch.lock().expect("a test's lock is never poisoned").written, expected);
    }
}
