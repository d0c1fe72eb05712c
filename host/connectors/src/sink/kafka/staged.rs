//! Exactly once into Kafka with librdkafka, which cannot resume a transaction another producer
//! left open (Flink's sink does so through the Java client's internals; librdkafka has no
//! KIP-939 either): so a checkpoint's records are not sent before it completes. They are staged
//! in the sink subtask and stored in the checkpoint (its sink state); when the checkpoint
//! completes, they are produced in one transaction that also commits a **marker**, the offset
//! `checkpoint` of the subtask's marker group on the topic's partition 0 (Kafka commits a
//! transaction's offsets atomically with its records). A restore produces exactly the staged
//! checkpoints past the marker: a transaction that committed is never repeated, one that did
//! not is made whole. Consumers read with `isolation.level=read_committed`.
//!
//! The transactional id is `eddy-<job>-<subtask>`, so a new run fences a zombie of the same
//! subtask; the marker group is `eddy-sink.<job>.<subtask>.<run>` with `<run>` new for every
//! sink instance, so a marker left by an earlier lineage (checkpoints deleted, ids restarting
//! at 1) is never mistaken for this one's. A transaction lasts only while a completed
//! checkpoint's records are sent, so `transaction.timeout.ms` (and the broker's
//! `transaction.max.timeout.ms`) need not cover the checkpoint interval.

use std::time::Duration;

use eddy_plan::KafkaSinkSpec;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::{Deliveries, OutRecord, send};
use crate::source::kafka::client_properties;

/// How long joining, committing or reading a marker may take before the job fails.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes in a checkpoint's sink state: UTF-8 text as it is (JSON values stay readable), other
/// bytes as hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    /// Valid UTF-8.
    Utf8(String),
    /// Anything else, hex-encoded.
    Hex(String),
}

impl Payload {
    fn new(bytes: Vec<u8>) -> Payload {
        match String::from_utf8(bytes) {
            Ok(text) => Payload::Utf8(text),
            Err(e) => Payload::Hex(e.into_bytes().iter().map(|b| format!("{b:02x}")).collect()),
        }
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            Payload::Utf8(text) => Ok(text.as_bytes().to_vec()),
            Payload::Hex(hex) if hex.len() % 2 == 0 => (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16).map_err(|e| e.to_string()))
                .collect(),
            Payload::Hex(_) => Err("odd hex length".into()),
        }
    }
}

/// One staged record, as it will be produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedRecord {
    /// The Kafka key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Payload>,
    /// The Kafka value.
    pub value: Payload,
    /// The record's timestamp, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    /// The side output it came from (the `eddy.output` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl StagedRecord {
    pub(super) fn new(record: OutRecord) -> StagedRecord {
        StagedRecord {
            key: record.key.map(Payload::new),
            value: Payload::new(record.value),
            timestamp: record.timestamp,
            output: record.output,
        }
    }
}

/// The records written between two barriers, produced when checkpoint `checkpoint` completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedCheckpoint {
    /// The checkpoint whose barrier closed them (`u64::MAX`: the end of input).
    pub checkpoint: u64,
    /// In order.
    pub records: Vec<StagedRecord>,
}

/// A sink subtask's state in a checkpoint: its staged checkpoints not known to be produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaSinkState {
    /// The subtask (its transactional id).
    pub subtask: u32,
    /// Its marker group.
    pub group: String,
    /// Oldest first.
    pub staged: Vec<StagedCheckpoint>,
}

/// The marker offset of checkpoint `n` (the end of input is the largest).
fn marker_offset(checkpoint: u64) -> i64 {
    i64::try_from(checkpoint).unwrap_or(i64::MAX)
}

pub(super) fn transactional_id(job: &str, subtask: u32) -> String {
    format!("eddy-{job}-{subtask}")
}

/// A marker group no earlier sink instance used.
pub(super) fn new_group(job: &str, subtask: u32) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.write_u32(std::process::id());
    format!("eddy-sink.{job}.{subtask}.{:016x}", hasher.finish())
}

fn error(what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("kafka sink (exactly once): {what}"))
}

/// A transactional producer and the reader of its marker.
pub(super) struct Committer {
    topic: String,
    group: String,
    producer: ThreadedProducer<Deliveries>,
    deliveries: Deliveries,
    marker_reader: BaseConsumer,
}

impl Committer {
    /// Joins as `eddy-<job>-<subtask>` (fencing any earlier producer of that id and aborting
    /// what it left open) with marker group `group`.
    pub(super) fn open(spec: &KafkaSinkSpec, job: &str, subtask: u32, group: &str) -> std::io::Result<Committer> {
        let what = format!("kafka sink to `{}`", spec.topic);
        let mut config =
            client_properties(&what, &spec.brokers, spec.connection.as_deref(), &spec.properties).map_err(error)?;
        let mut reader_config = config.clone();
        reader_config.set("group.id", group).set("enable.auto.commit", "false");
        let marker_reader: BaseConsumer = reader_config.create().map_err(|e| error(format!("{what}: {e}")))?;
        config
            .set("transactional.id", transactional_id(job, subtask))
            .set("enable.idempotence", "true")
            .set("acks", "all");
        let deliveries = Deliveries::default();
        let producer: ThreadedProducer<Deliveries> =
            config.create_with_context(deliveries.clone()).map_err(|e| error(format!("{what}: {e}")))?;
        producer
            .init_transactions(TRANSACTION_TIMEOUT)
            .map_err(|e| error(format!("{what}: joining as {}: {e}", transactional_id(job, subtask))))?;
        Ok(Committer { topic: spec.topic.clone(), group: group.to_owned(), producer, deliveries, marker_reader })
    }

