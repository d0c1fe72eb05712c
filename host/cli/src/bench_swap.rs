//! `eddy bench swap`: what changing a running step's code costs, live against restart.
//!
//! The job: an unpaced generator into a per-user running count at parallelism P over K users
//! (the state a restart must restore and a swap keeps in place), checkpoints
//! every second, a blackhole sink. After a warm-up the count is upgraded to the version that
//! adds two per record, once each way, in separate runs of the same job:
//!
//! - **live** (`Job::swap_live`): the pause the swap adds at its barrier (the slowest
//!   synchronous snapshot plus the slowest instantiate-and-open of the new code, as the engine
//!   measures them), the longest stall of the sink's counter seen from outside (sampled every
//!   millisecond) against the longest in the second before, and the sink's records per second
//!   before, its slowest 100 ms then (a regular checkpoint's dip) and its slowest 100 ms
//!   through the swap (the swap's checkpoint's dip);
//! - **restart** (savepoint, stop, start from the savepoint with the new code): from asking
//!   until the first record reaches the sink again.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eddy_engine::{Job, JobOptions};
use eddy_plan::{PipelineSpec, StoreLocation};
use eddy_runtime::Runtime;
use serde::Serialize;

/// What the bench is told.
pub struct SwapArgs {
    pub parallelism: u32,
    pub keys: u64,
    pub runs: usize,
    pub guests: crate::GuestDirs,
    pub work_dir: PathBuf,
    pub report: PathBuf,
}

/// One run of both ways.
#[derive(Debug, Serialize)]
pub struct SwapRow {
    /// The slowest synchronous snapshot plus the slowest swap, ms (engine-measured).
    pub swap_pause_ms: f64,
    /// The longest time the sink's counter stood still from the swap's request to 200 ms after
    /// it completed, ms.
    pub swap_stall_ms: f64,
    /// The longest such stall in the second before the request, ms (checkpoints included).
    pub stall_before_ms: f64,
    /// From the request to the swap's completed checkpoint, ms.
    pub swap_total_ms: f64,
    /// Sink records per second in the second before the request.
    pub records_per_sec_before: f64,
    /// The slowest 100 ms of the sink from the request to 500 ms after completion, per second.
    pub records_per_sec_through: f64,
    /// The slowest 100 ms in the second before the request (a regular checkpoint's cost), per
    /// second.
    pub records_per_sec_slowest_before: f64,
    /// Restart mode: from the request until records reach the sink again, ms.
    pub restart_pause_ms: f64,
}

/// How long the job runs before the upgrade.
const WARM_UP: Duration = Duration::from_secs(3);

/// The job at parallelism `p` over `keys` users running `wasm`, with its checkpoints and state
/// under `dir`.
fn spec(dir: &Path, p: u32, keys: u64, wasm: &Path) -> Result<PipelineSpec> {
    let yaml = format!(
        "name: swap-bench\nparallelism: {p}\nsources:\n  - {{type: generator, name: g, seed: 7, events: 2000000000, \
         keys: {keys}, key_field: user, key_prefix: u-, value_field: v}}\nsteps:\n  - {{name: count, wasm: {wasm}, \
         key_by: /user}}\ncheckpoints: {{dir: {dir}/checkpoints, interval_ms: 1000}}\nstate: {{dir: {dir}/state}}\n\
         sink: {{type: blackhole}}\n",
        wasm = wasm.display(),
        dir = dir.display(),
    );
    Ok(PipelineSpec::from_yaml(&yaml)?)
}

/// The sink's counter, every millisecond, as (time since `origin`, records).
type Samples = Vec<(Duration, u64)>;

