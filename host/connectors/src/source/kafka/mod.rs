//! The Kafka source: a reader assigns itself the partitions it owns (no consumer group, as
//! Flink's `KafkaSource`), so its partitions and offsets are its position. A restore at another
//! parallelism hands every reader all partitions of the checkpoint and each keeps its own
//! ([`owner`]). Event time is tracked per partition ([`PartitionClock`]), so a quiet partition
//! stops holding back the reader once it is idle.
//!
//! The client is `rdkafka` (librdkafka, bundled) behind the `kafka` feature. Its calls that
//! wait on the broker (metadata, offsets) run at open and at each discovery; `poll` only takes
//! what the client has prefetched.

mod clock;
mod decode;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use eddy_checkpoint::KafkaPartition;
use eddy_core::RecordBatch;
use eddy_plan::{KafkaEnd, KafkaSourceSpec, KafkaStart, OnDecodeError, PropertyValue};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use xxhash_rust::xxh3::xxh3_64;

pub(crate) use clock::PartitionClock;

use super::{SourceError, SourcePosition, SourceStatus};

/// How long a call that waits on the brokers (metadata, offsets) may take at open.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long discovery, which runs on the task thread between polls, may wait.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(2);
/// A broker away makes the client report errors on many polls: at most one warning this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The reader of `readers` that owns `partition` of `topic`: partitions of one topic go round
/// the readers from a start that depends on the topic, so several topics spread evenly.
pub fn owner(topic: &str, partition: i32, readers: u32) -> u32 {
    let readers = u64::from(readers.max(1));
    let start = xxh3_64(topic.as_bytes()) % readers;
    let partition = u64::from(partition.unsigned_abs());
    u32::try_from((start + partition) % readers).unwrap_or(0)
}

/// One owned partition.
#[derive(Debug)]
struct Owned {
    topic: String,
    partition: i32,
    next_offset: i64,
    end_offset: Option<i64>,
    /// Its index in the clock.
    clock: usize,
}

impl Owned {
    fn done(&self) -> bool {
        self.end_offset.is_some_and(|end| self.next_offset >= end)
    }
}

/// Reader `subtask` of `parallelism` of a Kafka source.
pub(crate) struct KafkaSource {
    spec: KafkaSourceSpec,
    subtask: u32,
    parallelism: u32,
    consumer: BaseConsumer,
    owned: Vec<Owned>,
    /// Index into `owned` by topic, then partition: looked up by a message's borrowed topic
    /// name, so reading a record allocates nothing.
    index: BTreeMap<String, BTreeMap<i32, usize>>,
    clock: PartitionClock,
    pattern: Option<regex::Regex>,
    next_discovery: Instant,
    started: Instant,
    side: Vec<(String, RecordBatch)>,
    scratch: Vec<u8>,
    warned: Option<Instant>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("source", &self.spec.name)
            .field("subtask", &self.subtask)
            .field("partitions", &self.owned.len())
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Opens the reader: connects, finds the topics' partitions, keeps those it owns and
    /// resolves where each starts (from `start` when restoring).
    pub(crate) fn open(
        spec: &KafkaSourceSpec,
        subtask: u32,
        parallelism: u32,
        start: Option<&SourcePosition>,
    ) -> Result<Self, SourceError> {
        let broker = |problem: String| SourceError::Broker { source_name: spec.name.clone(), problem };
        let restored: Option<&[KafkaPartition]> = match start {
            None => None,
            Some(SourcePosition::Kafka { partitions }) => Some(partitions),
            Some(other) => {
                return Err(SourceError::BadPosition {
                    source_name: spec.name.clone(),
                    position: other.clone(),
                    problem: "a Kafka source resumes at partition offsets".into(),
                });
            }
        };
        let consumer = client_config(spec)?.create::<BaseConsumer>().map_err(|e| broker(e.to_string()))?;
        let pattern = spec.topic_matcher().map_err(|e| broker(format!("topic_pattern: {e}")))?;
        let watermarks = spec.watermarks.unwrap_or_default();
        let now = Instant::now();
        let mut reader = KafkaSource {
            spec: spec.clone(),
            subtask,
            parallelism,
            consumer,
            owned: Vec::new(),
            index: BTreeMap::new(),
            clock: PartitionClock::new(watermarks.out_of_orderness_ms, watermarks.idleness_ms),
            pattern,
            next_discovery: now + Duration::from_millis(spec.discovery_interval_ms),
            started: now,
            side: Vec::new(),
            scratch: Vec::new(),
            warned: None,
        };
        let present = reader.partitions(BROKER_TIMEOUT)?;
        let mut added = Vec::new();
        match restored {
            Some(partitions) => {
                for p in partitions.iter().filter(|p| owner(&p.topic, p.partition, parallelism) == subtask) {
                    // A bounded source keeps the end it fixed at its first start; one restored
                    // from an unbounded run ends at what is present now; an unbounded one reads on.
                    let end = match (spec.end, p.end_offset) {
                        (KafkaEnd::Unbounded, _) => None,
                        (KafkaEnd::AtStart, Some(end)) => Some(end),
                        (KafkaEnd::AtStart, None) => Some(reader.high_watermark(&p.topic, p.partition)?),
                    };
                    added.push(reader.adopt(p.topic.clone(), p.partition, p.next_offset, end));
                }
                // Partitions that appeared since the checkpoint are new: read from their start.
                if spec.end == KafkaEnd::Unbounded {
                    let new: Vec<(String, i32)> = present
                        .into_iter()
                        .filter(|tp| !partitions.iter().any(|p| (&p.topic, p.partition) == (&tp.0, tp.1)))
                        .collect();
                    added.extend(reader.adopt_new(new, KafkaStart::Earliest, BROKER_TIMEOUT)?);
                }
            }
            None => added.extend(reader.adopt_new(present, spec.start, BROKER_TIMEOUT)?),
        }
        reader.assign(&added)?;
        Ok(reader)
    }

