//! Sinks: where a job's records end up. One sink subtask owns the sink; side outputs arrive
//! with their name so a single file or terminal shows everything the job produced.

use std::io::Write;

use eddy_core::RecordBatch;

/// Where a run's records end up. `output` is `None` for the main output, else a side output.
pub trait Sink: Send {
    /// Takes a batch.
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()>;
    /// Flushes at the end of the input.
    fn finish(&mut self) -> std::io::Result<()>;
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
                Some(k) => writeln!(self.0, "{} => {}", text(k), text(r.value))?,
                None => writeln!(self.0, "{}", text(r.value))?,
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
    serde_json::from_slice(bytes).unwrap_or_else(|_| serde_json::Value::String(text(bytes).into_owned()))
}

impl<W: Write + Send> Sink for JsonLinesSink<W> {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        for r in batch.iter() {
            let line = serde_json::json!({
                "output": output.unwrap_or("main"),
                "key": r.key.map(embed),
                "value": embed(r.value),
                "timestamp": r.timestamp,
            });
            serde_json::to_writer(&mut self.0, &line)?;
            self.0.write_all(b"\n")?;
        }
        Ok(())
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
