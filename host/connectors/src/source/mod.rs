//! Source connectors: readers that turn a [`SourceSpec`] into batches of records.
//!
//! Every reader appends records to a caller-owned [`RecordBatch`] and can say where it is
//! ([`SourcePosition`]), so a checkpoint can record the position and a restarted reader opened
//! there ([`open_source`] with `start`) yields exactly the records after it.
//!
//! Records leave a source with no key, a JSON value (compact bytes) and the event time in ms
//! when the source knows one.
//!
//! ```
//! use eddy_core::RecordBatch;
//! use eddy_connectors::{SourcePosition, SourceStatus, open_source};
//! use eddy_plan::PipelineSpec;
//!
//! let spec = PipelineSpec::from_yaml(
//!     "name: g\nsources: [{type: generator, name: g, events: 5}]\n\
//!      steps: [{name: a, wasm: a.wasm}]\nsink: {type: print}",
//! )?;
//! let mut reader = open_source(&spec.sources[0], 0, 1, None)?;
//! let mut batch = RecordBatch::default();
//! assert_eq!(reader.poll(&mut batch, 3)?, SourceStatus::Ready);
//! assert_eq!(batch.len(), 3);
//! assert_eq!(reader.position(), SourcePosition::Generator { next_index: 3 });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod file;
mod generator;
mod indexed;
#[cfg(feature = "kafka")]
pub(crate) mod kafka;
mod nexmark;

use std::path::PathBuf;

use eddy_core::RecordBatch;
use serde::Serialize;

use eddy_plan::{SourceSpec, StoreLocation};

pub use eddy_checkpoint::SourcePosition;
pub use generator::generator_event;

/// What one [`Source::poll`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceStatus {
    /// At least one record was appended.
    Ready,
    /// Nothing is available now; poll again later.
    Idle,
    /// The bounded input is exhausted; nothing was appended and nothing ever will be.
    End,
}

/// A source reader: one parallel subtask of one source.
///
/// # Contract
///
/// Exactly-once rests on [`Source::position`]: at a checkpoint the task records the position
/// of each reader between two polls, and a restore opens the reader there (`open_source` with
/// `start`). So a reader must guarantee:
///
/// - **Replay is exact.** Opened at `position()`, it yields exactly the records it had not yet
///   returned, in the same order and with the same values, keys and event times: nothing
///   before the position again, nothing after it skipped. A position is therefore a place in
///   the input (an offset, an event index), never a count of records seen in this run.
/// - **A position is plain data.** It is serialized into the checkpoint's metadata and may be
///   read back by another process on another machine; it holds no handle or path that only
///   this process can use.
/// - **Errors leave a true position.** Records appended before a failure stay appended, and the
///   position is just after them, so resuming meets the same error rather than skipping it.
/// - **`poll` does not block for long.** The task thread also handles barriers, watermarks and
///   timers between polls: return [`SourceStatus::Idle`] when nothing is available.
pub trait Source: Send {
    /// Appends up to `max` records to `out` (which it never clears).
    ///
    /// On an error, records appended before the offending line stay in `out` and
    /// [`Source::position`] is just after them, so resuming there meets the same error.
    /// `max == 0` appends nothing (and returns `Idle`, or `End` when the reader knows it is done).
    fn poll(&mut self, out: &mut RecordBatch, max: usize) -> Result<SourceStatus, SourceError>;

    /// The position after the last record returned; resuming there yields exactly the rest.
    fn position(&self) -> SourcePosition;

    /// The reader's watermark, for a source that tracks event time per split (a Kafka reader,
    /// per partition, with idleness); called after every poll. `None`: the task derives the
    /// watermark from the records' times (bounded out-of-orderness over the batches).
    fn watermark(&mut self) -> Option<i64> {
        None
    }

    /// Records the last polls set aside for side outputs (a record that could not be decoded,
    /// when the spec sends such records to a named output), by output name. They go to the
    /// sink directly, past the steps, as steps' side outputs do.
    fn take_side(&mut self) -> Vec<(String, RecordBatch)> {
        Vec::new()
    }
}

