//! A spinning tenant next to a healthy one, on this machine's cores: the healthy job's
//! throughput alone, beside a spinner with no CPU share, and beside the same spinner held to
//! half a core by its share (`eddy_runtime::CpuShare`, what `eddy serve` gives each tenant by
//! its `cpu_millicores` quota). Medians of 3 runs, in events/s, each configuration measured in
//! turn so drift hits all alike.
//!
//! Run: `cargo bench -p eddy-engine --bench cpu_share`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use eddy_engine::{Job, JobOptions};
use eddy_plan::PipelineSpec;
use eddy_runtime::{CpuShare, Runtime, RuntimeConfig};

const EVENTS: u64 = 1_500_000;
const RUNS: usize = 3;

fn healthy() -> PipelineSpec {
    let yaml = format!(
        "name: healthy\nsources:\n  - {{type: generator, name: g, seed: 1, events: {EVENTS}, keys: 1000, key_field: user, \
         value_field: v}}\nsteps:\n  - {{name: count, wasm: {count}, key_by: /user}}\nsink: {{type: blackhole}}\n",
        count = eddy_guest_artifacts::RUNNING_COUNT,
    );
    PipelineSpec::from_yaml(&yaml).expect("healthy spec")
}

/// Burns CPU on every record, on two subtasks: as greedy as a tenant can be within the call
/// timeout.
fn spinner() -> PipelineSpec {
    let yaml = format!(
        "name: spinner\nparallelism: 2\nsources:\n  - {{type: generator, name: g, seed: 2, keys: 100, key_field: user, \
         value_field: v, parallelism: 2}}\nbatch_size: 1\nsteps:\n  - {{name: burn, wasm: {hostile}, \
         config: {{mode: burn, count: 2000000}}}}\nsink: {{type: blackhole}}\n",
        hostile = eddy_guest_artifacts::HOSTILE,
    );
    PipelineSpec::from_yaml(&yaml).expect("spinner spec")
}

/// The healthy job's events/s while `neighbour` (if any) runs with `share`.
fn measure(runtime: &Runtime, neighbour: Option<Option<Arc<CpuShare>>>) -> f64 {
    let spin = neighbour.map(|share| {
        let options = JobOptions { cpu_share: share, ..JobOptions::default() };
        let job = Job::start(&spinner(), runtime, options).expect("spinner starts");
        // Let it take the cores before measuring.
        std::thread::sleep(Duration::from_millis(500));
        job
    });
    let started = Instant::now();
    let summary = Job::run(&healthy(), runtime, JobOptions::default(), Duration::from_secs(3600), |_, _| {})
        .expect("healthy job runs");
    let rate = summary.metrics.source_records as f64 / started.elapsed().as_secs_f64();
    if let Some(job) = spin {
        job.cancel();
        let _ = job.wait();
    }
    rate
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let runtime = Runtime::new(RuntimeConfig::default()).expect("runtime");
    let (mut alone, mut greedy, mut held) = (Vec::new(), Vec::new(), Vec::new());
    let mut throttled = Duration::ZERO;
    for _ in 0..RUNS {
        alone.push(measure(&runtime, None));
        greedy.push(measure(&runtime, Some(None)));
        let share = Arc::new(CpuShare::new(0.5, Duration::from_millis(500)));
        held.push(measure(&runtime, Some(Some(share.clone()))));
        throttled += share.throttled();
    }
    let (alone, greedy, held) = (median(alone), median(greedy), median(held));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("healthy job ({EVENTS} events, running count) beside a spinner, {cores} cores, median of {RUNS}:");
    println!("| neighbour | healthy events/s | vs alone |\n|---|---:|---:|");
    println!("| none | {alone:.0} | 1.00 |");
    println!("| spinner, no CPU share | {greedy:.0} | {:.2} |", greedy / alone);
    println!("| spinner held to 0.5 cores | {held:.0} | {:.2} |", held / alone);
    println!("(the held spinner waited {:.1} s for its share over the {RUNS} runs)", throttled.as_secs_f64());
}
