//! `eddy replay`: one subtask of a journaled step run again from a checkpoint's state over
//! the input its journal recorded, with every record, state access, timer, log line and
//! output shown in order; with `--wasm`, the same input through other code and the outputs
//! that differ.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use eddy_checkpoint::inspect::{StateEntry, key_from_text};
use eddy_engine::replay::{ReplayEnd, ReplayRequest, ReplaySummary, TraceEvent, replay};
use eddy_plan::{PipelineSpec, StoreLocation};
use eddy_runtime::Runtime;

use serde_json::Value;

use crate::client::{Api, Login};

/// Prints a line to stdout; a reader that went away (`eddy replay ... | head`) has what it
/// wanted, so the replay ends there quietly instead of panicking on the broken pipe.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("error: writing the replay: {e}");
            std::process::exit(1);
        }
    }};
}

/// How `eddy replay` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per event, for people.
    Text,
    /// One JSON object per event (the last one the summary), for tools.
    Jsonl,
}

/// What `eddy replay` was asked.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The journaled job: its pipeline spec (whose `checkpoints` store holds the journal), that
    /// checkpoints directory or `s3://bucket/prefix` (credentials and `AWS_ENDPOINT_URL` from
    /// the environment), or the id of a job on the server (`eddy login`), which replays it.
    pub source: String,
    /// The step to replay.
    #[arg(long)]
    pub step: String,
    /// Which subtask of it (`eddy plan` lists them).
    #[arg(long)]
    pub subtask: u32,
    /// Start from this checkpoint's state (default: the oldest the journal reaches back to).
    #[arg(long)]
    pub from_checkpoint: Option<u64>,
    /// Show only what concerns this key: JSON as the key is stored (`'"alice"'`, `42`); text
    /// that is not JSON is taken as a string (`alice`).
    #[arg(long)]
    pub key: Option<String>,
    /// Replay the same input through this component and print where its outputs differ from
    /// the recorded code's (a canary for an upgrade).
    #[arg(long)]
    pub wasm: Option<PathBuf>,
    /// Stop after this input record (1 is the first replayed).
    #[arg(long)]
    pub until: Option<u64>,
    /// How to print.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Where compiled operators are cached.
    #[arg(long, default_value = ".eddy/artifacts")]
    pub cache_dir: PathBuf,
}

/// Runs `eddy replay`; `login` is the server's, asked for only when `source` is a job id.
pub fn run(
    args: ReplayArgs,
    runtime: impl FnOnce() -> Result<Runtime>,
    login: impl FnOnce() -> Result<Login>,
) -> Result<()> {
    if crate::state::is_job_id(&args.source) {
        return from_server(&args, login()?);
    }
    let runtime = &runtime()?;
    let request = ReplayRequest {
        from_checkpoint: args.from_checkpoint,
        key: args.key.as_deref().map(key_from_text),
        until: args.until,
        ..ReplayRequest::new(checkpoints(&args.source)?, &args.step, args.subtask)
    };
    match &args.wasm {
        None => {
            let summary = replay(&request, runtime, &mut |event| print_event(&event, args.format))?;
            print_summary(&summary, args.format)
        }
        Some(wasm) => compare(&request, wasm, runtime, args.format),
    }
}

/// `eddy replay JOB`: the server replays from the job's journal (at most 5 000 events).
fn from_server(args: &ReplayArgs, login: Login) -> Result<()> {
    if args.wasm.is_some() {
        anyhow::bail!("--wasm replays other code in this process: give the job's checkpoints directory, not its id");
    }
    let api = Api::new(login)?;
    let mut query = vec![("step", args.step.clone()), ("subtask", args.subtask.to_string()), ("limit", "5000".into())];
    query.extend(args.key.clone().map(|k| ("key", k)));
    query.extend(args.from_checkpoint.map(|c| ("from_checkpoint", c.to_string())));
    query.extend(args.until.map(|u| ("until", u.to_string())));
    let answer = api.get_query(&format!("/v1/jobs/{}/replay", args.source), &query)?;
    let unexpected = "the server's answer is not a replay; is it an older `eddy serve`?";
    let events: Vec<TraceEvent> = serde_json::from_value(answer["events"].clone()).context(unexpected)?;
    for event in &events {
        print_event(event, args.format);
    }
    if let Some(failure) = answer["failure"].as_str() {
        anyhow::bail!("{failure}");
    }
    let summary: ReplaySummary = serde_json::from_value(answer["summary"].clone()).context(unexpected)?;
    print_summary(&summary, args.format)
}