/// Why a source cannot go on. Messages name the source, the file and the 1-based line.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A line that cannot become a record.
    #[error("source `{source_name}`: {} line {line}: {problem}", path.display())]
    BadInput {
        /// The source's name.
        source_name: String,
        /// The file read.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong with the line.
        problem: String,
    },
    /// The file could not be opened, read or positioned.
    #[error("source `{source_name}`: cannot read {}: {source}", path.display())]
    Io {
        /// The source's name.
        source_name: String,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A start position that does not fit this source (wrong kind, past the end of the file,
    /// not at a line start, or a generator index of another reader).
    #[error("source `{source_name}`: cannot resume at {position:?}: {problem}")]
    BadPosition {
        /// The source's name.
        source_name: String,
        /// The position asked for.
        position: SourcePosition,
        /// Why it does not fit.
        problem: String,
    },
    /// The brokers or the client refused or failed (unreachable, a missing topic, a property
    /// the client rejects).
    #[error("source `{source_name}`: {problem}")]
    Broker {
        /// The source's name.
        source_name: String,
        /// What went wrong and what to do.
        problem: String,
    },
    /// A record that cannot become a record value, named by where it is.
    #[error("source `{source_name}`: record at {at}: {problem}")]
    BadRecord {
        /// The source's name.
        source_name: String,
        /// Where the record is (topic, partition, offset).
        at: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A subtask/parallelism pair that cannot be: `subtask >= parallelism`, or a parallel
    /// reader of a file (a file is one split).
    #[error("source `{source_name}`: no reader {subtask} of parallelism {parallelism}: {problem}")]
    BadReader {
        /// The source's name.
        source_name: String,
        /// The subtask asked for.
        subtask: u32,
        /// The parallelism asked for.
        parallelism: u32,
        /// Why it cannot be.
        problem: String,
    },
}

/// Opens reader `subtask` of `parallelism` for `spec`, resuming at `start` when given.
///
/// A file is one split, so its only reader is `0` of `1`. A generator's (or Nexmark source's)
/// reader `j` of `p` produces the events `i` with `i % p == j`.
pub fn open_source(
    spec: &SourceSpec,
    subtask: u32,
    parallelism: u32,
    start: Option<&SourcePosition>,
) -> Result<Box<dyn Source>, SourceError> {
    let bad_reader = |problem: &str| SourceError::BadReader {
        source_name: spec.name().to_string(),
        subtask,
        parallelism,
        problem: problem.to_string(),
    };
    if subtask >= parallelism {
        return Err(bad_reader("the subtask must be below the parallelism"));
    }
    match spec {
        SourceSpec::File { name, path, format, timestamp, follow, max_line_bytes, s3, beneath } => {
            if parallelism != 1 {
                return Err(bad_reader("a file is read by one reader"));
            }
            let key = path.to_string_lossy().into_owned();
            let shown = match s3 {
                Some(s3) => PathBuf::from(StoreLocation::S3(s3.clone()).join(&key).to_string()),
                None => path.clone(),
            };
            let options = file::FileOptions {
                name: name.clone(),
                path: shown,
                object: s3.clone().map(|s3| (s3, key)),
                format: *format,
                timestamp: timestamp.clone(),
                follow: *follow,
                max_line_bytes: *max_line_bytes,
                beneath: beneath.clone(),
            };
            Ok(Box::new(file::FileSource::open(options, start)?))
        }
        SourceSpec::Generator(g) => {
            Ok(Box::new(indexed::IndexedSource::open(g.clone(), subtask, parallelism, start, g.rate_per_sec)?))
        }
        #[cfg(feature = "kafka")]
        SourceSpec::Kafka(k) => Ok(Box::new(kafka::KafkaSource::open(k, subtask, parallelism, start)?)),
        #[cfg(not(feature = "kafka"))]
        SourceSpec::Kafka(k) => Err(SourceError::Broker {
            source_name: k.name.clone(),
            problem: "this build has no Kafka client: build eddy with the `kafka` feature".into(),
        }),
        SourceSpec::Nexmark(n) => {
            let events = nexmark::NexmarkEvents::new(n);
            Ok(Box::new(indexed::IndexedSource::open(events, subtask, parallelism, start, n.rate_per_sec)?))
        }
    }
}

/// Reads a JSON value's event time: an integer, or a string holding one.
fn timestamp_of(value: Option<&serde_json::Value>, pointer: &str) -> Result<i64, String> {
    match value {
        None => Err(format!("timestamp `{pointer}` is missing")),
        Some(serde_json::Value::Number(n)) => {
            n.as_i64().ok_or_else(|| format!("timestamp `{pointer}` is {n}, not an integer number of ms in i64 range"))
        }
        Some(serde_json::Value::String(s)) => s
            .parse::<i64>()
            .map_err(|_| format!("timestamp `{pointer}` is the string {s:?}, not an integer number of ms")),
        Some(other) => Err(format!("timestamp `{pointer}` is {other}, not an integer number of ms")),
    }
}

/// Serializes `(name, value)` pairs as a JSON object in the given order: `serde_json::Map`
/// sorts its keys (the workspace does not enable `preserve_order`), but a CSV row or a
/// generator event should read in the order its fields were declared.
struct OrderedObject<'a, V: Serialize>(&'a [(&'a str, V)]);

impl<V: Serialize> Serialize for OrderedObject<'_, V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_must_be_integers() {
        let v = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert_eq!(timestamp_of(Some(&v("17")), "/ts"), Ok(17));
        assert_eq!(timestamp_of(Some(&v("-17")), "/ts"), Ok(-17));
        assert_eq!(timestamp_of(Some(&v("\"42\"")), "/ts"), Ok(42));
        for bad in ["1.5", "\"x\"", "null", "[1]", "18446744073709551615"] {
            let err = timestamp_of(Some(&v(bad)), "/t").unwrap_err();
            assert!(err.contains("`/t`") && err.contains("not an integer"), "{bad}: {err}");
        }
        assert!(timestamp_of(None, "/t").unwrap_err().contains("`/t` is missing"));
    }

    #[test]
    fn ordered_object_keeps_declared_order() {
        let bytes = serde_json::to_vec(&OrderedObject(&[("z", 1), ("a", 2)])).unwrap();
        assert_eq!(bytes, br#"{"z":1,"a":2}"#);
    }

    #[test]
    fn reader_numbers_are_checked() {
        let file = SourceSpec::File {
            name: "f".into(),
            path: "/nonexistent".into(),
            format: eddy_plan::SourceFormat::Lines,
            timestamp: None,
            follow: false,
            max_line_bytes: 1024,
            s3: None,
            beneath: None,
        };
        let err = open_source(&file, 0, 2, None).err().unwrap().to_string();
        assert!(err.contains("source `f`") && err.contains("one reader"), "{err}");
        let err = open_source(&file, 1, 1, None).err().unwrap().to_string();
        assert!(err.contains("below the parallelism"), "{err}");
    }
}
