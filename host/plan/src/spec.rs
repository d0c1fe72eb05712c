//! The pipeline spec: what a user writes. Unknown fields are errors, so a typo never silently
//! does nothing; every validation error names the field and what would be right.

use std::path::{Path, PathBuf};

use eddy_core::limits::{MAX_NAME_BYTES, MAX_SOURCES, MAX_STEP_CONFIG_BYTES, MAX_STEPS, MAX_VALUE_BYTES};
use serde::{Deserialize, Serialize};

use crate::window::WindowKind;
use crate::yaml_guard;

mod kafka;
mod postgres;

pub use kafka::{
    KafkaDelivery, KafkaEnd, KafkaFormat, KafkaSinkFormat, KafkaSinkSpec, KafkaSourceSpec, KafkaStart,
    MAX_ADDRESS_BYTES, MAX_PROPERTIES, MAX_PROPERTY_VALUE_BYTES, OnDecodeError, PropertyValue, SECRET_PROPERTIES,
};
pub use postgres::{
    ColumnSource, ColumnSpec, PostgresMode, PostgresSinkSpec, SqlType, check_url as check_postgres_url,
};

/// A pipeline: sources -> steps -> sink.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Shown in logs and summaries. Like every name in a spec, an identifier: 1 to 64 bytes
    /// of ASCII letters, digits, `_`, `-` and `.`, starting with a letter or digit.
    pub name: String,
    /// Number of key groups: the upper bound of any parallelism, fixed for the life of the state.
    #[serde(default = "default_max_parallelism")]
    pub max_parallelism: u32,
    /// Parallelism of steps that do not set their own.
    #[serde(default = "one")]
    pub parallelism: u32,
    /// Records a source reads per batch.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// A channel buffer is shipped at the latest after this long (latency bound at low load).
    #[serde(default = "default_buffer_timeout_ms")]
    pub buffer_timeout_ms: i64,
    /// Where records come from; their streams are united in front of the first step.
    pub sources: Vec<SourceSpec>,
    /// Event-time progress at the sources.
    #[serde(default)]
    pub watermarks: WatermarkSpec,
    /// Operators applied in order.
    pub steps: Vec<StepSpec>,
    /// Where the last step's records and every side output go.
    pub sink: SinkSpec,
    /// Where keyed state lives (heap by default).
    #[serde(default)]
    pub state: StateSpec,
    /// Periodic checkpoints; none = no fault tolerance (a failed job starts over).
    #[serde(default)]
    pub checkpoints: Option<CheckpointSpec>,
    /// What happens when a task fails (only meaningful with checkpoints).
    #[serde(default)]
    pub restart: RestartSpec,
    /// Debugging aids for every step (a step's own `debug` adds to these).
    #[serde(default)]
    pub debug: DebugSpec,
}

/// `debug:` — aids for finding out what a step did, per job or per step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DebugSpec {
    /// Record every subtask's input (batches, watermarks, processing-time ticks) in a journal
    /// beside the checkpoints, so `eddy replay` can run one subtask again from a checkpoint.
    #[serde(default)]
    pub journal: bool,
    /// Disk one subtask's journal may fill (its kept segments, compressed), in MiB; past it
    /// the journal stops and the job goes on. Default [`DEFAULT_JOURNAL_MAX_MB`].
    #[serde(default)]
    pub journal_max_mb: Option<u64>,
    /// How the journal stores batches. Default `none`.
    #[serde(default)]
    pub journal_compression: Option<JournalCompression>,
}

/// What one subtask's journal may fill on disk unless `debug.journal_max_mb` says otherwise.
pub const DEFAULT_JOURNAL_MAX_MB: u64 = 1024;

/// The longest `watermarks.interval_ms`: a minute, past which windows would wait longer for
/// their watermark than any latency a stream processor is run for.
pub const MAX_WATERMARK_INTERVAL_MS: i64 = 60_000;

/// How a journal stores the batches it records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalCompression {
    /// The batches as they are: the least CPU (on Nexmark q5's window step, a journal costs
    /// 8% of the job's throughput this way, 27% with LZ4), the most disk.
    #[default]
    None,
    /// LZ4 blocks: three to five times less disk on row data, for the CPU LZ4 takes.
    Lz4,
}

/// Which state backend the steps use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackendKind {
    /// In memory: fastest, bounded by memory.
    #[default]
    Heap,
    /// RocksDB on local disk: state larger than memory, bounded native memory.
    Rocksdb,
}

/// `state:` — the state backend.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    /// `heap` or `rocksdb`.
    #[serde(default)]
    pub backend: StateBackendKind,
    /// Local working directory of RocksDB and of checkpoint staging (relative to the spec
    /// file); default `.eddy/state/<pipeline name>` under the current directory.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// RocksDB block cache per subtask and step, MiB.
    #[serde(default = "default_block_cache_mb")]
    pub block_cache_mb: usize,
    /// RocksDB memtable size per subtask and step, MiB (two at most).
    #[serde(default = "default_write_buffer_mb")]
    pub write_buffer_mb: usize,
    /// State one subtask of one step may hold: on the heap the memory its entries occupy
    /// (`eddy_state`'s count: node share, keys and values as allocated), in RocksDB key plus
    /// value bytes; a step's `state_max_bytes`
    /// overrides it. Default: 1 GiB on the heap, 64 GiB in RocksDB.
    #[serde(default)]
    pub max_bytes_per_subtask: Option<u64>,
    /// Entries one subtask of one step may hold; a step's `state_max_entries` overrides it.
    /// Default: 10 M on the heap, 1 G in RocksDB.
    #[serde(default)]
    pub max_entries_per_subtask: Option<u64>,
}

impl Default for StateSpec {
    fn default() -> Self {
        Self {
            backend: StateBackendKind::Heap,
            dir: None,
            block_cache_mb: default_block_cache_mb(),
            write_buffer_mb: default_write_buffer_mb(),
            max_bytes_per_subtask: None,
            max_entries_per_subtask: None,
        }
    }
}

impl StateSpec {
    /// State one subtask of `step` may hold (heap: memory, RocksDB: key plus value bytes): the
    /// step's `state_max_bytes`, else
    /// `max_bytes_per_subtask`, else the backend's default (1 GiB on the heap, 64 GiB in RocksDB).
    pub fn max_bytes_for(&self, step: &StepSpec) -> u64 {
        let default = match self.backend {
            StateBackendKind::Heap => 1 << 30,
            StateBackendKind::Rocksdb => 64 << 30,
        };
        step.state_max_bytes.or(self.max_bytes_per_subtask).unwrap_or(default)
    }

    /// Entries one subtask of `step` may hold: the step's `state_max_entries`, else
    /// `max_entries_per_subtask`, else the backend's default (10 M on the heap, 1 G in RocksDB).
    pub fn max_entries_for(&self, step: &StepSpec) -> u64 {
        let default = match self.backend {
            StateBackendKind::Heap => 10_000_000,
            StateBackendKind::Rocksdb => 1_000_000_000,
        };
        step.state_max_entries.or(self.max_entries_per_subtask).unwrap_or(default)
    }
}

fn default_block_cache_mb() -> usize {
    64
}

fn default_write_buffer_mb() -> usize {
    16
}

/// How barriers and in-flight records are handled (`checkpoints.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointMode {
    /// A task with several inputs holds each input back from its barrier until all delivered
    /// it, then snapshots: nothing in flight is stored, but under backpressure a barrier waits
    /// behind every queued buffer.
    #[default]
    Aligned,
    /// A task snapshots at the first barrier, which overtakes the data queued in its channel;
    /// the records it overtook (and those arriving on other inputs before their barrier) are
    /// stored with the snapshot and replayed on restore before new input.
    Unaligned,
}

