//! The end of a task's chain that feeds an exchange: extracts keys at a `key_by`, picks the
//! channel for each record (forward, hash by key group, rebalance), collects records per channel
//! into buffers ([`BufferBuilder`]) and ships them; barriers and end-of-stream flush first so
//! they never overtake records. A watermark travels in the message of the buffer it follows
//! (shipped when the buffer times out, or when the next record for that channel comes, so
//! nothing overtakes it) instead of in a message and credit of its own.

use std::borrow::Cow;

use eddy_core::{KeyGroup, KeyGroupRange, RecordBatch, RecordView, key_group_of};
use eddy_wire::row::Kind;
use eddy_wire::schema::FieldSlots;

use crate::buffer::BufferBuilder;
use eddy_plan::KeyBy;
use eddy_plan::Partitioning;
use eddy_transport::channel::{ChannelSender, Disconnected, Message};

/// Why a record could not be routed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The downstream side is gone (the job is stopping).
    #[error(transparent)]
    Disconnected(#[from] Disconnected),
    /// `key_by` found no key in a record.
    #[error("key_by of step `{step}`: {problem}")]
    Key {
        /// The step behind the exchange.
        step: String,
        /// What is missing and what to change.
        problem: String,
    },
}

/// The key `key_by` selects from a record.
pub fn extract_key<'a>(key_by: &KeyBy, record: &RecordView<'a>) -> Result<Cow<'a, [u8]>, String> {
    match key_by {
        KeyBy::Key => record.key.map(Cow::Borrowed).ok_or_else(|| {
            "`key` selected, but the record has no key (the upstream step emitted none); key by a field such as `/user_id` instead".to_string()
        }),
        KeyBy::Value => Ok(Cow::Borrowed(record.value)),
        KeyBy::Field(pointer) => match eddy_connectors::values::pointer_text(record.value, pointer)? {
            Some(key) => Ok(Cow::Owned(key)),
            None => Err(format!(
                "the value has no field `{pointer}`: {}",
                String::from_utf8_lossy(&eddy_connectors::values::json_text(record.value))
            )),
        },
    }
}

/// A `key_by` of one field (`/name`) read from rows at the slot remembered for their schema
/// ([`FieldSlots`], the guest SDK's reader too), instead of asking the schema registry and
/// scanning the names per record (q5 keys each window result by `/end`).
#[derive(Debug, Default)]
struct RowField {
    /// The field's name; none for a `key_by` this path does not serve.
    name: Option<String>,
    slots: FieldSlots,
    /// The last key rendered (reused: no allocation per record).
    key: Vec<u8>,
    /// What `key` was rendered from when that was a fixed-width field (its kind and slot), and
    /// the key's group: neighbouring records often hold the same value (every result of one
    /// q5 window firing has the same `end`), and then the key is neither rendered nor hashed
    /// again.
    last: Option<((Kind, [u8; 8]), KeyGroup)>,
}

impl RowField {
    fn new(key_by: &KeyBy) -> Self {
        let name = match key_by {
            KeyBy::Field(pointer) => pointer.strip_prefix('/').filter(|n| !n.contains(['/', '~'])).map(str::to_owned),
            KeyBy::Key | KeyBy::Value => None,
        };
        Self { name, ..Self::default() }
    }

    /// The JSON text of the field in row `value` and its key group; `None` where this path
    /// does not answer (no one-step field, not a row, a schema without the field, a damaged
    /// row): [`extract_key`] then reads it, or says what is wrong.
    fn key(&mut self, value: &[u8], max_parallelism: u32) -> Option<(&[u8], KeyGroup)> {
        let name = self.name.as_deref()?;
        if !eddy_wire::row::is_row(value) {
            return None;
        }
        let row = eddy_wire::row::RowRef::new(value).ok()?;
        let index = self.slots.slot_of(&row, name, eddy_runtime::schemas())?;
        // A fixed-width field's JSON follows from its kind and slot alone.
        let fixed = match row.kind(index).ok()? {
            kind @ (Kind::Bool | Kind::I64 | Kind::U64 | Kind::F64) => row.fixed(index).ok()?.map(|slot| (kind, slot)),
            _ => None,
        };
        if let (Some(now), Some((seen, group))) = (fixed, self.last)
            && now == seen
        {
            return Some((&self.key, group));
        }
        self.last = None;
        self.key.clear();
        eddy_wire::json::field_to_json(&row, index, eddy_runtime::schemas(), &mut self.key).ok()?;
        let group = key_group_of(&self.key, max_parallelism);
        self.last = fixed.map(|f| (f, group));
        Some((&self.key, group))
    }
}