    /// The partitions of the source's topics present now, owned by this reader.
    fn partitions(&self, timeout: Duration) -> Result<Vec<(String, i32)>, SourceError> {
        let broker = |problem: String| SourceError::Broker { source_name: self.spec.name.clone(), problem };
        let metadata = self
            .consumer
            .fetch_metadata(None, timeout)
            .map_err(|e| broker(format!("cannot read the topics of brokers `{}`: {e}", self.spec.brokers)))?;
        let mut found = Vec::new();
        for topic in metadata.topics() {
            let wanted = match &self.pattern {
                Some(p) => p.is_match(topic.name()),
                None => self.spec.topics.iter().any(|t| t == topic.name()),
            };
            if wanted && topic.error().is_none() {
                found.extend(topic.partitions().iter().map(|p| (topic.name().to_owned(), p.id())));
            }
        }
        if self.pattern.is_none()
            && let Some(missing) = self.spec.topics.iter().find(|t| !found.iter().any(|(name, _)| name == *t))
        {
            return Err(broker(format!(
                "topic `{missing}` does not exist on brokers `{}`: create it, or fix `topics`",
                self.spec.brokers
            )));
        }
        found.retain(|(t, p)| owner(t, *p, self.parallelism) == self.subtask);
        found.sort();
        Ok(found)
    }

    fn high_watermark(&self, topic: &str, partition: i32) -> Result<i64, SourceError> {
        let (_, high) =
            self.consumer.fetch_watermarks(topic, partition, BROKER_TIMEOUT).map_err(|e| SourceError::Broker {
                source_name: self.spec.name.clone(),
                problem: format!("cannot read the offsets of `{topic}` partition {partition}: {e}"),
            })?;
        Ok(high)
    }

