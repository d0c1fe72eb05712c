//! `eddy`: run pipelines on the embedded runtime and inspect operator components.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod bench;
mod bench_checkpoint;
mod bench_languages;
mod bench_latency;
mod bench_swap;
mod client;
mod cluster;
mod project;
mod replay;
mod serve;
mod state;

use anyhow::Result;
use clap::{Parser, Subcommand};
use eddy_checkpoint::{CheckpointMetadata, CheckpointStore};
use eddy_engine::{Job, JobOptions, MetricsSnapshot, RunError, RunSummary};
use eddy_plan::{PhysicalPlan, PipelineSpec};
use eddy_runtime::{Runtime, RuntimeConfig};

#[derive(Parser)]
#[command(name = "eddy", version, about = "Eddy: stream processing with sandboxed WebAssembly operators")]
struct Cli {
    /// The `eddy serve` the client commands talk to (default: the one `eddy login` saved).
    #[arg(long, global = true, env = "EDDY_SERVER")]
    server: Option<String>,
    /// The bearer token for `--server` (default: the one `eddy login` saved).
    #[arg(long, global = true, env = "EDDY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// How `eddy build` and `eddy test` build a project.
#[derive(Debug, clap::Args)]
struct BuildFlags {
    /// The language, if the files do not tell.
    #[arg(long)]
    lang: Option<String>,
    /// JavaScript and TypeScript: the engine the component carries (quickjs, the default, or
    /// spidermonkey).
    #[arg(long)]
    js_engine: Option<String>,
}

impl BuildFlags {
    fn as_flags(&self) -> project::Flags<'_> {
        project::Flags { lang: self.lang.as_deref(), js_engine: self.js_engine.as_deref() }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a pipeline on the embedded default (one process, local state).
    Run {
        /// The pipeline spec (YAML).
        pipeline: PathBuf,
        /// Where compiled operators are cached.
        #[arg(long, default_value = ".eddy/artifacts")]
        cache_dir: PathBuf,
        /// Resume from the savepoint in this directory (new `.wasm` versions and other
        /// parallelisms are fine: state follows step names and key groups).
        #[arg(long)]
        from_savepoint: Option<PathBuf>,
        /// On Ctrl-C or SIGTERM, take a savepoint into this directory and stop cleanly.
        #[arg(long)]
        stop_with_savepoint: Option<PathBuf>,
    },
    /// With `--to`: copy the newest completed checkpoint of a local pipeline into a
    /// self-contained savepoint (works while the job runs, or after it stopped or crashed).
    /// Without: ask the server to take a savepoint of the running job with this id.
    Savepoint {
        /// The pipeline spec (YAML) whose `checkpoints.dir` to read, or a job id on the server.
        pipeline: String,
        /// The savepoint directory to write.
        #[arg(long)]
        to: Option<PathBuf>,
    },
    /// Stop a job on the server with a savepoint.
    Stop {
        /// The job's id.
        id: String,
    },
    /// Restart a job on the server from a savepoint with every step at a new parallelism.
    Rescale {
        /// The job's id.
        id: String,
        /// The new parallelism.
        parallelism: u32,
    },
    /// Give one step of a job on the server another artifact, its state kept: restarted from
    /// a savepoint, or with `--live` swapped at the next checkpoint while the job runs.
    Upgrade {
        /// The job's id.
        id: String,
        /// The step.
        step: String,
        /// The artifact (`sha256:<hex>` or `name@version`, or a local `.wasm` to upload first).
        wasm: String,
        /// Swap the code at the next checkpoint's barrier while the job runs (its state and
        /// timers kept, nothing restarted), instead of a savepoint and a restart.
        #[arg(long)]
        live: bool,
    },
    /// List a pipeline's completed checkpoints with their durations and sizes.
    Checkpoints {
        /// The pipeline spec (YAML).
        pipeline: PathBuf,
    },
    /// Print the physical plan: tasks (chains), their subtasks and key groups, and the exchanges.
    Plan {
        /// The pipeline spec (YAML).
        pipeline: PathBuf,
    },
    /// Benchmarks: Eddy next to a native Rust loop on identical data.
    Bench {
        #[command(subcommand)]
        suite: BenchSuite,
    },
    /// Run the hosted service: REST API, tenants, artifacts and jobs on an embedded worker.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Where the service keeps everything (created at the first start, with the admin
        /// token in `admin.token`).
        #[arg(long, default_value = ".eddy/service")]
        data_dir: PathBuf,
        /// Slots of the embedded worker.
        #[arg(long, default_value_t = 4)]
        slots: u32,
        #[command(flatten)]
        service: serve::ServiceFlags,
    },
    /// The cluster's certificates: a CA, and a certificate per node.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Run the coordinator: the REST API (TCP) and the workers' control plane (QUIC, UDP) on
    /// the same host and port.
    Coordinator {
        /// Address to listen on (TCP for REST, UDP for workers).
        #[arg(long, env = "EDDY_LISTEN", default_value = "127.0.0.1:8080")]
        listen: String,
        /// Where the coordinator keeps everything.
        #[arg(long, env = "EDDY_DATA_DIR", default_value = ".eddy/coordinator")]
        data_dir: PathBuf,
        /// This node's certificate directory (`ca.pem`, `cert.pem`, `key.pem`, from `eddy
        /// cluster cert`). Without it the coordinator runs its own CA in the data directory and
        /// enrolls workers on this machine only.
        #[arg(long, env = "EDDY_TLS_DIR")]
        tls: Option<PathBuf>,
        /// A worker silent this long is declared dead.
        #[arg(long, env = "EDDY_HEARTBEAT_TIMEOUT_MS", default_value_t = 5_000)]
        heartbeat_timeout_ms: u64,
        /// Where what every worker must reach goes (jobs' checkpoints, savepoints and files-sink
        /// output, tenants' files): a directory every worker shares, or `s3://bucket/prefix`
        /// (endpoint and keys from the AWS_* environment).
        #[arg(long, env = "EDDY_CHECKPOINT_STORE")]
        checkpoint_store: Option<String>,
        /// Slots of an embedded worker in the coordinator's own process.
        #[arg(long, env = "EDDY_SLOTS", default_value_t = 0)]
        slots: u32,
        #[command(flatten)]
        service: serve::ServiceFlags,
    },
    /// Run a worker: register with the coordinator and offer slots.
    Worker {
        /// The coordinator's HOST:PORT.
        #[arg(long, env = "EDDY_COORDINATOR")]
        coordinator: String,
        /// This worker's name (the DNS name in its certificate).
        #[arg(long, env = "EDDY_WORKER_NAME")]
        name: String,
        /// Slots offered (a slot runs one subtask of each task of a job).
        #[arg(long, env = "EDDY_SLOTS", default_value_t = 2)]
        slots: u32,
        /// Where the worker keeps its state.
        #[arg(long, env = "EDDY_DATA_DIR")]
        data_dir: PathBuf,
        /// This node's certificate directory. Without it the worker enrolls with a
        /// coordinator on this machine, with `--join-token`.
        #[arg(long, env = "EDDY_TLS_DIR")]
        tls: Option<PathBuf>,
        /// A join token from the admin (`eddy cluster join-token`), to enroll with a
        /// coordinator on this machine (and to renew an enrolled certificate).
        #[arg(long, env = "EDDY_JOIN_TOKEN", hide_env_values = true)]
        join_token: Option<String>,
        /// The data plane's UDP address.
        #[arg(long, env = "EDDY_DATA_LISTEN", default_value = "0.0.0.0:0")]
        data_listen: String,
        /// The host (or host:port, behind a NAT or relay) other workers dial (default: the
        /// address the coordinator sees, at the data plane's port).
        #[arg(long, env = "EDDY_ADVERTISE")]
        advertise: Option<String>,
    },
    /// Save `--server` and `--token` for the client commands (checks them first).
    Login,
    /// Upload an operator component to the server.
    Upload {
        /// The `.wasm` file.
        wasm: PathBuf,
        /// A name to refer to it by (`name@version` in pipelines).
        #[arg(long, requires = "version")]
        name: Option<String>,
        /// The version under that name.
        #[arg(long, requires = "name")]
        version: Option<String>,
    },
    /// Submit a pipeline to the server: the local `.wasm` and input files it names are
    /// uploaded first.
    Submit {
        /// The pipeline spec (YAML).
        pipeline: PathBuf,
        /// Follow the job until it ends.
        #[arg(long)]
        watch: bool,
    },
    /// List your jobs on the server.
    Jobs,
    /// Show one job on the server: status, tasks, checkpoints, failures.
    Job {
        /// The job's id.
        id: String,
        /// Refresh every second until the job ends.
        #[arg(long)]
        watch: bool,
    },
    /// Cancel a job on the server.
    Cancel {
        /// The job's id.
        id: String,
    },
    /// Delete an ended job on the server, with its output, checkpoints and savepoints.
    Delete {
        /// The job's id.
        id: String,
    },
    /// Start a held job again (one the server held after it died twice in a row under it).
    Resume {
        /// The job's id.
        id: String,
    },
    /// Print a job's committed output (JSON lines).
    Output {
        /// The job's id.
        id: String,
    },
    /// Manage tenants (admin token).
    Tenants {
        #[command(subcommand)]
        action: TenantAction,
    },
    /// Scaffold an operator project (`--lang rust|python|js|ts|go`) that builds and passes
    /// its own test.
    New {
        /// The language.
        #[arg(long)]
        lang: String,
        /// The new (or empty) directory.
        dir: PathBuf,
    },
    /// Build an operator project into a component; prints the `.wasm` path last.
    Build {
        /// The project directory (its language is told by its files).
        #[arg(default_value = ".")]
        dir: PathBuf,
        #[command(flatten)]
        flags: BuildFlags,
        /// Where to write the component.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Build a project, run its `pipeline.yaml` and compare the output with `expected.txt`.
    Test {
        /// The project directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
        #[command(flatten)]
        flags: BuildFlags,
    },
    /// Read a step's keyed state from a checkpoint or savepoint: keys and values of value,
    /// list and map states, window accumulators and timers, decoded.
    State(state::StateArgs),
    /// Run one subtask of a journaled step (`debug: {journal: true}`) again from a
    /// checkpoint over the input it saw: every record, state read and write, timer, log line
    /// and output, in order. With `--wasm`, the same input through other code, and where the
    /// outputs differ.
    Replay(replay::ReplayArgs),
    /// Validate a component and print what it is.
    Inspect {
        /// The `.wasm` file.
        wasm: PathBuf,
        /// Where compiled operators are cached.
        #[arg(long, default_value = ".eddy/artifacts")]
        cache_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum ClusterAction {
    /// Write a new cluster CA (`ca.pem`, `ca.key`) into a directory.
    Init {
        /// The directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a node's certificate from the CA.
    Cert {
        /// The CA's directory.
        #[arg(long)]
        ca: PathBuf,
        /// The node's name (a worker's `--name`; for the coordinator, the host workers dial).
        #[arg(long)]
        name: String,
        /// More DNS names the node answers to.
        #[arg(long)]
        alias: Vec<String>,
        /// Where to write `ca.pem`, `cert.pem` and `key.pem`.
        #[arg(long)]
        out: PathBuf,
        /// Days the certificate is valid (renew it by issuing a new one and restarting the node).
        #[arg(long, default_value_t = 365)]
        days: u64,
    },
    /// Ask a coordinator for a join token (admin token): a worker on its machine enrolls with
    /// it (`eddy worker --join-token`). Prints the token.
    JoinToken {
        /// The one worker name it enrolls (also one enrolled before: a renewal).
        #[arg(long)]
        name: Option<String>,
        /// Enrollments it allows.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// Seconds it lives.
        #[arg(long, default_value_t = 3_600)]
        ttl_s: u64,
    },
}

#[derive(Subcommand)]
enum TenantAction {
    /// Create a tenant; prints its first token.
    Create {
        /// Its name.
        name: String,
    },
    /// List the tenants.
    List,
    /// Issue another token for a tenant.
    Token {
        /// The tenant's id.
        tenant: String,
    },
    /// Revoke a tenant's token.
    Revoke {
        /// The tenant's id.
        tenant: String,
        /// The token's public id.
        token_id: String,
    },
}

/// Where a bench finds the built guest components and caches their compiled code.
#[derive(Debug, clap::Args)]
struct GuestDirs {
    /// Where the guest components are (`cargo build --release -p eddy-guest-artifacts`).
    #[arg(long, default_value = "target/wasm-guests")]
    guests_dir: PathBuf,
    /// Where compiled operators are cached.
    #[arg(long, default_value = ".eddy/artifacts")]
    cache_dir: PathBuf,
}

#[derive(Subcommand)]
enum BenchSuite {
    /// What an operator costs in each language: word count and Nexmark q1 per language next
    /// to the native loop, and each component's size, compile and instantiate time and memory.
    Languages {
        /// Words the word count counts.
        #[arg(long, default_value_t = 1_000_000)]
        words: u64,
        /// Events q1 maps.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// Runs per measurement; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[command(flatten)]
        guests: GuestDirs,
        /// The JSON report.
        #[arg(long, default_value = "languages-report.json")]
        report: PathBuf,
    },
    /// What a checkpoint costs as keyed state grows: heap against RocksDB.
    Checkpoint {
        /// State sizes (keys), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
        keys: Vec<u64>,
        /// Backends, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "heap,rocksdb")]
        backends: Vec<String>,
        /// Working directory (RocksDB databases and checkpoints).
        #[arg(long, default_value = ".eddy/bench")]
        work_dir: PathBuf,
        /// The JSON report.
        #[arg(long, default_value = "checkpoint-report.json")]
        report: PathBuf,
    },
    /// What changing a running step's code costs: a live swap against a restart-mode upgrade
    /// of the same job (a running count at `--parallelism`).
    Swap {
        /// Parallelism of the source and the count.
        #[arg(long, default_value_t = 4)]
        parallelism: u32,
        /// Users counted: the keyed state a restart restores and a swap keeps in place.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// Runs of each way; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[command(flatten)]
        guests: GuestDirs,
        /// Working directory (checkpoints, state, savepoints).
        #[arg(long, default_value = ".eddy/bench")]
        work_dir: PathBuf,
        /// The JSON report.
        #[arg(long, default_value = "swap-report.json")]
        report: PathBuf,
    },
    /// One Nexmark query (`examples/nexmark/<query>.yaml`) on Eddy and natively.
    Nexmark {
        /// q0, q1, q2, q3, q5, q7, q8 or q11; several separated by commas, or `all`.
        #[arg(long)]
        query: String,
        /// Checkpoint the Eddy side every this many ms (to a temporary directory).
        #[arg(long)]
        checkpoint_ms: Option<u64>,
        /// The Eddy side's state backend: `heap` or `rocksdb`.
        #[arg(long, default_value = "heap")]
        state_backend: String,
        /// Journal every step's input for `eddy replay` (needs --checkpoint-ms).
        #[arg(long)]
        journal: bool,
        /// Spread the Eddy side over this many QUIC nodes in one process (subtask `i` on node
        /// `i mod N`): exchanges cross loopback QUIC with mutual TLS. No checkpoints.
        #[arg(long, default_value_t = 1)]
        spread: u32,
        /// Paired runs per query; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Events over all source readers.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// Parallelism of the source and every step.
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Pace the source at this many events/s in total and measure latency.
        #[arg(long)]
        rate: Option<u64>,
        /// Where the query pipelines are.
        #[arg(long, default_value = "examples/nexmark")]
        queries_dir: PathBuf,
        /// Where compiled operators are cached.
        #[arg(long, default_value = ".eddy/artifacts")]
        cache_dir: PathBuf,
        /// The JSON report.
        #[arg(long, default_value = "nexmark-report.json")]
        report: PathBuf,
        /// Run one side in this process and print its JSON (used by the parent run).
        #[arg(long, hide = true)]
        only: Option<String>,
    },
}

fn bench(suite: BenchSuite) -> Result<()> {
    match suite {
        BenchSuite::Languages { words, events, runs, guests: GuestDirs { guests_dir, cache_dir }, report } => {
            bench_languages::run(&bench_languages::LanguageArgs { words, events, runs, guests_dir, cache_dir, report })
        }
        BenchSuite::Checkpoint { keys, backends, work_dir, report } => {
            bench_checkpoint::run(&backends, &keys, &work_dir, &report)
        }
        BenchSuite::Swap { parallelism, keys, runs, guests, work_dir, report } => {
            bench_swap::run(&bench_swap::SwapArgs { parallelism, keys, runs, guests, work_dir, report })
        }
        BenchSuite::Nexmark {
            query,
            checkpoint_ms,
            state_backend,
            journal,
            spread,
            runs,
            events,
            parallelism,
            rate,
            queries_dir,
            cache_dir,
            report,
            only,
        } => {
            let state_backend = bench::state_backend(&state_backend)?;
            let args = bench::BenchArgs {
                query,
                events,
                parallelism,
                rate,
                queries_dir,
                cache_dir,
                checkpoint_ms,
                state_backend,
                journal,
                spread,
            };
            nexmark(args, runs, &report, only.as_deref())
        }
    }
}

fn nexmark(args: bench::BenchArgs, runs: usize, report: &std::path::Path, only: Option<&str>) -> Result<()> {
    let queries: Vec<String> = match args.query.as_str() {
        "all" => bench::QUERIES.iter().map(|q| q.to_string()).collect(),
        list => list.split(',').map(|q| q.trim().to_owned()).collect(),
    };
    if let Some(unknown) = queries.iter().find(|q| !bench::QUERIES.contains(&q.as_str())) {
        anyhow::bail!("no Nexmark query `{unknown}`: choose from {} or `all`", bench::QUERIES.join(", "));
    }
    let side = match only {
        None => return bench::run_pairs(&args, &queries, runs, report),
        Some("eddy") => bench::run_eddy(&args)?,
        Some("native") => bench::run_native(&args)?,
        Some(other) => anyhow::bail!("--only takes eddy or native, not {other}"),
    };
    println!("{}", serde_json::to_string(&side)?);
    Ok(())
}

fn runtime(cache_dir: PathBuf) -> Result<Runtime> {
    Ok(Runtime::new(RuntimeConfig { cache_dir: Some(cache_dir), ..RuntimeConfig::default() })?)
}

fn watermark_text(w: Option<i64>) -> String {
    match w {
        None => "-".into(),
        Some(i64::MAX) => "end".into(),
        Some(w) => w.to_string(),
    }
}

/// One progress line: rates since the previous snapshot.
fn progress(job: &Job, now: &MetricsSnapshot, before: &MetricsSnapshot) {
    let secs = now.elapsed.saturating_sub(before.elapsed).as_secs_f64().max(1e-9);
    let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
    let checkpoint = match job.completed_checkpoints().last() {
        Some(c) => format!("  checkpoint {} ({})", c.id, checkpoint_text(&c.stats)),
        None => String::new(),
    };
    eprintln!(
        "[{:>6.1}s] in {} ({:.0}/s)  out {} ({:.0}/s)  watermark {}  backpressure {:.0}%  late {}{checkpoint}",
        now.elapsed.as_secs_f64(),
        now.source_records,
        rate(now.source_records, before.source_records),
        now.sink_records,
        rate(now.sink_records, before.sink_records),
        watermark_text(now.watermark()),
        100.0 * now.backpressure_since(before, &job.parallelisms()),
        now.late_records(),
    );
}

fn bytes_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1} KiB", b as f64 / 1024.0),
    }
}

fn checkpoint_text(s: &eddy_checkpoint::CheckpointStats) -> String {
    format!(
        "{}, {} new, alignment {:.0} ms, sync {:.1} ms, async {:.0} ms",
        bytes_text(s.full_bytes),
        bytes_text(s.incremental_bytes),
        s.alignment_ms,
        s.sync_ms,
        s.async_ms
    )
}

fn summary(plan: &PhysicalPlan, run: &RunSummary) {
    if let Some(id) = run.restored_from {
        eprintln!("restored from checkpoint {id}");
    }
    if let Some((id, dir)) = &run.savepoint {
        eprintln!("stopped with savepoint {id} in {}; resume with --from-savepoint {}", dir.display(), dir.display());
    }
    if run.restarts > 0 {
        eprintln!("restarted {} time(s) after failures", run.restarts);
    }
    if let Some(last) = run.checkpoints.last() {
        eprintln!(
            "{} checkpoint(s) completed; last: {} ({})",
            run.checkpoints_completed,
            last.id,
            checkpoint_text(&last.stats)
        );
    }
    let m = &run.metrics;
    let secs = m.elapsed.as_secs_f64().max(1e-9);
    eprintln!(
        "{} in {:.2}s: {} records in ({:.0}/s), {} out, {} late",
        if run.finished { "finished" } else { "cancelled" },
        secs,
        m.source_records,
        m.source_records as f64 / secs,
        m.sink_records,
        m.late_records()
    );
    for (task, t) in plan.tasks.iter().zip(&m.tasks) {
        eprintln!(
            "  task {} x{}  {}: in {}  out {}  watermark {}  cpu {:.2}s",
            task.id,
            task.parallelism,
            t.label,
            t.records_in,
            t.records_out,
            watermark_text(Some(t.watermark)),
            t.cpu_ns as f64 / 1e9
        );
    }
}

/// Raised by SIGINT/SIGTERM when `--stop-with-savepoint` is given.
static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    if let Some(flag) = STOP.get() {
        flag.store(true, Ordering::SeqCst);
    }
}