/// The channels of one exchange with their buffers and the watermarks waiting behind them.
struct Outlets {
    senders: Vec<Box<dyn ChannelSender>>,
    builders: Vec<BufferBuilder>,
    /// Per channel, the newest watermark behind the records buffered for it.
    pending_watermarks: Vec<Option<i64>>,
}

impl Outlets {
    fn ship(&mut self, channel: usize, batch: RecordBatch) -> Result<(), Disconnected> {
        let watermark = self.pending_watermarks[channel].take();
        let sender = &mut self.senders[channel];
        sender.send(Message::Data { side: None, batch, watermark })?;
        if let Some(spare) = sender.spare() {
            self.builders[channel].refill(spare);
        }
        Ok(())
    }

    /// Buffers `record` for `channel`, shipping what is buffered first if a watermark waits
    /// behind it (a record must not overtake a watermark it followed: downstream judges
    /// lateness by that order) and the buffer once it is full.
    fn push(&mut self, channel: usize, record: &RecordView<'_>, now_ms: i64) -> Result<(), Disconnected> {
        self.add(channel, record, now_ms)?;
        self.ship_ready(channel, now_ms)
    }

    /// [`Self::push`] without shipping a full buffer: [`Self::ship_ready`] does, once the
    /// caller added every record it has.
    fn add(&mut self, channel: usize, record: &RecordView<'_>, now_ms: i64) -> Result<(), Disconnected> {
        if self.pending_watermarks[channel].is_some()
            && let Some(before) = self.builders[channel].take()
        {
            self.ship(channel, before)?;
        }
        self.builders[channel].add(record, now_ms);
        Ok(())
    }

    /// Ships `channel`'s buffer if it is full or its buffer timeout passed.
    fn ship_ready(&mut self, channel: usize, now_ms: i64) -> Result<(), Disconnected> {
        match self.builders[channel].take_ready(now_ms) {
            Some(ready) => self.ship(channel, ready),
            None => Ok(()),
        }
    }

    /// [`Self::ship_ready`] for every channel, once a batch's records are all added.
    fn ship_all_ready(&mut self, now_ms: i64) -> Result<(), Disconnected> {
        (0..self.senders.len()).try_for_each(|channel| self.ship_ready(channel, now_ms))
    }

    /// [`Self::push_batch`] for a batch the caller gives up: one that fills a buffer by itself
    /// while the channel has nothing buffered (so no watermark waits either) ships as it is.
    fn push_given(&mut self, channel: usize, batch: Cow<'_, RecordBatch>, now_ms: i64) -> Result<(), Disconnected> {
        match batch {
            Cow::Owned(batch) if self.builders[channel].would_ship_whole(&batch) => self.ship(channel, batch),
            batch => self.push_batch(channel, &batch, now_ms),
        }
    }

    /// [`Self::push`] for every record of `batch`, copying its buffer once.
    fn push_batch(&mut self, channel: usize, batch: &RecordBatch, now_ms: i64) -> Result<(), Disconnected> {
        if self.pending_watermarks[channel].is_some()
            && let Some(before) = self.builders[channel].take()
        {
            self.ship(channel, before)?;
        }
        let full = match self.builders[channel].push_batch(batch, now_ms) {
            Ok(full) => full,
            // Over one batch's limit together: what is held goes first, then record by record.
            Err(_) => {
                if let Some(before) = self.builders[channel].take() {
                    self.ship(channel, before)?;
                }
                return batch.iter().try_for_each(|record| self.push(channel, &record, now_ms));
            }
        };
        match full {
            Some(full) => self.ship(channel, full),
            None => Ok(()),
        }
    }
}

/// Routes one task's output over one exchange.
pub struct OutputRouter {
    partitioning: Partitioning,
    outlets: Outlets,
    row_field: RowField,
    max_parallelism: u32,
    /// Per record of the batch being routed by `key`, its channel (reused).
    channels: Vec<u32>,
    next: usize,
    step: String,
}

impl std::fmt::Debug for OutputRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputRouter")
            .field("partitioning", &self.partitioning)
            .field("channels", &self.outlets.senders.len())
            .finish_non_exhaustive()
    }
}