/// `checkpoints:` — periodic checkpoints to a directory or an S3-compatible store.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Local directory the checkpoints are written to (relative to the spec file). `eddy run`
    /// resumes from the newest valid checkpoint in it. Give this or `s3`.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// An S3-compatible bucket instead of a directory.
    #[serde(default)]
    pub s3: Option<S3Spec>,
    /// Time between checkpoints.
    #[serde(default = "default_checkpoint_interval_ms")]
    pub interval_ms: u64,
    /// A checkpoint not complete after this long is aborted.
    #[serde(default = "default_checkpoint_timeout_ms")]
    pub timeout_ms: u64,
    /// Quiet time after one checkpoint ends before the next starts.
    #[serde(default)]
    pub min_pause_ms: u64,
    /// Completed checkpoints kept (older ones and unreferenced files are deleted).
    #[serde(default = "default_retained")]
    pub retained: usize,
    /// `aligned` (default) or `unaligned`.
    #[serde(default)]
    pub mode: CheckpointMode,
    /// In `aligned` mode: a task whose alignment of one checkpoint has taken this long switches
    /// that checkpoint to unaligned (none: stay aligned however long it takes).
    #[serde(default)]
    pub aligned_timeout_ms: Option<u64>,
}

/// `checkpoints.s3:` — where in an S3-compatible store. Credentials come from the standard
/// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct S3Spec {
    /// The bucket.
    pub bucket: String,
    /// Key prefix inside the bucket (say, the pipeline's name).
    #[serde(default)]
    pub prefix: String,
    /// Endpoint of an S3-compatible service (MinIO, moto, ...); none = AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The region.
    #[serde(default = "default_region")]
    pub region: String,
    /// Allow plain `http://` endpoints (local test services).
    #[serde(default)]
    pub allow_http: bool,
}

fn default_region() -> String {
    "us-east-1".into()
}

/// A directory or a key prefix in an S3-compatible bucket: where a store of checkpoints,
/// savepoints or sink files lives.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreLocation {
    /// A directory (on a machine, or a mount every machine shares).
    Dir(PathBuf),
    /// A bucket and key prefix.
    S3(S3Spec),
}

impl StoreLocation {
    /// `relative` inside this location: a subdirectory, or a longer key prefix.
    pub fn join(&self, relative: &str) -> Self {
        match self {
            Self::Dir(dir) => Self::Dir(dir.join(relative)),
            Self::S3(s3) => {
                let prefix =
                    if s3.prefix.is_empty() { relative.to_owned() } else { format!("{}/{relative}", s3.prefix) };
                Self::S3(S3Spec { prefix, ..s3.clone() })
            }
        }
    }

    /// As the `dir` and `s3` fields of a `checkpoints:` section or a files sink have it.
    pub fn into_fields(self) -> (Option<PathBuf>, Option<S3Spec>) {
        match self {
            Self::Dir(dir) => (Some(dir), None),
            Self::S3(s3) => (None, Some(s3)),
        }
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::S3(s3) => write!(f, "s3://{}/{}", s3.bucket, s3.prefix),
        }
    }
}

impl CheckpointSpec {
    /// Checkpoints to the local directory `dir` every `interval_ms`, the rest as a spec's defaults.
    pub fn in_dir(dir: PathBuf, interval_ms: u64) -> Self {
        Self {
            dir: Some(dir),
            s3: None,
            interval_ms,
            timeout_ms: default_checkpoint_timeout_ms(),
            min_pause_ms: 0,
            retained: default_retained(),
            mode: CheckpointMode::Aligned,
            aligned_timeout_ms: None,
        }
    }

    /// Where the checkpoints go, for messages.
    pub fn location(&self) -> String {
        match (&self.dir, &self.s3) {
            (Some(dir), _) => dir.display().to_string(),
            (None, Some(s3)) => format!("s3://{}/{}", s3.bucket, s3.prefix),
            (None, None) => "(nowhere)".into(),
        }
    }
}

fn default_checkpoint_interval_ms() -> u64 {
    1_000
}

fn default_checkpoint_timeout_ms() -> u64 {
    60_000
}

fn default_retained() -> usize {
    2
}

/// `restart:` — how a failed job is restarted from its latest checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "strategy", rename_all = "snake_case", deny_unknown_fields)]
pub enum RestartSpec {
    /// Fail the run on the first task failure.
    None,
    /// Up to `attempts` restarts, `delay_ms` apart.
    FixedDelay {
        /// Restarts at most.
        attempts: u32,
        /// Pause before each restart.
        #[serde(default = "default_restart_delay_ms")]
        delay_ms: u64,
    },
    /// Up to `attempts` restarts, the pause doubling from `delay_ms` up to `max_delay_ms`.
    ExponentialBackoff {
        /// Restarts at most.
        attempts: u32,
        /// First pause.
        #[serde(default = "default_restart_delay_ms")]
        delay_ms: u64,
        /// Longest pause.
        #[serde(default = "default_restart_max_delay_ms")]
        max_delay_ms: u64,
    },
}

impl Default for RestartSpec {
    fn default() -> Self {
        RestartSpec::FixedDelay { attempts: 3, delay_ms: default_restart_delay_ms() }
    }
}

impl RestartSpec {
    /// The pause before restart number `attempt` (1-based), or `None` when out of attempts.
    pub fn delay_before(&self, attempt: u32) -> Option<std::time::Duration> {
        let ms = match *self {
            RestartSpec::None => return None,
            RestartSpec::FixedDelay { attempts, delay_ms } => (attempt <= attempts).then_some(delay_ms)?,
            RestartSpec::ExponentialBackoff { attempts, delay_ms, max_delay_ms } => {
                if attempt > attempts {
                    return None;
                }
                let factor = 1u64.checked_shl(attempt.saturating_sub(1)).unwrap_or(u64::MAX);
                delay_ms.saturating_mul(factor).min(max_delay_ms)
            }
        };
        Some(std::time::Duration::from_millis(ms))
    }
}

fn default_restart_delay_ms() -> u64 {
    1_000
}

fn default_restart_max_delay_ms() -> u64 {
    30_000
}

fn default_max_parallelism() -> u32 {
    128
}

/// A path of plain names only: no root, no `.` or `..`, so it names a key under a prefix.
fn is_relative_key(path: &Path) -> bool {
    !path.as_os_str().is_empty() && path.components().all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// The largest value a guest takes (16 MiB): a longer line could not become a record anyway.
fn default_max_line_bytes() -> usize {
    MAX_VALUE_BYTES
}

fn one() -> u32 {
    1
}

fn default_batch_size() -> usize {
    256
}

fn default_buffer_timeout_ms() -> i64 {
    20
}

/// A source. `name` identifies it in the plan and in metrics (an identifier, as the
/// pipeline's `name`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// A file read line by line (one split, so parallelism 1).
    File {
        /// Unique among sources.
        name: String,
        /// Path, relative to the spec file; with `s3`, the object's key under the bucket's prefix.
        path: PathBuf,
        /// How lines become records.
        #[serde(default)]
        format: SourceFormat,
        /// JSON pointer (e.g. `/ts`) to the event time in ms; none = records carry no event time.
        #[serde(default)]
        timestamp: Option<String>,
        /// Keep reading as the file grows (an unbounded source) instead of ending at EOF.
        #[serde(default)]
        follow: bool,
        /// The longest line accepted, in bytes, not counting its `\n`: a longer line fails the
        /// job (naming the file and line) instead of being read whole into memory. At most
        /// (and by default) `eddy_core::limits::MAX_VALUE_BYTES`, the largest record value.
        #[serde(default = "default_max_line_bytes")]
        max_line_bytes: usize,
        /// Read an object of an S3-compatible bucket instead of a local file, so a reader on any
        /// machine finds it: the object is downloaded when the source opens (a resumed source
        /// fetches it from its position on, and a CSV header). Not with
        /// `follow` (an object is replaced whole, never appended to).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        s3: Option<S3Spec>,
        /// Read `path` only as a regular file under this directory, reached without following
        /// a symbolic link on the way (the service sets it to a tenant's files area, which a
        /// shared volume could fill with links to the host's files).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        beneath: Option<PathBuf>,
    },
    /// Deterministic synthetic events: event `i` is a pure function of `(seed, i)`.
    Generator(GeneratorSpec),
    /// The Nexmark benchmark's persons, auctions and bids (`eddy_nexmark`), deterministic too.
    Nexmark(NexmarkSourceSpec),
    /// Topics of a Kafka cluster, their partitions shared by the readers.
    Kafka(KafkaSourceSpec),
}