fn stop_on_signals() -> Arc<AtomicBool> {
    let flag = STOP.get_or_init(|| Arc::new(AtomicBool::new(false))).clone();
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_stop_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_stop_signal as *const () as libc::sighandler_t);
    }
    flag
}

fn checkpoint_store(spec: &PipelineSpec) -> Result<(CheckpointStore, String)> {
    match &spec.checkpoints {
        Some(c) => Ok((CheckpointStore::open(c)?, c.location())),
        None => anyhow::bail!("pipeline `{}` has no `checkpoints:` section, so it has no checkpoints", spec.name),
    }
}

fn savepoint(pipeline: PathBuf, to: PathBuf) -> Result<()> {
    let spec = PipelineSpec::from_file(&pipeline)?;
    let (from, _) = checkpoint_store(&spec)?;
    let (id, skipped) = eddy_checkpoint::savepoint::savepoint_from_latest(&from, &CheckpointStore::local(&to)?)?;
    for (damaged, reason) in skipped {
        eprintln!("warning: passed over checkpoint {damaged}: {reason}");
    }
    println!("savepoint of checkpoint {id} written to {}", to.display());
    println!("resume with: eddy run {} --from-savepoint {}", pipeline.display(), to.display());
    Ok(())
}

fn checkpoints(pipeline: PathBuf) -> Result<()> {
    let spec = PipelineSpec::from_file(&pipeline)?;
    let (store, dir) = checkpoint_store(&spec)?;
    let ids = eddy_checkpoint::metadata::completed_ids(&store)?;
    if ids.is_empty() {
        println!("no completed checkpoint in {dir}");
    }
    for id in ids.into_iter().rev() {
        match CheckpointMetadata::read_verified(&store, id) {
            Ok(meta) => println!(
                "checkpoint {id}{}: {} subtasks, {}, total {:.0} ms",
                if meta.finished { " (final)" } else { "" },
                meta.subtasks.len(),
                checkpoint_text(&meta.stats),
                meta.stats.total_ms
            ),
            Err(e) => println!("checkpoint {id}: DAMAGED ({e}); a restore skips it"),
        }
    }
    Ok(())
}

