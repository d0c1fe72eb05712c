//! The byte layout of state keys and of lists kept as one value. Part of the snapshot format: change it only
//! with a snapshot version bump.
//!
//! Key: `key group (u16 BE) | state id (u32 BE) | key hash (u32 BE) | key len (u32 BE) | key |
//! namespace len (u32 BE) | namespace | map key`. Lengths make every part self-delimiting, so
//! one key's entries of one state (all map keys, say) share a prefix, and big-endian key groups
//! keep a key-group range contiguous.
//!
//! The state is an integer id ([`state_id`] of its declared name), not the name, and the key
//! hash (computed once per record, the one its key group comes from) comes before the key
//! bytes: two state keys almost always differ within their first 16 bytes, so an ordered
//! backend decides a comparison with one integer compare instead of a `memcmp` over a name.

use eddy_core::{KeyGroup, key_group_of_hash, key_hash};

use crate::StateError;

/// How a state's entries are laid out, as its operator declared it: what a reader of a
/// snapshot needs besides the name to decode them. Recorded per step in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// One value under the key.
    Value,
    /// A list: a header under the key and an entry per item ([`crate::ListKeys`]).
    List,
    /// A map: an entry per map key, the map key after the namespace.
    Map,
    /// A window operator's accumulators: namespace = the window, value = a fired flag byte
    /// and the aggregate's bytes (`eddy_plan::window_state`).
    WindowAccumulator,
    /// A window operator's session sets: a list value of windows per key.
    WindowSessions,
}

/// A state an operator declared: its name (whose [`state_id`] its keys carry) and kind.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeclaredState {
    /// The declared name.
    pub name: String,
    /// How its entries are laid out.
    pub kind: StateKind,
}

/// Whether code declaring `new` can go on from state written by code declaring `old`: every
/// state both declare keeps its kind (a value read as a list would misread every entry).
/// States only one side declares are fine: new ones start empty, dropped ones are never read.
/// Names each state whose kind changed.
pub fn check_state_evolution(old: &[DeclaredState], new: &[DeclaredState]) -> Result<(), String> {
    let changed: Vec<String> = new
        .iter()
        .filter_map(|n| {
            let o = old.iter().find(|o| o.name == n.name)?;
            (o.kind != n.kind).then(|| format!("state `{}` was {:?} and is now {:?}", n.name, o.kind, n.kind))
        })
        .collect();
    if changed.is_empty() { Ok(()) } else { Err(changed.join("; ")) }
}

/// A state's id in state keys: [`state_id`] of its name.
pub type StateId = u32;

/// The id of the state named `name` (the low 32 bits of its xxh3), the same in every process
/// and every run, so a snapshot needs no table of names. Whoever declares states checks that
/// two names of one operator do not share an id.
pub fn state_id(name: &str) -> StateId {
    key_hash(name.as_bytes()) as u32
}

/// A record key with what its state keys need, hashed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashedKey<'a> {
    /// The key bytes.
    pub bytes: &'a [u8],
    /// [`eddy_core::key_hash`] of the bytes.
    pub hash: u64,
    /// The key group the hash falls in.
    pub group: KeyGroup,
}

impl<'a> HashedKey<'a> {
    /// Hashes `bytes` for a job of `max_parallelism` key groups.
    pub fn new(bytes: &'a [u8], max_parallelism: u32) -> Self {
        Self::with_hash(bytes, key_hash(bytes), max_parallelism)
    }

    /// A key whose [`eddy_core::key_hash`] the caller already has.
    pub fn with_hash(bytes: &'a [u8], hash: u64, max_parallelism: u32) -> Self {
        Self { bytes, hash, group: key_group_of_hash(hash, max_parallelism) }
    }

    /// The hash as stored in a state key: its low half (the key group comes from the high
    /// bits, so the two are independent).
    fn stored_hash(&self) -> u32 {
        self.hash as u32
    }
}

/// Reusable buffer that builds state keys without allocating per call.
#[derive(Debug, Default, Clone)]
pub struct StateKey {
    buf: Vec<u8>,
}