impl SourceSpec {
    /// The source's name.
    pub fn name(&self) -> &str {
        match self {
            SourceSpec::File { name, .. } => name,
            SourceSpec::Generator(g) => &g.name,
            SourceSpec::Nexmark(n) => &n.name,
            SourceSpec::Kafka(k) => &k.name,
        }
    }

    /// Number of parallel readers.
    pub fn parallelism(&self) -> u32 {
        match self {
            SourceSpec::File { .. } => 1,
            SourceSpec::Generator(g) => g.parallelism,
            SourceSpec::Nexmark(n) => n.parallelism,
            SourceSpec::Kafka(k) => k.parallelism,
        }
    }
}

/// The generator's event shape: `{"<key_field>": "<key_prefix><k>", "<value_field>": v,
/// "ts": t, "seq": i}` with event time `t = start_ms + i * interval_ms - disorder(i)`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorSpec {
    /// Unique among sources.
    pub name: String,
    /// Same seed, same events.
    #[serde(default)]
    pub seed: u64,
    /// Number of events; none = unbounded.
    #[serde(default)]
    pub events: Option<u64>,
    /// Parallel readers; reader `j` produces the events `i` with `i % parallelism == j`.
    #[serde(default = "one")]
    pub parallelism: u32,
    /// Number of distinct keys.
    #[serde(default = "default_keys")]
    pub keys: u64,
    /// Field holding the key.
    #[serde(default = "default_key_field")]
    pub key_field: String,
    /// Prefix of key strings.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Field holding the integer value.
    #[serde(default = "default_value_field")]
    pub value_field: String,
    /// Smallest value.
    #[serde(default)]
    pub min_value: i64,
    /// Largest value.
    #[serde(default = "default_max_value")]
    pub max_value: i64,
    /// Event time of event 0.
    #[serde(default)]
    pub start_ms: i64,
    /// Event-time distance between consecutive events.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: i64,
    /// Each event's time is moved back by up to this much (bounded disorder).
    #[serde(default)]
    pub max_disorder_ms: i64,
    /// Events per second per reader; none = as fast as possible.
    #[serde(default)]
    pub rate_per_sec: Option<u64>,
}

fn default_keys() -> u64 {
    100
}

fn default_key_field() -> String {
    "key".into()
}

fn default_key_prefix() -> String {
    "k".into()
}

fn default_value_field() -> String {
    "value".into()
}

fn default_max_value() -> i64 {
    100
}

fn default_interval_ms() -> i64 {
    1
}

/// The Nexmark source: events as rows (`eddy_nexmark::write_row`; they render as the JSON of
/// `eddy_nexmark::to_json`, `{"type":"person"|"auction"|"bid", ...}`) with their `date_time` as
/// event time; event `i` is `eddy_nexmark::event(config, i)`.
/// Every field but `name` is optional; the generator's fields and defaults are those of
/// `eddy_nexmark::NexmarkConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NexmarkSourceSpec {
    /// Unique among sources.
    pub name: String,
    /// Parallel readers; reader `j` produces the events `i` with `i % parallelism == j`.
    pub parallelism: u32,
    /// Events per second per reader; none = as fast as possible.
    pub rate_per_sec: Option<u64>,
    /// Same seed, same events.
    pub seed: u64,
    /// Number of events over all readers; none = unbounded.
    pub events: Option<u64>,
    /// Event time of event 0, ms since the epoch.
    pub first_event_time_ms: i64,
    /// Event-time distance between consecutive events in µs (100 = 10 000 events/s).
    pub inter_event_us: u64,
    /// Each event's time is moved back by up to this much (bounded disorder).
    pub max_disorder_ms: i64,
    /// A bid is on the hot auction with probability `1 - 1/hot_auction_ratio`.
    pub hot_auction_ratio: u64,
    /// A bid is by the hot bidder with probability `1 - 1/hot_bidder_ratio`.
    pub hot_bidder_ratio: u64,
    /// An auction is by the hot seller with probability `1 - 1/hot_seller_ratio`.
    pub hot_seller_ratio: u64,
    /// Other sellers and bidders are among this many most recent persons.
    pub num_active_people: u64,
    /// Other bids are on one of this many most recent auctions.
    pub num_in_flight_auctions: u64,
    /// Auction categories: `10..10 + num_categories`.
    pub num_categories: u64,
    /// Average person size in bytes (`extra` pads to it).
    pub avg_person_bytes: u64,
    /// Average auction size in bytes.
    pub avg_auction_bytes: u64,
    /// Average bid size in bytes.
    pub avg_bid_bytes: u64,
}

impl Default for NexmarkSourceSpec {
    fn default() -> Self {
        let c = eddy_nexmark::NexmarkConfig::default();
        NexmarkSourceSpec {
            name: String::new(),
            parallelism: 1,
            rate_per_sec: None,
            seed: c.seed,
            events: c.events,
            first_event_time_ms: c.first_event_time_ms,
            inter_event_us: c.inter_event_us,
            max_disorder_ms: c.max_disorder_ms,
            hot_auction_ratio: c.hot_auction_ratio,
            hot_bidder_ratio: c.hot_bidder_ratio,
            hot_seller_ratio: c.hot_seller_ratio,
            num_active_people: c.num_active_people,
            num_in_flight_auctions: c.num_in_flight_auctions,
            num_categories: c.num_categories,
            avg_person_bytes: c.avg_person_bytes,
            avg_auction_bytes: c.avg_auction_bytes,
            avg_bid_bytes: c.avg_bid_bytes,
        }
    }
}

impl NexmarkSourceSpec {
    /// The generator's configuration.
    pub fn config(&self) -> eddy_nexmark::NexmarkConfig {
        eddy_nexmark::NexmarkConfig {
            seed: self.seed,
            events: self.events,
            first_event_time_ms: self.first_event_time_ms,
            inter_event_us: self.inter_event_us,
            max_disorder_ms: self.max_disorder_ms,
            hot_auction_ratio: self.hot_auction_ratio,
            hot_bidder_ratio: self.hot_bidder_ratio,
            hot_seller_ratio: self.hot_seller_ratio,
            num_active_people: self.num_active_people,
            num_in_flight_auctions: self.num_in_flight_auctions,
            num_categories: self.num_categories,
            avg_person_bytes: self.avg_person_bytes,
            avg_auction_bytes: self.avg_auction_bytes,
            avg_bid_bytes: self.avg_bid_bytes,
        }
    }
}

/// How a file's lines become records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// Each line is a text value (encoded as a JSON string).
    #[default]
    Lines,
    /// Each line is a JSON value.
    JsonLines,
    /// Comma-separated values; the first line names the fields; each row becomes a JSON object
    /// (fields that parse as numbers become numbers).
    Csv,
}