fn run(
    pipeline: PathBuf,
    cache_dir: PathBuf,
    from_savepoint: Option<PathBuf>,
    stop_with_savepoint: Option<PathBuf>,
) -> Result<()> {
    let spec = PipelineSpec::from_file(&pipeline)?;
    let plan = PhysicalPlan::new(&spec);
    eprintln!(
        "pipeline `{}`: {} task(s), {} subtask(s), max_parallelism {} (`eddy plan` shows the chains)",
        spec.name,
        plan.tasks.len(),
        plan.subtasks(),
        spec.max_parallelism
    );
    if let Some(c) = &spec.checkpoints {
        eprintln!("checkpoints every {} ms to {} (a restart resumes from the newest)", c.interval_ms, c.location());
    }
    let runtime = runtime(cache_dir)?;
    let mut before = MetricsSnapshot::default();
    if let Some(dir) = &from_savepoint {
        eprintln!("resuming from the savepoint in {}", dir.display());
    }
    let stop = stop_with_savepoint.map(|dir| {
        eprintln!("Ctrl-C or SIGTERM takes a savepoint into {} and stops", dir.display());
        (stop_on_signals(), dir)
    });
    let outcome = Job::run_with_restarts(
        &spec,
        &runtime,
        || JobOptions {
            restore_from: from_savepoint.clone().map(eddy_plan::StoreLocation::Dir),
            stop_with_savepoint: stop.clone(),
            ..JobOptions::default()
        },
        Duration::from_secs(1),
        |job, now| {
            progress(job, now, &before);
            before = now.clone();
        },
        |error, attempt, delay| {
            eprintln!("failed: {error}");
            eprintln!("restart {attempt} from the latest checkpoint in {delay:?}");
        },
    );
    match outcome {
        Ok(run) => summary(&plan, &run),
        Err(done @ RunError::AlreadyFinished { .. }) => eprintln!("{done}"),
        Err(e) => return Err(anyhow::Error::new(e).context("the pipeline failed")),
    }
    Ok(())
}