/// The checkpoint store `source` names: a pipeline spec's, a directory, or `s3://bucket/prefix`.
fn checkpoints(source: &str) -> Result<StoreLocation> {
    if source.contains("://") {
        return eddy_service::placement::parse_store(source, |name| std::env::var(name).ok())
            .map_err(anyhow::Error::msg);
    }
    let path = Path::new(source);
    if path.is_file() {
        let spec = PipelineSpec::from_file(path)?;
        let Some(c) = spec.checkpoints else {
            anyhow::bail!(
                "pipeline `{}` has no `checkpoints:` section, so it keeps no journal: add one and `debug: {{journal: true}}`",
                spec.name
            );
        };
        return Ok(match (c.dir, c.s3) {
            (_, Some(s3)) => StoreLocation::S3(s3),
            (dir, None) => StoreLocation::Dir(dir.unwrap_or_default()),
        });
    }
    if path.is_dir() {
        return Ok(StoreLocation::Dir(path.to_path_buf()));
    }
    anyhow::bail!("`{source}` is neither a pipeline spec, a checkpoints directory, s3://bucket/prefix nor a job's id")
}

/// Replays the recorded code and `wasm` over the same input and prints the outputs that differ.
fn compare(request: &ReplayRequest, wasm: &Path, runtime: &Runtime, format: Format) -> Result<()> {
    let outputs = |request: &ReplayRequest| -> Result<(Vec<TraceEvent>, ReplaySummary)> {
        let mut out = Vec::new();
        let summary = replay(request, runtime, &mut |e| {
            if matches!(e, TraceEvent::Output { .. }) {
                out.push(e)
            }
        })?;
        Ok((out, summary))
    };
    let (old, old_summary) = outputs(request).context("replaying the recorded code")?;
    let other = ReplayRequest { wasm: Some(wasm.to_path_buf()), ..request.clone() };
    let (new, new_summary) = outputs(&other).with_context(|| format!("replaying {}", wasm.display()))?;
    let mut differ = 0;
    for n in 0..old.len().max(new.len()) {
        let (a, b) = (old.get(n), new.get(n));
        if a == b {
            continue;
        }
        differ += 1;
        match format {
            Format::Jsonl => {
                let line = serde_json::json!({"event": "difference", "output": n + 1, "recorded": a, "other": b});
                say!("{line}");
            }
            Format::Text => {
                let show =
                    |e: Option<&TraceEvent>| e.map_or_else(|| "(none)".to_string(), |e| text(e).trim().to_owned());
                say!("output #{}\n  recorded: {}\n  {}: {}", n + 1, show(a), wasm.display(), show(b));
            }
        }
    }
    let (recorded, others) = (old_summary.artifact.as_str(), new_summary.artifact.as_str());
    match format {
        Format::Jsonl => say!(
            "{}",
            serde_json::json!({"event": "summary", "recorded": old_summary, "other": new_summary, "outputs_differ": differ})
        ),
        Format::Text => say!(
            "{} input records from checkpoint {}: the recorded code ({recorded}) emitted {}, {} ({others}) emitted {}; \
             {differ} outputs differ",
            old_summary.records,
            old_summary.from_checkpoint,
            old.len(),
            wasm.display(),
            new.len()
        ),
    }
    Ok(())
}

fn print_event(event: &TraceEvent, format: Format) {
    match format {
        Format::Jsonl => say!("{}", serde_json::to_string(event).unwrap_or_default()),
        Format::Text => say!("{}", text(event)),
    }
}