fn sample_until(job: &Job, origin: Instant, stop: &AtomicBool, into: &Mutex<Samples>) {
    while !stop.load(Ordering::Relaxed) {
        let records = job.metrics().sink_records;
        if let Ok(mut samples) = into.lock() {
            samples.push((origin.elapsed(), records));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The longest time the counter stood still within `[from, to]`, ms.
fn longest_stall(samples: &Samples, from: Duration, to: Duration) -> f64 {
    let inside: Vec<&(Duration, u64)> = samples.iter().filter(|(t, _)| *t >= from && *t <= to).collect();
    let mut longest = Duration::ZERO;
    let mut since = inside.first().map(|(t, _)| *t);
    for pair in inside.windows(2) {
        let ((_, before), (t, now)) = (pair[0], pair[1]);
        if now > before {
            since = Some(*t);
        } else if let Some(s) = since {
            longest = longest.max(*t - s);
        }
    }
    longest.as_secs_f64() * 1e3
}

/// Records per second from `from` to `to`, read off the samples nearest to each.
fn rate(samples: &Samples, from: Duration, to: Duration) -> f64 {
    let at = |t: Duration| samples.iter().rev().find(|(s, _)| *s <= t).map_or(0, |(_, n)| *n);
    at(to).saturating_sub(at(from)) as f64 / (to - from).as_secs_f64().max(1e-3)
}

/// The live swap's half of a row.
fn live(runtime: &Runtime, dir: &Path, args: &SwapArgs, v1: &Path, v2: &Path) -> Result<SwapRow> {
    let job = Job::start(&spec(dir, args.parallelism, args.keys, v1)?, runtime, JobOptions::default())?;
    let (origin, stop, samples) = (Instant::now(), AtomicBool::new(false), Mutex::new(Samples::new()));
    let measured = std::thread::scope(|scope| {
        scope.spawn(|| sample_until(&job, origin, &stop, &samples));
        std::thread::sleep(WARM_UP);
        let component = runtime.load_file("count", v2)?;
        let asked = origin.elapsed();
        let done = job.swap_live("count", component, Duration::from_secs(60));
        let completed = origin.elapsed();
        std::thread::sleep(Duration::from_millis(600));
        stop.store(true, Ordering::Relaxed);
        Ok::<_, anyhow::Error>((asked, completed, done?))
    });
    let checkpoints = job.completed_checkpoints();
    job.cancel();
    let _ = job.wait();
    let (asked, completed, done) = measured?;
    let samples = samples.into_inner().map_err(|_| anyhow::anyhow!("the sampler panicked"))?;
    let sync_ms = checkpoints.iter().find(|c| c.id == done.checkpoint).map_or(0.0, |c| c.stats.sync_ms);
    let second = Duration::from_secs(1);
    let slowest = |from: Duration, to: Duration| {
        (0..)
            .map(|i| from + Duration::from_millis(100 * i))
            .take_while(|t| *t + Duration::from_millis(100) <= to)
            .map(|t| rate(&samples, t, t + Duration::from_millis(100)))
            .fold(f64::INFINITY, f64::min)
    };
    Ok(SwapRow {
        swap_pause_ms: sync_ms + done.longest_swap_ms,
        swap_stall_ms: longest_stall(&samples, asked, completed + Duration::from_millis(200)),
        stall_before_ms: longest_stall(&samples, asked - second, asked),
        swap_total_ms: done.total_ms,
        records_per_sec_before: rate(&samples, asked - second, asked),
        records_per_sec_through: slowest(asked, completed + Duration::from_millis(500)),
        records_per_sec_slowest_before: slowest(asked - second, asked),
        restart_pause_ms: 0.0,
    })
}

/// The restart mode: ms from asking until records reach the sink again.
fn restart(runtime: &Runtime, dir: &Path, args: &SwapArgs, v1: &Path, v2: &Path) -> Result<f64> {
    let job = Job::start(&spec(dir, args.parallelism, args.keys, v1)?, runtime, JobOptions::default())?;
    std::thread::sleep(WARM_UP);
    let asked = Instant::now();
    let savepoint = StoreLocation::Dir(dir.join("savepoint"));
    job.stop_with_savepoint(&savepoint, Duration::from_secs(60))?;
    let options = JobOptions { restore_from: Some(savepoint), ..JobOptions::default() };
    let job = Job::start(&spec(dir, args.parallelism, args.keys, v2)?, runtime, options)?;
    while job.metrics().sink_records == 0 {
        if job.is_done() || asked.elapsed() > Duration::from_secs(120) {
            bail!("the restarted job sent nothing to its sink");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let pause = asked.elapsed().as_secs_f64() * 1e3;
    job.cancel();
    let _ = job.wait();
    Ok(pause)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs both ways `runs` times, prints each row and the medians, writes the JSON report.
pub fn run(args: &SwapArgs) -> Result<()> {
    let guests = args.guests.guests_dir.join("wasm32-wasip2/release");
    let (v1, v2) = (guests.join("running_count.wasm"), guests.join("running_count_v2.wasm"));
    for wasm in [&v1, &v2] {
        if !wasm.is_file() {
            bail!(
                "{} is missing: build the guests first (cargo build --release -p eddy-guest-artifacts)",
                wasm.display()
            );
        }
    }
    let runtime = crate::runtime(args.guests.cache_dir.clone())?;
    std::fs::create_dir_all(&args.work_dir).with_context(|| format!("creating {}", args.work_dir.display()))?;
    let mut rows = Vec::new();
    for run in 0..args.runs {
        eprintln!(
            "swap bench: run {} of {}, parallelism {}, {} keys ...",
            run + 1,
            args.runs,
            args.parallelism,
            args.keys
        );
        let dir = tempfile::tempdir_in(&args.work_dir)?;
        let mut row = live(&runtime, &dir.path().join("live"), args, &v1, &v2)?;
        row.restart_pause_ms = restart(&runtime, &dir.path().join("restart"), args, &v1, &v2)?;
        eprintln!("  {row:?}");
        rows.push(row);
    }
    let med = |f: fn(&SwapRow) -> f64| median(rows.iter().map(f).collect());
    println!(
        "| parallelism {}, {} keys (medians of {}) | swap pause ms (sync + swap) | sink stall through the swap ms | longest stall in the second before ms | swap request to completed checkpoint ms | records/s before | slowest 100 ms in the second before, records/s | slowest 100 ms through the swap, records/s | restart-mode upgrade: request to first record ms |",
        args.parallelism, args.keys, args.runs
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| count → count v2 | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        med(|r| r.swap_pause_ms),
        med(|r| r.swap_stall_ms),
        med(|r| r.stall_before_ms),
        med(|r| r.swap_total_ms),
        med(|r| r.records_per_sec_before),
        med(|r| r.records_per_sec_slowest_before),
        med(|r| r.records_per_sec_through),
        med(|r| r.restart_pause_ms),
    );
    std::fs::write(&args.report, serde_json::to_vec_pretty(&rows)?)
        .with_context(|| format!("writing {}", args.report.display()))?;
    eprintln!("report written to {}", args.report.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A counter standing still from 10 to 40 ms, then from 50 to 60: the longest stall is 30 ms
    /// inside the whole range and 10 ms inside [45, 70]; rates read between samples.
    #[test]
    fn stalls_and_rates_read_off_the_samples() {
        let samples: Samples =
            vec![(ms(0), 0), (ms(10), 5), (ms(20), 5), (ms(40), 5), (ms(50), 9), (ms(60), 9), (ms(70), 12)];
        assert_eq!(longest_stall(&samples, ms(0), ms(70)), 30.0);
        assert_eq!(longest_stall(&samples, ms(45), ms(70)), 10.0);
        assert_eq!(rate(&samples, ms(0), ms(50)), 9.0 / 0.05);
        assert_eq!(rate(&samples, ms(15), ms(45)), 0.0);
    }
}
