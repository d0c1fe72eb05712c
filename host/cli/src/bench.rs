//! `eddy bench nexmark`: one Nexmark query on Eddy and as a native Rust loop over the same
//! generated events, side by side in one run.
//!
//! Each side runs in its own child process (`--only eddy|native`), so CPU time and peak RSS
//! (from `getrusage`) belong to that side alone; the parent prints the table and writes the
//! JSON report. Latency is measured in a paced run (`--rate`), from the moment the input that
//! made a result entered the job to the moment the result reached the sink
//! ([`crate::bench_latency`]); the events, their times and so the results are the unpaced run's.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eddy_connectors::Sink;
use eddy_core::RecordBatch;
use eddy_engine::{Job, JobOptions, SinkFactory};
use eddy_plan::{CheckpointSpec, PipelineSpec, SinkSpec, SourceSpec, StateBackendKind};
use eddy_runtime::Runtime;
use serde::{Deserialize, Serialize};

use crate::bench_latency::{EntryLog, Made};

/// The queries with a pipeline and a native baseline.
pub const QUERIES: [&str; 8] = ["q0", "q1", "q2", "q3", "q5", "q7", "q8", "q11"];

/// What one side measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SideReport {
    /// `eddy` or `native`.
    pub side: String,
    /// Events generated and processed.
    pub events: u64,
    /// Rows the query produced.
    pub rows: u64,
    /// Wall time.
    pub seconds: f64,
    /// Events per wall second.
    pub events_per_sec: f64,
    /// User + system CPU seconds per million events.
    pub cpu_sec_per_million: f64,
    /// Peak resident set of the side's process, MiB.
    pub peak_rss_mib: f64,
    /// Median event-to-sink latency, ms (paced runs only).
    pub latency_p50_ms: Option<f64>,
    /// 99th percentile latency, ms (paced runs only).
    pub latency_p99_ms: Option<f64>,
}

/// The run's parameters.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// `q0` .. `q11`.
    pub query: String,
    /// Events over all source readers.
    pub events: u64,
    /// Parallelism of the source and every step.
    pub parallelism: u32,
    /// Total events per second (paced, measures latency); none = as fast as possible.
    pub rate: Option<u64>,
    /// Where the query pipelines live.
    pub queries_dir: PathBuf,
    /// Compiled-component cache.
    pub cache_dir: PathBuf,
    /// Checkpoint the Eddy side every this many ms (to a temporary directory).
    pub checkpoint_ms: Option<u64>,
    /// The Eddy side's state backend.
    pub state_backend: StateBackendKind,
    /// Journal every step's input (`debug: {journal: true}`; needs `checkpoint_ms`).
    pub journal: bool,
    /// Spread the Eddy side's subtasks over this many QUIC nodes in the process (subtask `i`
    /// of every task on node `i mod spread`), so exchanges cross loopback QUIC with mutual TLS.
    pub spread: u32,
}

/// The backend `name` (`heap` or `rocksdb`) names.
pub fn state_backend(name: &str) -> Result<StateBackendKind> {
    match name {
        "heap" => Ok(StateBackendKind::Heap),
        "rocksdb" => Ok(StateBackendKind::Rocksdb),
        other => bail!("unknown state backend `{other}`: use heap or rocksdb"),
    }
}

fn backend_name(kind: StateBackendKind) -> &'static str {
    match kind {
        StateBackendKind::Heap => "heap",
        StateBackendKind::Rocksdb => "rocksdb",
    }
}

pub(crate) fn cpu_and_rss() -> (f64, f64) {
    // SAFETY: getrusage fills the struct we pass and touches nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime) + secs(usage.ru_stime), usage.ru_maxrss as f64 / 1024.0)
}