impl StateKey {
    /// The key of a value or list state, or the prefix of all entries of a map state.
    pub fn encode(&mut self, key: HashedKey<'_>, state: StateId, namespace: &[u8]) -> &[u8] {
        self.buf.clear();
        self.buf.extend_from_slice(&key.group.to_be_bytes());
        self.buf.extend_from_slice(&state.to_be_bytes());
        self.buf.extend_from_slice(&key.stored_hash().to_be_bytes());
        self.buf.extend_from_slice(&(key.bytes.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(key.bytes);
        self.buf.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(namespace);
        &self.buf
    }

    /// The key of one map-state entry.
    pub fn encode_map_entry(&mut self, key: HashedKey<'_>, state: StateId, namespace: &[u8], map_key: &[u8]) -> &[u8] {
        self.encode(key, state, namespace);
        self.buf.extend_from_slice(map_key);
        &self.buf
    }

    /// Length of the prefix [`encode`](Self::encode) writes, for splitting map keys off.
    pub fn prefix_len_of(key: &[u8], namespace: &[u8]) -> usize {
        2 + 4 + 4 + 4 + key.len() + 4 + namespace.len()
    }
}

/// A state key taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedStateKey<'a> {
    /// Key group.
    pub key_group: KeyGroup,
    /// The state.
    pub state: StateId,
    /// The record key.
    pub key: &'a [u8],
    /// Namespace (a window, or empty).
    pub namespace: &'a [u8],
    /// Map key (empty for value and list state).
    pub map_key: &'a [u8],
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], StateError> {
    if bytes.len() < n {
        return Err(StateError::Corrupt(format!("state key truncated: needs {n} more bytes, has {}", bytes.len())));
    }
    let (head, tail) = bytes.split_at(n);
    *bytes = tail;
    Ok(head)
}

fn take_u32(bytes: &mut &[u8]) -> Result<usize, StateError> {
    let b = take(bytes, 4)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

fn take_u16(bytes: &mut &[u8]) -> Result<u16, StateError> {
    let b = take(bytes, 2)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

/// Takes a state key apart; errors name what is wrong with a damaged key.
pub fn decode_state_key(mut bytes: &[u8]) -> Result<DecodedStateKey<'_>, StateError> {
    let key_group = take_u16(&mut bytes)?;
    let state = take_u32(&mut bytes)? as StateId;
    let stored_hash = take_u32(&mut bytes)?;
    let key_len = take_u32(&mut bytes)?;
    let key = take(&mut bytes, key_len)?;
    if stored_hash != key_hash(key) as u32 as usize {
        return Err(StateError::Corrupt(format!(
            "state key of group {key_group}: its key hash does not match its key"
        )));
    }
    let ns_len = take_u32(&mut bytes)?;
    let namespace = take(&mut bytes, ns_len)?;
    Ok(DecodedStateKey { key_group, state, key, namespace, map_key: bytes })
}

/// Encodes items as one value: `count (u32 BE) | (len (u32 BE) | item)*`. The window operator
/// keeps its session lists this way; list state used it before [`crate::ListKeys`] (an entry
/// per item), and lists in snapshots from then are still read.
pub fn encode_list<I: AsRef<[u8]>>(items: &[I]) -> Vec<u8> {
    let total: usize = items.iter().map(|i| 4 + i.as_ref().len()).sum();
    let mut out = Vec::with_capacity(4 + total);
    out.extend_from_slice(&(items.len() as u32).to_be_bytes());
    for item in items {
        out.extend_from_slice(&(item.as_ref().len() as u32).to_be_bytes());
        out.extend_from_slice(item.as_ref());
    }
    out
}

/// Decodes what [`encode_list`] wrote.
pub fn decode_list(mut bytes: &[u8]) -> Result<Vec<Vec<u8>>, StateError> {
    let count = take_u32(&mut bytes)?;
    // Each item needs at least its 4-byte length: a bogus count cannot make us allocate.
    if count > bytes.len() / 4 {
        return Err(StateError::Corrupt(format!("list claims {count} items in {} bytes", bytes.len())));
    }
    let mut items = Vec::with_capacity(count);
    for _ in 0..count {
        let len = take_u32(&mut bytes)?;
        items.push(take(&mut bytes, len)?.to_vec());
    }
    if !bytes.is_empty() {
        return Err(StateError::Corrupt(format!("{} stray bytes after list items", bytes.len())));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_may_be_added_or_dropped_but_not_change_its_kind() {
        let s = |name: &str, kind| DeclaredState { name: name.into(), kind };
        let old = [s("count", StateKind::Value), s("seen", StateKind::List)];
        assert_eq!(check_state_evolution(&old, &[s("count", StateKind::Value), s("new", StateKind::Map)]), Ok(()));
        assert_eq!(check_state_evolution(&old, &[]), Ok(()));
        let changed = check_state_evolution(&old, &[s("seen", StateKind::Map), s("count", StateKind::Value)]);
        assert_eq!(changed, Err("state `seen` was List and is now Map".into()));
    }
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn state_keys_round_trip(
            key in proptest::collection::vec(any::<u8>(), 0..32),
            state in any::<u32>(),
            ns in proptest::collection::vec(any::<u8>(), 0..8),
            map_key in proptest::collection::vec(any::<u8>(), 0..8),
            max_parallelism in 1u32..=32768,
        ) {
            let mut enc = StateKey::default();
            let hashed = HashedKey::new(&key, max_parallelism);
            let bytes = enc.encode_map_entry(hashed, state, &ns, &map_key).to_vec();
            let d = decode_state_key(&bytes).unwrap();
            prop_assert_eq!(d, DecodedStateKey { key_group: hashed.group, state, key: &key, namespace: &ns, map_key: &map_key });
            prop_assert_eq!(StateKey::prefix_len_of(&key, &ns), bytes.len() - map_key.len());
        }

        #[test]
        fn lists_round_trip(items in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..16), 0..16)) {
            prop_assert_eq!(decode_list(&encode_list(&items)).unwrap(), items);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_list(&bytes);
            let _ = decode_state_key(&bytes);
        }
    }

