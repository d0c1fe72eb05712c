//! Key groups: the unit of state ownership and rescaling.
//!
//! A key hashes into one of `max_parallelism` key groups; the subtasks of an operator each own
//! a contiguous range of them (the same assignment Flink uses), so a rescale moves whole
//! ranges and a range of one backend is one contiguous scan.

use serde::{Deserialize, Serialize};

/// The largest `max_parallelism` Eddy accepts (key groups are stored as u16).
pub const MAX_PARALLELISM_LIMIT: u32 = 1 << 15;

/// A key group id, `0..max_parallelism`.
pub type KeyGroup = u16;

/// The key group of `key`. The hash (xxh3, seed 0) is part of the snapshot format: changing it
/// would move every key of every savepoint.
pub fn key_group_of(key: &[u8], max_parallelism: u32) -> KeyGroup {
    key_group_of_hash(key_hash(key), max_parallelism)
}

/// The hash key groups come from, for callers that also want it for their own hash tables.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The key group of a key whose [`key_hash`] is `hash`.
#[inline]
pub fn key_group_of_hash(hash: u64, max_parallelism: u32) -> KeyGroup {
    debug_assert!((1..=MAX_PARALLELISM_LIMIT).contains(&max_parallelism));
    // Multiply-shift maps the hash uniformly onto 0..max_parallelism without a division.
    ((u128::from(hash) * u128::from(max_parallelism)) >> 64) as KeyGroup
}

/// An inclusive range of key groups owned by one subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    /// First key group owned.
    pub start: KeyGroup,
    /// Last key group owned (inclusive).
    pub end: KeyGroup,
}

impl KeyGroupRange {
    /// Every key group: what a subtask of parallelism 1 owns.
    pub fn all(max_parallelism: u32) -> Self {
        Self::for_subtask(max_parallelism, 1, 0)
    }

    /// The range of subtask `index` out of `parallelism`.
    ///
    /// Requires `1 <= parallelism <= max_parallelism <= MAX_PARALLELISM_LIMIT` and
    /// `index < parallelism`; the ranges of all subtasks partition `0..max_parallelism`.
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, index: u32) -> Self {
        debug_assert!(parallelism >= 1 && parallelism <= max_parallelism && index < parallelism);
        let (m, p, i) = (u64::from(max_parallelism), u64::from(parallelism), u64::from(index));
        let start = (i * m).div_ceil(p);
        let end = ((i + 1) * m - 1) / p;
        Self { start: start as KeyGroup, end: end as KeyGroup }
    }

    /// The subtask (of `parallelism`) that owns `group`.
    pub fn subtask_of(group: KeyGroup, max_parallelism: u32, parallelism: u32) -> u32 {
        (u64::from(group) * u64::from(parallelism) / u64::from(max_parallelism)) as u32
    }

    /// Whether `group` lies in this range.
    pub fn contains(&self, group: KeyGroup) -> bool {
        (self.start..=self.end).contains(&group)
    }

    /// How many key groups the range holds.
    pub fn len(&self) -> usize {
        usize::from(self.end) - usize::from(self.start) + 1
    }

    /// A range always holds at least one key group.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn subtask_ranges_partition_the_key_groups(max in 1u32..2048, p in 1u32..64) {
            prop_assume!(p <= max);
            let mut next = 0u32;
            for i in 0..p {
                let r = KeyGroupRange::for_subtask(max, p, i);
                prop_assert_eq!(u32::from(r.start), next);
                prop_assert!(r.end >= r.start);
                for g in r.start..=r.end {
                    prop_assert_eq!(KeyGroupRange::subtask_of(g, max, p), i);
                }
                next = u32::from(r.end) + 1;
            }
            prop_assert_eq!(next, max);
        }

        #[test]
        fn key_group_is_in_range(key in proptest::collection::vec(any::<u8>(), 0..64), max in 1u32..=MAX_PARALLELISM_LIMIT) {
            prop_assert!(u32::from(key_group_of(&key, max)) < max);
        }
    }

    #[test]
    fn key_groups_spread_keys() {
        let mut counts = [0u32; 128];
        for i in 0..128_000u32 {
            counts[usize::from(key_group_of(format!("user-{i}").as_bytes(), 128))] += 1;
        }
        let (min, max) = (counts.iter().min().copied(), counts.iter().max().copied());
        assert!(min > Some(800) && max < Some(1200), "uneven spread: {min:?}..{max:?}");
    }
}