/// Watermark strategy, applied at every source reader.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkSpec {
    /// Events arrive at most this much out of order (bounded out-of-orderness).
    #[serde(default)]
    pub out_of_orderness_ms: i64,
    /// An input silent this long stops holding back the watermark until it speaks again;
    /// none = a silent input stalls event time (correct when every input matters).
    #[serde(default)]
    pub idleness_ms: Option<i64>,
    /// A source reader passes its watermark on at most once per this much processing time
    /// (Flink's auto-watermark interval), the newest then; 0 passes it on after every batch.
    /// Results a watermark fires come up to this much later; fewer watermarks wake the
    /// subtasks behind the exchanges less often.
    #[serde(default)]
    pub interval_ms: i64,
}

/// Which bytes of a record become its key (and decide its key group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyBy {
    /// The key the upstream operator emitted.
    Key,
    /// The whole value.
    Value,
    /// A field of the JSON value, by JSON pointer (`/user/id`); the key is that field's JSON.
    Field(String),
}

impl Serialize for KeyBy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            KeyBy::Key => "key",
            KeyBy::Value => "value",
            KeyBy::Field(pointer) => pointer,
        })
    }
}

impl<'de> Deserialize<'de> for KeyBy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "key" => Ok(KeyBy::Key),
            "value" => Ok(KeyBy::Value),
            p if p.starts_with('/') => Ok(KeyBy::Field(text)),
            other => Err(serde::de::Error::custom(format!(
                "key_by `{other}` is not `key`, `value` or a JSON pointer such as `/user_id`"
            ))),
        }
    }
}

/// One operator step: a keyed Wasm operator, or a window whose `wasm` is an aggregate.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// Unique within the pipeline; names the operator in errors, logs and metrics (an
    /// identifier, as the pipeline's `name`).
    pub name: String,
    /// The component, relative to the spec file.
    pub wasm: PathBuf,
    /// Handed to the component's `open` as JSON.
    #[serde(default)]
    pub config: serde_json::Value,
    /// Parallel instances; default: the pipeline's `parallelism`.
    #[serde(default)]
    pub parallelism: Option<u32>,
    /// Repartition by key in front of this step (an exchange).
    #[serde(default)]
    pub key_by: Option<KeyBy>,
    /// Keyed state not written for this long reads as absent and is purged.
    #[serde(default)]
    pub state_ttl_ms: Option<i64>,
    /// State one subtask of this step may hold, as `state.max_bytes_per_subtask` counts it (its default).
    #[serde(default)]
    pub state_max_bytes: Option<u64>,
    /// Entries one subtask of this step may hold (default: `state.max_entries_per_subtask`).
    #[serde(default)]
    pub state_max_entries: Option<u64>,
    /// Makes the step a window over the aggregate in `wasm`.
    #[serde(default)]
    pub window: Option<WindowSpec>,
    /// Debugging aids for this step (the pipeline's `debug` applies too).
    #[serde(default)]
    pub debug: DebugSpec,
}

impl StepSpec {
    /// Whether the step is a two-phase window (`window.two_phase`).
    pub fn two_phase(&self) -> bool {
        self.window.as_ref().is_some_and(|w| w.two_phase)
    }
}

/// A window step's assigner, lateness and late-data handling.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    /// `tumbling`, `sliding` or `session`.
    #[serde(rename = "type")]
    pub kind: WindowType,
    /// Window length (tumbling, sliding).
    #[serde(default)]
    pub size_ms: Option<i64>,
    /// Distance between window starts (sliding).
    #[serde(default)]
    pub slide_ms: Option<i64>,
    /// Inactivity that closes a session (session).
    #[serde(default)]
    pub gap_ms: Option<i64>,
    /// How long after firing a window still accepts records (each re-fires the result).
    #[serde(default)]
    pub allowed_lateness_ms: i64,
    /// Side output receiving records later than that (an identifier, as the pipeline's `name`).
    #[serde(default = "default_late_output")]
    pub late_output: String,
    /// Drop late records instead (still counted in metrics).
    #[serde(default)]
    pub drop_late: bool,
    /// Two-phase aggregation (Flink SQL's local-global): each upstream subtask folds every
    /// batch it emits into one partial accumulator per (key, pane) before the exchange, and
    /// the window merges those. Fewer, smaller records cross, which pays where a batch holds
    /// many records per key (a global or a hot key). Tumbling and sliding windows only, with
    /// `drop_late` and no allowed lateness: a partial stands for many records, so it cannot
    /// go to a late output or re-fire a window once per record.
    #[serde(default)]
    pub two_phase: bool,
}

fn default_late_output() -> String {
    "late".into()
}

/// Window assigners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowType {
    /// Fixed, non-overlapping.
    Tumbling,
    /// Fixed length, overlapping.
    Sliding,
    /// Per-key activity sessions.
    Session,
}

impl WindowSpec {
    /// The assigner, or the name of the missing or wrong field.
    pub fn kind(&self) -> Result<WindowKind, (String, String)> {
        let need = |v: Option<i64>, field: &str, kind: &str| {
            v.ok_or_else(|| (field.to_string(), format!("a {kind} window needs `{field}`")))
        };
        let kind = match self.kind {
            WindowType::Tumbling => WindowKind::Tumbling { size_ms: need(self.size_ms, "size_ms", "tumbling")? },
            WindowType::Sliding => WindowKind::Sliding {
                size_ms: need(self.size_ms, "size_ms", "sliding")?,
                slide_ms: need(self.slide_ms, "slide_ms", "sliding")?,
            },
            WindowType::Session => WindowKind::Session { gap_ms: need(self.gap_ms, "gap_ms", "session")? },
        };
        kind.validate().map_err(|problem| ("type".to_string(), problem))?;
        Ok(kind)
    }

    /// Why `two_phase` cannot apply to this window, as (field, problem).
    fn check_two_phase(&self) -> Result<(), (String, String)> {
        let refuse = |field: &str, problem: &str| Err((field.to_string(), format!("with `two_phase`, {problem}")));
        if self.kind == WindowType::Session {
            return refuse(
                "type",
                "the window must be tumbling or sliding (sessions merge by gaps no upstream subtask sees)",
            );
        }
        if self.allowed_lateness_ms != 0 {
            return refuse(
                "allowed_lateness_ms",
                "allowed lateness must be 0 (a partial stands for many records, so a late one cannot re-fire the window once per record)",
            );
        }
        if !self.drop_late {
            return refuse(
                "drop_late",
                "set `drop_late: true` (a late partial is an accumulator, not records a late output could carry)",
            );
        }
        Ok(())
    }
}

/// The sink.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SinkSpec {
    /// Prints `key => value` lines to stdout (side outputs prefixed with `[name]`).
    Print,
    /// Writes JSON lines `{"output", "key", "value", "timestamp"}` to a file.
    File {
        /// Path, relative to the spec file.
        path: PathBuf,
    },
    /// Discards records (for benchmarks).
    Blackhole,
    /// Exactly-once JSON-lines files in a directory: records are written to in-progress files
    /// that become visible (renamed to `part-*.jsonl`) only when the checkpoint covering them
    /// completes; after a failure, uncommitted files are discarded and their records replayed.
    Files {
        /// The directory, relative to the spec file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dir: Option<PathBuf>,
        /// Or an S3-compatible bucket (a cluster's workers on several machines all reach it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        s3: Option<S3Spec>,
    },
    /// An idempotent upsert table (RocksDB) keyed by record key, the last value winning:
    /// exactly-once in effect, because a replay writes the same values again.
    Upsert {
        /// The table's directory, relative to the spec file.
        dir: PathBuf,
    },
    /// A Kafka topic, written at least once (each subtask of the input produces).
    Kafka(KafkaSinkSpec),
    /// A PostgreSQL table, exactly once (prepared transactions) or upserted (each subtask of
    /// the input writes on its own connection).
    Postgres(PostgresSinkSpec),
}