    /// Takes partitions that no position covers, starting each at `start`; a bounded source
    /// also fixes where each ends.
    fn adopt_new(
        &mut self,
        partitions: Vec<(String, i32)>,
        start: KafkaStart,
        timeout: Duration,
    ) -> Result<Vec<usize>, SourceError> {
        let broker = |problem: String| SourceError::Broker { source_name: self.spec.name.clone(), problem };
        let mut starts = Vec::new();
        for (topic, partition) in &partitions {
            let (low, high) = self
                .consumer
                .fetch_watermarks(topic, *partition, timeout)
                .map_err(|e| broker(format!("cannot read the offsets of `{topic}` partition {partition}: {e}")))?;
            starts.push((low, high));
        }
        let resolved: Vec<i64> = match start {
            KafkaStart::Earliest => starts.iter().map(|(low, _)| *low).collect(),
            KafkaStart::Latest => starts.iter().map(|(_, high)| *high).collect(),
            KafkaStart::Timestamp(ms) => self.offsets_for(&partitions, Offset::Offset(ms), &starts, timeout)?,
            KafkaStart::GroupOffsets => self.offsets_for(&partitions, Offset::Stored, &starts, timeout)?,
        };
        let mut added = Vec::new();
        for (((topic, partition), next), (_, high)) in partitions.into_iter().zip(resolved).zip(starts) {
            let end = (self.spec.end == KafkaEnd::AtStart).then_some(high);
            added.push(self.adopt(topic, partition, next, end));
        }
        Ok(added)
    }

    /// Resolves timestamps (`Offset::Offset(ms)`) or the group's committed offsets
    /// (`Offset::Stored`) to offsets; a partition with none starts at its low watermark, or
    /// for a timestamp past every record, at its end.
    fn offsets_for(
        &self,
        partitions: &[(String, i32)],
        query: Offset,
        watermarks: &[(i64, i64)],
        timeout: Duration,
    ) -> Result<Vec<i64>, SourceError> {
        let broker = |problem: String| SourceError::Broker { source_name: self.spec.name.clone(), problem };
        let mut list = TopicPartitionList::new();
        for (topic, partition) in partitions {
            list.add_partition_offset(topic, *partition, query).map_err(|e| broker(e.to_string()))?;
        }
        let answered = match query {
            Offset::Stored => self.consumer.committed_offsets(list, timeout),
            _ => self.consumer.offsets_for_times(list, timeout),
        }
        .map_err(|e| broker(format!("cannot resolve the start offsets: {e}")))?;
        Ok(partitions
            .iter()
            .zip(watermarks)
            .map(|((topic, partition), (low, high))| {
                match answered.find_partition(topic, *partition).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o.clamp(*low, *high),
                    Some(Offset::End) => *high,
                    _ if matches!(query, Offset::Offset(_)) => *high,
                    _ => *low,
                }
            })
            .collect())
    }

    fn owned_at(&self, topic: &str, partition: i32) -> Option<usize> {
        self.index.get(topic).and_then(|p| p.get(&partition)).copied()
    }

    fn adopt(&mut self, topic: String, partition: i32, next_offset: i64, end_offset: Option<i64>) -> usize {
        let clock = self.clock.add(self.started.elapsed());
        let at = self.owned.len();
        self.index.entry(topic.clone()).or_default().insert(partition, at);
        self.owned.push(Owned { topic, partition, next_offset, end_offset, clock });
        if self.owned[at].done() {
            self.clock.end(clock);
        }
        at
    }

    /// Starts fetching the partitions `added` (indices into `owned`) at their offsets.
    fn assign(&mut self, added: &[usize]) -> Result<(), SourceError> {
        let mut list = TopicPartitionList::new();
        for o in added.iter().map(|&i| &self.owned[i]).filter(|o| !o.done()) {
            list.add_partition_offset(&o.topic, o.partition, Offset::Offset(o.next_offset))
                .map_err(|e| SourceError::Broker { source_name: self.spec.name.clone(), problem: e.to_string() })?;
        }
        if list.count() == 0 {
            return Ok(());
        }
        self.consumer
            .incremental_assign(&list)
            .map_err(|e| SourceError::Broker { source_name: self.spec.name.clone(), problem: e.to_string() })
    }

    /// Looks for partitions and topics created since the last look (unbounded sources only).
    fn discover(&mut self) -> Result<(), SourceError> {
        self.next_discovery = Instant::now() + Duration::from_millis(self.spec.discovery_interval_ms);
        if self.spec.end == KafkaEnd::AtStart {
            return Ok(());
        }
        let present = match self.partitions(DISCOVERY_TIMEOUT) {
            Ok(p) => p,
            // The brokers may be away for a while; the client reconnects, and discovery tries
            // again at the next interval.
            Err(e) => {
                tracing::warn!(source = %self.spec.name, error = %e, "partition discovery failed; trying again later");
                return Ok(());
            }
        };
        let new: Vec<(String, i32)> = present.into_iter().filter(|(t, p)| self.owned_at(t, *p).is_none()).collect();
        if new.is_empty() {
            return Ok(());
        }
        tracing::info!(source = %self.spec.name, partitions = ?new, "reading new partitions from their start");
        let added = self.adopt_new(new, KafkaStart::Earliest, DISCOVERY_TIMEOUT)?;
        self.assign(&added)
    }

    /// A partition reached the end of what the broker holds: where the client stands there
    /// (past control records of transactions, which are never delivered) is where it is.
    fn on_partition_end(&mut self, partition: i32) {
        let Ok(positions) = self.consumer.position() else { return };
        for o in self.owned.iter_mut().filter(|o| o.partition == partition) {
            if let Some(Offset::Offset(at)) = positions.find_partition(&o.topic, o.partition).map(|e| e.offset()) {
                o.next_offset = o.next_offset.max(at);
            }
        }
        self.finish_done();
    }

    /// Stops the clock of, and unassigns, the partitions that reached their end.
    fn finish_done(&mut self) {
        let mut list = TopicPartitionList::new();
        for o in self.owned.iter().filter(|o| o.done() && !self.clock.ended(o.clock)) {
            list.add_partition(&o.topic, o.partition);
        }
        for o in &self.owned {
            if o.done() {
                self.clock.end(o.clock);
            }
        }
        if list.count() > 0 {
            let _ = self.consumer.incremental_unassign(&list);
        }
    }

    fn side_output(&mut self, name: &str) -> &mut RecordBatch {
        if let Some(i) = self.side.iter().position(|(n, _)| n == name) {
            return &mut self.side[i].1;
        }
        self.side.push((name.to_owned(), RecordBatch::default()));
        let last = self.side.len() - 1;
        &mut self.side[last].1
    }
}

