//! State on the heap: fast, bounded by memory.
//!
//! The entries live in a persistent ordered map (`imbl::OrdMap`, a B-tree whose nodes are
//! shared between copies): a snapshot is an O(1) clone, and a write after it copies only the
//! path to the entry it changes — copy-on-write, so the synchronous phase of a checkpoint does
//! not grow with the state.
//!
//! Keys compare in byte order, but a stored key keeps its first 16 bytes as one big-endian
//! integer beside the bytes (held inline when short): state keys ([`crate::StateKey`]) put
//! the key group, state id and key hash there, so a tree descent decides almost every
//! comparison with one integer compare on the node itself, without following a pointer to
//! the key's bytes or calling `memcmp` (which topped the profile of keyed jobs before).
//!
//! Its state limit counts the memory entries hold ([`EntryMeasure::HeapMemory`], modelled in
//! `heap_memory.rs`) from their lengths, so every key and value is kept in an allocation that
//! malloc sizes as one of its length: an overwrite that would change that size reallocates
//! instead of keeping the old capacity, and cloned keys are as long as the key.

use std::cmp::Ordering;
use std::ops::Bound;

use imbl::OrdMap;
use smallvec::SmallVec;

use crate::heap_memory::allocation_bytes;
use crate::{BackendSnapshot, EntryMeasure, FrozenEntries, StateBackend, StateError};

/// Bytes of a key compared as one integer.
const HEAD: usize = 16;

/// Key bytes held in the map's node itself; longer keys are an allocation of their own.
pub(crate) const INLINE_KEY_BYTES: usize = 40;

/// A key as the map holds it (and as lookups probe it, built on the stack for short keys).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct StoredKey {
    /// The first [`HEAD`] bytes, zero-padded, big-endian.
    head: u128,
    bytes: SmallVec<[u8; INLINE_KEY_BYTES]>,
}

impl Clone for StoredKey {
    /// Exactly as long as the key, as the state limit charges it: the tree clones keys into
    /// branches and into the nodes a write copies while a snapshot is held, and `SmallVec`'s
    /// own clone would round a spilled key's allocation up to a power of two.
    fn clone(&self) -> Self {
        Self { head: self.head, bytes: SmallVec::from_slice(&self.bytes) }
    }
}

impl StoredKey {
    fn new(bytes: &[u8]) -> Self {
        let mut head = [0u8; HEAD];
        let n = bytes.len().min(HEAD);
        head[..n].copy_from_slice(&bytes[..n]);
        Self { head: u128::from_be_bytes(head), bytes: SmallVec::from_slice(bytes) }
    }
}

impl Ord for StoredKey {
    /// Byte order: heads that differ differ where the bytes first do (a zero pad only sorts a
    /// proper prefix first, as byte order does); equal heads fall back to the bytes.
    fn cmp(&self, other: &Self) -> Ordering {
        self.head.cmp(&other.head).then_with(|| self.bytes.as_slice().cmp(other.bytes.as_slice()))
    }
}

impl PartialOrd for StoredKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

type Entries = OrdMap<StoredKey, Vec<u8>>;

/// A [`StateBackend`] in an ordered map, so prefix scans are range scans.
#[derive(Debug, Default, Clone)]
pub struct HeapStateBackend {
    entries: Entries,
}

impl HeapStateBackend {
    fn from<'a>(&'a self, from: &[u8]) -> impl Iterator<Item = (&'a [u8], &'a Vec<u8>)> + 'a {
        self.entries
            .range((Bound::Included(StoredKey::new(from)), Bound::Unbounded))
            .map(|(k, v)| (k.bytes.as_slice(), v))
    }

    fn range<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a Vec<u8>)> + 'a {
        self.from(prefix).take_while(move |(k, _)| k.starts_with(prefix))
    }
}

/// A frozen clone of the heap map.
#[derive(Debug)]
struct FrozenMap(Entries);

