//! The Kafka sink. At least once (`delivery: at_least_once`, the default): an idempotent
//! producer (no duplicates from its own retries), flushed at every barrier, so a checkpoint
//! completes only when every record before it is acknowledged by the brokers. After a failure
//! the records since the last completed checkpoint are written again: consumers see every
//! record, some twice. Exactly once: see [`staged`].
//!
//! A record's key becomes the Kafka key (so the default partitioner keeps a key's records in
//! one partition, in order); its value is rendered as JSON (`format: json`, rows with their
//! field names) or written as it is (`raw`). A side output's records carry the header
//! `eddy.output` with its name.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eddy_core::RecordBatch;
use eddy_plan::{KafkaDelivery, KafkaSinkFormat, KafkaSinkSpec};
use rdkafka::ClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use super::Sink;
use crate::source::kafka::client_properties;
use crate::values::json_text;

mod staged;

use staged::{Committer, StagedCheckpoint, StagedRecord};
pub use staged::{KafkaSinkState, commit_state};

/// How long a barrier waits for the brokers to acknowledge what was written before it.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// Remembers the first record the brokers refused, so the next write or flush fails with it.
#[derive(Clone, Default)]
struct Deliveries {
    failed: Arc<Mutex<Option<String>>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            failed.get_or_insert_with(|| e.to_string());
        }
    }
}

impl Deliveries {
    /// Fails with the first refused record, if any.
    fn check(&self, topic: &str) -> std::io::Result<()> {
        let failed = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match failed.as_ref() {
            Some(e) => {
                Err(std::io::Error::other(format!("kafka sink: the brokers refused a record for topic `{topic}`: {e}")))
            }
            None => Ok(()),
        }
    }
}

/// A record as it is produced: the value rendered, the side output named.
pub(super) struct OutRecord {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    timestamp: Option<i64>,
    output: Option<String>,
}

/// Sends one record, waiting while the client's queue is full.
fn send(
    producer: &ThreadedProducer<Deliveries>,
    topic: &str,
    key: Option<&[u8]>,
    value: &[u8],
    timestamp: Option<i64>,
    output: Option<&str>,
) -> std::io::Result<()> {
    let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(value);
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(t) = timestamp {
        record = record.timestamp(t);
    }
    if let Some(name) = output {
        record = record.headers(OwnedHeaders::new().insert(Header { key: "eddy.output", value: Some(name) }));
    }
    let mut pending = record;
    loop {
        match producer.send(pending) {
            Ok(()) => return Ok(()),
            Err((e, back)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                // The client's queue is full: wait for acknowledgements to free it.
                std::thread::sleep(Duration::from_millis(1));
                pending = back;
            }
            Err((e, _)) => {
                return Err(std::io::Error::other(format!("kafka sink: cannot write to topic `{topic}`: {e}")));
            }
        }
    }
}

/// What an exactly-once subtask holds: records since the last barrier, checkpoints closed
/// but not yet produced, and the producer that commits them.
struct Staging {
    subtask: u32,
    group: String,
    current: Vec<StagedRecord>,
    current_bytes: u64,
    closed: Vec<StagedCheckpoint>,
    committer: Committer,
}

/// One sink subtask's producer.
pub struct KafkaSink {
    spec: KafkaSinkSpec,
    producer: Option<ThreadedProducer<Deliveries>>,
    deliveries: Deliveries,
    staging: Option<Staging>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("topic", &self.spec.topic).finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Connects subtask `subtask` of `job`'s sink for `spec`: a producer at least once; exactly
    /// once, a transactional producer that commits staged checkpoints.
    pub fn open(spec: &KafkaSinkSpec, job: &str, subtask: u32) -> std::io::Result<Self> {
        let deliveries = Deliveries::default();
        if spec.delivery == KafkaDelivery::ExactlyOnce {
            let group = staged::new_group(job, subtask);
            let committer = Committer::open(spec, job, subtask, &group)?;
            let staging =
                Staging { subtask, group, current: Vec::new(), current_bytes: 0, closed: Vec::new(), committer };
            return Ok(KafkaSink {
                spec: spec.clone(),
                producer: None,
                deliveries,
                staging: Some(staging),
                scratch: Vec::new(),
            });
        }
        let what = format!("kafka sink to `{}`", spec.topic);
        let mut config = client_properties(&what, &spec.brokers, spec.connection.as_deref(), &spec.properties)
            .map_err(std::io::Error::other)?;
        config.set("enable.idempotence", "true").set("acks", "all");
        let producer = config
            .create_with_context(deliveries.clone())
            .map_err(|e| std::io::Error::other(format!("kafka sink to `{}`: {e}", spec.topic)))?;
        Ok(KafkaSink { spec: spec.clone(), producer: Some(producer), deliveries, staging: None, scratch: Vec::new() })
    }

