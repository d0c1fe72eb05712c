//! `eddy bench languages`: what an operator costs in each language, side by side in one run.
//!
//! Two workloads per language, each against the native Rust loop over the same data:
//! - **word count**: a file of lines, split into words and counted per word (both steps in
//!   the language, parallelism 1, into a blackhole); records are words.
//! - **q1**: Nexmark q1 (a stateless map over generated events); records are events.
//!
//! Records per CPU second (user + system, `getrusage`, the whole process while the job runs)
//! are medians over `--runs` runs taken in turn. For word count also per step: words out of
//! the split and into the count per CPU second of that step's own thread (the engine's
//! per-task CPU time), what one operator in the language costs apart from the rest of the job. Per component: artifact size, compile time
//! (a fresh compile, no cache), instantiate-and-open time and linear memory per instance.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eddy_engine::{Job, JobOptions, MetricsSnapshot};
use eddy_plan::PipelineSpec;
use eddy_runtime::{Runtime, RuntimeConfig, Subtask};
use serde::Serialize;

use crate::bench::{cpu_and_rss, median};

/// A language's guests, as file names under the guests directory (`target/wasm-guests`).
struct Guests {
    lang: &'static str,
    split: &'static str,
    count: &'static str,
    q1: &'static str,
}

const LANGUAGES: &[Guests] = &[
    Guests {
        lang: "rust",
        split: "wasm32-wasip2/release/wordcount_split.wasm",
        count: "wasm32-wasip2/release/wordcount_count.wasm",
        q1: "wasm32-wasip2/release/nexmark_q1.wasm",
    },
    Guests {
        lang: "python",
        split: "python_wordcount_split.wasm",
        count: "python_wordcount_count.wasm",
        q1: "python_nexmark_q1.wasm",
    },
    Guests { lang: "js", split: "js_wordcount_split.wasm", count: "js_wordcount_count.wasm", q1: "js_nexmark_q1.wasm" },
    Guests { lang: "go", split: "go_wordcount_split.wasm", count: "go_wordcount_count.wasm", q1: "go_nexmark_q1.wasm" },
];

/// What `eddy bench languages` takes.
pub struct LanguageArgs {
    pub words: u64,
    pub events: u64,
    pub runs: usize,
    pub guests_dir: PathBuf,
    pub cache_dir: PathBuf,
    pub report: PathBuf,
}

#[derive(Debug, Serialize)]
struct Throughput {
    lang: String,
    workload: &'static str,
    records: u64,
    records_per_cpu_sec: Option<f64>,
    native_per_cpu_sec: Option<f64>,
    /// Word count: words the split step emitted per CPU second of its thread.
    split_step_per_cpu_sec: Option<f64>,
    /// Word count: words the count step took per CPU second of its thread.
    count_step_per_cpu_sec: Option<f64>,
}

#[derive(Debug, Serialize)]
struct ComponentCost {
    lang: String,
    component: String,
    size_mb: f64,
    compile_sec: f64,
    instantiate_ms: Option<f64>,
    memory_mib: f64,
}

/// CPU seconds `f` takes.
fn cpu_of(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let (before, _) = cpu_and_rss();
    f()?;
    let (after, _) = cpu_and_rss();
    Ok(after - before)
}

fn words_file(dir: &Path, words: u64) -> Result<PathBuf> {
    // 10 000 distinct words, 10 a line, in a fixed pseudo-random order.
    let path = dir.join("words.txt");
    let mut text = String::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("w{}", x % 10_000));
        text.push(if i % 10 == 9 { '\n' } else { ' ' });
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn wordcount_spec(words: &Path, split: &Path, count: &Path) -> Result<PipelineSpec> {
    let yaml = format!(
        "name: bench-wordcount\nsources:\n  - {{type: file, name: lines, path: {:?}, format: lines}}\n\
         steps:\n  - {{name: split, wasm: {:?}}}\n  - {{name: count, wasm: {:?}, key_by: key}}\nsink: {{type: blackhole}}\n",
        words.display().to_string(),
        split.display().to_string(),
        count.display().to_string()
    );
    Ok(PipelineSpec::from_yaml(&yaml)?)
}

