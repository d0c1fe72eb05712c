//! The end of a task's chain that feeds an exchange: extracts keys at a `key_by`, picks the
//! channel for each record (forward, hash by key group, rebalance), collects records per channel
//! into buffers ([`BufferBuilder`]) and ships them; in-band events flush first so they never
//! overtake records.

use std::borrow::Cow;

use eddy_core::{KeyGroupRange, RecordBatch, RecordView, key_group_of};

use crate::buffer::BufferBuilder;
use crate::channel::{ChannelSender, Disconnected, Message};
use crate::plan::Partitioning;
use crate::spec::KeyBy;

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
        KeyBy::Field(pointer) => match crate::values::pointer_text(record.value, pointer)? {
            Some(key) => Ok(Cow::Owned(key)),
            None => Err(format!(
                "the value has no field `{pointer}`: {}",
                String::from_utf8_lossy(&crate::values::json_text(record.value))
            )),
        },
    }
}

/// Routes one task's output over one exchange.
pub struct OutputRouter {
    partitioning: Partitioning,
    senders: Vec<Box<dyn ChannelSender>>,
    builders: Vec<BufferBuilder>,
    max_parallelism: u32,
    next: usize,
    step: String,
}

impl std::fmt::Debug for OutputRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputRouter")
            .field("partitioning", &self.partitioning)
            .field("channels", &self.senders.len())
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
        Self { partitioning, senders, builders, max_parallelism, next: 0, step }
    }

    fn ship(&mut self, channel: usize, batch: RecordBatch) -> Result<(), Disconnected> {
        self.senders[channel].send(Message::Data { side: None, batch })
    }

    /// Routes the records of `batch`.
    pub fn emit(&mut self, batch: &RecordBatch, now_ms: i64) -> Result<(), RouteError> {
        if batch.is_empty() {
            return Ok(());
        }
        match &self.partitioning {
            Partitioning::Hash(key_by) => {
                let parallelism = self.senders.len() as u32;
                for record in batch.iter() {
                    let key = extract_key(key_by, &record)
                        .map_err(|problem| RouteError::Key { step: self.step.clone(), problem })?;
                    let group = key_group_of(&key, self.max_parallelism);
                    let channel = KeyGroupRange::subtask_of(group, self.max_parallelism, parallelism) as usize;
                    let keyed = RecordView { key: Some(&key), value: record.value, timestamp: record.timestamp };
                    if let Some(full) = self.builders[channel].push(&keyed, now_ms) {
                        self.senders[channel].send(Message::Data { side: None, batch: full })?;
                    }
                }
            }
            Partitioning::Forward | Partitioning::Rebalance => {
                // Whole batches rotate over the channels: records stay together, and a forward
                // edge has exactly one channel.
                let channel = self.next % self.senders.len();
                self.next = self.next.wrapping_add(1);
                for record in batch.iter() {
                    if let Some(full) = self.builders[channel].push(&record, now_ms) {
                        self.ship(channel, full)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends a side output's records on towards the sink (unbuffered: side outputs are rare).
    pub fn emit_side(&mut self, name: &str, batch: RecordBatch) -> Result<(), RouteError> {
        if batch.is_empty() {
            return Ok(());
        }
        let channel = self.next % self.senders.len();
        self.next = self.next.wrapping_add(1);
        Ok(self.senders[channel].send(Message::Data { side: Some(name.to_string()), batch })?)
    }

    /// Flushes every buffer, then sends `message` on every channel.
    pub fn broadcast(&mut self, message: Message) -> Result<(), RouteError> {
        self.flush_all()?;
        for sender in &mut self.senders {
            sender.send(message.clone())?;
        }
        Ok(())
    }

    /// Ships every buffered record.
    pub fn flush_all(&mut self) -> Result<(), RouteError> {
        for channel in 0..self.builders.len() {
            if let Some(batch) = self.builders[channel].take() {
                self.ship(channel, batch)?;
            }
        }
        Ok(())
    }

    /// Ships buffers whose oldest record waited the buffer timeout.
    pub fn flush_due(&mut self, now_ms: i64) -> Result<(), RouteError> {
        for channel in 0..self.builders.len() {
            if let Some(batch) = self.builders[channel].poll_timeout(now_ms) {
                self.ship(channel, batch)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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

    struct Collect(std::sync::Arc<std::sync::Mutex<Vec<Message>>>);
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
        router.emit(&batch, 0).unwrap();
        router.broadcast(Message::Watermark(7)).unwrap();
        for (subtask, out) in outs.iter().enumerate() {
            let out = out.lock().unwrap();
            assert_eq!(out.last(), Some(&Message::Watermark(7)), "the watermark comes after the records");
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

    #[test]
    fn key_groups_follow_the_documented_hash() {
        for (key, group, _) in OWNERS {
            assert_eq!(key_group_of(key.as_bytes(), 128), group, "key {key:?}");
        }
    }
}
