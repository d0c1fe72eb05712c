//! Sandbox cost benchmark: the word-count counter through the sandbox at several batch sizes,
//! next to the same logic as native Rust over the same state backend, in the same run; and
//! the cost of getting an instance (cold compile, cached artifact, instantiate only); and one
//! crossing: a batch of 1 024 Nexmark rows host -> guest -> host through a guest that emits each
//! record unchanged, in ns per record, next to copying the same batch natively.
//!
//! Run: `cargo bench -p eddy-runtime --bench sandbox` (add `-- --quick` for fewer samples).
//! Prints medians; ratios are computed from medians of the same run.
//!
//! `-- --instructions` instead counts the WebAssembly instructions (wasmtime's fuel) per event
//! that the stateless Nexmark operators and two SDK floors spend on one batch: a count, not a
//! time, so two builds of the SDK compare exactly on a noisy machine. `EDDY_BENCH_GUESTS=DIR`
//! counts the `.wasm` files of another build (copy `target/wasm-guests/wasm32-wasip2/release`
//! aside first); `EDDY_BENCH_ONLY=q1` counts one operator and `EDDY_BENCH_REPEAT=5000` runs its
//! batch that many more times, for `EDDY_WASM_PERFMAP=1 perf record` on the guest alone.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use eddy_core::{HeapTimerService, RecordBatch};
use eddy_guest_artifacts as guests;
use eddy_runtime::{InstanceAllocation, Runtime, RuntimeConfig, Subtask};
use eddy_state::{HashedKey, HeapStateBackend, StateBackend, StateKey, state_id};

