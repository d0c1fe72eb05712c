//! `eddy state`: a step's keyed state from a checkpoint or savepoint, decoded.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use eddy_checkpoint::inspect::{StateDump, StateEntry, StateQuery, key_from_text, read_state};
use eddy_checkpoint::{CheckpointId, CheckpointStore};
use eddy_plan::PipelineSpec;

use crate::client::{Api, Login};

/// How `eddy state` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per entry, for people.
    Table,
    /// One JSON object per entry (then one per timer), for tools.
    Jsonl,
}

/// What `eddy state` was asked.
#[derive(Debug, clap::Args)]
pub struct StateArgs {
    /// Where the state is: a pipeline spec (its checkpoints), a checkpoint or savepoint
    /// directory, one `chk-N` directory in it, `s3://bucket/prefix` (endpoint and keys from
    /// the AWS_* environment), or the id of a job on the server (`eddy login`): its newest
    /// completed checkpoint.
    pub source: String,
    /// The step whose state to read.
    #[arg(long)]
    pub step: String,
    /// Only this state (a declared name, or `#<id>` as printed).
    #[arg(long)]
    pub state: Option<String>,
    /// Only this key: JSON as the key is stored (`'"alice"'`, `42`); text that is not JSON is
    /// taken as a string (`alice`).
    #[arg(long)]
    pub key: Option<String>,
    /// Most entries to print.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Read this checkpoint instead of the newest.
    #[arg(long)]
    pub checkpoint: Option<CheckpointId>,
    /// How to print.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// The store and checkpoint `source` names.
fn open(source: &str, checkpoint: Option<CheckpointId>) -> Result<(CheckpointStore, Option<CheckpointId>)> {
    if source.contains("://") {
        let location = eddy_service::placement::parse_store(source, |name| std::env::var(name).ok())
            .map_err(anyhow::Error::msg)?;
        return Ok((CheckpointStore::at(&location)?, checkpoint));
    }
    let path = Path::new(source);
    if path.is_file() {
        let spec = PipelineSpec::from_file(path)?;
        let Some(c) = &spec.checkpoints else {
            anyhow::bail!("pipeline `{}` has no `checkpoints:` section, so it has no checkpoints", spec.name);
        };
        return Ok((CheckpointStore::open(c)?, checkpoint));
    }
    if !path.is_dir() {
        anyhow::bail!("`{source}` is neither a pipeline spec, a directory nor s3://bucket/prefix");
    }
    // `.../chk-7`: that checkpoint of the store around it.
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse::<CheckpointId>().ok())
        && let Some(parent) = path.parent()
    {
        if checkpoint.is_some_and(|c| c != id) {
            anyhow::bail!("`{source}` is checkpoint {id}, but --checkpoint asks for another");
        }
        let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
        return Ok((CheckpointStore::local(parent)?, Some(id)));
    }
    Ok((CheckpointStore::local(path)?, checkpoint))
}

/// Whether `source` names a job on the server rather than a place: not a URL, not a path
/// that exists, and no path separator.
pub(crate) fn is_job_id(source: &str) -> bool {
    !source.contains("://") && !source.contains('/') && !Path::new(source).exists()
}

/// Runs `eddy state`; `login` is the server's, asked for only when `source` is a job id.
pub fn state(args: StateArgs, login: impl FnOnce() -> Result<Login>) -> Result<()> {
    if is_job_id(&args.source) {
        return from_server(&args, login()?);
    }
    let (store, id) = open(&args.source, args.checkpoint)?;
    let query = StateQuery {
        step: args.step.clone(),
        state: args.state.clone(),
        key: args.key.as_deref().map(key_from_text),
        limit: args.limit,
    };
    // The step's files are fetched into a temporary directory there, removed after.
    let dump = read_state(&store, id, &query, &std::env::temp_dir())
        .with_context(|| format!("reading step `{}` from {}", args.step, store.describe()))?;
    print(&dump, args.format, store.describe())
}

/// `eddy state JOB`: the job's newest completed checkpoint, read by the server.
fn from_server(args: &StateArgs, login: Login) -> Result<()> {
    if args.checkpoint.is_some() {
        anyhow::bail!("the server reads a job's newest completed checkpoint: drop --checkpoint, or give a directory");
    }
    let api = Api::new(login)?;
    let mut query = vec![("step", args.step.clone()), ("limit", args.limit.to_string())];
    query.extend(args.key.clone().map(|k| ("key", k)));
    query.extend(args.state.clone().map(|s| ("state", s)));
    let path = format!("/v1/jobs/{}/state", args.source);
    let dump: StateDump = serde_json::from_value(api.get_query(&path, &query)?)
        .context("the server's answer is not a state read; is it an older `eddy serve`?")?;
    print(&dump, args.format, &format!("job {}", args.source))
}

fn print(dump: &StateDump, format: Format, source: &str) -> Result<()> {
    let printed = match format {
        Format::Jsonl => print_jsonl(dump),
        Format::Table => print_table(dump, source),
    };
    match printed {
        // `eddy state ... | head`: the reader has what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn print_jsonl(dump: &StateDump) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for entry in &dump.entries {
        writeln!(out, "{}", serde_json::to_string(entry).map_err(std::io::Error::other)?)?;
    }
    for timer in &dump.timers {
        writeln!(out, "{}", serde_json::json!({"timer": timer}))?;
    }
    Ok(())
}

fn print_table(dump: &StateDump, source: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let states: Vec<String> = dump
        .states
        .iter()
        .map(|d| format!("{} ({})", d.name, serde_json::json!(d.kind).as_str().unwrap_or("?")))
        .collect();
    writeln!(
        out,
        "checkpoint {} in {source}, step `{}`: {}",
        dump.checkpoint,
        dump.step,
        if states.is_empty() { "declared states not recorded".to_owned() } else { states.join(", ") }
    )?;
    for entry in &dump.entries {
        writeln!(out, "{}", entry_line(entry))?;
    }
    for timer in &dump.timers {
        writeln!(out, "timer  key {}  {} at {}", timer.key, timer.domain, timer.timestamp)?;
    }
    out.flush()?;
    let more = if dump.truncated { " (more match: raise --limit or give --key)" } else { "" };
    let count = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    eprintln!(
        "{}, {}{more}",
        count(dump.entries.len(), "entry", "entries"),
        count(dump.timers.len(), "timer", "timers")
    );
    Ok(())
}

fn entry_line(e: &StateEntry) -> String {
    let mut line = format!("{}  {}", e.key, e.state);
    if let Some(w) = e.window {
        line += &format!("  [{}, {})", w.start, w.end);
    }
    if e.fired == Some(true) {
        line += " fired";
    }
    if let Some(m) = &e.map_key {
        line += &format!("  [{m}]");
    }
    line + &format!("  = {}", e.value)
}