impl OutputRouter {
    /// A router over `senders` (one per downstream subtask, in subtask order; one for forward).
    /// `step` names the downstream step in key errors.
    pub fn new(
        partitioning: Partitioning,
        senders: Vec<Box<dyn ChannelSender>>,
        max_parallelism: u32,
        buffer_bytes: usize,
        buffer_timeout_ms: i64,
        step: String,
    ) -> Self {
        let builders = senders.iter().map(|_| BufferBuilder::new(buffer_bytes, buffer_timeout_ms)).collect();
        let row_field = match &partitioning {
            Partitioning::Hash(key_by) => RowField::new(key_by),
            Partitioning::Forward | Partitioning::Rebalance => RowField::default(),
        };
        let pending_watermarks = vec![None; senders.len()];
        Self {
            partitioning,
            outlets: Outlets { senders, builders, pending_watermarks },
            row_field,
            max_parallelism,
            channels: Vec::new(),
            next: 0,
            step,
        }
    }

    /// Routes the records of `batch`; an owned batch going whole to one channel ships without
    /// a copy when it fills a buffer by itself.
    pub fn emit(&mut self, batch: Cow<'_, RecordBatch>, now_ms: i64) -> Result<(), RouteError> {
        if batch.is_empty() {
            return Ok(());
        }
        match &self.partitioning {
            // The keys stay: where every record's key goes to one channel (one channel; one
            // key, as q7's), the batch goes whole, otherwise each record to its channel, each
            // channel's share shipped as one message (as below).
            Partitioning::Hash(KeyBy::Key) => {
                let Self { outlets, max_parallelism, step, channels, .. } = self;
                let parallelism = outlets.senders.len() as u32;
                channels.clear();
                for record in batch.iter() {
                    let key = extract_key(&KeyBy::Key, &record)
                        .map_err(|problem| RouteError::Key { step: step.clone(), problem })?;
                    if parallelism > 1 {
                        let group = key_group_of(&key, *max_parallelism);
                        channels.push(KeyGroupRange::subtask_of(group, *max_parallelism, parallelism));
                    }
                }
                match channels.first() {
                    // One channel: no key is hashed.
                    None => outlets.push_given(0, batch, now_ms)?,
                    Some(&first) if channels.iter().all(|&c| c == first) => {
                        outlets.push_given(first as usize, batch, now_ms)?;
                    }
                    Some(_) => {
                        for (record, &channel) in batch.iter().zip(channels.iter()) {
                            outlets.add(channel as usize, &record, now_ms)?;
                        }
                        outlets.ship_all_ready(now_ms)?;
                    }
                }
            }
            // Each channel's share of the batch goes as one message (past the buffer's size if
            // need be), as the whole batch goes to a single channel: cut into 32 KiB buffers,
            // a downstream window step woke and folded ~170 records at a time at parallelism 2
            // where it got ~1 900 at parallelism 1.
            Partitioning::Hash(key_by) => {
                let Self { outlets, row_field, max_parallelism, step, .. } = self;
                let parallelism = outlets.senders.len() as u32;
                for record in batch.iter() {
                    let extracted;
                    let (key, group) = match row_field.key(record.value, *max_parallelism) {
                        Some(found) => found,
                        None => {
                            extracted = extract_key(key_by, &record)
                                .map_err(|problem| RouteError::Key { step: step.clone(), problem })?;
                            (&*extracted, key_group_of(&extracted, *max_parallelism))
                        }
                    };
                    let channel = KeyGroupRange::subtask_of(group, *max_parallelism, parallelism) as usize;
                    let keyed = RecordView { key: Some(key), value: record.value, timestamp: record.timestamp };
                    outlets.add(channel, &keyed, now_ms)?;
                }
                outlets.ship_all_ready(now_ms)?;
            }
            Partitioning::Forward | Partitioning::Rebalance => {
                // Whole batches rotate over the channels: records stay together, and a forward
                // edge has exactly one channel.
                let channel = self.next % self.outlets.senders.len();
                self.next = self.next.wrapping_add(1);
                self.outlets.push_given(channel, batch, now_ms)?;
            }
        }
        Ok(())
    }

