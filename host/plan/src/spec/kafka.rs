//! The Kafka source's spec: which topics, where to start and end, how values become records,
//! and the librdkafka properties passed through.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{SpecError, WatermarkSpec, check_connection_name, invalid, one};

/// Properties a spec may not set, because the source owns them: assignment, offsets and
/// isolation decide what a checkpoint covers.
const OWNED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "auto.offset.reset",
    "group.id",
    "isolation.level",
];

/// Properties whose value is a secret: given only as `{env: NAME}`, never inline, so a spec
/// can be shown, logged and stored without them.
pub const SECRET_PROPERTIES: &[&str] =
    &["sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.password", "ssl.key.pem", "ssl.keystore.password"];

/// A Kafka source: `parallelism` readers share the partitions of `topics` (or of the topics
/// matching `topic_pattern`). Readers assign partitions themselves (no consumer group), so a
/// reader's partitions and offsets are its checkpointed position.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceSpec {
    /// Unique among sources.
    pub name: String,
    /// Bootstrap brokers, `host:port[,host:port...]`; or give `connection`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub brokers: String,
    /// A named connection of the service (`PUT /v1/connections/{name}`): its brokers and
    /// properties, secrets included, replace `brokers` when the job is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// Topics read; or give `topic_pattern`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    /// A regular expression matched against whole topic names; topics created later that match
    /// are found by discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_pattern: Option<String>,
    /// Parallel readers; partition `p` of topic `t` is read by reader
    /// `(hash(t) + p) % parallelism`. May change across a restore.
    #[serde(default = "one")]
    pub parallelism: u32,
    /// How a record's value becomes the record's value.
    #[serde(default)]
    pub format: KafkaFormat,
    /// Where each partition is read from when the job starts without a checkpoint.
    #[serde(default)]
    pub start: KafkaStart,
    /// Where reading ends.
    #[serde(default)]
    pub end: KafkaEnd,
    /// JSON pointer (e.g. `/ts`) to the event time in ms in a JSON value; none = the Kafka
    /// record's timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    /// The Kafka record's key becomes the record's key (its bytes as they are).
    #[serde(default)]
    pub key: bool,
    /// The consumer group whose committed offsets `start: group_offsets` reads. Eddy never
    /// commits offsets: recovery uses its checkpoints only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// How often the readers look for new partitions and topics, ms.
    #[serde(default = "default_discovery_interval_ms")]
    pub discovery_interval_ms: u64,
    /// What a record that cannot be decoded does.
    #[serde(default)]
    pub on_error: OnDecodeError,
    /// Per-partition watermarks: bounded out-of-orderness and idleness of each partition,
    /// combined per reader (the smallest of the partitions that are not idle). Default: the
    /// pipeline's `watermarks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermarks: Option<WatermarkSpec>,
    /// librdkafka properties passed through (security settings such as `security.protocol`,
    /// `sasl.mechanism`, `sasl.username`; tuning). Secrets (`sasl.password`, ...) only as
    /// `{env: NAME}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, PropertyValue>,
}

/// A librdkafka property's value.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PropertyValue {
    /// Given in the spec.
    Text(String),
    /// Read from an environment variable of the process that runs the reader.
    Env {
        /// The variable.
        env: String,
    },
}

/// How a Kafka record's value becomes a record value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaFormat {
    /// The bytes as they are (JSON or rows the operator reads itself).
    Raw,
    /// UTF-8 text, a JSON string.
    Lines,
    /// A JSON value.
    #[default]
    Json,
}

/// Where a partition is read from when the job starts afresh.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaStart {
    /// The first record kept.
    #[default]
    Earliest,
    /// After the last record present at start.
    Latest,
    /// The first record at or after this time, ms since the epoch.
    Timestamp(i64),
    /// The offsets `group` committed (the earliest where it committed none).
    GroupOffsets,
}

/// Where reading ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaEnd {
    /// Never: new records, partitions and topics are read as they come.
    #[default]
    Unbounded,
    /// At the offsets present when the job first started (kept across restores), over the
    /// partitions present then: for tests and backfills.
    AtStart,
}

/// What a record that cannot be decoded does.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDecodeError {
    /// Fails the job, naming the topic, partition and offset.
    #[default]
    Fail,
    /// Goes to this side output as `{"topic", "partition", "offset", "error", "value"}`
    /// (`value`: the bytes as text, invalid UTF-8 replaced) and reading goes on.
    SideOutput(String),
}

fn default_discovery_interval_ms() -> u64 {
    10_000
}