const KEYS: usize = 10_000;
const RECORDS: usize = 100_000;
const MAX_PARALLELISM: u32 = 128;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn measure(samples: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm-up
    median(
        (0..samples)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

/// The input: RECORDS words over KEYS distinct keys, JSON-encoded as the SDK expects.
fn input_batches(batch_size: usize) -> Vec<RecordBatch> {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let words: Vec<Vec<u8>> = (0..KEYS).map(|i| serde_json::to_vec(&format!("word-{i:08}")).expect("json")).collect();
    let mut batches = Vec::new();
    let mut batch = RecordBatch::default();
    for _ in 0..RECORDS {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        batch.push(Some(&words[(rng % KEYS as u64) as usize]), b"1", None);
        if batch.len() == batch_size {
            batches.push(std::mem::take(&mut batch));
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// The counter's logic in native Rust, over the same backend and key layout the sandbox uses.
struct NativeCounter {
    backend: HeapStateBackend,
    key: StateKey,
}

impl NativeCounter {
    fn process(&mut self, batch: &RecordBatch) -> RecordBatch {
        let mut out = RecordBatch::with_capacity(batch.len(), batch.byte_len() * 2);
        for r in batch.iter() {
            let key = r.key.expect("keyed");
            let word: String = serde_json::from_slice(key).expect("key");
            let n: u64 = serde_json::from_slice(r.value).expect("value");
            let state_key = self.key.encode(HashedKey::new(key, MAX_PARALLELISM), state_id("count"), b"").to_vec();
            let current: u64 = match self.backend.get(&state_key).expect("get") {
                Some(v) => serde_json::from_slice(&v).expect("state"),
                None => 0,
            };
            let count = current + n;
            self.backend.put(&state_key, &serde_json::to_vec(&count).expect("json")).expect("put");
            out.push(
                Some(&serde_json::to_vec(&word).expect("json")),
                &serde_json::to_vec(&count).expect("json"),
                r.timestamp,
            );
        }
        out
    }
}

/// The least a counter can do: a HashMap of counts, no encoding, no key layout.
fn bare_native(batches: &[RecordBatch], counts: &mut HashMap<Vec<u8>, u64>) {
    for b in batches {
        for r in b.iter() {
            *counts.entry(r.key.expect("keyed").to_vec()).or_default() += 1;
        }
    }
}

/// One crossing of a 1 024-record batch of Nexmark events (rows, as the source writes them):
/// `process` on a guest that emits every record unchanged, against a native copy of the batch
/// (what a pass-through costs without the sandbox).
fn crossing(runtime: &Runtime, samples: usize) {
    const BATCH: usize = 1024;
    let batch = nexmark_rows(BATCH as u64);
    let mut op = opened(runtime, "echo", guests::HOSTILE.as_ref(), r#"{"mode":"echo"}"#);
    let rounds = 200;
    let sandbox = measure(samples, || {
        for _ in 0..rounds {
            let out = op.process(&batch).expect("process");
            assert_eq!(out.main.len(), BATCH);
            black_box(out);
        }
    });
    let native = measure(samples, || {
        for _ in 0..rounds {
            let mut out = RecordBatch::with_capacity(batch.len(), batch.byte_len());
            for r in batch.iter() {
                out.push(r.key, r.value, r.timestamp);
            }
            black_box(out);
        }
    });
    let per = |d: Duration| d.as_nanos() as f64 / (rounds * BATCH) as f64;
    println!(
        "\none crossing: {BATCH} Nexmark rows ({} bytes) host -> guest -> host, median of {samples}\n",
        batch.byte_len()
    );
    println!("| path | ns/record |\n|---|---:|");
    println!("| pass-through guest (process + emit, sandboxed) | {:.1} |", per(sandbox));
    println!("| native copy of the batch | {:.1} |", per(native));
}

/// An instance of the operator in `wasm`, opened with `config`, over heap state.
fn opened(runtime: &Runtime, name: &str, wasm: &std::path::Path, config: &str) -> eddy_runtime::OperatorInstance {
    let mut op = runtime
        .load_file(name, wasm)
        .expect("load")
        .instantiate_operator(
            Subtask::single(MAX_PARALLELISM),
            Box::new(HeapStateBackend::default()),
            Box::new(HeapTimerService::default()),
        )
        .expect("instantiate");
    op.open(config).expect("open");
    op
}

/// A batch of `n` Nexmark events as rows, as the source writes them (and declares their names).
fn nexmark_rows(n: u64) -> RecordBatch {
    for schema in eddy_nexmark::row_schemas() {
        eddy_runtime::schemas().declare(&schema).expect("Nexmark's schemas");
    }
    let config = eddy_nexmark::NexmarkConfig::default();
    let mut scratch = eddy_nexmark::Scratch::default();
    let mut batch = RecordBatch::default();
    let mut value = Vec::new();
    for i in 0..n {
        let event = eddy_nexmark::event_ref(&config, i, &mut scratch);
        value.clear();
        eddy_nexmark::write_row(&event, &mut value);
        batch.push(None, &value, Some(event.date_time()));
    }
    batch
}

/// WebAssembly instructions (fuel) per event of the stateless Nexmark operators over one batch
/// of 1 024 events: a count, so it compares two builds of a guest or the SDK on a machine
/// whose timings move by a fifth from run to run.
fn instructions() {
    const EVENTS: u64 = 1024;
    let mut config = RuntimeConfig::default();
    config.limits.fuel_per_call = Some(u64::MAX / 2);
    let runtime = Runtime::new(config).expect("runtime with fuel");
    let batch = nexmark_rows(EVENTS);
    // `EDDY_BENCH_GUESTS=DIR` counts the `.wasm` files in DIR instead (another build, to compare).
    let other = std::env::var_os("EDDY_BENCH_GUESTS").map(std::path::PathBuf::from);
    let guests: [(&str, &std::path::Path, &str); 5] = [
        ("pass-through (hostile, echo)", guests::HOSTILE.as_ref(), r#"{"mode":"echo"}"#),
        ("8 bytes per record (hostile, burn 0)", guests::HOSTILE.as_ref(), r#"{"mode":"burn","count":0}"#),
        ("q0 (nexmark-select, bids)", guests::NEXMARK_SELECT.as_ref(), r#"{"bid":{}}"#),
        ("q1 (currency conversion)", guests::NEXMARK_Q1.as_ref(), "null"),
        ("q2 (selection)", guests::NEXMARK_Q2.as_ref(), "null"),
    ];
    println!("\nWebAssembly instructions (fuel) per event, one batch of {EVENTS} Nexmark events\n");
    println!("| operator | instructions/event | a call with one event | records out |\n|---|---:|---:|---:|");
    let only = std::env::var("EDDY_BENCH_ONLY").ok();
    for (name, built, open) in guests {
        if only.as_deref().is_some_and(|o| !name.starts_with(o)) {
            continue;
        }
        let wasm = match (&other, built.file_name()) {
            (Some(dir), Some(file)) => dir.join(file),
            _ => built.to_path_buf(),
        };
        let mut op = opened(&runtime, name, &wasm, open);
        // The first call grows the guest's buffers; the second is the steady state.
        op.process(&batch).expect("process");
        let out = op.process(&batch).expect("process");
        let fuel = op.last_call_fuel().expect("fuel is metered");
        for _ in 0..std::env::var("EDDY_BENCH_REPEAT").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(0) {
            black_box(op.process(&batch).expect("process"));
        }
        let one = nexmark_rows(1);
        op.process(&one).expect("process");
        let per_call = op.last_call_fuel().expect("fuel is metered");
        println!("| {name} | {:.1} | {per_call} | {} |", fuel as f64 / EVENTS as f64, out.main.len());
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let samples = if quick { 5 } else { 21 };
    // `--instructions`: only the instruction counts.
    if std::env::args().any(|a| a == "--instructions") {
        instructions();
        return;
    }
    let runtime = Runtime::new(RuntimeConfig::default()).expect("runtime");
    // `--crossing`: only the crossing section, e.g. under `perf record`.
    if std::env::args().any(|a| a == "--crossing") {
        crossing(&runtime, samples);
        return;
    }
    let component = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");

    println!("word-count counter, {RECORDS} records over {KEYS} keys; {samples} samples, each running the sandbox");
    println!("and the native twin back to back; medians of each and of the per-sample ratio\n");
    println!(
        "| batch | sandbox ns/record | native ns/record (same backend) | sandbox / native | bare HashMap ns/record |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let sizes: Vec<usize> = match std::env::var("EDDY_BENCH_BATCHES") {
        Ok(list) => list.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => vec![1, 64, 256, 1024],
    };
    for batch_size in sizes {
        let batches = input_batches(batch_size);
        let run_sandbox = || {
            let t = Instant::now();
            let mut op = component
                .instantiate_operator(
                    Subtask::single(MAX_PARALLELISM),
                    Box::new(HeapStateBackend::default()),
                    Box::new(HeapTimerService::default()),
                )
                .expect("instantiate");
            op.open("null").expect("open");
            for b in &batches {
                black_box(op.process(b).expect("process"));
            }
            t.elapsed()
        };
        let run_native = || {
            let t = Instant::now();
            let mut op = NativeCounter { backend: HeapStateBackend::default(), key: StateKey::default() };
            for b in &batches {
                black_box(op.process(b));
            }
            t.elapsed()
        };
        run_sandbox();
        run_native();
        let (mut sandbox, mut native, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..samples {
            let (s, n) = (run_sandbox(), run_native());
            ratios.push(s.as_secs_f64() / n.as_secs_f64());
            sandbox.push(s);
            native.push(n);
        }
        let bare = measure(samples, || {
            let mut counts = HashMap::new();
            bare_native(&batches, &mut counts);
            black_box(counts);
        });
        ratios.sort_by(f64::total_cmp);
        let per = |d: Duration| d.as_nanos() as f64 / RECORDS as f64;
        println!(
            "| {batch_size} | {:.0} | {:.0} | {:.2}x | {:.0} |",
            per(median(sandbox)),
            per(median(native)),
            ratios[ratios.len() / 2],
            per(bare)
        );
    }

    crossing(&runtime, samples);

    println!("\ninstance start-up (wordcount counter), median of {samples} runs\n");
    println!("| path | time |");
    println!("|---|---:|");
    let wasm = std::fs::read(guests::WORDCOUNT_COUNT).expect("guest");
    let cache = tempfile::tempdir().expect("tempdir");
    let cached_runtime =
        Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().to_owned()), ..RuntimeConfig::default() })
            .expect("runtime");
    cached_runtime.load("count", &wasm).expect("fill cache");
    let cold = measure(samples, || {
        black_box(runtime.load("count", &wasm).expect("compile"));
    });
    let cached = measure(samples, || {
        black_box(cached_runtime.load("count", &wasm).expect("cached"));
    });
    println!("| load: validate + Cranelift compile (cold) | {cold:.2?} |");
    println!("| load: validate + map cached artifact | {cached:.2?} |");
    for (label, allocation) in
        [("pooling", InstanceAllocation::Pooling { max_instances: 128 }), ("on-demand", InstanceAllocation::OnDemand)]
    {
        let rt = Runtime::new(RuntimeConfig { allocation, ..RuntimeConfig::default() }).expect("runtime");
        let c = rt.load("count", &wasm).expect("load");
        let inst = measure(samples * 20, || {
            let op = c
                .instantiate_operator(
                    Subtask::single(MAX_PARALLELISM),
                    Box::new(HeapStateBackend::default()),
                    Box::new(HeapTimerService::default()),
                )
                .expect("instantiate");
            black_box(op);
        });
        println!("| instantiate from pre-linked component ({label}) | {inst:.2?} |");
    }
}