    /// Two keys of one key group, as `(key, key group)`, found by search (no constants copied
    /// from a run).
    fn two_keys_of_one_group(max_parallelism: u32) -> (Vec<u8>, Vec<u8>, KeyGroup) {
        let mut seen = std::collections::HashMap::new();
        for i in 0u32.. {
            let key = format!("k{i}").into_bytes();
            let group = HashedKey::new(&key, max_parallelism).group;
            if let Some(first) = seen.insert(group, key.clone()) {
                return (first, key, group);
            }
        }
        unreachable!()
    }

    #[test]
    fn one_key_group_is_contiguous_and_one_keys_entries_share_a_prefix() {
        let mp = 8;
        let (a, b, group) = two_keys_of_one_group(mp);
        let mut enc = StateKey::default();
        let mut all = Vec::new();
        for key in [&a, &b] {
            for state in [state_id("s"), state_id("t")] {
                for ns in [&b""[..], b"\x01", b"\xff\xff"] {
                    all.push(enc.encode(HashedKey::new(key, mp), state, ns).to_vec());
                }
            }
        }
        let other =
            (0u32..).map(|i| format!("o{i}").into_bytes()).find(|k| HashedKey::new(k, mp).group != group).unwrap();
        let outsider = enc.encode(HashedKey::new(&other, mp), state_id("s"), b"").to_vec();
        all.push(outsider.clone());
        all.sort();
        // The outsider sorts before or after the whole group, never inside it.
        let at = all.iter().position(|k| *k == outsider).unwrap();
        assert!(at == 0 || at == all.len() - 1, "key group {group} is split by another group's key");
        // Every entry of (key a, state s) starts with the same prefix and nothing else does.
        let prefix = &enc.encode(HashedKey::new(&a, mp), state_id("s"), b"")[..2 + 4 + 4 + 4 + a.len()];
        let under: Vec<_> = all.iter().filter(|k| k.starts_with(prefix)).collect();
        assert_eq!(under.len(), 3);
    }

    #[test]
    fn state_ids_are_stable_and_distinct_for_the_engines_names() {
        assert_eq!(state_id("window-acc"), state_id("window-acc"));
        assert_ne!(state_id("window-acc"), state_id("window-sessions"));
    }

    #[test]
    fn a_key_whose_hash_does_not_match_is_corrupt() {
        let mut bytes = StateKey::default().encode(HashedKey::new(b"k", 128), 7, b"").to_vec();
        bytes[6] ^= 1;
        let err = decode_state_key(&bytes).unwrap_err();
        assert!(err.to_string().contains("hash"), "{err}");
    }

    #[test]
    fn bogus_list_count_is_corrupt() {
        let err = decode_list(&[0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.to_string().contains("claims"), "{err}");
    }
}