fn q1_spec(events: u64, q1: &Path) -> Result<PipelineSpec> {
    let yaml = format!(
        "name: bench-q1\nsources:\n  - {{type: nexmark, name: nexmark, seed: 42, events: {events}}}\n\
         steps:\n  - {{name: q1, wasm: {:?}}}\nsink: {{type: blackhole}}\n",
        q1.display().to_string()
    );
    Ok(PipelineSpec::from_yaml(&yaml)?)
}

fn run_job(spec: &PipelineSpec, runtime: &Runtime) -> Result<MetricsSnapshot> {
    let summary = Job::run(spec, runtime, JobOptions::default(), Duration::from_secs(3600), |_, _| {})?;
    if !summary.finished {
        bail!("{} did not finish", spec.name);
    }
    Ok(summary.metrics)
}

/// Per CPU second of its thread: the words the word count's split task emitted and its count
/// task took (the split is chained with the source, the count with the sink).
fn step_rates(metrics: &MetricsSnapshot) -> Option<(f64, f64)> {
    let rate = |records: u64, cpu_ns: u64| (cpu_ns > 0).then(|| records as f64 / (cpu_ns as f64 / 1e9));
    let task = |step: &str| metrics.tasks.iter().find(|t| t.label.contains(step));
    let (split, count) = (task("-> split")?, task("count ->")?);
    Some((rate(split.records_out, split.cpu_ns)?, rate(count.records_in, count.cpu_ns)?))
}

/// The native loop of the word count: the same split and count, in a HashMap.
fn native_wordcount(words: &Path) -> Result<()> {
    let text = std::fs::read_to_string(words)?;
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut emitted = 0u64;
    for line in text.lines() {
        for w in line.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
            let n = counts.entry(w.to_lowercase()).or_default();
            *n += 1;
            emitted = emitted.wrapping_add(*n);
        }
    }
    std::hint::black_box(emitted);
    Ok(())
}

fn native_q1(events: u64) -> Result<()> {
    let config =
        eddy_nexmark::NexmarkConfig { seed: 42, events: Some(events), ..eddy_nexmark::NexmarkConfig::default() };
    let eddy_nexmark::native::RowCount(rows) = eddy_nexmark::native::q1(eddy_nexmark::events(&config));
    std::hint::black_box(rows);
    Ok(())
}

fn rate(records: u64, cpu: Vec<f64>) -> Option<f64> {
    median(cpu).map(|s| records as f64 / s.max(1e-9))
}

fn component_cost(lang: &str, path: &Path) -> Result<ComponentCost> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("{} (build it: cargo build --release -p eddy-guest-artifacts)", path.display()))?;
    let runtime = Runtime::new(RuntimeConfig::default())?;
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let started = Instant::now();
    let component = runtime.load_fresh(&name, &bytes)?;
    let compile_sec = started.elapsed().as_secs_f64();
    let mut times = Vec::new();
    let mut memory = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let state = Box::new(eddy_state::HeapStateBackend::default());
        let timers = Box::new(eddy_core::HeapTimerService::default());
        let mut op = component.instantiate_operator(Subtask::single(128), state, timers)?;
        op.open("null")?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        memory = op.memory_bytes();
    }
    Ok(ComponentCost {
        lang: lang.into(),
        component: name,
        size_mb: bytes.len() as f64 / 1e6,
        compile_sec,
        instantiate_ms: median(times),
        memory_mib: memory as f64 / (1 << 20) as f64,
    })
}

