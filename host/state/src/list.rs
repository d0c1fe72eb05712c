//! List state stored as one entry per item, so an append writes one item and a small header
//! instead of re-encoding the whole list. Part of the snapshot format.
//!
//! Under a list's state key `K` (from [`crate::StateKey::encode`]):
//!
//! - `K` holds the header: `0xFFFF_FFFF | next index (u64 BE)`, 12 bytes;
//! - `K | index (u64 BE)` holds each item; indices ascend from 0 since the list was last
//!   replaced or cleared.
//!
//! Item keys extend the list's key, so they keep its key-group prefix (a restore at another
//! parallelism moves a list whole) and a prefix scan of `K` yields the header, then the items
//! in order. Clearing a list is deleting the prefix `K`.
//!
//! Lists written before this layout are one value under `K` ([`crate::encode_list`]). Such a
//! value never starts with `0xFFFF_FFFF` (it would claim 4 G items in a few bytes), so reads
//! tell the two apart and still read it, and the first append rewrites it item by item.

use crate::{StateBackend, StateError, decode_list};

/// First four bytes of a header: a count no single-value list can hold.
const HEADER_MARK: [u8; 4] = [0xFF; 4];
const HEADER_BYTES: usize = HEADER_MARK.len() + 8;
const INDEX_BYTES: usize = 8;

/// What the key `K` of a list holds.
enum Head {
    /// Items `0..next` (some may be gone: TTL expires items one by one).
    Header { next: u64 },
    /// A list in the single-value layout.
    Legacy(Vec<Vec<u8>>),
}

fn header(next: u64) -> [u8; HEADER_BYTES] {
    let mut out = [0; HEADER_BYTES];
    out[..4].copy_from_slice(&HEADER_MARK);
    out[4..].copy_from_slice(&next.to_be_bytes());
    out
}

fn parse_head(bytes: &[u8]) -> Result<Head, StateError> {
    if bytes.starts_with(&HEADER_MARK) {
        let next: [u8; 8] = bytes[4..].try_into().map_err(|_| {
            StateError::Corrupt(format!("list header is {} bytes, expected {HEADER_BYTES}", bytes.len()))
        })?;
        return Ok(Head::Header { next: u64::from_be_bytes(next) });
    }
    decode_list(bytes).map(Head::Legacy)
}

/// Reusable buffer for item keys, so appends do not allocate per call.
#[derive(Debug, Default, Clone)]
pub struct ListKeys {
    buf: Vec<u8>,
}

impl ListKeys {
    fn item<'a>(&'a mut self, list: &[u8], index: u64) -> &'a [u8] {
        self.buf.clear();
        self.buf.extend_from_slice(list);
        self.buf.extend_from_slice(&index.to_be_bytes());
        &self.buf
    }

    /// Appends `item` to the list under `list`: one header read, one item write, one header
    /// write, whatever the list's length.
    pub fn append(&mut self, backend: &mut dyn StateBackend, list: &[u8], item: &[u8]) -> Result<(), StateError> {
        let next = match backend.get(list)?.as_deref().map(parse_head).transpose()? {
            None => 0,
            Some(Head::Header { next }) => next,
            Some(Head::Legacy(items)) => self.write_from_zero(backend, list, &items)?,
        };
        backend.put(self.item(list, next), item)?;
        backend.put(list, &header(next + 1))
    }

    /// Replaces every item of the list under `list` with `items`.
    pub fn replace<I: AsRef<[u8]>>(
        &mut self,
        backend: &mut dyn StateBackend,
        list: &[u8],
        items: &[I],
    ) -> Result<(), StateError> {
        backend.delete_prefix(list)?;
        if !items.is_empty() {
            let next = self.write_from_zero(backend, list, items)?;
            backend.put(list, &header(next))?;
        }
        Ok(())
    }

    /// Writes `items` at indices from 0 and returns the next index (the header is the
    /// caller's).
    fn write_from_zero<I: AsRef<[u8]>>(
        &mut self,
        backend: &mut dyn StateBackend,
        list: &[u8],
        items: &[I],
    ) -> Result<u64, StateError> {
        let mut next = 0u64;
        for item in items {
            backend.put(self.item(list, next), item.as_ref())?;
            next += 1;
        }
        Ok(next)
    }
}