impl FrozenEntries for FrozenMap {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn for_each(&self, visit: &mut dyn FnMut(&[u8], &[u8])) {
        for (k, v) in self.0.iter() {
            visit(&k.bytes, v);
        }
    }
}

impl StateBackend for HeapStateBackend {
    fn get(&self, bytes: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.entries.get(&StoredKey::new(bytes)).cloned())
    }

    fn read_into(&self, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, StateError> {
        let value = self.entries.get(&StoredKey::new(bytes));
        if let Some(v) = value {
            out.extend_from_slice(v);
        }
        Ok(value.is_some())
    }

    fn value_len(&self, bytes: &[u8]) -> Result<Option<usize>, StateError> {
        Ok(self.entries.get(&StoredKey::new(bytes)).map(Vec::len))
    }

    fn put_admitted(
        &mut self,
        bytes: &[u8],
        value: &[u8],
        admit: &mut dyn FnMut(Option<usize>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        match self.entries.get_mut(&StoredKey::new(bytes)) {
            Some(v) => {
                admit(Some(v.len()))?;
                if v.len() == value.len() {
                    v.copy_from_slice(value);
                } else if value.len() <= v.capacity() && allocation_bytes(v.capacity()) == allocation_bytes(value.len())
                {
                    // The same chunk either way: what the count charges for this length.
                    v.clear();
                    v.extend_from_slice(value);
                } else {
                    // Not `extend_from_slice`: grown, it would round the capacity up to twice
                    // the old one; shrunk, it would keep memory the count no longer charges.
                    *v = value.to_vec();
                }
            }
            None => {
                admit(None)?;
                self.entries.insert(StoredKey::new(bytes), value.to_vec());
            }
        }
        Ok(())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.put_admitted(key, value, &mut |_| Ok(()))
    }

    fn delete(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        self.entries.remove(&StoredKey::new(bytes));
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        for (k, v) in self.range(prefix) {
            visit(k, v);
        }
        Ok(())
    }

    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        for (k, v) in self.from(from) {
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }

    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        let doomed: Vec<Vec<u8>> = self.range(prefix).map(|(k, _)| k.to_vec()).collect();
        for k in doomed {
            self.entries.remove(&StoredKey::new(&k));
        }
        Ok(())
    }

    fn approximate_len(&self) -> usize {
        self.entries.len()
    }

    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self
    }

    /// An O(1) clone of the map. While it is held, each write copies the tree nodes on its
    /// way, so writing every key once doubles what the state holds
    /// ([`crate::HEAP_SNAPSHOT_COPIES`]).
    fn snapshot(&mut self, _staging: &std::path::Path) -> Result<BackendSnapshot, StateError> {
        Ok(BackendSnapshot::Frozen(Box::new(FrozenMap(self.entries.clone()))))
    }

    fn entry_measure(&self) -> EntryMeasure {
        EntryMeasure::HeapMemory
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    use crate::test_ops::{Op, op, small_bytes};

    #[test]
    fn a_snapshot_is_frozen_while_the_backend_keeps_changing() {
        let mut backend = HeapStateBackend::default();
        for i in 0..1_000u32 {
            backend.put(&i.to_be_bytes(), b"old").unwrap();
        }
        let BackendSnapshot::Frozen(frozen) = backend.snapshot(std::path::Path::new(".")).unwrap() else {
            panic!("heap snapshots are frozen maps")
        };
        backend.put(&5u32.to_be_bytes(), b"new").unwrap();
        backend.delete(&6u32.to_be_bytes()).unwrap();
        backend.put(&5_000u32.to_be_bytes(), b"added").unwrap();
        let mut seen = Vec::new();
        frozen.for_each(&mut |k, v| seen.push((k.to_vec(), v.to_vec())));
        let expected: Vec<_> = (0..1_000u32).map(|i| (i.to_be_bytes().to_vec(), b"old".to_vec())).collect();
        assert_eq!(seen, expected);
        assert_eq!(backend.get(&5u32.to_be_bytes()).unwrap(), Some(b"new".to_vec()));
    }

    /// The heap's count charges a value by its length (and a key by its own): the allocation
    /// behind it must be the one malloc gives that length, whatever it held before.
    #[test]
    fn values_and_cloned_keys_are_held_at_their_length() {
        let mut backend = HeapStateBackend::default();
        let class = |v: &Vec<u8>| (allocation_bytes(v.capacity()), allocation_bytes(v.len()));
        for len in [100, 10, 101, 300, 290, 0, 24] {
            backend.put(b"k", &vec![1; len]).unwrap();
            let (held, charged) = class(backend.entries.get(&StoredKey::new(b"k")).unwrap());
            assert_eq!(held, charged, "after a write of {len} bytes");
        }
        let long = StoredKey::new(&[7; 50]).clone();
        assert_eq!((long.bytes.len(), long.bytes.capacity()), (50, 50), "a clone is not rounded up");
    }

    proptest! {
        /// The head-first comparison is byte order (the oracle: slices' own `cmp`), across the
        /// 16-byte head, with long shared prefixes and zero bytes (a three-letter alphabet from
        /// 0) and any lengths, so padding and prefixes meet.
        #[test]
        fn key_order_is_byte_order(
            a in proptest::collection::vec(0u8..3, 0..40),
            b in proptest::collection::vec(0u8..3, 0..40),
            shared in proptest::collection::vec(any::<u8>(), 0..24),
        ) {
            let (a, b) = ([&shared[..], &a].concat(), [&shared[..], &b].concat());
            prop_assert_eq!(StoredKey::new(&a).cmp(&StoredKey::new(&b)), a.cmp(&b));
            prop_assert_eq!(StoredKey::new(&a) == StoredKey::new(&b), a == b);
        }

        /// The backend behaves like a plain map (the oracle), and scans are ordered prefixes.
        /// Keys get a common prefix of 0 to 19 bytes, so they straddle the 16-byte head.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec(op(), 0..64), probe in small_bytes(), pad in 0usize..20) {
            let padded = |k: Vec<u8>| [vec![9; pad], k].concat();
            let probe = padded(probe);
            let mut backend = HeapStateBackend::default();
            let mut oracle: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            for op in ops {
                let op = match op {
                    Op::Put(k, v) => Op::Put(padded(k), v),
                    Op::Delete(k) => Op::Delete(padded(k)),
                    Op::DeletePrefix(p) => Op::DeletePrefix(padded(p)),
                };
                match op {
                    Op::Put(k, v) => { backend.put(&k, &v).unwrap(); oracle.insert(k, v); }
                    Op::Delete(k) => { backend.delete(&k).unwrap(); oracle.remove(&k); }
                    Op::DeletePrefix(p) => { backend.delete_prefix(&p).unwrap(); oracle.retain(|k, _| !k.starts_with(&p)); }
                }
            }
            for (k, v) in &oracle {
                prop_assert_eq!(backend.get(k).unwrap(), Some(v.clone()));
                let mut appended = b"before".to_vec();
                prop_assert!(backend.read_into(k, &mut appended).unwrap());
                prop_assert_eq!(&appended[6..], &v[..]);
            }
            let mut appended = Vec::new();
            prop_assert_eq!(backend.read_into(&probe, &mut appended).unwrap(), oracle.contains_key(&probe));
            prop_assert_eq!(appended, oracle.get(&probe).cloned().unwrap_or_default());
            prop_assert_eq!(backend.approximate_len(), oracle.len());
            let mut scanned = Vec::new();
            backend.scan_prefix(&probe, &mut |k, v| scanned.push((k.to_vec(), v.to_vec()))).unwrap();
            let mut expected: Vec<_> = oracle.into_iter().filter(|(k, _)| k.starts_with(&probe)).collect();
            expected.sort();
            prop_assert_eq!(scanned, expected);
        }
    }
}