    /// Sends a side output's records on towards the sink (unbuffered: side outputs are rare).
    pub fn emit_side(&mut self, name: &str, batch: RecordBatch) -> Result<(), RouteError> {
        if batch.is_empty() {
            return Ok(());
        }
        let channel = self.next % self.outlets.senders.len();
        self.next = self.next.wrapping_add(1);
        Ok(self.outlets.senders[channel].send(Message::Data {
            side: Some(name.to_string()),
            batch,
            watermark: None,
        })?)
    }

    /// Passes watermark `w` on: behind the records buffered for a channel (it ships with them),
    /// or at once on a channel with nothing buffered.
    pub fn watermark(&mut self, w: i64) -> Result<(), RouteError> {
        let o = &mut self.outlets;
        for channel in 0..o.senders.len() {
            if o.builders[channel].deadline_ms().is_some() {
                o.pending_watermarks[channel] = Some(w);
            } else {
                o.senders[channel].send(Message::Watermark(w))?;
            }
        }
        Ok(())
    }

    /// Flushes every buffer, then sends `message` on every channel.
    pub fn broadcast(&mut self, message: Message) -> Result<(), RouteError> {
        self.flush_all()?;
        for sender in &mut self.outlets.senders {
            sender.send(message.clone())?;
        }
        Ok(())
    }

    /// Ships every buffered record.
    pub fn flush_all(&mut self) -> Result<(), RouteError> {
        let o = &mut self.outlets;
        for channel in 0..o.builders.len() {
            if let Some(batch) = o.builders[channel].take() {
                o.ship(channel, batch)?;
            }
        }
        Ok(())
    }

