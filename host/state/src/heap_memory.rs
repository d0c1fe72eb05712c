//! What heap state occupies in memory, so that the heap backend's limit measures what it
//! protects.
//!
//! The heap backend keeps its entries in the leaves of an `imbl` B-tree. A leaf is one
//! allocation of 64 slots, each a key (a 16-byte integer head beside up to 40 inline bytes) and
//! a value's `Vec` header, 96 bytes whether the slot is used or not; a key longer than the
//! inline bytes and every non-empty value are allocations of their own, which malloc rounds
//! up. Measured against a counting allocator (`tests/heap_memory.rs`), a word count's entry (a
//! 28-byte key, an 8-byte value) holds 174 to 230 bytes: key plus value bytes, what the limit
//! counted before, are a sixth to a fifth of it.
//!
//! So an entry is charged [`entry_memory_bytes`]: its own allocations as malloc sizes them,
//! plus its share of a leaf holding [`LEAF_ENTRIES`] entries and of the branches above. Half
//! full is what a restore builds (keys in ascending order split each full leaf at its median
//! and never add to the left half again); keys arriving in hash order, as records do, fill
//! leaves to about 69 %, so a backend at its limit holds 0.75 to 1 times it. The charge
//! depends on the lengths alone, so the same entries count the same in every run and after
//! every restore.
//!
//! Two things take more than the charge, and [`heap_memory_bound_bytes`] budgets both: leaves
//! emptied by deletes down to a third (the fewest `imbl` keeps before merging) while new keys
//! make new leaves elsewhere, and a held snapshot, whose tree shares nodes with the live one
//! until a write copies them.

use std::mem::size_of;

use crate::heap::{INLINE_KEY_BYTES, StoredKey};

/// Slots of a leaf: `imbl` 6's B-tree node size (`ORD_CHUNK_SIZE`, private to `imbl`). An
/// entry's share depends on the slot's size and the leaves' fill far more than on this; after
/// an upgrade, `tests/heap_memory.rs` says whether the charge still holds.
const LEAF_SLOTS: usize = 64;

/// Entries per leaf that [`entry_memory_bytes`] charges for: half the slots, what ascending
/// inserts (a restore) leave, since a full leaf splits at its median.
pub(crate) const LEAF_ENTRIES: usize = LEAF_SLOTS / 2;

/// The fewest entries a leaf other than the root holds: below a third, `imbl` merges it with
/// a neighbour or moves entries over from one.
const LEAF_MIN_ENTRIES: usize = LEAF_SLOTS / 3;

/// Children per branch, charged like leaves: half of the 65 a branch has room for.
const BRANCH_CHILDREN: usize = LEAF_SLOTS / 2;

/// Strong and weak counts in front of every tree node (`std::sync::Arc`).
const ARC_COUNTS: usize = 2 * size_of::<usize>();

/// A node's slots are an `imbl_sized_chunks::Chunk`: the slots and two indices.
const CHUNK_INDICES: usize = 2 * size_of::<usize>();

/// One leaf, as malloc sizes it.
const LEAF_BYTES: u64 = allocation_bytes(ARC_COUNTS + CHUNK_INDICES + LEAF_SLOTS * size_of::<(StoredKey, Vec<u8>)>());

/// One branch, as malloc sizes it: its separator keys, its child pointers (a chunk of 65) and
/// the level and variant tag of its children.
const BRANCH_BYTES: u64 = allocation_bytes(
    ARC_COUNTS
        + CHUNK_INDICES
        + LEAF_SLOTS * size_of::<StoredKey>()
        + CHUNK_INDICES
        + (LEAF_SLOTS + 1) * size_of::<usize>()
        + 2 * size_of::<usize>(),
);

/// An entry's share of the tree's nodes: a leaf of [`LEAF_ENTRIES`] and a branch over
/// [`BRANCH_CHILDREN`] such leaves (the levels above add a thirty-second of that again, which
/// rounding up covers).
const NODE_SHARE_BYTES: u64 =
    (LEAF_BYTES * BRANCH_CHILDREN as u64 + BRANCH_BYTES).div_ceil((LEAF_ENTRIES * BRANCH_CHILDREN) as u64);

/// Requests from this size on are mapped pages of their own: glibc's initial mmap threshold.
const MMAP_THRESHOLD_BYTES: usize = 128 << 10;

/// What glibc's malloc takes for a request of `n` bytes (`0`: no allocation, as an empty
/// `Vec` makes none). Below the mmap threshold, a chunk of the request plus its 8-byte size
/// header, rounded up to 16 bytes and at least 32; from it on, whole 4 KiB pages (glibc may
/// raise the threshold, and such a request then takes a chunk: at most a page less). Eddy's
/// binaries use the system allocator, glibc's on the Linux hosts it runs on.
pub const fn allocation_bytes(n: usize) -> u64 {
    let bytes = if n == 0 {
        0
    } else if n >= MMAP_THRESHOLD_BYTES {
        (n + 16).next_multiple_of(4096)
    } else if n + 8 <= 32 {
        32
    } else {
        (n + 8).next_multiple_of(16)
    };
    bytes as u64
}