impl SinkSpec {
    /// Whether the sink runs at the parallelism of its input (each subtask writes its own
    /// part), rather than at 1: a terminal, one file or one upsert table takes one writer.
    pub fn follows_input_parallelism(&self) -> bool {
        match self {
            SinkSpec::Files { .. } | SinkSpec::Blackhole | SinkSpec::Kafka(_) | SinkSpec::Postgres(_) => true,
            SinkSpec::Print | SinkSpec::File { .. } | SinkSpec::Upsert { .. } => false,
        }
    }
}

/// Why a spec was rejected.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read pipeline spec {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// YAML syntax or a field of the wrong shape (the message names it and its line).
    #[error("pipeline spec: {0}")]
    Parse(String),
    /// The text holds what a spec may not (an anchor, alias or merge key) or more than it may
    /// (nesting, nodes), refused before any value is built from it.
    #[error("pipeline spec, line {line} column {column}: {problem}")]
    Refused {
        /// 1-based line of the refused node.
        line: u64,
        /// 1-based column of the refused node.
        column: u64,
        /// What is wrong and what to write instead.
        problem: String,
    },
    /// The text is longer than a spec may be.
    #[error(
        "pipeline spec: {bytes} bytes, above the limit of {limit} bytes (MAX_SPEC_BYTES); a step's `config` holds \
         settings, not data"
    )]
    TooLarge {
        /// Length of the text.
        bytes: usize,
        /// `eddy_core::limits::MAX_SPEC_BYTES`.
        limit: usize,
    },
    /// A field with a value that cannot work.
    #[error("pipeline spec field `{field}`: {problem}")]
    Invalid {
        /// Path of the field, e.g. `steps[1].name`.
        field: String,
        /// What is wrong and what would be right.
        problem: String,
    },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> SpecError {
    SpecError::Invalid { field: field.into(), problem: problem.into() }
}

/// The longest connection name.
pub const MAX_CONNECTION_NAME_BYTES: usize = 63;

/// Checks a connection's name: 1 to 63 of `a-z`, `0-9`, `-` and `_`, starting with a letter or
/// digit (it names a key of the service's store and appears in URLs).
pub fn check_connection_name(name: &str) -> Result<(), String> {
    let ok = (1..=MAX_CONNECTION_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        return Ok(());
    }
    let shown: String = name.chars().take(64).flat_map(char::escape_default).collect();
    Err(format!(
        "connection name `{shown}`: use 1-{MAX_CONNECTION_NAME_BYTES} characters of a-z, 0-9, `-` and `_`, starting \
         with a letter or digit"
    ))
}