fn print_summary(summary: &ReplaySummary, format: Format) -> Result<()> {
    if format == Format::Jsonl {
        let mut line = serde_json::to_value(summary)?;
        line["event"] = "summary".into();
        say!("{line}");
        return Ok(());
    }
    let end = match &summary.end {
        ReplayEnd::Finished => "the input ended and the operator finished".to_string(),
        ReplayEnd::Until { record } => format!("stopped at record {record} as asked"),
        ReplayEnd::EventLimit { events } => format!("stopped after {events} events (narrow it with --key or --until)"),
        ReplayEnd::JournalEnds { after_checkpoint } => format!(
            "the journal ends after checkpoint {after_checkpoint} without an end of input (the job was still \
             running, was stopped or killed)"
        ),
        ReplayEnd::SegmentMissing { checkpoint } => {
            format!("the segment after checkpoint {checkpoint} is not kept (the journal was pruned or stopped)")
        }
        ReplayEnd::CodeChanged { checkpoint, artifact } => format!(
            "the subtask ran other code ({artifact}) after checkpoint {checkpoint} (a live swap): replay on with \
             --from-checkpoint {checkpoint}"
        ),
    };
    if let Some(owner) = summary.key_subtask.filter(|&o| o != summary.subtask) {
        say!("the key asked for is in subtask {owner}'s key groups: this subtask never sees it");
    }
    say!(
        "replayed step `{}` subtask {} from {} over {} segment(s): {} input records, {} outputs; {end}",
        summary.step,
        summary.subtask,
        match summary.from_checkpoint {
            0 => "the job's start".to_string(),
            c => format!("checkpoint {c}"),
        },
        summary.segments,
        summary.records,
        summary.outputs
    );
    Ok(())
}

/// One event as a line for people.
fn text(event: &TraceEvent) -> String {
    let key = |k: &Option<Value>| k.as_ref().map_or_else(String::new, |k| format!(" key {k}"));
    let at = |t: &Option<i64>| t.map_or_else(String::new, |t| format!(" at {t}"));
    match event {
        TraceEvent::Segment { after_checkpoint: 0, artifact } => format!("── from the job's start, code {artifact}"),
        TraceEvent::Segment { after_checkpoint, artifact } => {
            format!("── after checkpoint {after_checkpoint}, code {artifact}")
        }
        TraceEvent::Input { n, channel, key: k, timestamp, value } => {
            let from = channel.map_or_else(String::new, |c| format!("  (channel {c})"));
            format!("#{n} in{}{}: {value}{from}", key(k), at(timestamp))
        }
        TraceEvent::Watermark { watermark } => format!("watermark {watermark}"),
        TraceEvent::ProcessingTime { now_ms } => format!("processing time {now_ms}"),
        TraceEvent::StateRead { entry, found: true } => format!("    read   {} = {}", entry_name(entry), entry.value),
        TraceEvent::StateRead { entry, found: false } => format!("    read   {} (absent)", entry_name(entry)),
        TraceEvent::StateWrite { entry } => format!("    write  {} = {}", entry_name(entry), entry.value),
        TraceEvent::StateDelete { entry, prefix } => {
            format!("    delete {}{}", entry_name(entry), if *prefix { " (all of it)" } else { "" })
        }
        TraceEvent::Timer { change, domain, key, timestamp } => {
            format!("    timer  {change} {domain} {key} at {timestamp}")
        }
        TraceEvent::Output { output, key: k, timestamp, value } => {
            let side = if output == "main" { String::new() } else { format!(" [{output}]") };
            format!("    out{side}{}{}: {value}", key(k), at(timestamp))
        }
        TraceEvent::Log { level, message } => format!("    log    {level}: {message}"),
        TraceEvent::Barrier { checkpoint } => format!("── barrier of checkpoint {checkpoint}"),
        TraceEvent::Finish => "── end of input".into(),
    }
}

/// `state[key]`, with a map key or a window when the entry has one.
fn entry_name(e: &StateEntry) -> String {
    let mut name = format!("{}[{}]", e.state, e.key);
    if let Some(m) = &e.map_key {
        name.push_str(&format!("[{m}]"));
    }
    if let Some(w) = &e.window {
        name.push_str(&format!(" window [{}, {})", w.start, w.end));
    }
    name
}