/// The memory one heap entry of `key_len` and `value_len` bytes holds, as the heap backend's
/// state limit charges it (see the module docs): its share of the tree's nodes, its key's own
/// allocation if the key is longer than the inline bytes (and a thirty-second of it again: the
/// first key of every leaf is copied into the branch above as a separator), and its value's.
pub(crate) const fn entry_memory_bytes(key_len: usize, value_len: usize) -> u64 {
    let key = if key_len > INLINE_KEY_BYTES { allocation_bytes(key_len) } else { 0 };
    NODE_SHARE_BYTES + key + key.div_ceil(LEAF_ENTRIES as u64) + allocation_bytes(value_len)
}

/// Copies of the tree a held snapshot can make the process hold: the live one and the
/// snapshot's. Taking a snapshot clones only the root; each later write copies the nodes on
/// its way (the leaf with every key and value in it), so writing every key once while the
/// snapshot is held duplicates the whole state. The checkpoint coordinator keeps one
/// checkpoint in flight, so a subtask holds one snapshot at a time (a snapshot of an aborted
/// checkpoint still queued for upload when the next one is taken would be a third copy).
pub const HEAP_SNAPSHOT_COPIES: u64 = 2;

/// The memory a heap backend whose state limit is `max_bytes` can make the process hold,
/// bytes: what admission charges a heap subtask of a stateful step against a tenant's memory
/// quota and the server's budget. About 3.05 × `max_bytes`, `u64::MAX` for an unlimited one.
///
/// The limit counts the memory the state occupies with leaves half full ([`LEAF_ENTRIES`]),
/// so a backend at its limit holds 0.75 to 1 times it: 1 times it after a restore, about 0.75
/// for small entries arriving in hash order, ~1 for large values. Two things can take more:
///
/// - Deletes can leave leaves down to a third full while inserts elsewhere make new leaves,
///   so the same count takes up to 64/21 slots per entry instead of 64/32: at most 32/21 (1.52)
///   times the limit, reached only with tiny entries and a pattern of deletes and ordered
///   inserts built for it (entries arriving in hash order refill the emptied leaves first).
/// - A checkpoint's snapshot, held during its asynchronous upload: [`HEAP_SNAPSHOT_COPIES`].
///   Measured (`tests/heap_memory.rs`), writing every key once while it is held takes the
///   state to 2.0 times what it held. Budget it as held, not as a passing peak: glibc keeps
///   what a dropped snapshot frees (the resident set stays at the peak, and the next
///   checkpoint reuses it).
///
/// The charge is the product of both; the backend's own fixed size (a few hundred bytes) is
/// left out.
pub fn heap_memory_bound_bytes(max_bytes: u64) -> u64 {
    let bound = u128::from(max_bytes) * u128::from(HEAP_SNAPSHOT_COPIES) * LEAF_ENTRIES as u128;
    u64::try_from(bound.div_ceil(LEAF_MIN_ENTRIES as u128)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_round_as_glibc_does() {
        // Literal sizes from glibc's chunk layout (`malloc_usable_size` + 8 on x86_64).
        let cases = [(0, 0), (1, 32), (24, 32), (25, 48), (40, 48), (100, 112), (16 << 10, 16_400)];
        for (n, chunk) in cases {
            assert_eq!(allocation_bytes(n), chunk, "{n} bytes");
        }
        assert_eq!(allocation_bytes(1 << 20), (1 << 20) + 4096, "a mapped request takes whole pages");
    }

    #[test]
    fn longer_keys_and_values_cost_more_and_inline_keys_cost_the_same() {
        let base = entry_memory_bytes(0, 0);
        assert_eq!(entry_memory_bytes(INLINE_KEY_BYTES, 0), base, "inline key bytes are in the slot");
        assert!(entry_memory_bytes(INLINE_KEY_BYTES + 1, 0) > base);
        assert!(entry_memory_bytes(0, 1) > base);
        assert_eq!(base, NODE_SHARE_BYTES);
    }

    #[test]
    fn the_bound_is_the_snapshot_times_the_emptiest_leaves_and_saturates() {
        assert_eq!(heap_memory_bound_bytes(21 << 20), 64 << 20);
        assert_eq!(heap_memory_bound_bytes(0), 0);
        assert_eq!(heap_memory_bound_bytes(u64::MAX), u64::MAX);
    }
}