impl super::Source for KafkaSource {
    fn poll(&mut self, out: &mut RecordBatch, max: usize) -> Result<SourceStatus, SourceError> {
        if Instant::now() >= self.next_discovery {
            self.discover()?;
        }
        if !self.owned.is_empty() && self.owned.iter().all(Owned::done)
            || self.owned.is_empty() && self.spec.end == KafkaEnd::AtStart
        {
            return Ok(SourceStatus::End);
        }
        let mut appended = 0;
        while appended < max {
            let message = match self.consumer.poll(Duration::ZERO) {
                None => break,
                Some(Ok(m)) => m,
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    self.on_partition_end(partition);
                    continue;
                }
                Some(Err(e)) => {
                    if e.rdkafka_error_code()
                        .is_some_and(|c| c == rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition)
                        || matches!(e, KafkaError::MessageConsumptionFatal(_))
                    {
                        return Err(SourceError::Broker {
                            source_name: self.spec.name.clone(),
                            problem: e.to_string(),
                        });
                    }
                    // Transient (a broker away, a leader moving): the client retries by itself.
                    if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                        self.warned = Some(Instant::now());
                        tracing::warn!(source = %self.spec.name, error = %e, "kafka consumer error; the client retries");
                    }
                    break;
                }
            };
            let Some(at) = self.owned_at(message.topic(), message.partition()) else { continue };
            let offset = message.offset();
            let owned = &self.owned[at];
            if offset < owned.next_offset || owned.done() {
                continue;
            }
            if owned.end_offset.is_some_and(|end| offset >= end) {
                self.owned[at].next_offset = offset;
                self.finish_done();
                continue;
            }
            let kafka_time = message.timestamp().to_millis();
            match decode::decode(&self.spec, message.payload(), kafka_time, &mut self.scratch) {
                Ok(time) => {
                    let key = if self.spec.key { message.key() } else { None };
                    out.push(key, &self.scratch, time);
                    if let Some(t) = time {
                        self.clock.on_record(owned.clock, t, self.started.elapsed());
                    }
                    appended += 1;
                }
                Err(problem) => {
                    let place = format!("`{}` partition {} offset {offset}", message.topic(), message.partition());
                    match self.spec.on_error.clone() {
                        OnDecodeError::Fail => {
                            return Err(SourceError::BadRecord {
                                source_name: self.spec.name.clone(),
                                at: place,
                                problem,
                            });
                        }
                        OnDecodeError::SideOutput(name) => {
                            let rejected = decode::rejected(
                                message.topic(),
                                message.partition(),
                                offset,
                                &problem,
                                message.payload(),
                            );
                            self.side_output(&name).push(None, &rejected, kafka_time);
                        }
                    }
                }
            }
            self.owned[at].next_offset = offset + 1;
            if self.owned[at].done() {
                self.finish_done();
            }
        }
        Ok(if appended > 0 { SourceStatus::Ready } else { SourceStatus::Idle })
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::Kafka {
            partitions: self
                .owned
                .iter()
                .map(|o| KafkaPartition {
                    topic: o.topic.clone(),
                    partition: o.partition,
                    next_offset: o.next_offset,
                    end_offset: o.end_offset,
                })
                .collect(),
        }
    }

    fn watermark(&mut self) -> Option<i64> {
        Some(self.clock.current(self.started.elapsed()))
    }

    fn take_side(&mut self) -> Vec<(String, RecordBatch)> {
        self.side.retain(|(_, b)| !b.is_empty());
        std::mem::take(&mut self.side)
    }
}