/// Most topics a source lists.
pub const MAX_TOPICS: usize = 1024;
/// Longest `topic_pattern`, in bytes.
pub const MAX_TOPIC_PATTERN_BYTES: usize = 1024;
/// The most memory a compiled `topic_pattern` may take: a short pattern can compile into a
/// large automaton (`a{1000}{1000}`), so the text's length alone bounds nothing.
pub const MAX_TOPIC_PATTERN_COMPILED_BYTES: usize = 1 << 20;
/// Longest `brokers` list and `group` name, in bytes.
pub const MAX_ADDRESS_BYTES: usize = 4096;
/// Most librdkafka properties a connector passes.
pub const MAX_PROPERTIES: usize = 128;
/// Longest property name; longest value (room for a PEM certificate chain).
pub const MAX_PROPERTY_NAME_BYTES: usize = 256;
/// Longest property value.
pub const MAX_PROPERTY_VALUE_BYTES: usize = 64 << 10;

/// Checks a `brokers` list (present and bounded) or a `connection` name, exactly one of them.
fn check_brokers(field: &dyn Fn(&str) -> String, brokers: &str, connection: Option<&str>) -> Result<(), SpecError> {
    if let Some(name) = connection {
        if !brokers.is_empty() {
            return Err(invalid(field("brokers"), "give `brokers` or `connection`, not both"));
        }
        return check_connection_name(name).map_err(|problem| invalid(field("connection"), problem));
    }
    if brokers.trim().is_empty() {
        return Err(invalid(field("brokers"), "needs at least one `host:port` (or a `connection`)"));
    }
    if brokers.len() > MAX_ADDRESS_BYTES {
        return Err(invalid(
            field("brokers"),
            format!("{} bytes, above the limit of {MAX_ADDRESS_BYTES} (MAX_ADDRESS_BYTES)", brokers.len()),
        ));
    }
    Ok(())
}

impl KafkaSourceSpec {
    /// Checks the fields; `field` names one (`sources[0].topics`).
    /// The compiled `topic_pattern`, matching whole topic names, within
    /// [`MAX_TOPIC_PATTERN_COMPILED_BYTES`]; `None` without a pattern.
    pub fn topic_matcher(&self) -> Result<Option<regex::Regex>, String> {
        let Some(pattern) = &self.topic_pattern else { return Ok(None) };
        if pattern.len() > MAX_TOPIC_PATTERN_BYTES {
            return Err(format!(
                "{} bytes, above the limit of {MAX_TOPIC_PATTERN_BYTES} (MAX_TOPIC_PATTERN_BYTES)",
                pattern.len()
            ));
        }
        regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(MAX_TOPIC_PATTERN_COMPILED_BYTES)
            .build()
            .map(Some)
            .map_err(|e| {
                format!("not a regular expression within {MAX_TOPIC_PATTERN_COMPILED_BYTES} bytes compiled: {e}")
            })
    }

    pub(super) fn validate(&self, field: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
        check_brokers(field, &self.brokers, self.connection.as_deref())?;
        if self.topics.len() > MAX_TOPICS {
            return Err(invalid(
                field("topics"),
                format!("{} topics, above the limit of {MAX_TOPICS} (MAX_TOPICS)", self.topics.len()),
            ));
        }
        if self.group.as_ref().is_some_and(|g| g.is_empty() || g.len() > MAX_ADDRESS_BYTES) {
            return Err(invalid(field("group"), format!("must be 1 to {MAX_ADDRESS_BYTES} bytes")));
        }
        match (&self.topics[..], &self.topic_pattern) {
            ([], None) => return Err(invalid(field("topics"), "give `topics` or `topic_pattern`")),
            ([_, ..], Some(_)) => {
                return Err(invalid(field("topic_pattern"), "give `topics` or `topic_pattern`, not both"));
            }
            (_, Some(_)) => {
                self.topic_matcher().map_err(|problem| invalid(field("topic_pattern"), problem))?;
            }
            (topics, None) => {
                if let Some(bad) = topics.iter().find(|t| !valid_topic(t)) {
                    return Err(invalid(
                        field("topics"),
                        format!("`{bad}` is not a Kafka topic name (1 to 249 of letters, digits, `.`, `_`, `-`)"),
                    ));
                }
            }
        }
        if let Some(p) = &self.timestamp
            && !p.starts_with('/')
        {
            return Err(invalid(field("timestamp"), format!("`{p}` is not a JSON pointer such as `/ts`")));
        }
        if self.timestamp.is_some() && self.format != KafkaFormat::Json {
            return Err(invalid(field("timestamp"), "a field of the value needs `format: json`"));
        }
        if self.start == KafkaStart::GroupOffsets && self.group.is_none() {
            return Err(invalid(field("group"), "`start: group_offsets` needs the `group` whose offsets it reads"));
        }
        if self.discovery_interval_ms == 0 {
            return Err(invalid(field("discovery_interval_ms"), "must be positive"));
        }
        if let OnDecodeError::SideOutput(name) = &self.on_error {
            super::check_name(field("on_error.side_output"), name)?;
        }
        if let Some(w) = &self.watermarks {
            if w.out_of_orderness_ms < 0 {
                return Err(invalid(field("watermarks.out_of_orderness_ms"), "must not be negative"));
            }
            if w.idleness_ms.is_some_and(|ms| ms <= 0) {
                return Err(invalid(field("watermarks.idleness_ms"), "must be positive (omit it to disable idleness)"));
            }
        }
        check_properties(
            field,
            &self.properties,
            OWNED_PROPERTIES,
            "is set by the source itself (from `brokers`, `group` and its checkpoints)",
        )
    }
}

