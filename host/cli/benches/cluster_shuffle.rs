//! Nexmark q5's keyed shuffle across two worker processes against one: `cargo bench -p eddy-cli
//! --bench cluster_shuffle`. Each round starts a coordinator and either one worker with two
//! slots (both subtasks of every task in one process, exchanges in memory) or two workers with
//! one slot each (half of every exchange crosses QUIC between the processes), runs q5 at
//! parallelism 2 over `EDDY_BENCH_EVENTS` events (default 3 000 000) into a blackhole, and
//! reads the workers' CPU time from `/proc` (after a small warm-up run, in which each worker
//! fetches and compiles the components). Rounds alternate the layouts; the medians are
//! printed, with events per CPU-second of the two-process layout against the one-process one
//! (issue 25's goal: at least 90%). `EDDY_BENCH_ROUNDS` sets the rounds (default 3) and
//! `EDDY_BENCH_WORKERS=1|2` runs one layout only (to profile it with `perf record -a`).
#![allow(clippy::unwrap_used, reason = "a bench driver: a failed step should stop it loudly")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::fleet::{Worker, eventually, names, nexmark_query};
use common::{Server, expect, submit, tenant, wait_job};

/// CPU seconds (user + system) process `pid` used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// One run: (wall seconds from submission to the end, the workers' CPU seconds).
fn run(workers: u32, events: u64) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = Server::start_as("coordinator", &dir.path().join("coordinator"), &[]);
    let slots = (2 / workers).to_string();
    let fleet: Vec<Worker> = (1..=workers)
        .map(|i| Worker::start_with_slots(&coordinator, &format!("worker-{i}"), dir.path(), &slots))
        .collect();
    eventually("the workers", || names(&coordinator).len() == workers as usize);
    let (_, token) = tenant(&coordinator, "bench");
    let run_q5 = |events: u64| {
        let mut spec = nexmark_query(&coordinator, &token, "q5", 2, events);
        spec.sink = eddy_plan::SinkSpec::Blackhole;
        let before: f64 = fleet.iter().map(|w| cpu_seconds(w.child.id())).sum();
        let started = Instant::now();
        let submitted = expect(submit(&coordinator, &token, &serde_json::to_string(&spec).unwrap()), 201);
        let id = submitted["id"].as_str().unwrap();
        let done =
            wait_job(&coordinator, &token, id, "ended", |j| j["status"] == "finished" || j["status"] == "failed");
        assert_eq!(done["status"], "finished", "{done}");
        let cpu = fleet.iter().map(|w| cpu_seconds(w.child.id())).sum::<f64>() - before;
        (started.elapsed().as_secs_f64(), cpu)
    };
    // A small run first: each worker fetches and compiles the components once, which is not
    // what is measured.
    run_q5(10_000);
    run_q5(events)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let events: u64 = std::env::var("EDDY_BENCH_EVENTS").ok().and_then(|e| e.parse().ok()).unwrap_or(3_000_000);
    let rounds: u32 = std::env::var("EDDY_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let (mut one, mut two) = (Vec::new(), Vec::new());
    let only: Option<u32> = std::env::var("EDDY_BENCH_WORKERS").ok().and_then(|w| w.parse().ok());
    for round in 1..=rounds {
        for (workers, into) in [(1, &mut one), (2, &mut two)] {
            if only.is_some_and(|o| o != workers) {
                continue;
            }
            let (wall, cpu) = run(workers, events);
            println!("round {round}, {workers} worker process(es): {wall:.2} s, {cpu:.2} CPU s");
            into.push((wall, cpu));
        }
    }
    let report = |label: &str, runs: &[(f64, f64)]| {
        let rate = median(runs.iter().map(|(w, _)| events as f64 / w).collect());
        let per_cpu = median(runs.iter().map(|(_, c)| events as f64 / c).collect());
        println!("{label}: median {rate:.0} events/s, {per_cpu:.0} events per CPU-second");
        per_cpu
    };
    if one.is_empty() || two.is_empty() {
        return;
    }
    let single = report("q5, one worker process (2 slots)", &one);
    let spread = report("q5, two worker processes (1 slot each)", &two);
    println!("two processes reach {:.0}% of one process's events per CPU-second", 100.0 * spread / single);
}