fn plan(pipeline: PathBuf) -> Result<()> {
    let spec = PipelineSpec::from_file(&pipeline)?;
    print!("{}", PhysicalPlan::new(&spec));
    Ok(())
}

fn inspect(wasm: PathBuf, cache_dir: PathBuf) -> Result<()> {
    let runtime = runtime(cache_dir)?;
    let name = wasm.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let component = runtime.load_file(&name, &wasm)?;
    let world = match component.world() {
        eddy_runtime::World::KeyedOperator => "keyed-operator",
        eddy_runtime::World::WindowAggregate => "window-aggregate",
    };
    println!("{}: {world}", wasm.display());
    println!("  sha256  {}", component.digest());
    println!("  loaded  in {:.1?} ({:?})", component.load_time(), component.cache_outcome());
    Ok(())
}

fn tenants(login: client::Login, action: TenantAction) -> Result<()> {
    use client::TenantCmd;
    client::tenants_cmd(
        login,
        match action {
            TenantAction::Create { name } => TenantCmd::Create(name),
            TenantAction::List => TenantCmd::List,
            TenantAction::Token { tenant } => TenantCmd::Token(tenant),
            TenantAction::Revoke { tenant, token_id } => TenantCmd::Revoke(tenant, token_id),
        },
    )
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("EDDY_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a log file gets plain `key=value` fields.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let login = || client::Login::resolve(cli.server.clone(), cli.token.clone());
    let result = match cli.command {
        Command::Run { pipeline, cache_dir, from_savepoint, stop_with_savepoint } => {
            run(pipeline, cache_dir, from_savepoint, stop_with_savepoint)
        }
        Command::Savepoint { pipeline, to: Some(to) } => savepoint(PathBuf::from(pipeline), to),
        Command::Savepoint { pipeline: id, to: None } => {
            login().and_then(|l| client::control_cmd(l, &id, "savepoints", serde_json::json!({})))
        }
        Command::Stop { id } => login().and_then(|l| client::control_cmd(l, &id, "stop", serde_json::json!({}))),
        Command::Rescale { id, parallelism } => login()
            .and_then(|l| client::control_cmd(l, &id, "rescale", serde_json::json!({ "parallelism": parallelism }))),
        Command::Upgrade { id, step, wasm, live } => {
            login().and_then(|l| client::upgrade_cmd(l, &id, &step, &wasm, live))
        }
        Command::Checkpoints { pipeline } => checkpoints(pipeline),
        Command::Plan { pipeline } => plan(pipeline),
        Command::Bench { suite } => bench(suite),
        Command::Inspect { wasm, cache_dir } => inspect(wasm, cache_dir),
        Command::State(args) => state::state(args, login),
        Command::Replay(args) => {
            let cache_dir = args.cache_dir.clone();
            replay::run(args, || runtime(cache_dir), login)
        }
        Command::New { lang, dir } => project::new(&lang, &dir),
        Command::Build { dir, flags, out } => project::build(&dir, flags.as_flags(), out).map(|_| ()),
        Command::Test { dir, flags } => project::test(&dir, flags.as_flags()),
        Command::Serve { listen, data_dir, slots, service } => serve::serve(&listen, data_dir, slots, &service),
        Command::Cluster { action: ClusterAction::Init { out } } => cluster::init(&out),
        Command::Cluster { action: ClusterAction::Cert { ca, name, alias, out, days } } => {
            cluster::cert(&ca, &name, &alias, &out, days)
        }
        Command::Cluster { action: ClusterAction::JoinToken { name, uses, ttl_s } } => {
            login().and_then(|l| client::join_token_cmd(l, name, uses, ttl_s))
        }
        Command::Coordinator { listen, data_dir, tls, heartbeat_timeout_ms, checkpoint_store, slots, service } => {
            cluster::coordinator(cluster::CoordinatorArgs {
                listen,
                data_dir,
                tls,
                heartbeat_timeout: Duration::from_millis(heartbeat_timeout_ms),
                checkpoint_store,
                slots,
                service,
            })
        }
        Command::Worker { coordinator, name, slots, data_dir, tls, join_token, data_listen, advertise } => {
            cluster::worker(cluster::WorkerArgs {
                coordinator,
                name,
                slots,
                data_dir,
                tls,
                join_token,
                data_listen,
                advertise,
            })
        }
        Command::Login => client::login(cli.server.clone(), cli.token.clone()),
        Command::Upload { wasm, name, version } => login().and_then(|l| client::upload_cmd(l, &wasm, name, version)),
        Command::Submit { pipeline, watch } => login().and_then(|l| client::submit_cmd(l, &pipeline, watch)),
        Command::Jobs => login().and_then(client::jobs_cmd),
        Command::Job { id, watch } => login().and_then(|l| client::job_cmd(l, &id, watch)),
        Command::Cancel { id } => login().and_then(|l| client::cancel_cmd(l, &id)),
        Command::Delete { id } => login().and_then(|l| client::delete_cmd(l, &id)),
        Command::Resume { id } => login().and_then(|l| client::resume_cmd(l, &id)),
        Command::Output { id } => login().and_then(|l| client::output_cmd(l, &id)),
        Command::Tenants { action } => login().and_then(|l| tenants(l, action)),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
