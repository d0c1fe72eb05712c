//! The contract every state backend keeps.

use std::path::{Path, PathBuf};

/// Why a state operation failed. Whose fault: the backend's storage (I/O) or a corrupt entry.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Stored bytes do not decode; the state (or a snapshot it came from) is damaged.
    #[error("corrupt state entry: {0}")]
    Corrupt(String),
    /// The storage under the backend failed; retrying the task may help.
    #[error("state storage failed: {0}")]
    Storage(String),
    /// A write would take the state past a configured limit ([`crate::StateLimits`]): the
    /// operator's doing (or a limit sized too small); retrying will not help.
    #[error(transparent)]
    LimitExceeded(#[from] StateLimitExceeded),
}

/// What a state limit refused: which limit, its value, what the write would have made of it,
/// and how to raise it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the subtask's state would hold {actual} {what}, over its limit of {limit} {what}; {how_to_raise}")]
pub struct StateLimitExceeded {
    /// `bytes` or `entries`.
    pub what: &'static str,
    /// The limit.
    pub limit: u64,
    /// What the refused write would have made of it.
    pub actual: u64,
    /// The setting that raises the limit, in the words of whoever configured it.
    pub how_to_raise: String,
}

/// An ordered map of byte keys to byte values, owned by one subtask.
///
/// Contract: a `get` sees every `put` and `delete` before it; `scan_prefix` visits every live
/// entry whose key starts with `prefix`, in ascending byte order of keys; `delete_prefix`
/// removes exactly those. Keys are built by [`crate::StateKey`]; backends never interpret them.
pub trait StateBackend: Send {
    /// The value under `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;
    /// Appends the value under `key` to `out` and says whether there was one: the hot-path
    /// read (state prefetched into a guest's batch) without an allocation per key.
    fn read_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, StateError> {
        let value = self.get(key)?;
        if let Some(v) = &value {
            out.extend_from_slice(v);
        }
        Ok(value.is_some())
    }
    /// Length of the value under `key` as stored, without copying it (what a write replaces,
    /// for [`crate::BoundedBackend`]'s count).
    fn value_len(&self, key: &[u8]) -> Result<Option<usize>, StateError> {
        Ok(self.get(key)?.map(|v| v.len()))
    }
    /// Sets the value under `key`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError>;
    /// Sets the value under `key` if `admit` accepts the length of the value it replaces
    /// (`None`: the key is new); nothing changes if it refuses. For [`crate::BoundedBackend`]'s
    /// count; a backend that finds the old value on its way to writing overrides it to look
    /// the key up once instead of twice.
    fn put_admitted(
        &mut self,
        key: &[u8],
        value: &[u8],
        admit: &mut dyn FnMut(Option<usize>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        admit(self.value_len(key)?)?;
        self.put(key, value)
    }
    /// Removes `key` if present.
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError>;
    /// Visits the entries under `prefix` in key order.
    fn scan_prefix(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), StateError>;
    /// Visits the entries with keys from `from` on, in key order, until `visit` returns `false`:
    /// a bounded walk a later call resumes (TTL purge steps). The default is correct for any
    /// backend but walks every key before `from`; storage backends and wrappers override it.
    fn scan_from(&self, from: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StateError> {
        let mut going = true;
        self.scan_prefix(b"", &mut |k, v| going = going && (k < from || visit(k, v)))
    }
    /// Removes the entries under `prefix`.
    fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError>;
    /// Number of live entries (for metrics and tests; may be an estimate on disk backends).
    fn approximate_len(&self) -> usize;
    /// Reclaims space held by entries no read can see any more (expired TTL state) and returns
    /// how many were removed. The engine calls it periodically; backends without expiry have
    /// nothing to do.
    fn purge_expired(&mut self) -> Result<usize, StateError> {
        Ok(0)
    }

    /// The synchronous phase of a checkpoint: a consistent, immutable picture of every entry
    /// as stored (wrappers such as TTL stamps included), cheap enough to take while the task
    /// waits. `staging` is a fresh directory a disk backend may fill (a native checkpoint);
    /// writing the picture out happens later, off the task's thread.
    fn snapshot(&mut self, staging: &Path) -> Result<BackendSnapshot, StateError> {
        let _ = staging;
        let mut entries = Vec::with_capacity(self.approximate_len());
        self.scan_prefix(b"", &mut |k, v| entries.push((k.to_vec(), v.to_vec())))?;
        Ok(BackendSnapshot::Frozen(Box::new(entries)))
    }

    /// The backend under wrappers (such as TTL), where restored entries go as stored.
    fn raw_mut(&mut self) -> &mut dyn StateBackend;

    /// What the state quota ([`crate::BoundedBackend`]) counts now, if this backend is or
    /// wraps one: a snapshot carries it so a restore that opens the checkpointed database as
    /// its own need not count every entry again.
    fn usage(&self) -> Option<crate::StateUsage> {
        None
    }

    /// How the state quota ([`crate::BoundedBackend`]) measures this backend's entries as
    /// stored (wrappers' additions, such as TTL stamps, included): by what the limit protects,
    /// memory for state on the heap, key and value bytes for state on disk.
    fn entry_measure(&self) -> EntryMeasure {
        EntryMeasure::KeyValueBytes
    }
}

/// What the state quota counts of one entry ([`StateBackend::entry_measure`]).
///
/// Contract: a measure depends on the key's and the value's lengths alone, never on when or
/// in what order entries were written, so the same entries count the same in every run and
/// after every restore, and a count carried in a checkpoint stays true for the backend that
/// opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryMeasure {
    /// Key plus value bytes: state on disk (RocksDB), whose memory is its bounded block cache
    /// and memtables, not its entries.
    KeyValueBytes,
    /// The memory an entry of the heap backend holds: its node share and its allocations as
    /// malloc sizes them (see [`crate::heap_memory_bound_bytes`] for what the process may hold
    /// beyond the count).
    HeapMemory,
}

impl EntryMeasure {
    /// What an entry of `key_len` and `value_len` bytes counts, bytes.
    pub const fn bytes(self, key_len: usize, value_len: usize) -> u64 {
        match self {
            Self::KeyValueBytes => (key_len + value_len) as u64,
            Self::HeapMemory => crate::heap_memory::entry_memory_bytes(key_len, value_len),
        }
    }
}

/// What [`StateBackend::snapshot`] took.
#[derive(Debug)]
pub enum BackendSnapshot {
    /// Every entry, frozen at the snapshot and read later, off the task's thread (the heap
    /// backend's copy-on-write picture).
    Frozen(Box<dyn FrozenEntries>),
    /// A directory holding a native checkpoint (RocksDB): immutable files, SSTs shared with
    /// earlier checkpoints where unchanged.
    Directory(PathBuf),
}

/// Entries frozen at a snapshot: cheap to take, read in the asynchronous phase.
pub trait FrozenEntries: Send + std::fmt::Debug {
    /// Number of entries.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Visits every entry in ascending key order.
    fn for_each(&self, visit: &mut dyn FnMut(&[u8], &[u8]));
}

impl FrozenEntries for Vec<(Vec<u8>, Vec<u8>)> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn for_each(&self, visit: &mut dyn FnMut(&[u8], &[u8])) {
        for (k, v) in self {
            visit(k, v);
        }
    }
}