    /// Readies the topic for a run of `job` restored from a checkpoint whose sink subtasks
    /// stored `restored`: every staged checkpoint their markers do not cover is produced.
    pub fn recover(spec: &KafkaSinkSpec, job: &str, restored: &[KafkaSinkState]) -> std::io::Result<()> {
        for state in restored {
            commit_state(spec, job, state)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let Some(producer) = &self.producer else { return Ok(()) };
        producer.flush(FLUSH_TIMEOUT).map_err(|e| {
            std::io::Error::other(format!(
                "kafka sink: records for topic `{}` not acknowledged within {FLUSH_TIMEOUT:?}: {e}",
                self.spec.topic
            ))
        })?;
        self.deliveries.check(&self.spec.topic)
    }
}

impl Sink for KafkaSink {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        self.deliveries.check(&self.spec.topic)?;
        for r in batch.iter() {
            self.scratch.clear();
            match self.spec.format {
                KafkaSinkFormat::Json => self.scratch.extend_from_slice(&json_text(r.value)),
                KafkaSinkFormat::Raw => self.scratch.extend_from_slice(r.value),
            }
            match (&self.producer, &mut self.staging) {
                (Some(producer), _) => send(producer, &self.spec.topic, r.key, &self.scratch, r.timestamp, output)?,
                (None, Some(staging)) => {
                    // What the staged record holds in memory: its bytes and its own size.
                    let bytes = (r.key.map_or(0, <[u8]>::len)
                        + self.scratch.len()
                        + output.map_or(0, str::len)
                        + std::mem::size_of::<StagedRecord>()) as u64;
                    staging.current_bytes += bytes;
                    if staging.current_bytes > self.spec.max_staged_bytes {
                        return Err(std::io::Error::other(format!(
                            "kafka sink (exactly once): more than max_staged_bytes ({}) written between two \
                             checkpoints; they are held until the checkpoint completes: checkpoint more often, or \
                             raise `max_staged_bytes`",
                            self.spec.max_staged_bytes
                        )));
                    }
                    staging.current.push(StagedRecord::new(OutRecord {
                        key: r.key.map(<[u8]>::to_vec),
                        value: self.scratch.clone(),
                        timestamp: r.timestamp,
                        output: output.map(str::to_owned),
                    }));
                }
                (None, None) => return Err(std::io::Error::other("kafka sink: no producer")),
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.flush()
    }

    /// At least once: everything before the barrier is acknowledged before the checkpoint may
    /// complete; nothing to record. Exactly once: the records since the last barrier close as
    /// checkpoint `checkpoint`'s, and the state holds every closed checkpoint not yet produced.
    fn pre_commit(&mut self, checkpoint: u64) -> std::io::Result<Option<serde_json::Value>> {
        self.flush()?;
        let Some(staging) = &mut self.staging else { return Ok(None) };
        if !staging.current.is_empty() {
            let records = std::mem::take(&mut staging.current);
            staging.current_bytes = 0;
            staging.closed.push(StagedCheckpoint { checkpoint, records });
        }
        let state =
            KafkaSinkState { subtask: staging.subtask, group: staging.group.clone(), staged: staging.closed.clone() };
        serde_json::to_value(state).map(Some).map_err(std::io::Error::other)
    }

    fn notify_complete(&mut self, checkpoint: u64) -> std::io::Result<()> {
        let Some(staging) = &mut self.staging else { return Ok(()) };
        let done = staging.closed.iter().take_while(|s| s.checkpoint <= checkpoint).count();
        if done == 0 {
            return Ok(());
        }
        staging.committer.commit(&staging.closed[..done])?;
        staging.closed.drain(..done);
        Ok(())
    }
}