/// Visits the items of the list under `list`, oldest first.
///
/// A list without its key `K` holds nothing (items are written only with the header, which
/// each write rewrites, so under a TTL the header outlives its items), and most lists a job
/// reads are empty (q3 reads a person's waiting auctions per person): a point read of `K`
/// answers those without a scan, which on RocksDB is an iterator and, behind the write-back
/// buffer, a write-back first.
pub fn list_for_each(backend: &dyn StateBackend, list: &[u8], visit: &mut dyn FnMut(&[u8])) -> Result<(), StateError> {
    if backend.value_len(list)?.is_none() {
        return Ok(());
    }
    let mut problem = None;
    backend.scan_prefix(list, &mut |key, value| {
        if problem.is_some() {
            return;
        }
        match key.len() - list.len() {
            0 => match parse_head(value) {
                Ok(Head::Header { .. }) => {}
                Ok(Head::Legacy(items)) => items.iter().for_each(|i| visit(i)),
                Err(e) => problem = Some(e),
            },
            INDEX_BYTES => visit(value),
            n => problem = Some(StateError::Corrupt(format!("list item key has a {n}-byte suffix, expected 8"))),
        }
    })?;
    problem.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::test_ops::Watched;
    use crate::{HashedKey, HeapStateBackend, StateKey, encode_list, state_id};

    fn read(backend: &dyn StateBackend, list: &[u8]) -> Vec<Vec<u8>> {
        let mut items = Vec::new();
        list_for_each(backend, list, &mut |i| items.push(i.to_vec())).expect("read");
        items
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append(u8, Vec<u8>),
        Replace(u8, Vec<Vec<u8>>),
        Clear(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let item = proptest::collection::vec(any::<u8>(), 0..6);
        prop_oneof![
            4 => (0u8..3, item.clone()).prop_map(|(k, i)| Op::Append(k, i)),
            1 => (0u8..3, proptest::collection::vec(item, 0..4)).prop_map(|(k, is)| Op::Replace(k, is)),
            1 => (0u8..3).prop_map(Op::Clear),
        ]
    }

    /// The list key of user key `k`.
    fn list_key(k: u8) -> Vec<u8> {
        StateKey::default().encode(HashedKey::new(&[b'k', k], 128), state_id("list"), b"").to_vec()
    }

    proptest! {
        /// Oracle: a plain `Vec` per key. Lists of neighbouring keys and states stay apart.
        #[test]
        fn lists_behave_like_vectors(ops in proptest::collection::vec(op(), 0..40)) {
            let mut backend = HeapStateBackend::default();
            let mut keys = ListKeys::default();
            let mut oracle: HashMap<u8, Vec<Vec<u8>>> = HashMap::new();
            let neighbour = StateKey::default().encode(HashedKey::new(b"k\0", 128), state_id("lisu"), b"").to_vec();
            backend.put(&neighbour, b"other state").unwrap();
            for op in ops {
                match op {
                    Op::Append(k, item) => {
                        keys.append(&mut backend, &list_key(k), &item).unwrap();
                        oracle.entry(k).or_default().push(item);
                    }
                    Op::Replace(k, items) => {
                        keys.replace(&mut backend, &list_key(k), &items).unwrap();
                        oracle.insert(k, items);
                    }
                    Op::Clear(k) => {
                        backend.delete_prefix(&list_key(k)).unwrap();
                        oracle.remove(&k);
                    }
                }
            }
            for k in 0..3 {
                prop_assert_eq!(read(&backend, &list_key(k)), oracle.get(&k).cloned().unwrap_or_default());
            }
            prop_assert_eq!(backend.get(&neighbour).unwrap(), Some(b"other state".to_vec()));
        }
    }

    #[test]
    fn a_list_in_the_single_value_layout_reads_and_grows() {
        let mut backend = HeapStateBackend::default();
        let list = list_key(1);
        backend.put(&list, &encode_list(&[b"a".as_slice(), b"bc"])).unwrap();
        assert_eq!(read(&backend, &list), vec![b"a".to_vec(), b"bc".to_vec()]);
        ListKeys::default().append(&mut backend, &list, b"d").unwrap();
        assert_eq!(read(&backend, &list), vec![b"a".to_vec(), b"bc".to_vec(), b"d".to_vec()]);
        assert_eq!(backend.approximate_len(), 4, "header and three items");
    }

    /// A restore at another parallelism hands out entries by the key group in their first two
    /// bytes: every entry of a list goes with it.
    #[test]
    fn lists_split_by_key_group_like_a_restore_at_another_parallelism() {
        let mut backend = HeapStateBackend::default();
        let mut keys = ListKeys::default();
        let mut oracle = Vec::new();
        for k in 0..3u8 {
            let items: Vec<Vec<u8>> = (0..=k).map(|i| vec![k, i]).collect();
            for item in &items {
                keys.append(&mut backend, &list_key(k), item).unwrap();
            }
            oracle.push(items);
        }
        // Two new subtasks: key groups 0..=59 and 60..=127.
        let mut halves = [HeapStateBackend::default(), HeapStateBackend::default()];
        backend
            .scan_prefix(b"", &mut |key, value| {
                let group = u16::from_be_bytes([key[0], key[1]]);
                halves[usize::from(group >= 60)].put(key, value).unwrap();
            })
            .unwrap();
        for (k, items) in oracle.iter().enumerate() {
            let group = HashedKey::new(&[b'k', k as u8], 128).group;
            let half = &halves[usize::from(group >= 60)];
            assert_eq!(&read(half, &list_key(k as u8)), items, "list of key {k}");
        }
        assert_eq!(halves[0].approximate_len() + halves[1].approximate_len(), backend.approximate_len());
    }

    /// A list never written, or cleared, is read without a scan; a list with items (in either
    /// layout) by one.
    #[test]
    fn an_empty_list_is_read_without_a_scan() {
        let mut backend = Watched::default();
        let scans = |b: &Watched| b.watch.lock().expect("a test's lock is never poisoned").scans;
        let mut keys = ListKeys::default();
        let (list, legacy) = (list_key(0), list_key(1));
        assert!(read(&backend, &list).is_empty());
        assert_eq!(scans(&backend), 0, "never written");
        keys.append(&mut backend, &list, b"a").unwrap();
        backend.put(&legacy, &encode_list(&[b"b".as_slice()])).unwrap();
        assert_eq!((read(&backend, &list), read(&backend, &legacy)), (vec![b"a".to_vec()], vec![b"b".to_vec()]));
        assert_eq!(scans(&backend), 2);
        keys.replace::<&[u8]>(&mut backend, &list, &[]).unwrap();
        assert!(read(&backend, &list).is_empty());
        assert_eq!(scans(&backend), 2, "cleared");
    }

    #[test]
    fn a_damaged_header_is_corrupt() {
        let mut backend = HeapStateBackend::default();
        let list = list_key(0);
        backend.put(&list, &[0xFF, 0xFF, 0xFF, 0xFF, 1]).unwrap();
        let err = list_for_each(&backend, &list, &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("list header"), "{err}");
        assert!(ListKeys::default().append(&mut backend, &list, b"x").is_err());
    }
}
