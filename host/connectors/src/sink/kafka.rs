//! The Kafka sink, at least once: an idempotent producer (no duplicates from its own retries),
//! flushed at every barrier, so a checkpoint completes only when every record before it is
//! acknowledged by the brokers. After a failure the records since the last completed
//! checkpoint are written again: consumers see every record, some twice.
//!
//! A record's key becomes the Kafka key (so the default partitioner keeps a key's records in
//! one partition, in order); its value is rendered as JSON (`format: json`, rows with their
//! field names) or written as it is (`raw`). A side output's records carry the header
//! `eddy.output` with its name.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eddy_core::RecordBatch;
use eddy_plan::{KafkaSinkFormat, KafkaSinkSpec};
use rdkafka::ClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use super::Sink;
use crate::source::kafka::client_properties;
use crate::values::json_text;

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

/// One sink subtask's producer.
pub struct KafkaSink {
    spec: KafkaSinkSpec,
    producer: ThreadedProducer<Deliveries>,
    deliveries: Deliveries,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("topic", &self.spec.topic).finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Connects a producer for `spec`.
    pub fn open(spec: &KafkaSinkSpec) -> std::io::Result<Self> {
        let mut config = client_properties(&format!("kafka sink to `{}`", spec.topic), &spec.properties)
            .map_err(std::io::Error::other)?;
        config.set("bootstrap.servers", &spec.brokers).set("enable.idempotence", "true").set("acks", "all");
        let deliveries = Deliveries::default();
        let producer = config
            .create_with_context(deliveries.clone())
            .map_err(|e| std::io::Error::other(format!("kafka sink to `{}`: {e}", spec.topic)))?;
        Ok(KafkaSink { spec: spec.clone(), producer, deliveries, scratch: Vec::new() })
    }

    fn check_deliveries(&self) -> std::io::Result<()> {
        let failed = self.deliveries.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match failed.as_ref() {
            Some(e) => Err(std::io::Error::other(format!(
                "kafka sink: the brokers `{}` refused a record for topic `{}`: {e}",
                self.spec.brokers, self.spec.topic
            ))),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.producer.flush(FLUSH_TIMEOUT).map_err(|e| {
            std::io::Error::other(format!(
                "kafka sink: records for topic `{}` not acknowledged within {FLUSH_TIMEOUT:?}: {e}",
                self.spec.topic
            ))
        })?;
        self.check_deliveries()
    }
}

impl Sink for KafkaSink {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        self.check_deliveries()?;
        for r in batch.iter() {
            self.scratch.clear();
            match self.spec.format {
                KafkaSinkFormat::Json => self.scratch.extend_from_slice(&json_text(r.value)),
                KafkaSinkFormat::Raw => self.scratch.extend_from_slice(r.value),
            }
            let mut record = BaseRecord::<[u8], [u8]>::to(&self.spec.topic).payload(&self.scratch[..]);
            if let Some(key) = r.key {
                record = record.key(key);
            }
            if let Some(t) = r.timestamp {
                record = record.timestamp(t);
            }
            if let Some(name) = output {
                record = record.headers(OwnedHeaders::new().insert(Header { key: "eddy.output", value: Some(name) }));
            }
            let mut pending = record;
            loop {
                match self.producer.send(pending) {
                    Ok(()) => break,
                    Err((e, back)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                        // The client's queue is full: wait for acknowledgements to free it.
                        std::thread::sleep(Duration::from_millis(1));
                        pending = back;
                    }
                    Err((e, _)) => {
                        return Err(std::io::Error::other(format!(
                            "kafka sink: cannot write to topic `{}`: {e}",
                            self.spec.topic
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.flush()
    }

    /// At least once: everything before the barrier is acknowledged before the checkpoint may
    /// complete; nothing to record.
    fn pre_commit(&mut self, _checkpoint: u64) -> std::io::Result<Option<serde_json::Value>> {
        self.flush()?;
        Ok(None)
    }
}
