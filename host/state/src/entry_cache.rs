//! A bounded map from state keys to what their owner last wrote under them, beside a backend:
//! the owner answers reads from it instead of a lookup through RocksDB's memtable and block
//! cache or the heap backend's B-tree.
//!
//! Two uses, one map. A write-through cache ([`EntryCache::new`]) is exact only because every
//! write under its keys passes through its owner, which updates it after the backend took the
//! write (so limits, snapshots and restores see the backend alone); it holds at most its
//! budget of host memory and starts over when that is reached: no eviction order to keep, and
//! a cache that keeps starting over is one whose keys do not repeat, where it could not help
//! anyway. A write-back buffer ([`EntryCache::write_back`]) holds values the backend has not
//! seen yet; it never drops one by itself: its owner checks [`EntryCache::over_budget`]
//! between batches and then writes everything back and clears it. Its count is of the memory
//! it holds: slots, and keys and values as glibc's malloc sizes them, so a job's memory demand
//! can reserve its budget.

use crate::heap_memory::allocation_bytes;

/// Host memory of the caches beside a disk backend: a [`crate::BoundedBackend`]'s lengths.
pub const LENGTHS_CACHE_BYTES: usize = 4 << 20;
/// Host memory of a window operator's write-back buffer of its accumulators and session lists
/// (on every backend; it may pass this by one `add` call's windows before it is written back).
pub const WINDOW_CACHE_BYTES: usize = 8 << 20;
/// The most host memory the entry caches take per step subtask (what a job's memory demand
/// counts beside its state): the lengths beside a disk backend, and a window step's
/// write-back buffer on every backend.
pub const fn entry_caches_bytes(on_disk: bool, window: bool) -> usize {
    let lengths = if on_disk { LENGTHS_CACHE_BYTES } else { 0 };
    let windows = if window { WINDOW_CACHE_BYTES } else { 0 };
    lengths + windows
}

/// What a cached value holds outside its slot of the map, bytes.
pub trait Weigh {
    /// Bytes of its own allocations, as malloc sizes them.
    fn heap_bytes(&self) -> usize;
}

impl Weigh for usize {
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl Weigh for Vec<u8> {
    fn heap_bytes(&self) -> usize {
        allocation_bytes(self.capacity()) as usize
    }
}

/// Keys to the last value written under them, within a memory budget.
#[derive(Debug)]
pub struct EntryCache<V> {
    map: foldhash::HashMap<Box<[u8]>, V>,
    used: usize,
    budget: usize,
    /// Whether an insert past the budget empties the map first (a cache), or is kept for the
    /// owner to write back (a write-back buffer).
    starts_over: bool,
}

impl<V: Weigh> EntryCache<V> {
    /// An empty cache of at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self { map: foldhash::HashMap::default(), used: 0, budget, starts_over: true }
    }

    /// An empty write-back buffer of `budget` bytes: inserts past it are kept, and
    /// [`Self::over_budget`] tells the owner to write back and [`Self::clear`].
    pub fn write_back(budget: usize) -> Self {
        Self { starts_over: false, ..Self::new(budget) }
    }

    /// Whether it holds more than its budget.
    pub fn over_budget(&self) -> bool {
        self.used > self.budget
    }

    /// What was last written under `key`, if this cache still knows.
    pub fn get(&self, key: &[u8]) -> Option<&V> {
        self.map.get(key)
    }

    /// Remembers what was just written under `key`: rewrites the known value in place (no
    /// allocation for a key seen before), or inserts `fresh()`.
    pub fn write(&mut self, key: &[u8], rewrite: impl FnOnce(&mut V), fresh: impl FnOnce() -> V) {
        match self.map.get_mut(key) {
            Some(slot) => {
                let before = slot.heap_bytes();
                rewrite(slot);
                self.used = self.used.saturating_sub(before) + slot.heap_bytes();
            }
            None => self.insert(key, fresh()),
        }
    }

    /// What an entry costs at most: its slots (the table doubles as it grows and keeps at most
    /// 7 of 8 slots full, so up to 16/7 slots and control bytes per entry), the key's
    /// allocation and the value's.
    fn cost(key: &[u8], value: &V) -> usize {
        (size_of::<(Box<[u8]>, V)>() + 1) * 16 / 7 + allocation_bytes(key.len()) as usize + value.heap_bytes()
    }