    /// The last checkpoint whose records this marker group committed.
    fn marker(&self) -> std::io::Result<Option<u64>> {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, 0);
        let committed = self
            .marker_reader
            .committed_offsets(list, TRANSACTION_TIMEOUT)
            .map_err(|e| error(format!("reading the marker of group `{}`: {e}", self.group)))?;
        let offset = committed.find_partition(&self.topic, 0).map(|p| p.offset());
        Ok(match offset {
            Some(Offset::Offset(n)) => u64::try_from(n).ok(),
            _ => None,
        })
    }

    /// Produces the staged checkpoints past the marker, with the marker, in one transaction.
    pub(super) fn commit(&mut self, staged: &[StagedCheckpoint]) -> std::io::Result<()> {
        let Some(last) = staged.last() else { return Ok(()) };
        let marker = self.marker()?;
        let pending: Vec<&StagedCheckpoint> =
            staged.iter().filter(|s| marker.is_none_or(|m| marker_offset(s.checkpoint) > marker_offset(m))).collect();
        if pending.is_empty() {
            return Ok(());
        }
        self.producer.begin_transaction().map_err(|e| error(format!("beginning a transaction: {e}")))?;
        let sent = self.send_all(&pending, last.checkpoint);
        if let Err(e) = sent {
            // Nothing of it becomes visible; the job restarts from its last checkpoint.
            let _ = self.producer.abort_transaction(TRANSACTION_TIMEOUT);
            return Err(e);
        }
        self.producer.commit_transaction(TRANSACTION_TIMEOUT).map_err(|e| {
            error(format!("committing checkpoint {}'s records to `{}`: {e}", last.checkpoint, self.topic))
        })?;
        self.deliveries.check(&self.topic)
    }

    fn send_all(&self, pending: &[&StagedCheckpoint], last: u64) -> std::io::Result<()> {
        for staged in pending {
            for r in &staged.records {
                let key = r.key.as_ref().map(Payload::bytes).transpose().map_err(error)?;
                let value = r.value.bytes().map_err(error)?;
                send(&self.producer, &self.topic, key.as_deref(), &value, r.timestamp, r.output.as_deref())?;
            }
        }
        let mut marker = TopicPartitionList::new();
        marker
            .add_partition_offset(&self.topic, 0, Offset::Offset(marker_offset(last)))
            .map_err(|e| error(format!("marker: {e}")))?;
        let group = self.marker_reader.group_metadata().ok_or_else(|| error("no group metadata for the marker"))?;
        self.producer
            .send_offsets_to_transaction(&marker, &group, TRANSACTION_TIMEOUT)
            .map_err(|e| error(format!("committing the marker of group `{}`: {e}", self.group)))?;
        self.deliveries.check(&self.topic)
    }
}

/// Produces what `state` staged and its marker group has not committed (a restore's recovery,
/// and the final checkpoint's commit once the subtask is gone).
pub fn commit_state(spec: &KafkaSinkSpec, job: &str, state: &KafkaSinkState) -> std::io::Result<()> {
    if state.staged.is_empty() {
        return Ok(());
    }
    Committer::open(spec, job, state.subtask, &state.group)?.commit(&state.staged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_keep_text_readable_and_every_byte_exact() {
        for bytes in [b"{\"n\":1}".to_vec(), vec![0xff, 0x00, 0x7f], Vec::new()] {
            let payload = Payload::new(bytes.clone());
            let text = serde_json::to_string(&payload).unwrap();
            let back: Payload = serde_json::from_str(&text).unwrap();
            assert_eq!(back.bytes().unwrap(), bytes, "{text}");
        }
        assert_eq!(Payload::new(b"ab".to_vec()), Payload::Utf8("ab".into()));
        assert_eq!(Payload::new(vec![0xff, 1]), Payload::Hex("ff01".into()));
        assert!(Payload::Hex("f".into()).bytes().is_err());
        assert!(Payload::Hex("zz".into()).bytes().is_err());
    }

    #[test]
    fn markers_order_checkpoints_and_the_end_of_input_last() {
        assert!(marker_offset(u64::MAX) > marker_offset(1 << 40));
        assert_eq!(marker_offset(7), 7);
        assert_ne!(new_group("j", 0), new_group("j", 0), "each sink instance has a group of its own");
        assert!(new_group("j", 3).starts_with("eddy-sink.j.3."));
    }
}
