//! The byte layout of state keys and of lists kept as one value. Part of the snapshot format: change it only
//! with a snapshot version bump.
//!
//! Key: `key group (u16 BE) | key len (u32 BE) | key | name len (u16 BE) | name |
//! namespace len (u32 BE) | namespace | map key`. Lengths make every part self-delimiting, so
//! one key's entries of one state (all map keys, say) share a prefix, and big-endian key groups
//! keep a key-group range contiguous.

use eddy_core::KeyGroup;

use crate::StateError;

/// Reusable buffer that builds state keys without allocating per call.
#[derive(Debug, Default, Clone)]
pub struct StateKey {
    buf: Vec<u8>,
}

impl StateKey {
    /// The key of a value or list state, or the prefix of all entries of a map state.
    pub fn encode(&mut self, key_group: KeyGroup, key: &[u8], state: &str, namespace: &[u8]) -> &[u8] {
        self.buf.clear();
        self.buf.extend_from_slice(&key_group.to_be_bytes());
        self.buf.extend_from_slice(&(key.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(key);
        self.buf.extend_from_slice(&(state.len() as u16).to_be_bytes());
        self.buf.extend_from_slice(state.as_bytes());
        self.buf.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(namespace);
        &self.buf
    }

    /// The key of one map-state entry.
    pub fn encode_map_entry(
        &mut self,
        key_group: KeyGroup,
        key: &[u8],
        state: &str,
        namespace: &[u8],
        map_key: &[u8],
    ) -> &[u8] {
        self.encode(key_group, key, state, namespace);
        self.buf.extend_from_slice(map_key);
        &self.buf
    }

    /// Length of the prefix written by the last [`encode`](Self::encode), for splitting map keys off.
    pub fn prefix_len_of(key: &[u8], state: &str, namespace: &[u8]) -> usize {
        2 + 4 + key.len() + 2 + state.len() + 4 + namespace.len()
    }
}

/// A state key taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedStateKey<'a> {
    /// Key group.
    pub key_group: KeyGroup,
    /// The record key.
    pub key: &'a [u8],
    /// State name.
    pub state: &'a str,
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
    let key_len = take_u32(&mut bytes)?;
    let key = take(&mut bytes, key_len)?;
    let name_len = usize::from(take_u16(&mut bytes)?);
    let state = std::str::from_utf8(take(&mut bytes, name_len)?)
        .map_err(|_| StateError::Corrupt("state name is not UTF-8".into()))?;
    let ns_len = take_u32(&mut bytes)?;
    let namespace = take(&mut bytes, ns_len)?;
    Ok(DecodedStateKey { key_group, key, state, namespace, map_key: bytes })
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
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn state_keys_round_trip(
            kg in any::<u16>(),
            key in proptest::collection::vec(any::<u8>(), 0..32),
            state in "[a-z]{0,12}",
            ns in proptest::collection::vec(any::<u8>(), 0..8),
            map_key in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let mut enc = StateKey::default();
            let bytes = enc.encode_map_entry(kg, &key, &state, &ns, &map_key).to_vec();
            let d = decode_state_key(&bytes).unwrap();
            prop_assert_eq!(d, DecodedStateKey { key_group: kg, key: &key, state: &state, namespace: &ns, map_key: &map_key });
            prop_assert_eq!(StateKey::prefix_len_of(&key, &state, &ns), bytes.len() - map_key.len());
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

    #[test]
    fn one_key_group_is_contiguous() {
        let mut enc = StateKey::default();
        let a = enc.encode(1, b"zzzz", "s", b"").to_vec();
        let b = enc.encode(2, b"a", "s", b"").to_vec();
        let c = enc.encode(1, b"a", "zz", b"").to_vec();
        assert!(c < a && a < b);
    }

    #[test]
    fn bogus_list_count_is_corrupt() {
        let err = decode_list(&[0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.to_string().contains("claims"), "{err}");
    }
}
