//! State on the heap: fast, bounded by memory.
//!
//! The entries live in a persistent ordered map (`imbl::OrdMap`, a B-tree whose nodes are
//! shared between copies): a snapshot is an O(1) clone, and a write after it copies only the
//! path to the entry it changes — copy-on-write, so the synchronous phase of a checkpoint does
//! not grow with the state.
//!
//! Keys compare in byte order, but through [`KeyBytes`], whose comparison decides on the first
//! 16 bytes as one integer: state keys ([`crate::StateKey`]) put the key group, state id and
//! key hash there, so a tree descent is a few inlined integer compares, not a `memcmp` call per
//! node visited (which topped the profile of keyed jobs before).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::ops::Bound;

use imbl::OrdMap;
use ref_cast::RefCast;

use crate::{BackendSnapshot, FrozenEntries, StateBackend, StateError};

/// Key bytes ordered as bytes are, compared head first (see the module docs).
#[derive(Debug, PartialEq, Eq, RefCast)]
#[repr(transparent)]
struct KeyBytes([u8]);

/// Bytes compared at once.
const HEAD: usize = 16;

impl Ord for KeyBytes {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (&self.0, &other.0);
        match (a.first_chunk::<HEAD>(), b.first_chunk::<HEAD>()) {
            // Big-endian integers order as their bytes do.
            (Some(ha), Some(hb)) => {
                u128::from_be_bytes(*ha).cmp(&u128::from_be_bytes(*hb)).then_with(|| a[HEAD..].cmp(&b[HEAD..]))
            }
            _ => a.cmp(b),
        }
    }
}

impl PartialOrd for KeyBytes {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A stored key: owned bytes, ordered as [`KeyBytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredKey(Vec<u8>);

impl Borrow<KeyBytes> for StoredKey {
    fn borrow(&self) -> &KeyBytes {
        KeyBytes::ref_cast(&self.0)
    }
}

impl Ord for StoredKey {
    fn cmp(&self, other: &Self) -> Ordering {
        KeyBytes::ref_cast(&self.0).cmp(KeyBytes::ref_cast(&other.0))
    }
}

impl PartialOrd for StoredKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

fn key(bytes: &[u8]) -> &KeyBytes {
    KeyBytes::ref_cast(bytes)
}

type Entries = OrdMap<StoredKey, Vec<u8>>;

/// A [`StateBackend`] in an ordered map, so prefix scans are range scans.
#[derive(Debug, Default, Clone)]
pub struct HeapStateBackend {
    entries: Entries,
}

impl HeapStateBackend {
    fn from<'a>(&'a self, from: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a Vec<u8>)> + 'a {
        self.entries.range::<_, KeyBytes>((Bound::Included(key(from)), Bound::Unbounded)).map(|(k, v)| (&k.0[..], v))
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
            visit(&k.0, v);
        }
    }
}

impl StateBackend for HeapStateBackend {
    fn get(&self, bytes: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.entries.get(key(bytes)).cloned())
    }

    fn read_into(&self, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, StateError> {
        let value = self.entries.get(key(bytes));
        if let Some(v) = value {
            out.extend_from_slice(v);
        }
        Ok(value.is_some())
    }

    fn value_len(&self, bytes: &[u8]) -> Result<Option<usize>, StateError> {
        Ok(self.entries.get(key(bytes)).map(Vec::len))
    }

    fn put_admitted(
        &mut self,
        bytes: &[u8],
        value: &[u8],
        admit: &mut dyn FnMut(Option<usize>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        match self.entries.get_mut(key(bytes)) {
            Some(v) => {
                admit(Some(v.len()))?;
                v.clear();
                v.extend_from_slice(value);
            }
            None => {
                admit(None)?;
                self.entries.insert(StoredKey(bytes.to_vec()), value.to_vec());
            }
        }
        Ok(())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.put_admitted(key, value, &mut |_| Ok(()))
    }

    fn delete(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        self.entries.remove(key(bytes));
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
            self.entries.remove(key(&k));
        }
        Ok(())
    }

    fn approximate_len(&self) -> usize {
        self.entries.len()
    }

    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self
    }

    fn snapshot(&mut self, _staging: &std::path::Path) -> Result<BackendSnapshot, StateError> {
        Ok(BackendSnapshot::Frozen(Box::new(FrozenMap(self.entries.clone()))))
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

    proptest! {
        /// The head-first comparison is byte order (the oracle: slices' own `cmp`), across the
        /// 16-byte head, with long shared prefixes (a three-letter alphabet) and any lengths.
        #[test]
        fn key_order_is_byte_order(
            a in proptest::collection::vec(0u8..3, 0..40),
            b in proptest::collection::vec(0u8..3, 0..40),
            shared in proptest::collection::vec(any::<u8>(), 0..24),
        ) {
            let (a, b) = ([&shared[..], &a].concat(), [&shared[..], &b].concat());
            prop_assert_eq!(key(&a).cmp(key(&b)), a.cmp(&b));
            prop_assert_eq!(StoredKey(a.clone()).cmp(&StoredKey(b.clone())), a.cmp(&b));
        }

        /// The backend behaves like a plain map (the oracle), and scans are ordered prefixes.
        #[test]
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