    /// Remembers `value` as written under `key`.
    pub fn insert(&mut self, key: &[u8], value: V) {
        if let Some(slot) = self.map.get_mut(key) {
            self.used = self.used.saturating_sub(slot.heap_bytes()) + value.heap_bytes();
            *slot = value;
            return;
        }
        let cost = Self::cost(key, &value);
        if self.starts_over && self.used + cost > self.budget {
            self.clear();
            if cost > self.budget {
                return;
            }
        }
        self.used += cost;
        self.map.insert(key.into(), value);
    }

    /// Forgets `key` (deleted, or no longer known) and gives back what it held.
    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        let value = self.map.remove(key)?;
        self.used = self.used.saturating_sub(Self::cost(key, &value));
        Some(value)
    }

    /// Visits every entry, mutably (to write it back and mark it written), stopping at the
    /// first error.
    pub fn try_for_each_mut<E>(&mut self, mut visit: impl FnMut(&[u8], &mut V) -> Result<(), E>) -> Result<(), E> {
        for (key, value) in &mut self.map {
            let before = value.heap_bytes();
            let visited = visit(key, value);
            self.used = self.used.saturating_sub(before) + value.heap_bytes();
            visited?;
        }
        Ok(())
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.map.clear();
        self.used = 0;
    }

    /// Bytes held, as counted.
    pub fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_answers_what_was_written_and_starts_over_when_full() {
        let cost = |key: &[u8]| EntryCache::<usize>::cost(key, &0);
        let mut cache = EntryCache::new(2 * cost(b"a"));
        cache.insert(b"a", 1usize);
        cache.insert(b"b", 2);
        assert_eq!((cache.get(b"a"), cache.get(b"b")), (Some(&1), Some(&2)));
        cache.insert(b"a", 3);
        assert_eq!((cache.get(b"a"), cache.used()), (Some(&3), 2 * cost(b"a")), "an overwrite costs nothing more");
        cache.insert(b"c", 4);
        assert_eq!((cache.get(b"a"), cache.get(b"b"), cache.get(b"c")), (None, None, Some(&4)), "full: started over");
        cache.write(b"c", |v| *v = 5, || 6);
        assert_eq!(cache.get(b"c"), Some(&5), "a known key is rewritten");
        cache.write(b"d", |v| *v = 5, || 6);
        assert_eq!((cache.get(b"c"), cache.get(b"d")), (Some(&5), Some(&6)), "a new one is inserted");
        cache.remove(b"d");
        cache.remove(b"c");
        assert_eq!((cache.get(b"c"), cache.used()), (None, 0));
        let mut tiny: EntryCache<Vec<u8>> = EntryCache::new(8);
        tiny.insert(b"k", vec![0; 64]);
        assert_eq!(tiny.get(b"k"), None, "a value beyond the budget is not kept");
    }

    #[test]
    fn a_write_back_buffer_keeps_what_passes_its_budget_and_says_so() {
        let cost = |key: &[u8]| EntryCache::<Vec<u8>>::cost(key, &Vec::new());
        let mut buffer: EntryCache<Vec<u8>> = EntryCache::write_back(2 * cost(b"a"));
        buffer.insert(b"a", Vec::new());
        buffer.insert(b"b", Vec::new());
        assert!(!buffer.over_budget(), "at its budget, not past it");
        buffer.insert(b"c", Vec::new());
        assert!(buffer.over_budget());
        assert!([b"a", b"b", b"c"].iter().all(|k| buffer.get(*k).is_some()), "nothing dropped");
        let mut visited = Vec::new();
        let grown = buffer.try_for_each_mut(|key, value| {
            visited.push(key.to_vec());
            value.resize(100, 0);
            Ok::<_, ()>(())
        });
        assert_eq!((grown, visited.len()), (Ok(()), 3));
        let grown_cost = 3 * cost(b"a") + 3 * allocation_bytes(100) as usize;
        assert_eq!(buffer.used(), grown_cost, "values changed by a visit are counted as they are now");
        assert_eq!(buffer.remove(b"a").map(|v| v.len()), Some(100));
        assert_eq!(buffer.remove(b"a"), None);
        buffer.clear();
        assert_eq!((buffer.used(), buffer.over_budget()), (0, false));
    }
}
