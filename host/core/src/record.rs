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
    /// The range as an index into the buffer the span lies in.
    pub fn range(self) -> std::ops::Range<usize> {
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

/// A batch's bytes are addressed by `u32` spans: this many bytes at most.
pub const MAX_BATCH_BYTES: usize = u32::MAX as usize;

/// A record that would take a batch past [`MAX_BATCH_BYTES`]; the batch is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a record batch holds at most {MAX_BATCH_BYTES} bytes; adding {adding} to {held} would pass that")]
pub struct BatchFull {
    /// Bytes the batch held.
    pub held: usize,
    /// Bytes the refused record or batch would have added.
    pub adding: usize,
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

    /// Refuses `adding` more bytes if they would not be addressable by `u32` spans.
    #[inline]
    fn room_for(&self, adding: usize) -> Result<(), BatchFull> {
        let held = self.data.len();
        match held.checked_add(adding) {
            Some(total) if total <= MAX_BATCH_BYTES => Ok(()),
            _ => Err(BatchFull { held, adding }),
        }
    }

    /// Appends bytes that `room_for` admitted, so the casts cannot truncate.
    #[inline]
    fn append(&mut self, bytes: &[u8]) -> Span {
        let offset = self.data.len() as u32;
        self.data.extend_from_slice(bytes);
        Span { offset, len: bytes.len() as u32 }
    }

    /// Appends a record, or refuses it (changing nothing) if the batch would pass
    /// [`MAX_BATCH_BYTES`]. Use this for records whose size a guest or an input controls.
    #[inline]
    pub fn try_push(&mut self, key: Option<&[u8]>, value: &[u8], timestamp: Option<i64>) -> Result<(), BatchFull> {
        self.room_for(key.map_or(0, <[u8]>::len).saturating_add(value.len()))?;
        let key = key.map(|k| self.append(k));
        let value = self.append(value);
        self.records.push(RecordMeta { key, value, timestamp });
        Ok(())
    }

    /// Appends a record.
    ///
    /// # Panics
    ///
    /// If the batch would pass [`MAX_BATCH_BYTES`]: for batches the host sizes itself (a
    /// channel buffer of ~32 KiB). Where a guest or an input decides the size, use
    /// [`RecordBatch::try_push`].
    pub fn push(&mut self, key: Option<&[u8]>, value: &[u8], timestamp: Option<i64>) {
        if let Err(full) = self.try_push(key, value, timestamp) {
            panic!("{full}");
        }
    }

    /// Appends a record whose value `write` appends to the batch's buffer in place (no buffer
    /// of its own per record), or refuses it (changing nothing) if the batch would then pass
    /// [`MAX_BATCH_BYTES`]. `write` may only append.
    pub fn try_push_written(
        &mut self,
        key: Option<&[u8]>,
        timestamp: Option<i64>,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), BatchFull> {
        let held = self.data.len();
        self.room_for(key.map_or(0, <[u8]>::len))?;
        let key = key.map(|k| self.append(k));
        let start = self.data.len();
        write(&mut self.data);
        let len = self.data.len().checked_sub(start).expect("a record's writer may only append to its batch");
        if self.data.len() > MAX_BATCH_BYTES {
            let adding = self.data.len() - held;
            self.data.truncate(held);
            return Err(BatchFull { held, adding });
        }
        let value = Span { offset: start as u32, len: len as u32 };
        self.records.push(RecordMeta { key, value, timestamp });
        Ok(())
    }

    /// Appends a record without a key whose value `write` appends to the batch's buffer in
    /// place (a source saves the copy out of a buffer of its own); `write` returns the record's
    /// event time and may only append.
    ///
    /// # Panics
    ///
    /// As [`RecordBatch::push`] does, for batches the host sizes itself.
    pub fn push_written(&mut self, write: impl FnOnce(&mut Vec<u8>) -> Option<i64>) {
        let start = self.data.len();
        let timestamp = write(&mut self.data);
        let len = self.data.len().checked_sub(start).expect("a record's writer may only append to its batch");
        if self.data.len() > MAX_BATCH_BYTES {
            panic!("{}", BatchFull { held: start, adding: len });
        }
        self.records.push(RecordMeta { key: None, value: Span { offset: start as u32, len: len as u32 }, timestamp });
    }

    /// Appends every record of `other`, or none of them if the batch would pass
    /// [`MAX_BATCH_BYTES`].
    pub fn try_extend(&mut self, other: &RecordBatch) -> Result<(), BatchFull> {
        self.room_for(other.data.len())?;
        let base = self.data.len() as u32;
        let moved = |s: Span| Span { offset: s.offset + base, len: s.len };
        self.data.extend_from_slice(&other.data);
        self.records.extend(other.records.iter().map(|m| RecordMeta {
            key: m.key.map(moved),
            value: moved(m.value),
            timestamp: m.timestamp,
        }));
        Ok(())
    }

    /// A batch whose buffer is `data` as it is, with `records` spanning into it: bytes that
    /// arrived as one buffer (a guest's output) kept where they are instead of copied record
    /// by record. Gives `data` back if a span lies outside it or it is over
    /// [`MAX_BATCH_BYTES`].
    pub fn adopt(data: Vec<u8>, records: Vec<RecordMeta>) -> Result<Self, Vec<u8>> {
        let within = |s: Span| (s.offset as usize).checked_add(s.len as usize).is_some_and(|end| end <= data.len());
        if data.len() > MAX_BATCH_BYTES || !records.iter().all(|m| m.key.is_none_or(within) && within(m.value)) {
            return Err(data);
        }
        Ok(Self { data, records })
    }

    /// Appends a borrowed record.
    pub fn push_view(&mut self, r: &RecordView<'_>) {
        self.push(r.key, r.value, r.timestamp);
    }

    /// Number of records.
    #[inline]
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

    /// Bytes allocated for the buffer and the record table (what keeping the batch costs).
    pub fn allocated_bytes(&self) -> usize {
        self.data.capacity() + self.records.capacity() * std::mem::size_of::<RecordMeta>()
    }

    /// Removes every record, keeping the allocations.
    pub fn clear(&mut self) {
        self.data.clear();
        self.records.clear();
    }

    /// The record at `index`.
    #[inline]
    pub fn get(&self, index: usize) -> Option<RecordView<'_>> {
        self.records.get(index).map(|m| self.view(m))
    }

    #[inline]
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
    #[inline]
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

    #[test]
    fn an_adopted_buffer_reads_as_pushed_records_and_bad_spans_are_refused() {
        let data = b"keyvalueXvalue2".to_vec();
        let span = |offset, len| Span { offset, len };
        let metas = vec![
            RecordMeta { key: Some(span(0, 3)), value: span(3, 5), timestamp: Some(7) },
            RecordMeta { key: None, value: span(9, 6), timestamp: None },
            RecordMeta { key: Some(span(0, 3)), value: span(3, 5), timestamp: Some(8) },
        ];
        let adopted = RecordBatch::adopt(data.clone(), metas).expect("spans within");
        let mut pushed = RecordBatch::default();
        pushed.push(Some(b"key"), b"value", Some(7));
        pushed.push(None, b"value2", None);
        pushed.push(Some(b"key"), b"value", Some(8));
        let owned = |b: &RecordBatch| b.iter().map(|r| r.to_owned()).collect::<Vec<_>>();
        assert_eq!(owned(&adopted), owned(&pushed));
        for bad in [span(10, 6), span(u32::MAX, 2), span(15, 1)] {
            let metas = vec![RecordMeta { key: None, value: bad, timestamp: None }];
            assert_eq!(RecordBatch::adopt(data.clone(), metas).expect_err("outside"), data, "{bad:?}");
            let metas = vec![RecordMeta { key: Some(bad), value: span(0, 1), timestamp: None }];
            assert!(RecordBatch::adopt(data.clone(), metas).is_err(), "key {bad:?}");
        }
        assert!(
            RecordBatch::adopt(data.clone(), vec![RecordMeta { key: None, value: span(15, 0), timestamp: None }])
                .is_ok()
        );
    }

    #[test]
    fn a_value_written_in_place_reads_as_the_same_value_pushed() {
        let mut written = RecordBatch::default();
        let mut pushed = RecordBatch::default();
        for (i, value) in [&b"first"[..], b"", b"third value"].into_iter().enumerate() {
            let time = Some(i as i64 - 1);
            written.push(Some(b"k"), b"before", None);
            written.push_written(|buf| {
                buf.extend_from_slice(value);
                time
            });
            pushed.push(Some(b"k"), b"before", None);
            pushed.push(None, value, time);
        }
        assert_eq!(written, pushed);
    }

    #[test]
    fn extending_appends_the_other_batchs_records_in_order() {
        let mut a = RecordBatch::default();
        a.push(Some(b"k1"), b"v1", Some(1));
        let mut b = RecordBatch::default();
        b.push(None, b"v2", None);
        b.push(Some(b"k3"), b"", Some(3));
        a.try_extend(&b).expect("room");
        let got: Vec<Record> = a.iter().map(|r| r.to_owned()).collect();
        let record =
            |k: Option<&[u8]>, v: &[u8], t| Record { key: k.map(<[u8]>::to_vec), value: v.to_vec(), timestamp: t };
        assert_eq!(
            got,
            vec![record(Some(b"k1"), b"v1", Some(1)), record(None, b"v2", None), record(Some(b"k3"), b"", Some(3))]
        );
    }

    #[test]
    fn a_record_written_in_place_reads_back_after_those_before_it() {
        let mut b = RecordBatch::default();
        b.push(Some(b"k1"), b"v1", Some(1));
        b.try_push_written(Some(b"k2"), Some(2), |data| data.extend_from_slice(b"written")).expect("room");
        b.try_push_written(None, None, |_| {}).expect("room");
        let got: Vec<_> = b.iter().map(|r| (r.key.map(<[u8]>::to_vec), r.value.to_vec(), r.timestamp)).collect();
        let expected = [
            (Some(b"k1".to_vec()), b"v1".to_vec(), Some(1)),
            (Some(b"k2".to_vec()), b"written".to_vec(), Some(2)),
            (None, Vec::new(), None),
        ];
        assert_eq!(got, expected);
    }

    #[test]
    fn a_record_past_the_span_range_is_refused_and_changes_nothing() {
        let mut b = RecordBatch::default();
        b.push(Some(b"k"), b"v", None);
        let before = b.clone();
        let err = b.room_for(MAX_BATCH_BYTES - 1).expect_err("two bytes held");
        assert_eq!(err, BatchFull { held: 2, adding: MAX_BATCH_BYTES - 1 });
        assert!(b.room_for(MAX_BATCH_BYTES - 2).is_ok(), "exactly the limit fits");
        assert!(b.room_for(usize::MAX).is_err(), "no overflow in the sum");
        assert!(err.to_string().contains(&MAX_BATCH_BYTES.to_string()), "{err}");
        assert_eq!(b, before);
    }
}