impl PipelineSpec {
    /// Parses and validates YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        let spec = Self::parse(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses YAML (or JSON) text without checking how the fields fit together, for a caller
    /// that fills in fields (the service places paths) before [`PipelineSpec::validate`].
    ///
    /// The text's shape is checked first, before any value is built: at most
    /// `eddy_core::limits::MAX_SPEC_BYTES` bytes, `MAX_SPEC_NESTING` levels and
    /// `MAX_SPEC_NODES` nodes, and no anchors, aliases or merge keys (an alias makes a copy
    /// of its anchor's value, so a short text could stand for an unbounded one). A refusal
    /// names the line and column ([`SpecError::Refused`]).
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        yaml_guard::check(text, &yaml_guard::Limits::SPEC)?;
        let mut spec: Self = serde_norway::from_str(text).map_err(|e| SpecError::Parse(e.to_string()))?;
        for source in &mut spec.sources {
            if let SourceSpec::Kafka(k) = source {
                k.watermarks.get_or_insert(spec.watermarks);
            }
        }
        Ok(spec)
    }

    /// Reads a spec file; relative paths in it are resolved against its directory.
    pub fn from_file(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SpecError::Read { path: path.display().to_string(), source })?;
        let mut spec = Self::from_yaml(&text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        spec.resolve_paths(base);
        Ok(spec)
    }

    fn resolve_paths(&mut self, base: &Path) {
        for source in &mut self.sources {
            if let SourceSpec::File { path, s3: None, .. } = source {
                *path = base.join(&*path);
            }
        }
        for step in &mut self.steps {
            step.wasm = base.join(&step.wasm);
        }
        match &mut self.sink {
            SinkSpec::File { path } | SinkSpec::Files { dir: Some(path), .. } | SinkSpec::Upsert { dir: path } => {
                *path = base.join(&*path)
            }
            SinkSpec::Print
            | SinkSpec::Blackhole
            | SinkSpec::Files { dir: None, .. }
            | SinkSpec::Kafka(_)
            | SinkSpec::Postgres(_) => {}
        }
        if let Some(dir) = &mut self.state.dir {
            *dir = base.join(&*dir);
        }
        if let Some(dir) = self.checkpoints.as_mut().and_then(|c| c.dir.as_mut()) {
            *dir = base.join(&*dir);
        }
    }

    /// The named connections the sources and sink use: `(field, name)`, e.g.
    /// `("sources[0].connection", "orders")`.
    pub fn connections(&self) -> Vec<(String, String)> {
        let mut used = Vec::new();
        for (i, source) in self.sources.iter().enumerate() {
            if let SourceSpec::Kafka(k) = source
                && let Some(name) = &k.connection
            {
                used.push((format!("sources[{i}].connection"), name.clone()));
            }
        }
        let sink = match &self.sink {
            SinkSpec::Kafka(k) => k.connection.as_ref(),
            SinkSpec::Postgres(p) => p.connection.as_ref(),
            _ => None,
        };
        used.extend(sink.map(|name| ("sink.connection".to_string(), name.clone())));
        used
    }

    /// Whether step `i`'s subtasks keep an input journal (its own `debug` or the pipeline's).
    pub fn journals(&self, i: usize) -> bool {
        self.debug.journal || self.steps.get(i).is_some_and(|s| s.debug.journal)
    }

    /// The disk one subtask of step `i` may fill with its journal, in bytes (its own
    /// `journal_max_mb`, else the pipeline's, else the default).
    pub fn journal_max_bytes(&self, i: usize) -> u64 {
        let own = self.steps.get(i).and_then(|s| s.debug.journal_max_mb);
        own.or(self.debug.journal_max_mb).unwrap_or(DEFAULT_JOURNAL_MAX_MB).saturating_mul(1 << 20)
    }

    /// How step `i`'s journal stores batches (its own `journal_compression`, else the
    /// pipeline's, else as they are).
    pub fn journal_compression(&self, i: usize) -> JournalCompression {
        let own = self.steps.get(i).and_then(|s| s.debug.journal_compression);
        own.or(self.debug.journal_compression).unwrap_or_default()
    }

    /// The parallelism of step `i`.
    pub fn step_parallelism(&self, i: usize) -> u32 {
        self.steps.get(i).and_then(|s| s.parallelism).unwrap_or(self.parallelism)
    }

    /// Checks that the fields fit together; every error names the field.
    pub fn validate(&self) -> Result<(), SpecError> {
        check_name("name", &self.name)?;
        let max_p = self.max_parallelism;
        if !(1..=eddy_core::MAX_PARALLELISM_LIMIT).contains(&max_p) {
            return Err(invalid(
                "max_parallelism",
                format!("{max_p} is outside 1..={}", eddy_core::MAX_PARALLELISM_LIMIT),
            ));
        }
        let check_parallelism = |field: String, p: u32| {
            if (1..=max_p).contains(&p) {
                Ok(())
            } else {
                Err(invalid(field, format!("{p} is outside 1..={max_p} (max_parallelism bounds every parallelism)")))
            }
        };
        check_parallelism("parallelism".into(), self.parallelism)?;
        if !(1..=65_536).contains(&self.batch_size) {
            return Err(invalid("batch_size", format!("{} is outside 1..=65536", self.batch_size)));
        }
        if self.buffer_timeout_ms < 0 {
            return Err(invalid("buffer_timeout_ms", "must not be negative"));
        }
        if self.watermarks.out_of_orderness_ms < 0 {
            return Err(invalid("watermarks.out_of_orderness_ms", "must not be negative"));
        }
        if !(0..=MAX_WATERMARK_INTERVAL_MS).contains(&self.watermarks.interval_ms) {
            return Err(invalid(
                "watermarks.interval_ms",
                format!(
                    "must be 0 (after every batch) to {MAX_WATERMARK_INTERVAL_MS} ms (MAX_WATERMARK_INTERVAL_MS); \
                     windows fire that much later"
                ),
            ));
        }
        if self.watermarks.idleness_ms.is_some_and(|ms| ms <= 0) {
            return Err(invalid("watermarks.idleness_ms", "must be positive (omit it to disable idleness)"));
        }
        if self.sources.is_empty() {
            return Err(invalid("sources", "needs at least one source"));
        }
        // Counted before the loops below, which compare each name with every earlier one.
        if self.sources.len() > MAX_SOURCES {
            return Err(invalid(
                "sources",
                format!("{} sources, above the limit of {MAX_SOURCES} (MAX_SOURCES)", self.sources.len()),
            ));
        }
        if self.steps.len() > MAX_STEPS {
            return Err(invalid(
                "steps",
                format!("{} steps, above the limit of {MAX_STEPS} (MAX_STEPS)", self.steps.len()),
            ));
        }
        if self.state.block_cache_mb == 0 || self.state.write_buffer_mb == 0 {
            return Err(invalid("state", "block_cache_mb and write_buffer_mb must be at least 1"));
        }
        if self.debug.journal_max_mb == Some(0) {
            return Err(invalid("debug.journal_max_mb", "must be at least 1 (omit `journal` to keep none)"));
        }
        if let Some(i) = self.steps.iter().position(|s| s.debug.journal_max_mb == Some(0)) {
            return Err(invalid(
                format!("steps[{i}].debug.journal_max_mb"),
                "must be at least 1 (omit `journal` to keep none)",
            ));
        }
        if let Some(i) = (0..self.steps.len()).find(|&i| self.journals(i))
            && self.checkpoints.is_none()
        {
            let field =
                if self.debug.journal { "debug.journal".to_string() } else { format!("steps[{i}].debug.journal") };
            return Err(invalid(
                field,
                "the journal is kept beside the checkpoints: add `checkpoints: {dir: ...}` (or `s3: ...`)",
            ));
        }
        if let Some(c) = &self.checkpoints {
            if c.dir.is_some() == c.s3.is_some() {
                return Err(invalid(
                    "checkpoints",
                    "give exactly one of `dir` (a local directory) and `s3` (a bucket)",
                ));
            }
            if c.interval_ms == 0 {
                return Err(invalid("checkpoints.interval_ms", "must be positive"));
            }
            if c.timeout_ms == 0 {
                return Err(invalid("checkpoints.timeout_ms", "must be positive"));
            }
            if c.retained == 0 {
                return Err(invalid("checkpoints.retained", "must keep at least 1 checkpoint"));
            }
            if let Some(ms) = c.aligned_timeout_ms {
                if c.mode == CheckpointMode::Unaligned {
                    return Err(invalid(
                        "checkpoints.aligned_timeout_ms",
                        "applies to `mode: aligned` only (an unaligned checkpoint never aligns); drop it or set `mode: \
                         aligned`",
                    ));
                }
                if ms == 0 {
                    return Err(invalid(
                        "checkpoints.aligned_timeout_ms",
                        "must be positive (omit it to stay aligned, or set `mode: unaligned`)",
                    ));
                }
                if ms >= c.timeout_ms {
                    return Err(invalid(
                        "checkpoints.aligned_timeout_ms",
                        format!(
                            "{ms} must be below checkpoints.timeout_ms ({}): the checkpoint would be aborted before \
                             it switches to unaligned",
                            c.timeout_ms
                        ),
                    ));
                }
            }
        }
        match &self.sink {
            SinkSpec::Kafka(k) => k.validate(&|f: &str| format!("sink.{f}"))?,
            SinkSpec::Postgres(p) => p.validate(&|f: &str| format!("sink.{f}"))?,
            _ => {}
        }
        if let SinkSpec::Files { dir, s3 } = &self.sink
            && dir.is_some() == s3.is_some()
        {
            return Err(invalid("sink", "a files sink needs exactly one of `dir` and `s3`"));
        }
        for (i, source) in self.sources.iter().enumerate() {
            let field = |f: &str| format!("sources[{i}].{f}");
            check_name(field("name"), source.name())?;
            if self.sources[..i].iter().any(|s| s.name() == source.name()) {
                return Err(invalid(field("name"), format!("`{}` is used by an earlier source", source.name())));
            }
            match source {
                SourceSpec::File { max_line_bytes, .. } if !(1..=MAX_VALUE_BYTES).contains(max_line_bytes) => {
                    return Err(invalid(
                        field("max_line_bytes"),
                        format!(
                            "{max_line_bytes} is outside 1..={MAX_VALUE_BYTES} (MAX_VALUE_BYTES, the largest record \
                             value a step takes)"
                        ),
                    ));
                }
                SourceSpec::File { timestamp: Some(p), .. } if !p.starts_with('/') => {
                    return Err(invalid(field("timestamp"), format!("`{p}` is not a JSON pointer such as `/ts`")));
                }
                SourceSpec::Generator(g) => {
                    check_parallelism(field("parallelism"), g.parallelism)?;
                    if g.keys == 0 {
                        return Err(invalid(field("keys"), "must be at least 1"));
                    }
                    if g.min_value > g.max_value {
                        return Err(invalid(field("min_value"), "must not exceed max_value"));
                    }
                    if g.interval_ms < 0 || g.max_disorder_ms < 0 {
                        return Err(invalid(
                            field("interval_ms"),
                            "interval_ms and max_disorder_ms must not be negative",
                        ));
                    }
                    if g.rate_per_sec == Some(0) {
                        return Err(invalid(field("rate_per_sec"), "must be positive (omit it for full speed)"));
                    }
                }
                SourceSpec::Kafka(k) => {
                    check_parallelism(field("parallelism"), k.parallelism)?;
                    k.validate(&field)?;
                }
                SourceSpec::Nexmark(n) => {
                    check_parallelism(field("parallelism"), n.parallelism)?;
                    n.config().validate().map_err(|e| invalid(field(e.field), e.problem))?;
                    if n.rate_per_sec == Some(0) {
                        return Err(invalid(field("rate_per_sec"), "must be positive (omit it for full speed)"));
                    }
                }
                SourceSpec::File { s3: Some(_), follow: true, .. } => {
                    return Err(invalid(
                        field("follow"),
                        "an object in a bucket is replaced whole, never appended to: drop `follow`, or read a \
                         local file",
                    ));
                }
                SourceSpec::File { s3: Some(_), path, .. } if !is_relative_key(path) => {
                    return Err(invalid(
                        field("path"),
                        format!(
                            "`{}`: with `s3`, give the object's key under the prefix, without `..`",
                            path.display()
                        ),
                    ));
                }
                SourceSpec::File { .. } => {}
            }
        }
        if self.steps.is_empty() {
            return Err(invalid("steps", "needs at least one operator step"));
        }
        for (i, step) in self.steps.iter().enumerate() {
            let field = |f: &str| format!("steps[{i}].{f}");
            check_name(field("name"), &step.name)?;
            if self.steps[..i].iter().any(|s| s.name == step.name) {
                return Err(invalid(field("name"), format!("`{}` is used by an earlier step", step.name)));
            }
            let config_bytes = json_len(&step.config);
            if config_bytes > MAX_STEP_CONFIG_BYTES {
                return Err(invalid(
                    field("config"),
                    format!(
                        "{config_bytes} bytes as JSON, above the limit of {MAX_STEP_CONFIG_BYTES} \
                         (MAX_STEP_CONFIG_BYTES); a config holds settings, not data: read bulk data from a source"
                    ),
                ));
            }
            if let Some(p) = step.parallelism {
                check_parallelism(field("parallelism"), p)?;
            }
            if step.state_ttl_ms.is_some_and(|ms| ms <= 0) {
                return Err(invalid(field("state_ttl_ms"), "must be positive (omit it to keep state forever)"));
            }
            if let Some(window) = &step.window {
                check_name(field("window.late_output"), &window.late_output)?;
                window.kind().map_err(|(f, problem)| {
                    invalid(field(&format!("window.{f}")), format!("step `{}`: {problem}", step.name))
                })?;
                if window.allowed_lateness_ms < 0 {
                    return Err(invalid(field("window.allowed_lateness_ms"), "must not be negative"));
                }
                if window.two_phase {
                    window.check_two_phase().map_err(|(f, problem)| {
                        invalid(field(&format!("window.{f}")), format!("step `{}`: {problem}", step.name))
                    })?;
                }
                if step.key_by.is_none() {
                    return Err(invalid(
                        field("key_by"),
                        "a window step needs `key_by` (`key`, `value` or a JSON pointer such as `/user_id`)",
                    ));
                }
                if step.state_ttl_ms.is_some() {
                    return Err(invalid(field("state_ttl_ms"), "window state is purged by the window itself"));
                }
            }
        }
        Ok(())
    }
}