    /// Ships buffers whose oldest record waited the buffer timeout.
    pub fn flush_due(&mut self, now_ms: i64) -> Result<(), RouteError> {
        let o = &mut self.outlets;
        for channel in 0..o.builders.len() {
            if let Some(batch) = o.builders[channel].poll_timeout(now_ms) {
                o.ship(channel, batch)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn view<'a>(key: Option<&'a [u8]>, value: &'a [u8]) -> RecordView<'a> {
        RecordView { key, value, timestamp: None }
    }

    #[test]
    fn keys_come_from_the_key_the_value_or_a_field() {
        let v = br#"{"user": {"id": "u1"}, "n": 2}"#;
        assert_eq!(extract_key(&KeyBy::Key, &view(Some(b"k"), v)).unwrap().as_ref(), b"k");
        assert_eq!(extract_key(&KeyBy::Value, &view(None, v)).unwrap().as_ref(), v);
        assert_eq!(extract_key(&KeyBy::Field("/user/id".into()), &view(None, v)).unwrap().as_ref(), b"\"u1\"");
        assert!(extract_key(&KeyBy::Key, &view(None, v)).unwrap_err().contains("no key"));
        assert!(extract_key(&KeyBy::Field("/x".into()), &view(None, v)).unwrap_err().contains("no field `/x`"));
        assert!(extract_key(&KeyBy::Field("/x".into()), &view(None, b"nope")).unwrap_err().contains("not JSON"));
    }

    /// A channel that keeps what is sent on it, for tests to read.
    pub(crate) struct Collect(pub(crate) std::sync::Arc<std::sync::Mutex<Vec<Message>>>);
    impl ChannelSender for Collect {
        fn send(&mut self, message: Message) -> Result<(), Disconnected> {
            self.0.lock().unwrap().push(message);
            Ok(())
        }
    }

    /// Keys, their key group and owning subtask at `max_parallelism` 128 and parallelism 3,
    /// derived by hand from the definitions, not from Eddy's code:
    ///
    /// - key group = `(xxh3_64(key, seed 0) * max_parallelism) >> 64` (multiply-shift);
    /// - subtask = `group * parallelism / max_parallelism` (Flink's assignment), so subtask 0
    ///   owns groups 0..=42, subtask 1 owns 43..=85 and subtask 2 owns 86..=127.
    ///
    /// Computed with the `xxhash` Python package (4.1.0), e.g. for `user-481`:
    /// `h = xxhash.xxh3_64_intdigest(b"user-481")` = 0x56157e2e906c0100, `(h * 128) >> 64` = 43,
    /// `43 * 3 // 128` = 1. The `user-*` keys sit on the edges of the ranges. (xxh3 of the empty
    /// input is the published 0x2d06800538d394c2.)
    const OWNERS: [(&str, u16, usize); 14] = [
        ("", 22, 0),
        ("alice", 38, 0),
        ("bob", 10, 0),
        ("carol", 113, 2),
        ("dave", 24, 0),
        ("erin", 122, 2),
        ("grace", 43, 1),
        ("niaj", 49, 1),
        ("user-59", 0, 0),
        ("user-36", 42, 0),
        ("user-481", 43, 1),
        ("user-67", 85, 1),
        ("user-40", 86, 2),
        ("user-209", 127, 2),
    ];

    #[test]
    fn hash_routing_sends_each_key_to_the_subtask_owning_its_group_and_events_follow_records() {
        let outs: Vec<_> = (0..3).map(|_| std::sync::Arc::new(std::sync::Mutex::new(Vec::new()))).collect();
        let senders: Vec<Box<dyn ChannelSender>> =
            outs.iter().map(|o| Box::new(Collect(o.clone())) as Box<dyn ChannelSender>).collect();
        let mut router = OutputRouter::new(Partitioning::Hash(KeyBy::Value), senders, 128, 1 << 20, 1_000, "s".into());
        let mut batch = RecordBatch::default();
        for (i, (key, ..)) in OWNERS.iter().enumerate() {
            batch.push(None, key.as_bytes(), Some(i as i64));
        }
        router.emit(Cow::Borrowed(&batch), 0).unwrap();
        router.watermark(7).unwrap();
        router.broadcast(Message::EndOfStream).unwrap();
        for (subtask, out) in outs.iter().enumerate() {
            let out = out.lock().unwrap();
            assert_eq!(out.last(), Some(&Message::EndOfStream), "end-of-stream comes after the records");
            let Some(Message::Data { watermark, .. }) = out.iter().rev().nth(1) else { panic!("records last") };
            assert_eq!(*watermark, Some(7), "the watermark rides on the records it follows");
            let mut got = Vec::new();
            for m in out.iter() {
                if let Message::Data { batch, .. } = m {
                    for r in batch.iter() {
                        assert_eq!(r.key, Some(r.value), "key_by value keys the record by its value");
                        got.push(String::from_utf8(r.value.to_vec()).unwrap());
                    }
                }
            }
            let expected: Vec<&str> = OWNERS.iter().filter(|(.., owner)| *owner == subtask).map(|(k, ..)| *k).collect();
            assert_eq!(got, expected, "keys routed to subtask {subtask}, in input order");
        }
    }

    /// What each subtask behind a router received, per message: `(records, watermark)`, with
    /// `(0, Some(w))` for a watermark of its own and `(0, None)` for end-of-stream.
    fn received(outs: &[std::sync::Arc<std::sync::Mutex<Vec<Message>>>]) -> Vec<Vec<(usize, Option<i64>)>> {
        outs.iter()
            .map(|o| {
                o.lock()
                    .unwrap()
                    .iter()
                    .map(|m| match m {
                        Message::Data { batch, watermark, .. } => (batch.len(), *watermark),
                        Message::Watermark(w) => (0, Some(*w)),
                        Message::EndOfStream => (0, None),
                        other => panic!("unexpected {other:?}"),
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_watermark_waits_in_the_buffer_it_follows_and_goes_alone_only_where_nothing_is_buffered() {
        let outs: Vec<_> = (0..2).map(|_| std::sync::Arc::new(std::sync::Mutex::new(Vec::new()))).collect();
        let senders: Vec<Box<dyn ChannelSender>> =
            outs.iter().map(|o| Box::new(Collect(o.clone())) as Box<dyn ChannelSender>).collect();
        // 1 MiB buffers, 100 ms buffer timeout; batches rotate over the two channels.
        let mut router = OutputRouter::new(Partitioning::Rebalance, senders, 128, 1 << 20, 100, "s".into());
        let mut batch = RecordBatch::default();
        batch.push(None, b"r", Some(1));
        router.emit(Cow::Borrowed(&batch), 0).unwrap(); // channel 0 buffers one record
        router.watermark(5).unwrap();
        router.watermark(6).unwrap();
        assert_eq!(received(&outs), vec![vec![], vec![(0, Some(5)), (0, Some(6))]], "nothing flushed early");
        router.flush_due(50).unwrap();
        assert_eq!(received(&outs)[0], vec![], "the buffer keeps its timeout");
        router.flush_due(100).unwrap();
        assert_eq!(received(&outs)[0], vec![(1, Some(6))], "the newest watermark ships with the records");
        router.watermark(7).unwrap();
        assert_eq!(received(&outs)[0], vec![(1, Some(6)), (0, Some(7))], "an empty channel gets it at once");
        // Records after a buffered watermark: the buffer and its watermark ship first.
        let mut two = RecordBatch::default();
        two.push(None, b"a", Some(9));
        router.emit(Cow::Borrowed(&two), 200).unwrap(); // channel 1
        router.emit(Cow::Borrowed(&two), 200).unwrap(); // channel 0
        router.watermark(8).unwrap();
        router.emit(Cow::Borrowed(&two), 200).unwrap(); // channel 1 again: one record before 8, one after
        router.broadcast(Message::EndOfStream).unwrap();
        let got = received(&outs);
        assert_eq!(got[1][3..], [(1, Some(8)), (1, None), (0, None)], "order kept: record, 8, record, end");
        assert_eq!(got[0][2..], [(1, Some(8)), (0, None)], "flushed before the end, with its watermark");
    }

    #[test]
    fn each_channels_share_of_a_batch_ships_as_one_message_once_full_or_due() {
        let route = |capacity: usize| {
            let outs: Vec<_> = (0..3).map(|_| std::sync::Arc::new(std::sync::Mutex::new(Vec::new()))).collect();
            let senders: Vec<Box<dyn ChannelSender>> =
                outs.iter().map(|o| Box::new(Collect(o.clone())) as Box<dyn ChannelSender>).collect();
            let router = OutputRouter::new(Partitioning::Hash(KeyBy::Value), senders, 128, capacity, 100, "s".into());
            (router, outs)
        };
        let mut batch = RecordBatch::default();
        for (key, ..) in OWNERS {
            batch.push(None, key.as_bytes(), Some(1));
        }
        let shares: Vec<usize> = (0..3).map(|s| OWNERS.iter().filter(|(.., owner)| *owner == s).count()).collect();
        let one_each: Vec<Vec<(usize, Option<i64>)>> = shares.iter().map(|&n| vec![(n, None)]).collect();
        // Buffers of one byte: every share is full at once, and goes whole.
        let (mut router, outs) = route(1);
        router.emit(Cow::Borrowed(&batch), 0).unwrap();
        assert_eq!(received(&outs), one_each, "one message per channel, not one per record");
        // Buffers of 1 MiB: the shares wait for the buffer timeout.
        let (mut router, outs) = route(1 << 20);
        router.emit(Cow::Borrowed(&batch), 0).unwrap();
        router.flush_due(99).unwrap();
        assert_eq!(received(&outs), vec![vec![]; 3], "nothing before the timeout");
        router.flush_due(100).unwrap();
        assert_eq!(received(&outs), one_each);
    }

    #[test]
    fn a_given_batch_that_fills_a_buffer_ships_as_it_is_and_after_what_was_buffered() {
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let senders: Vec<Box<dyn ChannelSender>> = vec![Box::new(Collect(out.clone()))];
        // Buffers of 8 bytes, a 100 ms timeout.
        let mut router = OutputRouter::new(Partitioning::Forward, senders, 128, 8, 100, "s".into());
        let batch = |values: &[&str]| {
            let mut b = RecordBatch::default();
            values.iter().for_each(|v| b.push(None, v.as_bytes(), Some(1)));
            b
        };
        let whole = batch(&["abcd", "efgh"]);
        let at = whole.parts().0.as_ptr();
        router.emit(Cow::Owned(whole), 0).unwrap();
        router.emit(Cow::Owned(batch(&["i"])), 0).unwrap(); // buffered: 1 byte of 8
        router.emit(Cow::Owned(batch(&["jklmnopq"])), 0).unwrap(); // after "i", so copied behind it
        router.emit(Cow::Borrowed(&batch(&["rstuvwxy"])), 0).unwrap(); // not given: copied
        let sent = out.lock().unwrap();
        let values: Vec<Vec<&[u8]>> = sent
            .iter()
            .map(|m| match m {
                Message::Data { batch, .. } => batch.iter().map(|r| r.value).collect(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(values, vec![vec![&b"abcd"[..], b"efgh"], vec![b"i", b"jklmnopq"], vec![b"rstuvwxy"]]);
        let Message::Data { batch: first, .. } = &sent[0] else { unreachable!() };
        assert_eq!(first.parts().0.as_ptr(), at, "the given batch itself, not a copy");
    }

    #[test]
    fn by_key_a_batch_whose_keys_one_subtask_owns_goes_whole_and_a_mixed_one_record_by_record() {
        let outs: Vec<_> = (0..3).map(|_| std::sync::Arc::new(std::sync::Mutex::new(Vec::new()))).collect();
        let senders: Vec<Box<dyn ChannelSender>> =
            outs.iter().map(|o| Box::new(Collect(o.clone())) as Box<dyn ChannelSender>).collect();
        // Buffers of 8 bytes: a given batch of more fills one by itself and ships as it is.
        let mut router = OutputRouter::new(Partitioning::Hash(KeyBy::Key), senders, 128, 8, 1_000, "s".into());
        let owned_by = |subtask: usize| OWNERS.iter().filter(move |(.., owner)| *owner == subtask).map(|(k, ..)| *k);
        let mut whole = RecordBatch::default();
        for (i, key) in owned_by(2).chain(owned_by(2)).enumerate() {
            whole.push(Some(key.as_bytes()), format!("w{i}").as_bytes(), Some(i as i64));
        }
        router.emit(Cow::Owned(whole.clone()), 0).unwrap();
        let mut mixed = RecordBatch::default();
        for (i, (key, ..)) in OWNERS.iter().enumerate() {
            mixed.push(Some(key.as_bytes()), format!("m{i}").as_bytes(), Some(i as i64));
        }
        router.emit(Cow::Borrowed(&mixed), 0).unwrap();
        let mut keyless = RecordBatch::default();
        keyless.push(Some(b"carol"), b"x", None);
        keyless.push(None, b"y", None);
        let err = router.emit(Cow::Borrowed(&keyless), 0).unwrap_err().to_string();
        assert!(err.contains("no key"), "{err}");
        router.broadcast(Message::EndOfStream).unwrap();
        for (subtask, out) in outs.iter().enumerate() {
            let out = out.lock().unwrap();
            let batches: Vec<&RecordBatch> = out
                .iter()
                .filter_map(|m| match m {
                    Message::Data { batch, .. } => Some(batch),
                    _ => None,
                })
                .collect();
            let records = |b: &RecordBatch| {
                b.iter().map(|r| (r.key.map(<[u8]>::to_vec), r.value.to_vec(), r.timestamp)).collect::<Vec<_>>()
            };
            let got: Vec<_> = batches.iter().flat_map(|b| records(b)).collect();
            let mut expected = if subtask == 2 { records(&whole) } else { Vec::new() };
            expected
                .extend(records(&mixed).into_iter().zip(OWNERS).filter(|(_, (.., o))| *o == subtask).map(|(r, _)| r));
            assert_eq!(got, expected, "subtask {subtask}: its keys, in order, and nothing of the refused batch");
            if subtask == 2 {
                assert_eq!(batches.first().map(|b| records(b)), Some(records(&whole)), "the one-owner batch as it was");
            }
        }
    }

    #[test]
    fn one_channel_by_key_ships_whole_batches_in_order_and_still_refuses_a_record_without_a_key() {
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let senders: Vec<Box<dyn ChannelSender>> = vec![Box::new(Collect(out.clone()))];
        // Buffers of 24 bytes: the second batch fills the first buffer.
        let mut router = OutputRouter::new(Partitioning::Hash(KeyBy::Key), senders, 128, 24, 1_000, "s".into());
        let mut sent = Vec::new();
        for (n, t) in [(2, 0), (3, 1), (1, 2)] {
            let mut batch = RecordBatch::default();
            for i in 0..n {
                let (key, value) = (format!("k{t}{i}"), format!("v{t}{i}"));
                batch.push(Some(key.as_bytes()), value.as_bytes(), Some(t));
                sent.push((key.into_bytes(), value.into_bytes(), Some(t)));
            }
            router.emit(Cow::Borrowed(&batch), 0).unwrap();
        }
        router.broadcast(Message::EndOfStream).unwrap();
        let mut got = Vec::new();
        let mut batches = Vec::new();
        for m in out.lock().unwrap().iter() {
            if let Message::Data { batch, .. } = m {
                batches.push(batch.len());
                got.extend(batch.iter().map(|r| (r.key.unwrap_or_default().to_vec(), r.value.to_vec(), r.timestamp)));
            }
        }
        assert_eq!(got, sent, "every record, keys kept, in order");
        assert_eq!(batches, vec![5, 1], "shipped when full, the rest before the end");

        let mut keyless = RecordBatch::default();
        keyless.push(Some(b"k"), b"v", None);
        keyless.push(None, b"w", None);
        let err = router.emit(Cow::Borrowed(&keyless), 0).unwrap_err().to_string();
        assert!(err.contains("no key"), "{err}");
    }

    #[test]
    fn keys_read_from_row_slots_equal_the_general_reader_across_schemas() {
        use eddy_wire::row::{Kind, RowFrame};
        use eddy_wire::schema::Schema;
        // A second schema of as many fields with `end` at another slot: a cache that does not
        // check the schema id reads the wrong field.
        let other = eddy_runtime::schemas().declare(&Schema::new("router-test", &["end", "x", "y"])).expect("declared");
        let other_row = |end: &str| {
            let mut out = Vec::new();
            let row = RowFrame::begin(&mut out, 3, other);
            row.variable(&mut out, 0, Kind::Str, end.as_bytes());
            row.i64(&mut out, 1, 9);
            row.i64(&mut out, 2, 8);
            out
        };
        // One field of every fixed kind, neighbours alike and not: equal slot bytes of another
        // kind are another key (u64::MAX and -1, 1 and true), so a remembered key must be
        // remembered with its kind.
        let single = eddy_runtime::schemas().declare(&Schema::new("router-memo", &["end"])).expect("declared");
        let fixed = |write: &dyn Fn(&RowFrame, &mut Vec<u8>)| {
            let mut out = Vec::new();
            let row = RowFrame::begin(&mut out, 1, single);
            write(&row, &mut out);
            out
        };
        let values = [
            eddy_connectors::values::window_row(0, 10, &other_row("a")),
            other_row("b\"c"),
            eddy_connectors::values::window_row(-5, i64::MAX, &other_row("d")),
            other_row(""),
            br#"{"end": 3}"#.to_vec(),
            fixed(&|r, b| r.u64(b, 0, 5)),
            fixed(&|r, b| r.u64(b, 0, 5)),
            fixed(&|r, b| r.i64(b, 0, 5)),
            fixed(&|r, b| r.u64(b, 0, u64::MAX)),
            fixed(&|r, b| r.i64(b, 0, -1)),
            fixed(&|r, b| r.u64(b, 0, 1)),
            fixed(&|r, b| r.bool(b, 0, true)),
            fixed(&|r, b| r.f64(b, 0, 2.5)),
            fixed(&|r, b| r.f64(b, 0, 2.5)),
            fixed(&|r, b| r.null(b, 0)),
            fixed(&|r, b| r.u64(b, 0, 1)),
        ];
        for pointer in ["/end", "/x", "/start", "/result/end"] {
            let key_by = KeyBy::Field(pointer.into());
            let mut slot = RowField::new(&key_by);
            // Twice over, so the second pass reads from what the first cached.
            for value in values.iter().chain(&values) {
                let general = extract_key(&key_by, &view(None, value)).ok();
                if let Some((fast, group)) = slot.key(value, 128) {
                    assert_eq!(Some(fast), general.as_deref(), "{pointer} of {value:?}");
                    assert_eq!(group, key_group_of(fast, 128), "{pointer} of {value:?}");
                }
            }
        }
        let mut end = RowField::new(&KeyBy::Field("/end".into()));
        let mut key = |value: &[u8]| end.key(value, 128).map(|(k, _)| String::from_utf8_lossy(k).into_owned());
        let keys: Vec<_> = values.iter().map(|v| key(v)).collect();
        let expected = [
            Some("10"),
            Some(r#""b\"c""#),
            Some("9223372036854775807"),
            Some(r#""""#),
            None, // JSON goes to the general reader
            Some("5"),
            Some("5"),
            Some("5"),
            Some("18446744073709551615"),
            Some("-1"),
            Some("1"),
            Some("true"),
            Some("2.5"),
            Some("2.5"),
            Some("null"),
            Some("1"),
        ];
        assert_eq!(keys, expected.map(|k| k.map(str::to_owned)));
        assert_eq!(RowField::new(&KeyBy::Field("/result/end".into())).key(&values[0], 128), None, "one step only");
    }

    #[test]
    fn key_groups_follow_the_documented_hash() {
        for (key, group, _) in OWNERS {
            assert_eq!(key_group_of(key.as_bytes(), 128), group, "key {key:?}");
        }
    }
}
