//! A bounded map from state keys to what their owner last wrote under them, beside a backend:
//! the owner answers reads from it instead of a lookup through RocksDB's memtable and block
//! cache or the heap backend's B-tree.
//!
//! A write-through cache: exact only because every write under its keys passes through its
//! owner, which updates it after the backend took the write (so limits, snapshots and restores
//! see the backend alone); it holds at most its budget of host memory and starts over when
//! that is reached: no eviction order to keep, and a cache that keeps starting over is one
//! whose keys do not repeat, where it could not help anyway. Its count is of the memory it
//! holds: slots, and keys and values as glibc's malloc sizes them, so a job's memory demand can
//! reserve its budget. (The window operator's write-back buffer, which must never drop an
//! entry by itself, is its own map, held per key: `eddy_engine`'s `window_operator::store`.)

use crate::heap_memory::allocation_bytes;

/// Host memory of the caches beside a disk backend: a [`crate::BoundedBackend`]'s lengths.
pub const LENGTHS_CACHE_BYTES: usize = 4 << 20;
/// Host memory of a window operator's write-back buffer of its accumulators and session lists
/// (on every backend; it may pass this by one `add` call's windows before it is written back).
pub const WINDOW_CACHE_BYTES: usize = 8 << 20;
/// The most host memory the entry caches take per step subtask (what a job's memory demand
/// counts beside its state): the lengths beside a disk backend, a window step's write-back
/// buffer on every backend, and any other step's write-back buffer of its keyed state on disk
/// ([`crate::WriteBackBackend`]).
pub const fn entry_caches_bytes(on_disk: bool, window: bool) -> usize {
    let lengths = if on_disk { LENGTHS_CACHE_BYTES } else { 0 };
    let windows = if window { WINDOW_CACHE_BYTES } else { 0 };
    let writes = if on_disk && !window { crate::STATE_WRITE_BACK_BYTES } else { 0 };
    lengths + windows + writes
}

/// What an entry of a map from boxed keys to `V` costs at most: its slots (the table doubles as
/// it grows and keeps at most 7 of 8 slots full, so up to 16/7 slots and control bytes per
/// entry), the key's allocation and the value's (`value_heap_bytes`).
pub(crate) fn entry_cost<V>(key_len: usize, value_heap_bytes: usize) -> usize {
    (size_of::<(Box<[u8]>, V)>() + 1) * 16 / 7 + allocation_bytes(key_len) as usize + value_heap_bytes
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
}

impl<V: Weigh> EntryCache<V> {
    /// An empty cache of at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self { map: foldhash::HashMap::default(), used: 0, budget }
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

    fn cost(key: &[u8], value: &V) -> usize {
        entry_cost::<V>(key.len(), value.heap_bytes())
    }

    /// Remembers `value` as written under `key`.
    pub fn insert(&mut self, key: &[u8], value: V) {
        if let Some(slot) = self.map.get_mut(key) {
            self.used = self.used.saturating_sub(slot.heap_bytes()) + value.heap_bytes();
            *slot = value;
            return;
        }
        let cost = Self::cost(key, &value);
        if self.used + cost > self.budget {
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
}