/// Checks that `name` is an identifier: 1 to `MAX_NAME_BYTES` bytes of ASCII letters, digits,
/// `_`, `-` and `.`, starting with a letter or digit. Names become metric labels, log fields,
/// file and key names, and the `[name]` prefix of printed side outputs, so one holding a
/// quote, a newline, a brace or a `/` could forge another series, line or key; one starting
/// with `.` could be `..`.
pub fn check_name(field: impl Into<String>, name: &str) -> Result<(), SpecError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
    let first_ok = name.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric);
    if first_ok && name.len() <= MAX_NAME_BYTES && name.bytes().all(allowed) {
        return Ok(());
    }
    // Quoted by `Debug`, and cut, so the message itself carries no newline and no megabyte.
    let shown: String = name.chars().take(MAX_NAME_BYTES + 1).collect();
    let cut = if shown.len() < name.len() { "..." } else { "" };
    Err(invalid(
        field,
        format!(
            "{shown:?}{cut} ({} bytes) is not a name: use 1 to {MAX_NAME_BYTES} bytes of ASCII letters, digits, `_`, \
             `-` and `.`, starting with a letter or digit",
            name.len()
        ),
    ))
}

/// Bytes of `value` as compact JSON (what a guest's `open` receives), counted without
/// building the text.
fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // A `Value` always serializes (its keys are strings) and `Count` never fails; were it to
    // fail all the same, the config is refused as too large rather than passed unmeasured.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