/// A client configuration for `brokers` holding `properties`, secrets read from the
/// environment; `what` names the connector in errors. A `connection` is the service's to
/// resolve: one left here was never placed.
pub(crate) fn client_properties(
    what: &str,
    brokers: &str,
    connection: Option<&str>,
    properties: &BTreeMap<String, PropertyValue>,
) -> Result<ClientConfig, String> {
    if let Some(name) = connection {
        return Err(crate::unresolved_connection(what, name));
    }
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (key, value) in properties {
        let value = match value {
            PropertyValue::Text(text) => text.clone(),
            PropertyValue::Env { env } => std::env::var(env).map_err(|_| {
                format!("{what}: property `{key}` is read from the environment variable `{env}`, which is not set")
            })?,
        };
        config.set(key, value);
    }
    Ok(config)
}

/// The client's settings: the spec's properties, then what the source owns (it assigns
/// partitions itself and never commits, so the group is only read for `start: group_offsets`).
fn client_config(spec: &KafkaSourceSpec) -> Result<ClientConfig, SourceError> {
    let what = format!("source `{}`", spec.name);
    let mut config = client_properties(&what, &spec.brokers, spec.connection.as_deref(), &spec.properties)
        .map_err(|problem| SourceError::Broker { source_name: spec.name.clone(), problem })?;
    config
        .set("group.id", spec.group.clone().unwrap_or_else(|| format!("eddy-{}", spec.name)))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", if spec.end == KafkaEnd::AtStart { "true" } else { "false" })
        .set("isolation.level", "read_committed");
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::owner;

    #[test]
    fn every_partition_has_one_owner_and_the_readers_share_them_evenly() {
        for readers in 1..=7u32 {
            for topic in ["purchases", "orders", "a"] {
                let mut counts = vec![0u32; readers as usize];
                for partition in 0..(readers as i32 * 3) {
                    let o = owner(topic, partition, readers);
                    assert!(o < readers);
                    counts[o as usize] += 1;
                }
                assert!(counts.iter().all(|&c| c == 3), "{topic} over {readers}: {counts:?}");
            }
        }
        // Consecutive partitions go to consecutive readers.
        let first = owner("t", 0, 4);
        assert_eq!(owner("t", 1, 4), (first + 1) % 4);
    }
}