fn finish(side: &str, events: u64, rows: u64, started: Instant, cpu_before: f64, latencies: Vec<f64>) -> SideReport {
    let seconds = started.elapsed().as_secs_f64();
    let (cpu, rss) = cpu_and_rss();
    let (p50, p99) = percentiles(latencies);
    SideReport {
        side: side.into(),
        events,
        rows,
        seconds,
        events_per_sec: events as f64 / seconds.max(1e-9),
        cpu_sec_per_million: (cpu - cpu_before) / (events as f64 / 1e6).max(1e-9),
        peak_rss_mib: rss,
        latency_p50_ms: p50,
        latency_p99_ms: p99,
    }
}

fn percentiles(mut samples: Vec<f64>) -> (Option<f64>, Option<f64>) {
    if samples.is_empty() {
        return (None, None);
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (Some(at(0.5)), Some(at(0.99)))
}

/// What the measuring sinks saw: rows, and in paced runs each row's arrival and event time.
type Arrivals = Arc<Mutex<(u64, Vec<(u64, i64)>)>>;

/// Counts rows and, in paced runs, logs when each arrived (for its latency).
struct MeasuringSink {
    rows: Arrivals,
    paced: Option<Arc<EntryLog>>,
}

impl Sink for MeasuringSink {
    fn write(&mut self, _output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        let mut rows = self.rows.lock().map_err(|_| std::io::Error::other("sink lock poisoned"))?;
        rows.0 += batch.len() as u64;
        if let Some(log) = &self.paced {
            let now = log.now();
            rows.1.extend(batch.iter().filter_map(|r| r.timestamp).map(|t| (now, t)));
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How `query`'s results come about: q0–q3 emit a row per event (with its time), the others
/// fire windows or event-time timers.
fn made_by(query: &str, bound_ms: i64) -> Made {
    match query {
        "q0" | "q1" | "q2" | "q3" => Made::ByItsEvent,
        _ => Made::ByWatermark { bound_ms },
    }
}

/// The query's pipeline with the run's events, parallelism and pacing.
fn bench_spec(args: &BenchArgs) -> Result<PipelineSpec> {
    let path = args.queries_dir.join(format!("{}.yaml", args.query));
    let mut spec = PipelineSpec::from_file(&path).with_context(|| format!("query `{}`", args.query))?;
    let Some(SourceSpec::Nexmark(source)) = spec.sources.first_mut() else {
        bail!("{} does not read a nexmark source", path.display());
    };
    source.events = Some(args.events);
    source.parallelism = args.parallelism;
    if let Some(rate) = args.rate {
        source.rate_per_sec = Some((rate / u64::from(args.parallelism)).max(1));
    }
    spec.parallelism = args.parallelism;
    for step in &mut spec.steps {
        step.parallelism = None;
    }
    spec.checkpoints = args.checkpoint_ms.map(|interval_ms| CheckpointSpec {
        timeout_ms: 60_000,
        retained: 1,
        ..CheckpointSpec::in_dir(
            std::env::temp_dir().join(format!("eddy-bench-checkpoints-{}", std::process::id())),
            interval_ms,
        )
    });
    if args.journal {
        if spec.checkpoints.is_none() {
            bail!("--journal writes beside the checkpoints: give --checkpoint-ms too");
        }
        spec.debug.journal = true;
    }
    spec.state.dir = Some(std::env::temp_dir().join(format!("eddy-bench-state-{}", std::process::id())));
    spec.state.backend = args.state_backend;
    spec.sink = SinkSpec::Blackhole;
    Ok(spec)
}

/// Runs the Eddy side in this process.
pub fn run_eddy(args: &BenchArgs) -> Result<SideReport> {
    let runtime = Runtime::new(eddy_runtime::RuntimeConfig {
        cache_dir: Some(args.cache_dir.clone()),
        ..eddy_runtime::RuntimeConfig::default()
    })?;
    let spec = bench_spec(args)?;
    let rows: Arrivals = Arc::default();
    let entries = args.rate.map(|_| EntryLog::new());
    let (shared, paced) = (rows.clone(), entries.clone());
    // One measuring sink per subtask of the last step (the spec's sink is a blackhole, which
    // runs at its input's parallelism), so no single sink thread funnels the output.
    let sinks: SinkFactory = Box::new(move |_| Box::new(MeasuringSink { rows: shared.clone(), paced: paced.clone() }));
    let observer = entries.as_ref().map(EntryLog::observer);
    let (cpu_before, _) = cpu_and_rss();
    let started = Instant::now();
    let summary = if args.spread > 1 {
        run_spread(&spec, &runtime, args.spread, sinks, observer)
    } else {
        let options = JobOptions { sink_per_subtask: Some(sinks), source_observer: observer, ..JobOptions::default() };
        Job::run(&spec, &runtime, options, Duration::from_secs(3600), |_, _| {}).map_err(anyhow::Error::from)
    };
    // The temporary checkpoint and state directories of this side.
    for dir in spec.checkpoints.iter().filter_map(|c| c.dir.as_ref()).chain(spec.state.dir.as_ref()) {
        let _ = std::fs::remove_dir_all(dir);
    }
    let summary = summary?;
    let events = summary.metrics.source_records;
    let (count, arrivals) = std::mem::take(&mut *rows.lock().map_err(|_| anyhow::anyhow!("sink lock poisoned"))?);
    let latencies = match &entries {
        Some(log) => log.latencies(&arrivals, made_by(&args.query, spec.watermarks.out_of_orderness_ms)),
        None => Vec::new(),
    };
    Ok(finish("eddy", events, count, started, cpu_before, latencies))
}

/// Runs `spec` over `nodes` QUIC nodes in this process, one job part per node; the source
/// records of all parts add up.
fn run_spread(
    spec: &PipelineSpec,
    runtime: &Runtime,
    nodes: u32,
    sinks: SinkFactory,
    observer: Option<eddy_engine::SourceObserver>,
) -> Result<eddy_engine::RunSummary> {
    use eddy_transport::quic::{ClusterCa, QuicNode, Tuning};
    if spec.checkpoints.is_some() {
        bail!("--spread runs without checkpoints: drop --checkpoint-ms");
    }
    let net =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().thread_name("eddy-net").build()?;
    let ca = ClusterCa::generate()?;
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    let nodes = names
        .iter()
        .map(|n| Ok(QuicNode::bind(&ca.issue(n)?, "127.0.0.1:0".parse()?, Tuning::default(), net.handle().clone())?))
        .collect::<Result<Vec<_>>>()?;
    let addrs: std::collections::HashMap<String, std::net::SocketAddr> =
        nodes.iter().map(|n| Ok((n.name().to_owned(), n.local_addr()?))).collect::<Result<_>>()?;
    let plan = eddy_plan::PhysicalPlan::new(spec);
    let assignment: Vec<Vec<String>> = plan
        .tasks
        .iter()
        .map(|t| (0..t.parallelism).map(|i| names[i as usize % names.len()].clone()).collect())
        .collect();
    let sinks = Arc::new(Mutex::new(sinks));
    let jobs = nodes
        .iter()
        .map(|node| {
            let placement =
                eddy_cluster::QuicPlacement::new(node.clone(), "bench".into(), 0, assignment.clone(), addrs.clone());
            let sinks = sinks.clone();
            let per_subtask: SinkFactory = Box::new(move |i| match sinks.lock() {
                Ok(mut make) => make(i),
                Err(poisoned) => (poisoned.into_inner())(i),
            });
            let options = JobOptions {
                sink_per_subtask: Some(per_subtask),
                placement: Some(Arc::new(placement)),
                source_observer: observer.clone(),
                ..JobOptions::default()
            };
            Ok(Job::start(spec, runtime, options)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut total: Option<eddy_engine::RunSummary> = None;
    for job in jobs {
        let summary = job.wait()?;
        match &mut total {
            Some(t) => t.metrics.source_records += summary.metrics.source_records,
            None => total = Some(summary),
        }
    }
    total.context("no node ran")
}

/// Runs the native baseline in this process.
pub fn run_native(args: &BenchArgs) -> Result<SideReport> {
    let spec = bench_spec(args)?;
    let Some(SourceSpec::Nexmark(source)) = spec.sources.first() else { bail!("no nexmark source") };
    let config = source.config();
    let (cpu_before, _) = cpu_and_rss();
    let started = Instant::now();
    let events = eddy_nexmark::events(&config);
    // Rows are counted, not built: the baseline is the computation, not JSON formatting.
    use eddy_nexmark::native::{self, RowCount};
    let RowCount(rows) = match args.query.as_str() {
        "q0" => native::q0(events),
        "q1" => native::q1(events),
        "q2" => native::q2(events),
        "q3" => native::q3(events),
        "q5" => native::q5(events),
        "q7" => native::q7(events),
        "q8" => native::q8(events),
        "q11" => native::q11(events),
        other => bail!("no native baseline for `{other}` ({})", QUERIES.join(" ")),
    };
    Ok(finish("native", args.events, rows as u64, started, cpu_before, Vec::new()))
}

fn child(args: &BenchArgs, only: &str) -> Result<SideReport> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "nexmark", "--query", &args.query, "--events", &args.events.to_string()])
        .args(["--parallelism", &args.parallelism.to_string(), "--only", only])
        .arg("--queries-dir")
        .arg(&args.queries_dir)
        .arg("--cache-dir")
        .arg(&args.cache_dir);
    if let Some(rate) = args.rate {
        cmd.args(["--rate", &rate.to_string()]);
    }
    if let Some(ms) = args.checkpoint_ms {
        cmd.args(["--checkpoint-ms", &ms.to_string()]);
    }
    if args.journal {
        cmd.arg("--journal");
    }
    cmd.args(["--state-backend", backend_name(args.state_backend)]);
    cmd.args(["--spread", &args.spread.to_string()]);
    let out = cmd.output().with_context(|| format!("starting the {only} side"))?;
    if !out.status.success() {
        bail!("the {only} side failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim()).with_context(|| format!("reading the {only} side's report: {line}"))
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The medians over paired runs of one query.
#[derive(Debug, Clone, Serialize)]
pub struct QuerySummary {
    /// The query.
    pub query: String,
    /// Paired runs (native, then Eddy, each in a fresh process).
    pub runs: usize,
    /// Median native events/s.
    pub native_events_per_sec: f64,
    /// Median Eddy events/s.
    pub eddy_events_per_sec: f64,
    /// Median native CPU s per million events.
    pub native_cpu_sec_per_million: f64,
    /// Median Eddy CPU s per million events.
    pub eddy_cpu_sec_per_million: f64,
    /// Median over runs of (Eddy CPU / native CPU) within each pair.
    pub cpu_ratio: f64,
    /// Median Eddy peak RSS, MiB.
    pub eddy_peak_rss_mib: f64,
    /// Median Eddy p50 / p99 latency, ms (paced runs).
    pub eddy_latency_p50_ms: Option<f64>,
    /// See `eddy_latency_p50_ms`.
    pub eddy_latency_p99_ms: Option<f64>,
    /// Every run, for the record.
    pub pairs: Vec<(SideReport, SideReport)>,
}

fn summarize(query: &str, pairs: Vec<(SideReport, SideReport)>) -> QuerySummary {
    let of = |f: &dyn Fn(&(SideReport, SideReport)) -> f64| median(pairs.iter().map(f).collect()).unwrap_or(f64::NAN);
    let latency = |f: &dyn Fn(&SideReport) -> Option<f64>| median(pairs.iter().filter_map(|(_, e)| f(e)).collect());
    QuerySummary {
        query: query.to_owned(),
        runs: pairs.len(),
        native_events_per_sec: of(&|(n, _)| n.events_per_sec),
        eddy_events_per_sec: of(&|(_, e)| e.events_per_sec),
        native_cpu_sec_per_million: of(&|(n, _)| n.cpu_sec_per_million),
        eddy_cpu_sec_per_million: of(&|(_, e)| e.cpu_sec_per_million),
        cpu_ratio: of(&|(n, e)| e.cpu_sec_per_million / n.cpu_sec_per_million.max(1e-12)),
        eddy_peak_rss_mib: of(&|(_, e)| e.peak_rss_mib),
        eddy_latency_p50_ms: latency(&|e| e.latency_p50_ms),
        eddy_latency_p99_ms: latency(&|e| e.latency_p99_ms),
        pairs,
    }
}

/// Runs each query `runs` times as a pair (native, then Eddy), prints one line per run and a
/// table of medians, and writes every run and the medians to `report`.
pub fn run_pairs(args: &BenchArgs, queries: &[String], runs: usize, report: &std::path::Path) -> Result<()> {
    eprintln!(
        "nexmark {}: {} events, parallelism {}{}, {} state{}{}, {} paired run(s) each (native, then eddy, each in its own process)",
        queries.join(" "),
        args.events,
        args.parallelism,
        if args.spread > 1 { format!(" spread over {} QUIC nodes", args.spread) } else { String::new() },
        backend_name(args.state_backend),
        args.rate.map_or(String::new(), |r| format!(", paced at {r} events/s")),
        args.checkpoint_ms.map_or(String::new(), |ms| format!(", eddy checkpointing every {ms} ms"))
            + if args.journal { ", input journaled" } else { "" },
        runs
    );
    let mut summaries = Vec::new();
    for query in queries {
        let args = BenchArgs { query: query.clone(), ..args.clone() };
        let mut pairs = Vec::new();
        for run in 1..=runs.max(1) {
            let native = child(&args, "native")?;
            let eddy = child(&args, "eddy")?;
            if native.rows != eddy.rows {
                eprintln!("warning: {query}: row counts differ (native {}, eddy {})", native.rows, eddy.rows);
            }
            if let Some(rate) = args.rate.filter(|&r| eddy.events_per_sec < 0.9 * r as f64) {
                eprintln!(
                    "warning: {query}: eddy kept {:.0} of the {rate} events/s asked: its latency is that of an \
                     overloaded job; ask a lower --rate",
                    eddy.events_per_sec
                );
            }
            eprintln!(
                "  {query} run {run}: native {:.0} events/s {:.2} CPU s/M | eddy {:.0} events/s {:.2} CPU s/M, {:.0} MiB, p50 {} p99 {} ms",
                native.events_per_sec,
                native.cpu_sec_per_million,
                eddy.events_per_sec,
                eddy.cpu_sec_per_million,
                eddy.peak_rss_mib,
                opt(eddy.latency_p50_ms),
                opt(eddy.latency_p99_ms)
            );
            pairs.push((native, eddy));
        }
        summaries.push(summarize(query, pairs));
    }
    println!("medians of {runs} paired run(s), parallelism {}, {} events:", args.parallelism, args.events);
    println!(
        "| query | native events/s | Eddy events/s | native CPU s/M | Eddy CPU s/M | CPU ratio | Eddy RSS MiB | p50 ms | p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for q in &summaries {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1}x | {:.0} | {} | {} |",
            q.query,
            q.native_events_per_sec,
            q.eddy_events_per_sec,
            q.native_cpu_sec_per_million,
            q.eddy_cpu_sec_per_million,
            q.cpu_ratio,
            q.eddy_peak_rss_mib,
            opt(q.eddy_latency_p50_ms),
            opt(q.eddy_latency_p99_ms)
        );
    }
    let json = serde_json::json!({
        "events": args.events, "parallelism": args.parallelism, "rate": args.rate, "runs": runs,
        "queries": summaries,
    });
    std::fs::write(report, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", report.display()))?;
    eprintln!("report written to {}", report.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(Vec::new()), None);
    }
}