/// Refuses properties the connector owns and secrets given inline.
fn check_properties(
    field: &dyn Fn(&str) -> String,
    properties: &BTreeMap<String, PropertyValue>,
    owned: &[&str],
    why_owned: &str,
) -> Result<(), SpecError> {
    if properties.len() > MAX_PROPERTIES {
        return Err(invalid(
            field("properties"),
            format!("{} properties, above the limit of {MAX_PROPERTIES} (MAX_PROPERTIES)", properties.len()),
        ));
    }
    for (key, value) in properties {
        if key.len() > MAX_PROPERTY_NAME_BYTES {
            return Err(invalid(
                field("properties"),
                format!("a name of {} bytes, above the limit of {MAX_PROPERTY_NAME_BYTES}", key.len()),
            ));
        }
        let at = || field(&format!("properties.{key}"));
        let (PropertyValue::Text(text) | PropertyValue::Env { env: text }) = value;
        if text.len() > MAX_PROPERTY_VALUE_BYTES {
            return Err(invalid(
                at(),
                format!(
                    "{} bytes, above the limit of {MAX_PROPERTY_VALUE_BYTES} (MAX_PROPERTY_VALUE_BYTES)",
                    text.len()
                ),
            ));
        }
        if owned.contains(&key.as_str()) {
            return Err(invalid(at(), why_owned));
        }
        match value {
            PropertyValue::Text(_) if SECRET_PROPERTIES.contains(&key.as_str()) => {
                return Err(invalid(at(), "is a secret: give it as `{env: NAME}`, never inline"));
            }
            PropertyValue::Env { env } if env.is_empty() => {
                return Err(invalid(at(), "`env` names no variable"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Properties a Kafka sink's spec may not set: the sink owns delivery.
const SINK_OWNED_PROPERTIES: &[&str] =
    &["bootstrap.servers", "enable.idempotence", "acks", "transactional.id", "transaction.timeout.ms"];

/// A Kafka sink: each sink subtask (at its input's parallelism) produces to `topic`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkSpec {
    /// Bootstrap brokers, `host:port[,host:port...]`; or give `connection`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub brokers: String,
    /// A named connection of the service, as for the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// The topic written (it must exist).
    pub topic: String,
    /// The guarantee.
    #[serde(default)]
    pub delivery: KafkaDelivery,
    /// How a record's value becomes the Kafka value.
    #[serde(default)]
    pub format: KafkaSinkFormat,
    /// librdkafka properties passed through, as for the source.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, PropertyValue>,
    /// Exactly once: the most record bytes one sink subtask holds between two checkpoints
    /// (they are kept in the checkpoint until it completes); more fails the job.
    #[serde(default = "default_max_staged_bytes")]
    pub max_staged_bytes: u64,
}

fn default_max_staged_bytes() -> u64 {
    16 << 20
}

/// The largest `max_staged_bytes`: staged records live in memory and in the checkpoint's
/// metadata.
pub const MAX_STAGED_BYTES: u64 = 256 << 20;

/// What a Kafka sink guarantees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaDelivery {
    /// Every record is written; after a failure, records since the last completed checkpoint
    /// are written again.
    #[default]
    AtLeastOnce,
    /// A checkpoint's records are kept in the checkpoint and produced in one transaction when
    /// it completes, with a marker committed in the same transaction, so a restore produces
    /// exactly the checkpoints whose transaction did not commit.
    ExactlyOnce,
}

/// How a record's value becomes a Kafka value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaSinkFormat {
    /// JSON (rows rendered with their field names).
    #[default]
    Json,
    /// The value's bytes as they are.
    Raw,
}

impl KafkaSinkSpec {
    /// Checks the fields; `field` names one (`sink.topic`).
    pub(super) fn validate(&self, field: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
        check_brokers(field, &self.brokers, self.connection.as_deref())?;
        if !valid_topic(&self.topic) {
            return Err(invalid(
                field("topic"),
                format!("`{}` is not a Kafka topic name (1 to 249 of letters, digits, `.`, `_`, `-`)", self.topic),
            ));
        }
        if !(1 << 20..=MAX_STAGED_BYTES).contains(&self.max_staged_bytes) {
            return Err(invalid(
                field("max_staged_bytes"),
                format!("{} is outside 1 MiB..=256 MiB (MAX_STAGED_BYTES)", self.max_staged_bytes),
            ));
        }
        check_properties(field, &self.properties, SINK_OWNED_PROPERTIES, "is set by the sink itself")
    }
}

fn valid_topic(topic: &str) -> bool {
    (1..=249).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use crate::{PipelineSpec, SourceSpec};

    use super::*;

    fn kafka(source: &str) -> Result<PipelineSpec, SpecError> {
        PipelineSpec::from_yaml(&format!(
            "name: k\nsources: [{source}]\nsteps: [{{name: a, wasm: a.wasm}}]\nsink: {{type: print}}"
        ))
    }

    #[test]
    fn the_interface_of_the_issue_parses_with_its_defaults() {
        let spec = kafka(
            "{type: kafka, name: purchases, brokers: \"127.0.0.1:9092\", topics: [purchases], format: json, start: \
             earliest, end: at_start, timestamp: /ts}",
        )
        .unwrap();
        let SourceSpec::Kafka(k) = &spec.sources[0] else { panic!("a kafka source") };
        assert_eq!(k.topics, ["purchases"]);
        assert_eq!((k.format, k.start, k.end), (KafkaFormat::Json, KafkaStart::Earliest, KafkaEnd::AtStart));
        assert_eq!(k.timestamp.as_deref(), Some("/ts"));
        assert_eq!((k.parallelism, k.key, k.discovery_interval_ms), (1, false, 10_000));
        assert_eq!(k.on_error, OnDecodeError::Fail);
        // The pipeline's watermarks are the partitions' when the source names none.
        assert_eq!(k.watermarks, Some(spec.watermarks));
        let spec = kafka(
            "{type: kafka, name: p, brokers: b:1, topic_pattern: 'orders-.*', start: {timestamp: 1700000000000}, \
             on_error: {side_output: bad}, properties: {security.protocol: sasl_ssl, sasl.password: {env: PW}}}",
        )
        .unwrap();
        let SourceSpec::Kafka(k) = &spec.sources[0] else { panic!("a kafka source") };
        assert_eq!(k.start, KafkaStart::Timestamp(1_700_000_000_000));
        assert_eq!(k.on_error, OnDecodeError::SideOutput("bad".into()));
        assert_eq!(k.properties["sasl.password"], PropertyValue::Env { env: "PW".into() });
    }

    #[test]
    fn mistakes_are_refused_naming_the_field() {
        let cases = [
            ("{type: kafka, name: p, brokers: b:1}", "sources[0].topics"),
            ("{type: kafka, name: p, brokers: '', topics: [t]}", "sources[0].brokers"),
            ("{type: kafka, name: p, brokers: b:1, topics: [t], topic_pattern: x}", "sources[0].topic_pattern"),
            ("{type: kafka, name: p, brokers: b:1, topic_pattern: '('}", "sources[0].topic_pattern"),
            ("{type: kafka, name: p, brokers: b:1, topics: ['a b']}", "sources[0].topics"),
            ("{type: kafka, name: p, brokers: b:1, topics: [t], timestamp: ts}", "sources[0].timestamp"),
            ("{type: kafka, name: p, brokers: b:1, topics: [t], format: raw, timestamp: /ts}", "sources[0].timestamp"),
            ("{type: kafka, name: p, brokers: b:1, topics: [t], start: group_offsets}", "sources[0].group"),
            ("{type: kafka, name: p, brokers: b:1, topics: [t], parallelism: 0}", "sources[0].parallelism"),
            ("{type: kafka, name: p, brokers: b:1, topics: [t], on_error: {side_output: 'a b'}}", "on_error"),
            ("{type: kafka, name: p, brokers: b:1, topics: [t], properties: {group.id: g}}", "properties.group.id"),
            (
                "{type: kafka, name: p, brokers: b:1, topics: [t], properties: {sasl.password: hunter2}}",
                "properties.sasl.password",
            ),
        ];
        for (source, field) in cases {
            let err = kafka(source).unwrap_err().to_string();
            assert!(err.contains(field), "{source}: {err}");
        }
        let err = kafka("{type: kafka, name: p, brokers: b:1, topics: [t], offsets: 3}").unwrap_err().to_string();
        assert!(err.contains("offsets"), "{err}");
    }

    #[test]
    fn oversized_and_explosive_kafka_fields_are_refused_naming_the_limit() {
        let base = "type: kafka, name: p, brokers: b:1";
        let many_topics = (0..=MAX_TOPICS).map(|i| format!("t{i}")).collect::<Vec<_>>().join(", ");
        let many_properties = (0..=MAX_PROPERTIES).map(|i| format!("p{i}: v")).collect::<Vec<_>>().join(", ");
        let cases = [
            (format!("{{{base}, topics: [{many_topics}]}}"), "MAX_TOPICS"),
            (
                format!("{{{base}, topic_pattern: '{}'}}", "a".repeat(MAX_TOPIC_PATTERN_BYTES + 1)),
                "MAX_TOPIC_PATTERN_BYTES",
            ),
            // Eleven bytes of pattern, a million states compiled.
            (format!("{{{base}, topic_pattern: 'a{{1000}}{{1000}}'}}"), "compiled"),
            (
                format!("{{type: kafka, name: p, brokers: '{}', topics: [t]}}", "b".repeat(MAX_ADDRESS_BYTES + 1)),
                "MAX_ADDRESS_BYTES",
            ),
            (format!("{{{base}, topics: [t], properties: {{{many_properties}}}}}"), "MAX_PROPERTIES"),
            (
                format!(
                    "{{{base}, topics: [t], properties: {{ssl.ca.pem: '{}'}}}}",
                    "x".repeat(MAX_PROPERTY_VALUE_BYTES + 1)
                ),
                "MAX_PROPERTY_VALUE_BYTES",
            ),
            (format!("{{{base}, topics: [t], group: ''}}"), "sources[0].group"),
        ];
        for (source, limit) in cases {
            let err = kafka(&source).unwrap_err().to_string();
            assert!(err.contains(limit), "{}: {err}", &source[..source.len().min(80)]);
        }
    }

    #[test]
    fn a_kafka_sink_is_at_least_once_by_default_and_refuses_what_it_cannot_do() {
        let sink = |sink: &str| {
            PipelineSpec::from_yaml(&format!(
                "name: k\nsources: [{{type: generator, name: g}}]\nsteps: [{{name: a, wasm: a.wasm}}]\nsink: {sink}"
            ))
        };
        let spec = sink("{type: kafka, brokers: b:1, topic: counts}").unwrap();
        let crate::SinkSpec::Kafka(k) = &spec.sink else { panic!("a kafka sink") };
        assert_eq!((k.delivery, k.format), (KafkaDelivery::AtLeastOnce, KafkaSinkFormat::Json));
        assert!(spec.sink.follows_input_parallelism());
        let spec = sink("{type: kafka, brokers: b:1, topic: counts, delivery: exactly_once}").unwrap();
        let crate::SinkSpec::Kafka(k) = &spec.sink else { panic!("a kafka sink") };
        assert_eq!((k.delivery, k.max_staged_bytes), (KafkaDelivery::ExactlyOnce, 16 << 20));
        for (text, field) in [
            ("{type: kafka, brokers: b:1, topic: counts, max_staged_bytes: 1000}", "sink.max_staged_bytes"),
            ("{type: kafka, brokers: b:1, topic: 'a/b'}", "sink.topic"),
            ("{type: kafka, brokers: ' ', topic: t}", "sink.brokers"),
            ("{type: kafka, brokers: b:1, topic: t, properties: {acks: '0'}}", "sink.properties.acks"),
            (
                "{type: kafka, brokers: b:1, topic: t, properties: {ssl.key.password: x}}",
                "sink.properties.ssl.key.password",
            ),
        ] {
            let err = sink(text).unwrap_err().to_string();
            assert!(err.contains(field), "{text}: {err}");
        }
    }
}
