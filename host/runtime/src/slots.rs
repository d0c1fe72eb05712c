//! Key slots: every record (or timer) of a call is told the index of the call's first record
//! with an equal key. Guests buffer per-key work in an array indexed by slot instead of
//! hashing key bytes, and the host prefetches state once per distinct key.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A key with the hash it was already given (the key-group hash), so the map hashes nothing
/// again.
struct Hashed<'a> {
    hash: u64,
    key: &'a [u8],
}

impl Hash for Hashed<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Hashed<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl Eq for Hashed<'_> {}

/// Hands a precomputed (xxh3, well mixed) hash through unchanged.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `Hashed`; fold anything else in rather than ignore it.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The slots of one call's keys.
pub(crate) struct KeySlots<'a> {
    first: HashMap<Hashed<'a>, u32, BuildHasherDefault<PassThrough>>,
}

impl<'a> KeySlots<'a> {
    pub(crate) fn with_capacity(keys: usize) -> Self {
        Self { first: HashMap::with_capacity_and_hasher(keys, BuildHasherDefault::default()) }
    }

    /// The slot of record `index`, whose key is `key` with [`eddy_core::key_hash`] `hash`.
    pub(crate) fn slot(&mut self, key: &'a [u8], hash: u64, index: u32) -> u32 {
        *self.first.entry(Hashed { hash, key }).or_insert(index)
    }
}

#[cfg(test)]
mod tests {
    use eddy_core::key_hash;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Oracle: a linear search for the first equal key.
        #[test]
        fn a_slot_is_the_index_of_the_first_equal_key(keys in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..3), 0..40)) {
            let mut slots = KeySlots::with_capacity(keys.len());
            for (i, key) in keys.iter().enumerate() {
                let first = keys.iter().position(|k| k == key).expect("present");
                prop_assert_eq!(slots.slot(key, key_hash(key), i as u32), first as u32);
            }
        }
    }

    #[test]
    fn equal_hashes_of_different_keys_keep_their_own_slots() {
        let mut slots = KeySlots::with_capacity(2);
        assert_eq!(slots.slot(b"a", 7, 0), 0);
        assert_eq!(slots.slot(b"b", 7, 1), 1);
        assert_eq!(slots.slot(b"a", 7, 2), 0);
    }
}
