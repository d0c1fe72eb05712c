//! Records and batches. A batch keeps every record's bytes in one buffer with spans into it,
//! the same layout the WIT contract uses, so handing a batch to a guest is a few copies.

use serde::{Deserialize, Serialize};

/// A byte range inside a batch's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// Start of the range.
    pub offset: u32,
    /// Length of the range.
    pub len: u32,
}

impl Span {
    fn range(self) -> std::ops::Range<usize> {
        self.offset as usize..self.offset as usize + self.len as usize
    }
}

/// Where one record's parts live in its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordMeta {
    /// Key bytes, absent before a `key_by`.
    pub key: Option<Span>,
    /// Value bytes.
    pub value: Span,
    /// Event time (ms since the Unix epoch).
    pub timestamp: Option<i64>,
}

/// A record that owns its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Record {
    /// Key bytes, absent before a `key_by`.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Vec<u8>,
    /// Event time (ms since the Unix epoch).
    pub timestamp: Option<i64>,
}

/// A record borrowed from a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Key bytes, absent before a `key_by`.
    pub key: Option<&'a [u8]>,
    /// Value bytes.
    pub value: &'a [u8],
    /// Event time (ms since the Unix epoch).
    pub timestamp: Option<i64>,
}

impl RecordView<'_> {
    /// Copies the record out of its batch.
    pub fn to_owned(&self) -> Record {
        Record { key: self.key.map(<[u8]>::to_vec), value: self.value.to_vec(), timestamp: self.timestamp }
    }
}

/// Records in one contiguous buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordBatch {
    data: Vec<u8>,
    records: Vec<RecordMeta>,
}

impl RecordBatch {
    /// An empty batch with room for `records` records and `bytes` bytes.
    pub fn with_capacity(records: usize, bytes: usize) -> Self {
        Self { data: Vec::with_capacity(bytes), records: Vec::with_capacity(records) }
    }

    fn append(&mut self, bytes: &[u8]) -> Span {
        let offset = self.data.len();
        self.data.extend_from_slice(bytes);
        // Batches are bounded far below 4 GiB by the channel buffer size; a larger one is a bug.
        let offset = u32::try_from(offset).expect("record batch larger than 4 GiB");
        Span { offset, len: bytes.len() as u32 }
    }

    /// Appends a record.
    pub fn push(&mut self, key: Option<&[u8]>, value: &[u8], timestamp: Option<i64>) {
        let key = key.map(|k| self.append(k));
        let value = self.append(value);
        self.records.push(RecordMeta { key, value, timestamp });
    }

    /// Appends a borrowed record.
    pub fn push_view(&mut self, r: &RecordView<'_>) {
        self.push(r.key, r.value, r.timestamp);
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes of keys and values held.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// Removes every record, keeping the allocations.
    pub fn clear(&mut self) {
        self.data.clear();
        self.records.clear();
    }

    /// The record at `index`.
    pub fn get(&self, index: usize) -> Option<RecordView<'_>> {
        self.records.get(index).map(|m| self.view(m))
    }

    fn view(&self, m: &RecordMeta) -> RecordView<'_> {
        RecordView {
            key: m.key.map(|k| &self.data[k.range()]),
            value: &self.data[m.value.range()],
            timestamp: m.timestamp,
        }
    }

    /// The records in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RecordView<'_>> + '_ {
        self.records.iter().map(|m| self.view(m))
    }

    /// The raw buffer and record table, for handing to a guest.
    pub fn parts(&self) -> (&[u8], &[RecordMeta]) {
        (&self.data, &self.records)
    }
}

impl<'a> FromIterator<RecordView<'a>> for RecordBatch {
    fn from_iter<I: IntoIterator<Item = RecordView<'a>>>(iter: I) -> Self {
        let mut batch = RecordBatch::default();
        for r in iter {
            batch.push_view(&r);
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trips_records() {
        let mut b = RecordBatch::default();
        b.push(Some(b"k1"), b"v1", Some(5));
        b.push(None, b"", None);
        b.push(Some(b""), b"v3", Some(-1));
        let got: Vec<Record> = b.iter().map(|r| r.to_owned()).collect();
        assert_eq!(
            got,
            vec![
                Record { key: Some(b"k1".to_vec()), value: b"v1".to_vec(), timestamp: Some(5) },
                Record { key: None, value: vec![], timestamp: None },
                Record { key: Some(vec![]), value: b"v3".to_vec(), timestamp: Some(-1) },
            ]
        );
        assert_eq!(b.byte_len(), 6);
    }
}
