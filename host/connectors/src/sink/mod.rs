//! Sinks: where a job's records end up. Side outputs arrive with their name so a file or
//! terminal shows everything the job produced. The print, file and upsert sinks have one
//! subtask; the files and blackhole sinks one per subtask of their input (see `plan`).

use std::io::Write;

use eddy_core::RecordBatch;

use crate::values::json_text;

mod files;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "postgres")]
mod postgres;
mod upsert;

pub use files::{FilesSink, FilesSinkState, LocalDir, OutputDir, StoreDir};
#[cfg(feature = "kafka")]
pub use kafka::{KafkaSink, KafkaSinkState, commit_state as commit_kafka_state};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresSink, PostgresSinkState};
pub use upsert::UpsertSink;

/// Where a run's records end up. `output` is `None` for the main output, else a side output.
///
/// # Contract
///
/// Sinks that only append or overwrite (print, blackhole, upsert) ignore checkpoints. An
/// exactly-once sink takes part in them as a two-phase commit, and must guarantee:
///
/// - **`pre_commit(n)`** is called when checkpoint `n`'s barrier reaches the sink, after every
///   record before the barrier was written and before any record after it. It makes those
///   records durable but not yet visible (a closed in-progress file, a prepared transaction)
///   and returns the state that finds them again: plain JSON, stored in checkpoint `n`'s
///   metadata. Records written after it belong to the next transaction.
/// - **`notify_complete(n)`** is called once checkpoint `n` (and with it every earlier one) is
///   complete: make what `pre_commit(n)` and every earlier pre-commit left visible. It may come
///   late or never (the process died between the metadata and the call), and may repeat a
///   commit already made, so committing must be idempotent.
/// - **Recovery** is the connector's too: on a restore from checkpoint `n`, what the sink
///   states stored in `n` list is committed (that checkpoint completed, whether or not
///   `notify_complete` ran), and everything else this job's sink subtasks left pre-committed or
///   open is aborted, because those records come again from the sources' rewound positions
///   (see [`FilesSink::recover`]).
/// - **Errors fail the job.** An `Err` from any method fails the attempt; the job restarts from
///   its last completed checkpoint. A sink never drops records to keep going.
pub trait Sink: Send {
    /// Takes a batch.
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()>;
    /// Flushes at the end of the input.
    fn finish(&mut self) -> std::io::Result<()>;
    /// Checkpoint `checkpoint`'s barrier passed: the transaction state it must record.
    fn pre_commit(&mut self, checkpoint: u64) -> std::io::Result<Option<serde_json::Value>> {
        let _ = checkpoint;
        Ok(None)
    }
    /// Checkpoint `checkpoint` (and every one before it) is complete.
    fn notify_complete(&mut self, checkpoint: u64) -> std::io::Result<()> {
        let _ = checkpoint;
        Ok(())
    }
}

fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// `key => value` lines (side outputs prefixed with `[name]`).
#[derive(Debug)]
pub struct PrintSink<W: Write>(pub W);

impl<W: Write + Send> Sink for PrintSink<W> {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        for r in batch.iter() {
            if let Some(name) = output {
                write!(self.0, "[{name}] ")?;
            }
            match r.key {
                Some(k) => writeln!(self.0, "{} => {}", text(&json_text(k)), text(&json_text(r.value)))?,
                None => writeln!(self.0, "{}", text(&json_text(r.value)))?,
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// JSON lines `{"output", "key", "value", "timestamp"}`; keys and values are embedded as JSON
/// when they are JSON, else as strings.
#[derive(Debug)]
pub struct JsonLinesSink<W: Write>(pub W);

fn embed(bytes: &[u8]) -> serde_json::Value {
    let bytes = &json_text(bytes);
    serde_json::from_slice(bytes).unwrap_or_else(|_| serde_json::Value::String(text(bytes).into_owned()))
}

/// Writes `batch` as JSON lines (the format of [`JsonLinesSink`] and the files sink).
pub(crate) fn write_json_lines(out: &mut impl Write, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
    for r in batch.iter() {
        let line = serde_json::json!({
            "output": output.unwrap_or("main"),
            "key": r.key.map(embed),
            "value": embed(r.value),
            "timestamp": r.timestamp,
        });
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

impl<W: Write + Send> Sink for JsonLinesSink<W> {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        write_json_lines(&mut self.0, output, batch)
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Discards everything.
#[derive(Debug, Default)]
pub struct Blackhole;

impl Sink for Blackhole {
    fn write(&mut self, _: Option<&str>, _: &RecordBatch) -> std::io::Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
