//! Runs a pipeline as one chain in one thread: source batches pass through every step in
//! order by call (no channels), and what comes out goes to the sink.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use eddy_core::{HeapTimerService, RecordBatch};
use eddy_runtime::{CallError, LoadError, OperatorInstance, Output, Runtime, RuntimeError, Subtask};
use eddy_state::HeapStateBackend;

use crate::spec::{PipelineSpec, SinkSpec, SourceFormat, SourceSpec};

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A step's component could not be loaded.
    #[error("step `{step}`: {source}")]
    Load {
        /// The step.
        step: String,
        /// Why.
        source: LoadError,
    },
    /// A step could not be instantiated.
    #[error(transparent)]
    Instantiate(#[from] RuntimeError),
    /// A step failed while running.
    #[error(transparent)]
    Call(#[from] CallError),
    /// An input line is not what the source format promises.
    #[error("{path} line {line}: {problem}")]
    BadInput {
        /// The input file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// Reading the source or writing the sink failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// "reading" or "writing".
        what: &'static str,
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Where a run's records end up. `output` is `None` for the main output, else a side output.
pub trait Sink {
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

impl<W: Write> Sink for PrintSink<W> {
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

impl<W: Write> Sink for JsonLinesSink<W> {
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

/// Counts of one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepCounts {
    /// The step.
    pub name: String,
    /// Records handed to it.
    pub records_in: u64,
    /// Records it emitted to its main output.
    pub records_out: u64,
    /// Records it emitted to side outputs.
    pub side_records_out: u64,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Records read from the source.
    pub records_in: u64,
    /// Records written to the sink (main and side outputs).
    pub records_out: u64,
    /// Per step.
    pub steps: Vec<StepCounts>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Runs a [`PipelineSpec`] as one chain.
#[derive(Debug)]
pub struct ChainRunner<'r> {
    spec: PipelineSpec,
    runtime: &'r Runtime,
}

struct Step {
    instance: OperatorInstance,
    counts: StepCounts,
}

impl<'r> ChainRunner<'r> {
    /// A runner for `spec` on `runtime`.
    pub fn new(spec: PipelineSpec, runtime: &'r Runtime) -> Self {
        Self { spec, runtime }
    }

    /// The sink the spec names.
    pub fn open_sink(&self) -> Result<Box<dyn Sink>, RunError> {
        Ok(match &self.spec.sink {
            SinkSpec::Print => Box::new(PrintSink(std::io::stdout().lock())),
            SinkSpec::Blackhole => Box::new(Blackhole),
            SinkSpec::File { path } => {
                let file = File::create(path).map_err(|source| io_err("writing", path, source))?;
                Box::new(JsonLinesSink(BufWriter::new(file)))
            }
        })
    }

    fn open_steps(&self) -> Result<Vec<Step>, RunError> {
        let subtask = Subtask::single(self.spec.max_parallelism);
        self.spec
            .steps
            .iter()
            .map(|s| {
                let component = self
                    .runtime
                    .load_file(&s.name, &s.wasm)
                    .map_err(|source| RunError::Load { step: s.name.clone(), source })?;
                let mut instance = component.instantiate_operator(
                    subtask,
                    Box::new(HeapStateBackend::default()),
                    Box::new(HeapTimerService::default()),
                )?;
                instance.open(&s.config.to_string())?;
                Ok(Step { instance, counts: StepCounts { name: s.name.clone(), ..StepCounts::default() } })
            })
            .collect()
    }

    /// Runs to the end of the input. `progress` is called about once a second.
    pub fn run(&self, sink: &mut dyn Sink, mut progress: impl FnMut(&RunSummary)) -> Result<RunSummary, RunError> {
        let started = Instant::now();
        let mut steps = self.open_steps()?;
        let mut summary = RunSummary::default();
        let mut last_report = Instant::now();
        let SourceSpec::File { path, format } = &self.spec.source;
        let file = File::open(path).map_err(|source| io_err("reading", path, source))?;
        let mut batch = RecordBatch::default();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| io_err("reading", path, source))?;
            batch.push(None, &encode_line(&line, *format, path, i + 1)?, None);
            summary.records_in += 1;
            if batch.len() >= self.spec.batch_size {
                push(&mut steps, 0, std::mem::take(&mut batch), sink, &mut summary, path)?;
            }
            if last_report.elapsed() >= Duration::from_secs(1) {
                last_report = Instant::now();
                summary.elapsed = started.elapsed();
                summary.steps = steps.iter().map(|s| s.counts.clone()).collect();
                progress(&summary);
            }
        }
        push(&mut steps, 0, batch, sink, &mut summary, path)?;
        // End of a bounded input: close each step in order; what a step emits on close still
        // flows through the steps after it.
        for i in 0..steps.len() {
            let out = steps[i].instance.close()?;
            route(&mut steps, i, out, sink, &mut summary, path)?;
        }
        sink.finish().map_err(|source| io_err("writing", Path::new("sink"), source))?;
        summary.elapsed = started.elapsed();
        summary.steps = steps.into_iter().map(|s| s.counts).collect();
        Ok(summary)
    }
}

fn io_err(what: &'static str, path: &Path, source: std::io::Error) -> RunError {
    RunError::Io { what, path: path.display().to_string(), source }
}

fn encode_line(line: &str, format: SourceFormat, path: &Path, number: usize) -> Result<Vec<u8>, RunError> {
    match format {
        SourceFormat::Lines => Ok(serde_json::to_vec(line).unwrap_or_default()),
        SourceFormat::JsonLines => match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => Ok(serde_json::to_vec(&v).unwrap_or_default()),
            Err(e) => Err(RunError::BadInput {
                path: path.display().to_string(),
                line: number,
                problem: format!("not JSON: {e}"),
            }),
        },
    }
}

/// Feeds `batch` to step `from` and everything after it.
fn push(
    steps: &mut [Step],
    from: usize,
    batch: RecordBatch,
    sink: &mut dyn Sink,
    summary: &mut RunSummary,
    path: &Path,
) -> Result<(), RunError> {
    if batch.is_empty() {
        return Ok(());
    }
    let Some(step) = steps.get_mut(from) else {
        summary.records_out += batch.len() as u64;
        return sink.write(None, &batch).map_err(|source| io_err("writing", Path::new("sink"), source));
    };
    step.counts.records_in += batch.len() as u64;
    let out = step.instance.process(&batch)?;
    route(steps, from, out, sink, summary, path)
}

/// Sends step `at`'s output on: main output to the next step, side outputs to the sink.
fn route(
    steps: &mut [Step],
    at: usize,
    out: Output,
    sink: &mut dyn Sink,
    summary: &mut RunSummary,
    path: &Path,
) -> Result<(), RunError> {
    steps[at].counts.records_out += out.main.len() as u64;
    for (name, side) in &out.side {
        steps[at].counts.side_records_out += side.len() as u64;
        summary.records_out += side.len() as u64;
        if !side.is_empty() {
            sink.write(Some(name), side).map_err(|source| io_err("writing", Path::new("sink"), source))?;
        }
    }
    push(steps, at + 1, out.main, sink, summary, path)
}