pub fn run(args: &LanguageArgs) -> Result<()> {
    let work = tempfile::tempdir()?;
    let words = words_file(work.path(), args.words)?;
    let runtime = Runtime::new(RuntimeConfig { cache_dir: Some(args.cache_dir.clone()), ..RuntimeConfig::default() })?;
    let mut costs = Vec::new();
    let mut jobs = Vec::new();
    for g in LANGUAGES {
        let path = |file: &str| args.guests_dir.join(file);
        let (split, count, q1) = (path(g.split), path(g.count), path(g.q1));
        for component in [&count, &q1] {
            costs.push(component_cost(g.lang, component)?);
        }
        jobs.push((g.lang, wordcount_spec(&words, &split, &count)?, q1_spec(args.events, &q1)?));
    }
    // One untimed run each: compiled components reach the cache.
    for (_, wordcount, q1) in &jobs {
        run_job(wordcount, &runtime)?;
        run_job(q1, &runtime)?;
    }
    let mut cpu: HashMap<(&str, &str), Vec<f64>> = HashMap::new();
    let mut steps: HashMap<&str, (Vec<f64>, Vec<f64>)> = HashMap::new();
    for run in 0..args.runs {
        eprintln!("run {} of {} ...", run + 1, args.runs);
        cpu.entry(("native", "wordcount")).or_default().push(cpu_of(|| native_wordcount(&words))?);
        cpu.entry(("native", "q1")).or_default().push(cpu_of(|| native_q1(args.events))?);
        for (lang, wordcount, q1) in &jobs {
            let mut metrics = None;
            cpu.entry((lang, "wordcount"))
                .or_default()
                .push(cpu_of(|| run_job(wordcount, &runtime).map(|m| metrics = Some(m)))?);
            if let Some((split, count)) = metrics.as_ref().and_then(step_rates) {
                let rates = steps.entry(lang).or_default();
                rates.0.push(split);
                rates.1.push(count);
            }
            cpu.entry((lang, "q1")).or_default().push(cpu_of(|| run_job(q1, &runtime).map(drop))?);
        }
    }
    let mut rows = Vec::new();
    for g in LANGUAGES {
        for (workload, records) in [("wordcount", args.words), ("q1", args.events)] {
            let (split, count) = match workload {
                "wordcount" => steps.remove(g.lang).map_or((None, None), |(s, c)| (median(s), median(c))),
                _ => (None, None),
            };
            rows.push(Throughput {
                lang: g.lang.into(),
                workload,
                records,
                records_per_cpu_sec: rate(records, cpu.remove(&(g.lang, workload)).unwrap_or_default()),
                native_per_cpu_sec: rate(records, cpu.get(&("native", workload)).cloned().unwrap_or_default()),
                split_step_per_cpu_sec: split,
                count_step_per_cpu_sec: count,
            });
        }
    }
    print_tables(&rows, &costs, args.runs);
    let report = serde_json::json!({ "throughput": rows, "components": costs, "runs": args.runs });
    std::fs::write(&args.report, serde_json::to_vec_pretty(&report)?)?;
    println!("report: {}", args.report.display());
    Ok(())
}

fn print_tables(rows: &[Throughput], costs: &[ComponentCost], runs: usize) {
    let per = |r: &Throughput| r.records_per_cpu_sec.unwrap_or(0.0);
    let rust = |workload: &str| rows.iter().find(|r| r.lang == "rust" && r.workload == workload).map(per);
    println!("records per CPU second, medians of {runs} runs:");
    println!(
        "{:<8} {:<10} {:>10} {:>14} {:>9} {:>11} {:>16} {:>16}",
        "language",
        "workload",
        "records",
        "records/cpu-s",
        "vs rust",
        "vs native",
        "split step/cpu-s",
        "count step/cpu-s"
    );
    let step = |rate: Option<f64>| rate.map_or("-".to_string(), |r| format!("{r:.0}"));
    for r in rows {
        let vs_rust = rust(r.workload).map_or(0.0, |base| per(r) / base.max(1e-9));
        let vs_native = r.native_per_cpu_sec.map_or(0.0, |n| per(r) / n.max(1e-9));
        println!(
            "{:<8} {:<10} {:>10} {:>14.0} {:>8.3}x {:>10.3}x {:>16} {:>16}",
            r.lang,
            r.workload,
            r.records,
            per(r),
            vs_rust,
            vs_native,
            step(r.split_step_per_cpu_sec),
            step(r.count_step_per_cpu_sec)
        );
    }
    println!(
        "\n{:<8} {:<24} {:>8} {:>11} {:>15} {:>11}",
        "language", "component", "size MB", "compile s", "instantiate ms", "memory MiB"
    );
    for c in costs {
        println!(
            "{:<8} {:<24} {:>8.2} {:>11.2} {:>15.1} {:>11.1}",
            c.lang,
            c.component,
            c.size_mb,
            c.compile_sec,
            c.instantiate_ms.unwrap_or(0.0),
            c.memory_mib
        );
    }
}
