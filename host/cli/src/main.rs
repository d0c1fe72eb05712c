//! `eddy`: run pipelines on the embedded runtime and inspect operator components.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use eddy_engine::{ChainRunner, PipelineSpec, RunSummary};
use eddy_runtime::{Runtime, RuntimeConfig};

#[derive(Parser)]
#[command(name = "eddy", version, about = "Eddy: stream processing with sandboxed WebAssembly operators")]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
    },
    /// Validate a component and print what it is.
    Inspect {
        /// The `.wasm` file.
        wasm: PathBuf,
        /// Where compiled operators are cached.
        #[arg(long, default_value = ".eddy/artifacts")]
        cache_dir: PathBuf,
    },
}

fn runtime(cache_dir: PathBuf) -> Result<Runtime> {
    Ok(Runtime::new(RuntimeConfig { cache_dir: Some(cache_dir), ..RuntimeConfig::default() })?)
}

fn report(summary: &RunSummary, done: bool) {
    let secs = summary.elapsed.as_secs_f64().max(1e-9);
    let steps: Vec<String> =
        summary.steps.iter().map(|s| format!("{} {}->{}", s.name, s.records_in, s.records_out)).collect();
    eprintln!(
        "{} {:.1}s  in {} ({:.0}/s)  out {}  [{}]",
        if done { "done" } else { "running" },
        secs,
        summary.records_in,
        summary.records_in as f64 / secs,
        summary.records_out,
        steps.join(", ")
    );
}

fn run(pipeline: PathBuf, cache_dir: PathBuf) -> Result<()> {
    let spec = PipelineSpec::from_file(&pipeline)?;
    eprintln!("pipeline `{}`: {} step(s), max_parallelism {}", spec.name, spec.steps.len(), spec.max_parallelism);
    let runtime = runtime(cache_dir)?;
    let runner = ChainRunner::new(spec, &runtime);
    let mut sink = runner.open_sink()?;
    let summary = runner.run(sink.as_mut(), |s| report(s, false)).context("the pipeline failed")?;
    report(&summary, true);
    Ok(())
}

fn inspect(wasm: PathBuf, cache_dir: PathBuf) -> Result<()> {
    let runtime = runtime(cache_dir)?;
    let name = wasm.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let component = runtime.load_file(&name, &wasm)?;
    println!("{}: {:?}", wasm.display(), component.world());
    println!("  sha256  {}", component.digest());
    println!("  loaded  in {:.1?} ({:?})", component.load_time(), component.cache_outcome());
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("EDDY_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Run { pipeline, cache_dir } => run(pipeline, cache_dir),
        Command::Inspect { wasm, cache_dir } => inspect(wasm, cache_dir),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
