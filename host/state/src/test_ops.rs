//! Random write sequences for the backends' model tests (heap, bounded), and a backend that
//! notes what reaches it.

use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use crate::{HeapStateBackend, StateBackend, StateError};

/// One write to a backend.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    DeletePrefix(Vec<u8>),
}

/// Short keys over a tiny alphabet, so writes collide and prefixes overlap.
pub(crate) fn small_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..4, 0..4)
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (small_bytes(), small_bytes()).prop_map(|(k, v)| Op::Put(k, v)),
        small_bytes().prop_map(Op::Delete),
        small_bytes().prop_map(Op::DeletePrefix),
    ]
}

/// What reached a [`Watched`] backend: the keys written or deleted, in order, the prefix scans,
/// and the entries scans of either kind handed to their visitors.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    pub(crate) written: Vec<Vec<u8>>,
    pub(crate) scans: usize,
    pub(crate) visited: usize,
}

/// A heap backend that notes what reaches it where a test can read it (also once boxed).
#[derive(Debug, Default)]
pub(crate) struct Watched {
    inner: HeapStateBackend,
    pub(crate) watch: Arc<Mutex<Watch>>,
}

impl Watched {
    fn note(&self, f: impl FnOnce(&mut Watch)) {
        f(&mut self.watch.lock().expect("a test's lock is never poisoned"));
    }
}

impl StateBackend for Watched {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.inner.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.note(|w| w.written.push(key.to_vec()));
        self.inner.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.note(|w| w.written.push(key.to_vec()));
        self.inner.delete(key)
    }
    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError> {
        self.note(|w| w.scans += 1);
        self.inner.scan_prefix(prefix, &mut |k, v| {
            self.note(|w| w.visited += 1);
            visit(k, v);
        })
    }
    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        self.inner.scan_from(from, &mut |k, v| {
            self.note(|w| w.visited += 1);
            visit(k, v)
        })
    }
    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        self.inner.delete_prefix(prefix)
    }
    fn approximate_len(&self) -> usize {
        self.inner.approximate_len()
    }
    fn raw_mut(&mut self) -> &mut dyn StateBackend {
        self
    }
}