#[cfg(test)]
mod hostile_tests;

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "name: wc\nsources: [{type: file, name: in, path: in.txt}]\nsteps:\n  - {name: a, wasm: a.wasm}\nsink: {type: print}\n";

    #[test]
    fn defaults_apply() {
        let spec = PipelineSpec::from_yaml(OK).unwrap();
        assert_eq!(spec.max_parallelism, 128);
        assert_eq!(spec.batch_size, 256);
        assert_eq!(spec.step_parallelism(0), 1);
        assert_eq!(spec.watermarks, WatermarkSpec { out_of_orderness_ms: 0, idleness_ms: None, interval_ms: 0 });
        assert_eq!(
            spec.sources[0],
            SourceSpec::File {
                name: "in".into(),
                path: "in.txt".into(),
                format: SourceFormat::Lines,
                timestamp: None,
                follow: false,
                max_line_bytes: 16 << 20,
                s3: None,
                beneath: None,
            }
        );
    }

    #[test]
    fn windows_and_key_by_parse() {
        let yaml = OK.replace(
            "{name: a, wasm: a.wasm}",
            "{name: a, wasm: a.wasm, key_by: /user, window: {type: sliding, size_ms: 60000, slide_ms: 10000}}",
        );
        let spec = PipelineSpec::from_yaml(&yaml).unwrap();
        let step = &spec.steps[0];
        assert_eq!(step.key_by, Some(KeyBy::Field("/user".into())));
        let window = step.window.as_ref().unwrap();
        assert_eq!(window.kind().unwrap(), WindowKind::Sliding { size_ms: 60_000, slide_ms: 10_000 });
        assert_eq!(window.late_output, "late");
    }

    #[test]
    fn two_phase_windows_are_tumbling_or_sliding_drop_late_records_and_allow_no_lateness() {
        let with = |window: &str| {
            PipelineSpec::from_yaml(&OK.replace(
                "{name: a, wasm: a.wasm}",
                &format!("{{name: a, wasm: a.wasm, key_by: key, window: {{{window}}}}}"),
            ))
        };
        let spec = with("type: sliding, size_ms: 10, slide_ms: 5, two_phase: true, drop_late: true").unwrap();
        assert!(spec.steps[0].window.as_ref().unwrap().two_phase);
        assert!(
            !with("type: tumbling, size_ms: 10").unwrap().steps[0].window.as_ref().unwrap().two_phase,
            "off by default"
        );
        // (window, the field named, a word of the reason)
        let refused = [
            ("type: session, gap_ms: 10, two_phase: true, drop_late: true", "steps[0].window.type", "sessions"),
            ("type: tumbling, size_ms: 10, two_phase: true", "steps[0].window.drop_late", "drop_late: true"),
            (
                "type: tumbling, size_ms: 10, two_phase: true, drop_late: true, allowed_lateness_ms: 5",
                "steps[0].window.allowed_lateness_ms",
                "must be 0",
            ),
        ];
        for (window, field, why) in refused {
            let err = with(window).unwrap_err().to_string();
            assert!(err.contains(field) && err.contains(why) && err.contains("two_phase"), "{window}: {err}");
        }
    }

    #[test]
    fn checkpoint_mode_and_aligned_timeout_parse_and_are_validated() {
        let with = |c: &str| OK.replace("sink:", &format!("checkpoints: {{dir: ck, {c}}}\nsink:"));
        let spec = PipelineSpec::from_yaml(&with("interval_ms: 100")).unwrap();
        let c = spec.checkpoints.unwrap();
        assert_eq!((c.mode, c.aligned_timeout_ms), (CheckpointMode::Aligned, None), "aligned by default");
        let spec = PipelineSpec::from_yaml(&with("mode: unaligned")).unwrap();
        assert_eq!(spec.checkpoints.unwrap().mode, CheckpointMode::Unaligned);
        let spec = PipelineSpec::from_yaml(&with("mode: aligned, aligned_timeout_ms: 250")).unwrap();
        assert_eq!(spec.checkpoints.unwrap().aligned_timeout_ms, Some(250));
        let refused = [
            (with("mode: sideways"), "mode"),
            (with("aligned_timeout_ms: 0"), "`checkpoints.aligned_timeout_ms`: must be positive"),
            (
                with("mode: unaligned, aligned_timeout_ms: 100"),
                "`checkpoints.aligned_timeout_ms`: applies to `mode: aligned` only",
            ),
            (
                with("timeout_ms: 500, aligned_timeout_ms: 500"),
                "`checkpoints.aligned_timeout_ms`: 500 must be below checkpoints.timeout_ms (500)",
            ),
        ];
        for (yaml, expected) in refused {
            let err = PipelineSpec::from_yaml(&yaml).expect_err(&yaml).to_string();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let step = |s: &str| OK.replace("{name: a, wasm: a.wasm}", s);
        let cases = [
            (OK.replace("name: wc", "name: ''"), "`name`"),
            (OK.replace("steps:", "max_parallelism: 0\nsteps:"), "max_parallelism"),
            (OK.replace("steps:", "parallelism: 200\nsteps:"), "`parallelism`: 200 is outside 1..=128"),
            (step("{name: a, wasm: a.wasm}\n  - {name: a, wasm: b.wasm}"), "steps[1].name"),
            (step("{name: a, wasm: a.wasm, confg: 1}"), "confg"),
            (step("{name: a, wasm: a.wasm, key_by: user}"), "JSON pointer"),
            (step("{name: a, wasm: a.wasm, key_by: key, window: {type: tumbling}}"), "steps[0].window.size_ms"),
            (
                step("{name: a, wasm: a.wasm, key_by: key, window: {type: sliding, size_ms: 10, slide_ms: 3}}"),
                "multiple",
            ),
            (
                step("{name: a, wasm: a.wasm, key_by: key, window: {type: sliding, size_ms: 100000, slide_ms: 1}}"),
                "step `a`: size_ms / slide_ms = 100000 / 1 = 100000 windows per record, above the limit of 1000",
            ),
            (step("{name: a, wasm: a.wasm, window: {type: session, gap_ms: 5}}"), "steps[0].key_by"),
            (step("{name: a, wasm: a.wasm, state_ttl_ms: 0}"), "steps[0].state_ttl_ms"),
            (step("{name: a, wasm: a.wasm, debug: {journal: true}}"), "steps[0].debug.journal"),
            (
                OK.replace("steps:", "debug: {journal: true}\nsteps:"),
                "`debug.journal`: the journal is kept beside the checkpoints",
            ),
            (step("{name: a, wasm: a.wasm, debug: {jurnal: true}}"), "jurnal"),
            (step("{name: a, wasm: a.wasm, debug: {journal_max_mb: 0}}"), "steps[0].debug.journal_max_mb"),
            (step("{name: a, wasm: a.wasm, debug: {journal_compression: zstd}}"), "steps[0].debug.journal_compression"),
            (OK.replace("type: print", "type: pulsar"), "pulsar"),
            (OK.replace("sink: {type: print}\n", ""), "sink"),
            (OK.replace("type: print", "type: files"), "exactly one of `dir` and `s3`"),
            (OK.replace("type: print", "type: files, dir: out, s3: {bucket: b}"), "exactly one of `dir` and `s3`"),
            (OK.replace("path: in.txt}", "path: in.txt, timestamp: ts}"), "sources[0].timestamp"),
            (OK.replace("path: in.txt}", "path: in.txt, follow: true, s3: {bucket: b}}"), "sources[0].follow"),
            (OK.replace("path: in.txt}", "path: ../in.txt, s3: {bucket: b}}"), "sources[0].path"),
            (OK.replace("path: in.txt}", "path: /in.txt, s3: {bucket: b}}"), "sources[0].path"),
            (OK.replace("steps:", "watermarks: {idleness_ms: 0}\nsteps:"), "watermarks.idleness_ms"),
            (OK.replace("steps:", "watermarks: {interval_ms: -1}\nsteps:"), "watermarks.interval_ms"),
            (OK.replace("steps:", "watermarks: {interval_ms: 60001}\nsteps:"), "watermarks.interval_ms"),
            (
                OK.replace("{type: file, name: in, path: in.txt}", "{type: generator, name: g, keys: 0}"),
                "sources[0].keys",
            ),
            (OK.replace("{type: file, name: in, path: in.txt}", "{type: nexmark}"), "sources[0].name"),
            (
                OK.replace("{type: file, name: in, path: in.txt}", "{type: nexmark, name: n, hot_bidder_ratio: 0}"),
                "sources[0].hot_bidder_ratio",
            ),
            (
                OK.replace("{type: file, name: in, path: in.txt}", "{type: nexmark, name: n, max_disorder_ms: -5}"),
                "sources[0].max_disorder_ms",
            ),
            (
                OK.replace("{type: file, name: in, path: in.txt}", "{type: nexmark, name: n, parallelism: 0}"),
                "sources[0].parallelism",
            ),
            (
                OK.replace("{type: file, name: in, path: in.txt}", "{type: nexmark, name: n, rate_per_sec: 0}"),
                "sources[0].rate_per_sec",
            ),
            (OK.replace("{type: file, name: in, path: in.txt}", "{type: nexmark, name: n, keys: 3}"), "keys"),
        ];
        for (yaml, needle) in cases {
            let err = PipelineSpec::from_yaml(&yaml).unwrap_err().to_string();
            assert!(err.contains(needle), "error for {needle}: {err}");
        }
        let journaled = OK.replace("steps:", "debug: {journal: true}\nsteps:");
        for store in ["dir: c", "s3: {bucket: b}"] {
            let yaml = journaled.replace("steps:", &format!("checkpoints: {{{store}}}\nsteps:"));
            PipelineSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("a journal beside checkpoints in {store}: {e}"));
        }
    }

    #[test]
    fn nexmark_sources_default_to_the_generator_defaults() {
        let yaml = OK.replace(
            "{type: file, name: in, path: in.txt}",
            "{type: nexmark, name: bids, seed: 3, events: 1000, parallelism: 2, hot_auction_ratio: 5}",
        );
        let spec = PipelineSpec::from_yaml(&yaml).unwrap();
        let SourceSpec::Nexmark(n) = &spec.sources[0] else { panic!("nexmark source") };
        assert_eq!((spec.sources[0].name(), spec.sources[0].parallelism()), ("bids", 2));
        assert_eq!(n.rate_per_sec, None);
        let expected = eddy_nexmark::NexmarkConfig {
            seed: 3,
            events: Some(1000),
            hot_auction_ratio: 5,
            ..eddy_nexmark::NexmarkConfig::default()
        };
        assert_eq!(n.config(), expected);
    }

    #[test]
    fn state_limits_take_the_step_then_the_section_then_the_backend_default() {
        let yaml = OK.replace(
            "{name: a, wasm: a.wasm}",
            "{name: a, wasm: a.wasm}\n  - {name: b, wasm: b.wasm, state_max_bytes: 5, state_max_entries: 6}",
        );
        let mut spec = PipelineSpec::from_yaml(&yaml).unwrap();
        let (a, b) = (&spec.steps[0], &spec.steps[1]);
        assert_eq!((spec.state.max_bytes_for(a), spec.state.max_entries_for(a)), (1 << 30, 10_000_000));
        assert_eq!((spec.state.max_bytes_for(b), spec.state.max_entries_for(b)), (5, 6));
        spec.state.backend = StateBackendKind::Rocksdb;
        let a = &spec.steps[0];
        assert_eq!((spec.state.max_bytes_for(a), spec.state.max_entries_for(a)), (64 << 30, 1_000_000_000));
        spec.state.max_bytes_per_subtask = Some(7);
        spec.state.max_entries_per_subtask = Some(8);
        let (a, b) = (&spec.steps[0], &spec.steps[1]);
        assert_eq!((spec.state.max_bytes_for(a), spec.state.max_entries_for(a)), (7, 8));
        assert_eq!((spec.state.max_bytes_for(b), spec.state.max_entries_for(b)), (5, 6));
    }

    #[test]
    fn paths_resolve_against_the_spec_directory() {
        let mut spec = PipelineSpec::from_yaml(OK).unwrap();
        spec.resolve_paths(Path::new("/pipelines"));
        assert_eq!(spec.steps[0].wasm, PathBuf::from("/pipelines/a.wasm"));
        let SourceSpec::File { path, .. } = &spec.sources[0] else { panic!("file source") };
        assert_eq!(path, &PathBuf::from("/pipelines/in.txt"));
    }
}
