//! Output buffering on a channel: records collect into a batch that is flushed when it is full
//! or when its oldest record has waited `buffer_timeout_ms` (latency bound under low load).
//! I/O-free: the caller passes `now_ms` and polls.

use eddy_core::{BatchFull, RecordBatch, RecordView};

/// Collects records into batches of about `capacity_bytes`.
#[derive(Debug)]
pub struct BufferBuilder {
    batch: RecordBatch,
    capacity_bytes: usize,
    buffer_timeout_ms: i64,
    oldest_ms: Option<i64>,
}

impl BufferBuilder {
    /// A builder flushing at `capacity_bytes` of keys and values (~32 KiB is a good default)
    /// or after `buffer_timeout_ms` (0 flushes every record: lowest latency, most overhead).
    pub fn new(capacity_bytes: usize, buffer_timeout_ms: i64) -> Self {
        Self {
            batch: RecordBatch::default(),
            capacity_bytes: capacity_bytes.max(1),
            buffer_timeout_ms,
            oldest_ms: None,
        }
    }

    /// Adds a record; returns the batch if it is now full.
    pub fn push(&mut self, record: &RecordView<'_>, now_ms: i64) -> Option<RecordBatch> {
        self.add(record, now_ms);
        self.take_ready(now_ms)
    }

    /// Adds a record, letting the batch pass its capacity until [`Self::take_ready`] ships it
    /// (a router spreading one input batch over its channels ships each channel's share once,
    /// at the end of the input batch).
    pub fn add(&mut self, record: &RecordView<'_>, now_ms: i64) {
        self.oldest_ms.get_or_insert(now_ms);
        self.batch.push_view(record);
    }

    /// Returns the batch if it is full or its oldest record waited long enough.
    pub fn take_ready(&mut self, now_ms: i64) -> Option<RecordBatch> {
        if self.batch.byte_len() >= self.capacity_bytes { self.take() } else { self.poll_timeout(now_ms) }
    }

    /// Adds every record of `batch` with one copy of its buffer (a batch going whole to one
    /// channel); returns the batch if it is now full. Adds nothing if the two would not fit in
    /// one batch: the caller ships what is held ([`Self::take`]) and adds it to the empty one.
    pub fn push_batch(&mut self, batch: &RecordBatch, now_ms: i64) -> Result<Option<RecordBatch>, BatchFull> {
        self.batch.try_extend(batch)?;
        self.oldest_ms.get_or_insert(now_ms);
        Ok(self.take_ready(now_ms))
    }

    /// Whether `batch`, with nothing buffered, is a full buffer by itself: it can then ship as
    /// it is, without a copy into the buffer.
    pub fn would_ship_whole(&self, batch: &RecordBatch) -> bool {
        self.batch.is_empty() && batch.byte_len() >= self.capacity_bytes
    }

    /// Returns the batch if its oldest record waited long enough.
    pub fn poll_timeout(&mut self, now_ms: i64) -> Option<RecordBatch> {
        match self.oldest_ms {
            Some(oldest) if now_ms.saturating_sub(oldest) >= self.buffer_timeout_ms => self.take(),
            _ => None,
        }
    }

    /// Returns whatever is buffered (before an in-band event such as a watermark or barrier,
    /// which must not overtake records).
    pub fn take(&mut self) -> Option<RecordBatch> {
        self.oldest_ms = None;
        (!self.batch.is_empty()).then(|| std::mem::take(&mut self.batch))
    }

    /// Gives the builder an emptied buffer to fill next, if it holds nothing yet: a recycled
    /// buffer keeps its allocation, so filling it allocates nothing.
    pub fn refill(&mut self, mut buffer: RecordBatch) {
        if self.batch.is_empty() && buffer.allocated_bytes() > self.batch.allocated_bytes() {
            buffer.clear();
            self.batch = buffer;
        }
    }

    /// When the buffered batch must be flushed at the latest, if anything is buffered.
    pub fn deadline_ms(&self) -> Option<i64> {
        self.oldest_ms.map(|t| t.saturating_add(self.buffer_timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value: &[u8]) -> RecordView<'_> {
        RecordView { key: None, value, timestamp: None }
    }

    #[test]
    fn a_whole_batch_is_added_at_once_and_flushes_when_full() {
        let mut b = BufferBuilder::new(8, 1_000);
        let mut three = RecordBatch::default();
        for v in [b"12", b"34", b"56"] {
            three.push(None, v, None);
        }
        assert!(b.push_batch(&three, 0).expect("fits").is_none(), "6 bytes is not full");
        let full = b.push_batch(&three, 1).expect("fits").expect("12 bytes is full");
        let values: Vec<&[u8]> = full.iter().map(|r| r.value).collect();
        assert_eq!(values, [b"12", b"34", b"56", b"12", b"34", b"56"]);
        assert!(b.take().is_none());
    }

    #[test]
    fn flushes_when_full() {
        let mut b = BufferBuilder::new(8, 1_000);
        assert!(b.push(&rec(b"1234"), 0).is_none());
        let full = b.push(&rec(b"5678"), 1).expect("8 bytes is full");
        assert_eq!(full.len(), 2);
        assert!(b.take().is_none());
    }

    #[test]
    fn flushes_on_timeout_measured_from_the_oldest_record() {
        let mut b = BufferBuilder::new(1 << 20, 100);
        assert!(b.push(&rec(b"a"), 10).is_none());
        assert_eq!(b.deadline_ms(), Some(110));
        assert!(b.push(&rec(b"b"), 90).is_none());
        assert!(b.poll_timeout(109).is_none());
        assert_eq!(b.poll_timeout(110).map(|x| x.len()), Some(2));
        assert_eq!(b.deadline_ms(), None);
        assert!(b.poll_timeout(10_000).is_none(), "nothing buffered, nothing flushed");
    }

    #[test]
    fn a_refilled_builder_fills_the_given_buffer_and_never_drops_records() {
        let mut b = BufferBuilder::new(1 << 20, 1_000);
        let mut spare = RecordBatch::with_capacity(16, 1024);
        spare.push(None, b"stale", None);
        b.refill(spare);
        assert!(b.take().is_none(), "a refill is emptied first");
        b.refill(RecordBatch::with_capacity(16, 1024));
        assert!(b.push(&rec(b"a"), 0).is_none());
        b.refill(RecordBatch::with_capacity(64, 4096));
        let held = b.take().expect("a refill never replaces buffered records");
        assert_eq!(held.iter().map(|r| r.value.to_vec()).collect::<Vec<_>>(), [b"a".to_vec()]);
        assert!(held.allocated_bytes() >= 1024, "the refilled allocation was used");
    }

    #[test]
    fn zero_timeout_flushes_every_record() {
        let mut b = BufferBuilder::new(1 << 20, 0);
        assert_eq!(b.push(&rec(b"a"), 5).map(|x| x.len()), Some(1));
    }
}
