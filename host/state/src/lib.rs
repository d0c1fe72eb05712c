//! # eddy-state: where keyed state lives
//!
//! [`StateBackend`] is an ordered key-value store with prefix scans; [`HeapStateBackend`] keeps
//! it in memory, [`RocksDbBackend`] on local disk (state larger than memory, bounded native
//! memory). Both take checkpoint snapshots ([`StateBackend::snapshot`]): a copy of the entries
//! for the heap, a native checkpoint (hard-linked SST files) for RocksDB. Every state entry's key
//! follows one layout ([`StateKey`]): `key group | state id | key hash | key | namespace | map
//! key`, so everything of one key group is one contiguous range and a rescale moves ranges. [`TtlBackend`]
//! wraps any backend so state expires a fixed processing time after its last write;
//! [`BoundedBackend`] keeps one subtask's state within [`StateLimits`] (bytes and entries;
//! bytes are memory on the heap, so [`heap_memory_bound_bytes`] says what a heap limit may make
//! the process hold).
//! List state is an entry per item under the list's key ([`ListKeys`]), so an append costs the
//! same at any length. [`WriteBackBackend`] buffers writes in front of a disk backend until
//! the next snapshot, so a value rewritten per record costs RocksDB one write per checkpoint.
//!
//! ```
//! use eddy_state::{HashedKey, HeapStateBackend, StateBackend, StateKey, state_id};
//!
//! let mut backend = HeapStateBackend::default();
//! let mut key = StateKey::default();
//! let (alice, total) = (HashedKey::new(b"\"alice\"", 128), state_id("total"));
//! backend.put(key.encode(alice, total, b""), b"42")?;
//! assert_eq!(backend.get(key.encode(alice, total, b""))?, Some(b"42".to_vec()));
//! # Ok::<(), eddy_state::StateError>(())
//! ```

mod backend;
mod bounded;
mod entry_cache;
mod heap;
mod heap_memory;
mod layout;
mod list;
mod rocks;
#[cfg(test)]
mod test_ops;
mod ttl;
mod write_back;

pub use backend::{BackendSnapshot, EntryMeasure, FrozenEntries, StateBackend, StateError, StateLimitExceeded};
pub use bounded::{BoundedBackend, StateLimits, StateUsage};
pub use entry_cache::{EntryCache, LENGTHS_CACHE_BYTES, WINDOW_CACHE_BYTES, Weigh, entry_caches_bytes};
pub use heap::HeapStateBackend;
pub use heap_memory::{HEAP_SNAPSHOT_COPIES, allocation_bytes, heap_memory_bound_bytes};
pub use layout::{
    DeclaredState, DecodedStateKey, HashedKey, StateId, StateKey, StateKind, check_state_evolution, decode_list,
    decode_state_key, encode_list, state_id,
};
pub use list::{ListKeys, list_for_each};
pub use rocks::{RocksDbBackend, RocksDbConfig};
pub use ttl::{ManualTtlClock, PURGE_STEP_ENTRIES, TtlBackend, TtlClock};
pub use write_back::{STATE_WRITE_BACK_BYTES, WriteBackBackend};
