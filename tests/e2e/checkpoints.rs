//! Checkpoints and exactly-once, tested the way users lose data: jobs stopped mid-stream and
//! restarted (also at another parallelism), damaged checkpoints, and the crash test — a
//! process killed with SIGKILL at random moments, again and again — all compared with an
//! oracle computed straight from the generator, not with another run.
//!
//! The pipeline: generated purchases (replayable: event `i` is a function of the seed and
//! `i`), keyed by user into 10 s tumbling windows summing purchases (keyed state), into the
//! exactly-once files sink. Disorder stays within the watermark bound, so every window's result
//! is fixed by the input alone and the committed output must equal the oracle exactly: nothing
//! lost, nothing twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use eddy_checkpoint::store::StoreOp;
use eddy_connectors::generator_event;
use eddy_engine::{FaultPoint, Job, JobOptions, RunError};
use eddy_plan::{PipelineSpec, SourceSpec, StoreLocation};
use eddy_tests::S3Service;
use eddy_tests::runtime;
use serde_json::Value;

/// One window result: (user, window start, purchases, total cents).
type Row = (String, i64, u64, i64);

pub(crate) struct Setup {
    pub(crate) seed: u64,
    pub(crate) events: u64,
    pub(crate) rate: u64,
    pub(crate) parallelism: u32,
    pub(crate) backend: &'static str,
    pub(crate) interval_ms: u64,
    pub(crate) retained: usize,
    /// `files` (transactional) or `upsert` (idempotent).
    pub(crate) sink: &'static str,
    /// `checkpoints.mode`: `aligned` or `unaligned`.
    pub(crate) mode: &'static str,
    pub(crate) min_pause_ms: u64,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            seed: 11,
            events: 20_000,
            rate: 8_000,
            parallelism: 2,
            backend: "heap",
            interval_ms: 100,
            retained: 2,
            sink: "files",
            mode: "aligned",
            min_pause_ms: 0,
        }
    }
}

/// Writes the pipeline into `dir` (state, checkpoints and output beside it) and returns its path.
pub(crate) fn write_pipeline(dir: &Path, s: &Setup) -> PathBuf {
    let yaml = format!(
        r#"
name: exactly-once-test
parallelism: {parallelism}
sources:
  - type: generator
    name: purchases
    seed: {seed}
    events: {events}
    keys: 40
    key_field: user_id
    key_prefix: user-
    value_field: amount_cents
    min_value: 1
    max_value: 1000
    start_ms: 0
    interval_ms: 5
    max_disorder_ms: 300
    rate_per_sec: {rate}
watermarks:
  out_of_orderness_ms: 300
steps:
  - name: totals
    wasm: {wasm}
    key_by: /user_id
    window: {{type: tumbling, size_ms: 10000}}
state:
  backend: {backend}
  dir: state
checkpoints:
  dir: checkpoints
  interval_ms: {interval}
  retained: {retained}
  mode: {mode}
  min_pause_ms: {min_pause}
restart: {{strategy: none}}
sink:
  type: {sink}
  dir: out
"#,
        parallelism = s.parallelism,
        seed = s.seed,
        events = s.events,
        rate = s.rate,
        wasm = eddy_guest_artifacts::PURCHASE_TOTALS,
        backend = s.backend,
        interval = s.interval_ms,
        retained = s.retained,
        sink = s.sink,
        mode = s.mode,
        min_pause = s.min_pause_ms,
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write pipeline");
    path
}

/// Window results computed directly from the generator's events.
pub(crate) fn oracle(spec: &PipelineSpec) -> Vec<Row> {
    let SourceSpec::Generator(g) = &spec.sources[0] else { panic!("generator source") };
    let mut windows: BTreeMap<(String, i64), (u64, i64)> = BTreeMap::new();
    for i in 0..g.events.expect("bounded") {
        let event = generator_event(g, i);
        let value: Value = eddy_tests::value_json(&event.value);
        let user = value["user_id"].as_str().expect("user").to_owned();
        let ts = event.timestamp.expect("event time");
        let entry = windows.entry((user, ts - ts.rem_euclid(10_000))).or_default();
        entry.0 += 1;
        entry.1 += value["amount_cents"].as_i64().expect("amount");
    }
    windows.into_iter().map(|((user, start), (n, sum))| (user, start, n, sum)).collect()
}

/// Every row in the committed files, sorted (duplicates kept, so they show).
pub(crate) fn committed(out: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    let Ok(entries) = std::fs::read_dir(out) else { return rows };
    for entry in entries.filter_map(Result::ok).filter(|e| e.path().is_file()) {
        for line in std::fs::read_to_string(entry.path()).expect("read").lines() {
            let v: Value = serde_json::from_str(line).expect("json line");
            rows.push((
                v["key"].as_str().expect("key").to_owned(),
                v["value"]["start"].as_i64().expect("start"),
                v["value"]["result"]["purchases"].as_u64().expect("purchases"),
                v["value"]["result"]["total_cents"].as_i64().expect("total"),
            ));
        }
    }
    rows.sort();
    rows
}

/// Where two sorted row lists differ (for failure messages), at most a few.
fn differences(got: &[Row], expected: &[Row]) -> String {
    let mut counts: BTreeMap<&Row, i64> = BTreeMap::new();
    for r in got {
        *counts.entry(r).or_default() += 1;
    }
    for r in expected {
        *counts.entry(r).or_default() -= 1;
    }
    let diff: Vec<String> = counts
        .into_iter()
        .filter(|(_, c)| *c != 0)
        .take(5)
        .map(|(r, c)| format!("{r:?} {}", if c > 0 { format!("{c} extra") } else { format!("{} missing", -c) }))
        .collect();
    diff.join("; ")
}

/// Runs the pipeline in this process until `stop` says so (then cancels) or it finishes.
pub(crate) fn run_until(path: &Path, stop: impl Fn(&Job) -> bool) -> Result<eddy_engine::RunSummary, RunError> {
    run_with(path, JobOptions::default(), stop)
}

/// [`run_until`] with `options`.
pub(crate) fn run_with(
    path: &Path,
    options: JobOptions,
    stop: impl Fn(&Job) -> bool,
) -> Result<eddy_engine::RunSummary, RunError> {
    let spec = PipelineSpec::from_file(path).expect("spec");
    let job = Job::start(&spec, runtime(), options)?;
    while !job.is_done() {
        if stop(&job) {
            job.cancel();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    job.wait()
}

pub(crate) fn assert_exactly_once(path: &Path, context: &str) {
    let spec = PipelineSpec::from_file(path).expect("spec");
    let expected = oracle(&spec);
    let got = committed(&path.parent().expect("dir").join("out"));
    assert!(!expected.is_empty());
    assert!(
        got == expected,
        "{context}: {} rows vs {} expected: {}",
        got.len(),
        expected.len(),
        differences(&got, &expected)
    );
}

#[test]
fn a_stopped_job_resumes_from_its_checkpoint_at_another_parallelism_and_commits_everything_once() {
    for backend in ["heap", "rocksdb"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_pipeline(dir.path(), &Setup { backend, ..Setup::default() });
        // Stop after the third completed checkpoint.
        let first = run_until(&path, |job| job.completed_checkpoints().len() >= 3).expect("first run");
        assert!(!first.finished, "{backend}: stopped midway");
        let partial = committed(&dir.path().join("out")).len();
        // Resume with the window step at parallelism 3: keyed state moves by key group.
        let mut spec_text = std::fs::read_to_string(&path).expect("read");
        spec_text = spec_text.replace("parallelism: 2", "parallelism: 3");
        std::fs::write(&path, spec_text).expect("write");
        let second = run_until(&path, |_| false).expect("second run");
        assert!(second.finished, "{backend}: ran to the end");
        let restored = second.restored_from.expect("restored from a checkpoint");
        assert!(restored >= 3, "{backend}: restored from checkpoint {restored}");
        assert!(second.metrics.source_records < 20_000, "{backend}: resumed, not started over");
        assert!(partial < oracle(&PipelineSpec::from_file(&path).expect("spec")).len());
        assert_exactly_once(&path, backend);
        // Running it again says it is finished and changes nothing.
        let again = run_until(&path, |_| false).expect_err("already finished");
        assert!(matches!(again, RunError::AlreadyFinished { .. }), "{again}");
        assert!(again.to_string().contains("delete"), "says what to do: {again}");
        assert_exactly_once(&path, backend);
    }
}

#[test]
fn a_damaged_newest_checkpoint_is_skipped_for_the_previous_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), &Setup { retained: 3, ..Setup::default() });
    run_until(&path, |job| job.completed_checkpoints().len() >= 4).expect("first run");
    let checkpoints = dir.path().join("checkpoints");
    let mut ids: Vec<u64> = std::fs::read_dir(&checkpoints)
        .expect("dir")
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .filter(|id| checkpoints.join(format!("chk-{id}/_metadata")).exists())
        .collect();
    ids.sort_unstable();
    let newest = *ids.last().expect("a checkpoint");
    // Flip one byte in the middle of one of the newest checkpoint's state files.
    let victim = std::fs::read_dir(checkpoints.join(format!("chk-{newest}/t1-s0")))
        .expect("subtask dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().contains(".state.")))
        .expect("a state file");
    let mut bytes = std::fs::read(&victim).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&victim, bytes).expect("write");

    let second = run_until(&path, |_| false).expect("second run");
    assert_eq!(second.restored_from, Some(ids[ids.len() - 2]), "fell back to the previous checkpoint");
    // The newest checkpoint's committed output was rolled back and produced again.
    assert_exactly_once(&path, "after falling back");
}

/// Runs the test pipeline until its first checkpoint, applies `edit` to its YAML and starts it
/// again; returns the error the restart must fail with.
pub(crate) fn refused_after_edit(edit: impl Fn(String) -> String) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), &Setup::default());
    run_until(&path, |job| !job.completed_checkpoints().is_empty()).expect("first run");
    let text = edit(std::fs::read_to_string(&path).expect("read"));
    std::fs::write(&path, text).expect("write");
    run_until(&path, |_| false).expect_err("the edited pipeline must be refused").to_string()
}

#[test]
fn a_source_parallelism_change_is_refused_with_a_clear_error() {
    let message = refused_after_edit(|text| text.replace("    rate_per_sec:", "    parallelism: 2\n    rate_per_sec:"));
    assert!(message.contains("source `purchases`") && message.contains("parallelism"), "{message}");
}

/// Env var that turns [`crash_child`] into the job under test.
const CHILD_PIPELINE: &str = "EDDY_CRASH_PIPELINE";

/// Env var: the seed of the faults [`crash_child`] injects; unset, it injects none.
const CHILD_FAULT_SEED: &str = "EDDY_CRASH_FAULT_SEED";

/// Env var: with [`CHILD_FAULT_SEED`], the child dies at this fault point only (its `Debug`
/// name, e.g. `BeforeCommit`), the first, second or third time it reaches it (see [`faulty`]).
const CHILD_FAULT_POINT: &str = "EDDY_CRASH_FAULT_POINT";

/// Env var: throttle [`crash_child`]'s operators to this many cores, so the sources outrun
/// them and every channel stays full (backpressure: unaligned checkpoints store records in
/// flight); unset, no throttle.
pub(crate) const CHILD_CPU_SHARE: &str = "EDDY_CRASH_CPU_SHARE";

/// A seeded xorshift draw in `0..bound`, shareable between threads.
pub(crate) fn seeded_draws(seed: u64) -> Arc<dyn Fn(u64) -> u64 + Send + Sync> {
    let state = Mutex::new(seed | 1);
    Arc::new(move |bound: u64| {
        let mut x = state.lock().expect("rng");
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x % bound.max(1)
    })
}

/// Options that make the checkpoint store fail 5% of writes and delay 20% by up to 20 ms, and
/// make the process die (abort: no destructor, no flush, like SIGKILL) at one in twelve of the
/// checkpoint protocol's fault points, so deaths land inside checkpoints on purpose. With
/// `only_at`, it dies at that point only, the first to third time it is reached (by the
/// seed), so a death always comes before the job ends.
fn faulty(seed: u64, only_at: Option<String>) -> JobOptions {
    let draw = seeded_draws(seed);
    let store_draw = draw.clone();
    let reached = std::sync::atomic::AtomicU64::new(0);
    JobOptions {
        store_faults: Some(Arc::new(move |op: StoreOp, _: &str| {
            if op == StoreOp::Put {
                match store_draw(100) {
                    0..5 => return Err("injected write failure".into()),
                    5..25 => std::thread::sleep(Duration::from_millis(store_draw(20))),
                    _ => {}
                }
            }
            Ok(())
        })),
        fault_hook: Some(Arc::new(move |point: FaultPoint| {
            let dies = match &only_at {
                Some(only) if *only == format!("{point:?}") => {
                    reached.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 1 + seed % 3
                }
                Some(_) => false,
                None => draw(12) == 0,
            };
            if dies {
                std::process::abort();
            }
        })),
        ..JobOptions::default()
    }
}

/// Not a test of its own: the process the crash test starts (and kills).
#[test]
#[ignore = "started by the crash test in a child process"]
fn crash_child() {
    let Ok(path) = std::env::var(CHILD_PIPELINE) else { return };
    let mut options = match std::env::var(CHILD_FAULT_SEED).ok().and_then(|s| s.parse().ok()) {
        Some(seed) => faulty(seed, std::env::var(CHILD_FAULT_POINT).ok()),
        None => JobOptions::default(),
    };
    if let Some(cores) = std::env::var(CHILD_CPU_SHARE).ok().and_then(|s| s.parse().ok()) {
        options.cpu_share = Some(Arc::new(eddy_runtime::CpuShare::new(cores, Duration::from_millis(10))));
    }
    match run_with(Path::new(&path), options, |_| false) {
        Ok(summary) => assert!(summary.finished),
        Err(RunError::AlreadyFinished { .. }) => {}
        Err(e) => panic!("child job failed: {e}"),
    }
}

pub(crate) fn start_child(path: &Path) -> std::process::Child {
    start_child_with(path, &[])
}

pub(crate) fn start_child_with(path: &Path, env: &[(&str, &str)]) -> std::process::Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "checkpoints::crash_child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_PIPELINE, path)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the child job")
}

/// The crash test's seed (`EDDY_CRASH_SEED` repeats a run) and number of kills
/// (`EDDY_CRASH_KILLS`, at least 20).
pub(crate) fn crash_settings() -> (u64, u32) {
    let kills: u32 = std::env::var("EDDY_CRASH_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(20).max(20);
    let seed: u64 = std::env::var("EDDY_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    (seed, kills)
}

/// Runs the pipeline at `path` in child processes until `kills` of them died mid-run — killed
/// with SIGKILL at a random moment, or (with `faults`) dead by their own injected fault — then
/// once more to the end (unthrottled). `throttle` (cores) slows the killed runs' operators.
/// Returns how many runs finished before they could be killed, how many died of an injected
/// fault, and after how many deaths the newest checkpoint (the next run's restore point) held
/// records in flight. `after_death` looks at what each death left.
pub(crate) fn crash_repeatedly(
    path: &Path,
    seed: u64,
    kills: u32,
    faults: bool,
    throttle: Option<&str>,
    after_death: &mut dyn FnMut(),
) -> (u32, u32, u32) {
    let draw = seeded_draws(seed);
    let mut killed = 0;
    let mut attempt = 0u64;
    let mut finished_early = 0;
    let mut died_of_faults = 0;
    let mut in_flight_restores = 0;
    let checkpoints = path.parent().expect("dir").join("checkpoints");
    while killed < kills {
        attempt += 1;
        let fault_seed = (seed ^ attempt.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_string();
        let mut env: Vec<(&str, &str)> = if faults { vec![(CHILD_FAULT_SEED, &fault_seed)] } else { Vec::new() };
        env.extend(throttle.map(|cores| (CHILD_CPU_SHARE, cores)));
        let mut child = start_child_with(path, &env);
        std::thread::sleep(Duration::from_millis(150 + draw(600)));
        match child.try_wait().expect("poll child") {
            Some(status) if status.success() => {
                finished_early += 1;
                break;
            }
            Some(_) => died_of_faults += 1,
            None => {
                child.kill().expect("SIGKILL");
                child.wait().expect("reap");
            }
        }
        killed += 1;
        after_death();
        if newest_holds_records_in_flight(&checkpoints) {
            in_flight_restores += 1;
        }
    }
    // Let the last run finish (or confirm it had), without faults.
    let status = start_child(path).wait().expect("final run");
    assert!(status.success(), "seed {seed}: the final run failed");
    (finished_early, died_of_faults, in_flight_restores)
}

/// Runs the pipeline at `path` at least `runs` times, each throttled and dying (abort) at a
/// `BeforeCommit` fault point: a checkpoint completed, its sink commit not made. `after_death`
/// looks at what each death left and says whether it left what the test is after (a death at
/// a checkpoint that brought the sink no rows leaves nothing to commit); runs go on, at most
/// [`EXTRA_DEATH_RUNS`] more, until one did. Then once more to the end; returns how many runs
/// died.
pub(crate) fn die_before_commits(path: &Path, seed: u64, runs: u64, after_death: &mut dyn FnMut() -> bool) -> u32 {
    let mut deaths = 0;
    let mut telling = false;
    for attempt in 0..runs + EXTRA_DEATH_RUNS {
        if attempt >= runs && telling {
            break;
        }
        let fault_seed = (seed ^ (attempt + 1)).to_string();
        let env =
            [(CHILD_FAULT_SEED, fault_seed.as_str()), (CHILD_FAULT_POINT, "BeforeCommit"), (CHILD_CPU_SHARE, "0.01")];
        if !start_child_with(path, &env).wait().expect("reap").success() {
            deaths += 1;
            telling |= after_death();
        }
    }
    assert!(start_child(path).wait().expect("final run").success(), "seed {seed}: the final run failed");
    deaths
}

/// How many runs [`die_before_commits`] adds, at most, while no death left what the test is
/// after: the deaths come at the first to third commit point, and those may find the sink
/// with nothing to commit yet.
const EXTRA_DEATH_RUNS: u64 = 6;

/// Whether the newest completed checkpoint in `dir` stored records in flight.
fn newest_holds_records_in_flight(dir: &Path) -> bool {
    use eddy_checkpoint::{CheckpointMetadata, CheckpointStore, metadata::completed_ids};
    let Ok(store) = CheckpointStore::local(dir) else { return false };
    let newest = completed_ids(&store).ok().and_then(|ids| ids.first().copied());
    newest
        .and_then(|id| CheckpointMetadata::read(&store, id).ok())
        .is_some_and(|m| m.subtasks.iter().any(|s| !s.in_flight.is_empty()))
}

/// The crash test: the job runs in a child process that is killed with SIGKILL at random
/// moments (`EDDY_CRASH_KILLS` times, at least 20; `EDDY_CRASH_SEED` repeats a run) and
/// restarted each time; afterwards the committed output equals the oracle exactly.
#[test]
fn sigkill_at_random_moments_loses_nothing_and_duplicates_nothing() {
    sigkill_crash_test("aligned", None);
}

/// The crash test in unaligned mode, with the killed runs' operators throttled so that the
/// channels are full and every checkpoint stores records in flight, which each restart
/// replays before new input.
#[test]
fn sigkill_at_random_moments_in_unaligned_mode_under_backpressure_loses_nothing_and_duplicates_nothing() {
    sigkill_crash_test("unaligned", Some("0.05"));
}

fn sigkill_crash_test(mode: &'static str, throttle: Option<&str>) {
    let (seed, kills) = crash_settings();
    eprintln!("crash test ({mode}): seed {seed} (EDDY_CRASH_SEED={seed} repeats it), {kills} kills");
    let dir = tempfile::tempdir().expect("tempdir");
    // ~0.55 s of input per kill: the job outlives the kills whatever their number.
    let events = 4_500 * u64::from(kills);
    let setup = Setup { seed, events, rate: 8_000, backend: "rocksdb", interval_ms: 150, mode, ..Setup::default() };
    let path = write_pipeline(dir.path(), &setup);
    let started = Instant::now();
    let (finished_early, _, in_flight_restores) = crash_repeatedly(&path, seed, kills, false, throttle, &mut || {});
    eprintln!("crash test ({mode}): {in_flight_restores} of {kills} restarts from a checkpoint with records in flight");
    if throttle.is_some() {
        assert!(in_flight_restores > 0, "seed {seed}: no restart replayed records in flight");
    }
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let expected = oracle(&spec);
    let got = committed(&dir.path().join("out"));
    eprintln!(
        "crash test: seed {seed}: {kills} SIGKILLs in {:.1}s, {} window results compared with the oracle, {} differences",
        started.elapsed().as_secs_f64(),
        expected.len(),
        if got == expected { 0 } else { 1 }
    );
    assert_eq!(finished_early, 0, "the job finished before {kills} kills; make it longer");
    assert!(got == expected, "seed {seed}: {}", differences(&got, &expected));
}

/// Generated purchases keyed by user into a Wasm operator with value state that emits each
/// user's running count, RocksDB state at parallelism 2, exactly-once files.
fn running_count_pipeline(dir: &Path, seed: u64, events: u64, mode: &str) -> PathBuf {
    let yaml = format!(
        "name: crash-running-count\nparallelism: 2\nsources:\n  - {{type: generator, name: purchases, seed: {seed}, \
         events: {events}, keys: 40, key_field: user_id, key_prefix: user-, value_field: amount_cents, min_value: 1, \
         max_value: 1000, start_ms: 0, interval_ms: 5, rate_per_sec: 8000}}\nsteps:\n  - {{name: count, wasm: {count}, \
         key_by: /user_id}}\nstate: {{backend: rocksdb, dir: state}}\ncheckpoints: {{dir: checkpoints, interval_ms: 100, \
         retained: 2, mode: {mode}}}\nrestart: {{strategy: none}}\nsink: {{type: files, dir: out}}\n",
        count = eddy_guest_artifacts::RUNNING_COUNT,
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write pipeline");
    path
}

/// Each user's running counts 1..=n, computed from the generator's events.
fn running_count_oracle(spec: &PipelineSpec) -> Vec<(String, u64)> {
    let SourceSpec::Generator(g) = &spec.sources[0] else { panic!("generator source") };
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..g.events.expect("bounded") {
        let value: Value = eddy_tests::value_json(&generator_event(g, i).value);
        *totals.entry(value["user_id"].as_str().expect("user").to_owned()).or_default() += 1;
    }
    totals.into_iter().flat_map(|(user, n)| (1..=n).map(move |k| (user.clone(), k))).collect()
}

/// The (key, count) rows committed in `out`, sorted, duplicates kept.
pub(crate) fn committed_counts(out: &Path) -> Vec<(String, u64)> {
    let mut rows = Vec::new();
    let Ok(entries) = std::fs::read_dir(out) else { return rows };
    for entry in entries.filter_map(Result::ok).filter(|e| e.path().is_file()) {
        for line in std::fs::read_to_string(entry.path()).expect("read").lines() {
            let v: Value = serde_json::from_str(line).expect("json line");
            rows.push((v["key"].as_str().expect("key").to_owned(), v["value"].as_u64().expect("count")));
        }
    }
    rows.sort();
    rows
}

/// The crash test with faults: a stateful Wasm operator, a checkpoint store that fails and
/// delays writes at random, and deaths placed inside checkpoints (after an upload, before and
/// after the metadata, before the sink commits) besides SIGKILLs at random moments. Seeded:
/// `EDDY_CRASH_SEED` repeats a run.
#[test]
fn deaths_inside_checkpoints_with_a_failing_store_lose_nothing_and_duplicate_nothing() {
    faults_crash_test("aligned", None);
}

/// The crash test with faults in unaligned mode under backpressure: deaths inside checkpoints
/// whose snapshots carry records in flight.
#[test]
fn deaths_inside_unaligned_checkpoints_with_a_failing_store_lose_nothing_and_duplicate_nothing() {
    faults_crash_test("unaligned", Some("0.05"));
}

fn faults_crash_test(mode: &str, throttle: Option<&str>) {
    let (seed, kills) = crash_settings();
    eprintln!("crash test with faults ({mode}): seed {seed} (EDDY_CRASH_SEED={seed} repeats it), {kills} deaths");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = running_count_pipeline(dir.path(), seed, 4_500 * u64::from(kills), mode);
    let started = Instant::now();
    let (finished_early, died_of_faults, in_flight_restores) =
        crash_repeatedly(&path, seed, kills, true, throttle, &mut || {});
    eprintln!(
        "crash test with faults ({mode}): {in_flight_restores} of {kills} restarts from a checkpoint with records in flight"
    );
    if throttle.is_some() {
        assert!(in_flight_restores > 0, "seed {seed}: no restart replayed records in flight");
    }
    let expected = running_count_oracle(&PipelineSpec::from_file(&path).expect("spec"));
    let got = committed_counts(&dir.path().join("out"));
    let mut balance: BTreeMap<&(String, u64), i64> = BTreeMap::new();
    for row in &got {
        *balance.entry(row).or_default() += 1;
    }
    for row in &expected {
        *balance.entry(row).or_default() -= 1;
    }
    let extra: i64 = balance.values().filter(|c| **c > 0).sum();
    let missing: i64 = -balance.values().filter(|c| **c < 0).sum::<i64>();
    eprintln!(
        "crash test with faults: seed {seed}: {kills} deaths ({died_of_faults} at fault points, the rest SIGKILL) in \
         {:.1}s, {} running counts compared with the oracle, {} differences",
        started.elapsed().as_secs_f64(),
        expected.len(),
        missing + extra
    );
    assert_eq!(finished_early, 0, "the job finished before {kills} deaths; make it longer");
    assert!(got == expected, "seed {seed}: {missing} running counts missing, {extra} extra");
}

/// Word counts from a followed file through `split` and `count`, with checkpoints.
fn wordcount_yaml(count_wasm: &str, parallelism: u32) -> String {
    format!(
        "name: wc-savepoint\nbatch_size: 16\nsources: [{{type: file, name: lines, path: input.txt, follow: true}}]\n\
         steps:\n  - {{name: split, wasm: {split}}}\n  - {{name: count, wasm: {count_wasm}, key_by: key, parallelism: {parallelism}}}\n\
         checkpoints: {{dir: checkpoints, interval_ms: 50}}\nsink: {{type: print}}\n",
        split = eddy_guest_artifacts::WORDCOUNT_SPLIT,
    )
}

fn word_totals(text: &str) -> BTreeMap<String, u64> {
    let mut totals = BTreeMap::new();
    for w in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        *totals.entry(w.to_lowercase()).or_default() += 1;
    }
    totals
}

/// Starts the word count with an in-memory sink; returns the job and what the sink receives.
pub(crate) fn start_wordcount(dir: &Path, yaml: &str, restore_from: Option<PathBuf>) -> (Job, eddy_tests::Received) {
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write spec");
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let sink = eddy_tests::MemorySink::default();
    let received = sink.received.clone();
    let restore_from = restore_from.map(StoreLocation::Dir);
    let options = JobOptions { sink: Some(Box::new(sink)), restore_from, ..JobOptions::default() };
    (Job::start(&spec, runtime(), options).expect("starts"), received)
}

/// Waits until the sink has received `n` records.
pub(crate) fn wait_for(received: &eddy_tests::Received, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.lock().expect("lock").len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} records arrived", received.lock().expect("lock").len());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stop with a savepoint, then resume from it with the counting operator in another language
/// (Rust, then its Python, JavaScript, TypeScript and Go twins, all reading the same `count` state)
/// at another parallelism each time: every word's count continues exactly where the savepoint
/// left it, and only the new lines are read.
#[test]
fn stop_with_savepoint_then_resume_in_another_language_at_another_parallelism() {
    let dir = tempfile::tempdir().expect("tempdir");
    let parts = [
        "the quick brown fox\njumps over the lazy dog\nthe end\n".repeat(40),
        "a quick end to the story\nthe fox again\n".repeat(25),
        "lazy dogs and quick foxes\n".repeat(12),
        "the story ends\n".repeat(9),
        "go gophers end the lazy story\n".repeat(7),
    ];
    let versions = [
        (eddy_guest_artifacts::WORDCOUNT_COUNT, 2),
        (eddy_guest_artifacts::PYTHON_WORDCOUNT_COUNT, 3),
        (eddy_guest_artifacts::JS_WORDCOUNT_COUNT, 2),
        (eddy_guest_artifacts::TS_WORDCOUNT_COUNT, 1),
        (eddy_guest_artifacts::GO_WORDCOUNT_COUNT, 2),
    ];
    let savepoint = dir.path().join("savepoint");
    let mut input = String::new();
    let mut restored = None;
    for (part, (count, parallelism)) in parts.iter().zip(versions) {
        // New input arrives while the job is stopped; the next version resumes from the
        // savepoint alone (a fresh checkpoint directory).
        input.push_str(part);
        std::fs::write(dir.path().join("input.txt"), &input).expect("input");
        let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
        let restore = restored.map(|_| savepoint.clone());
        let (job, received) = start_wordcount(dir.path(), &wordcount_yaml(count, parallelism), restore);
        assert_eq!(job.restored_from(), restored, "{count}");
        let new_words = word_totals(part).values().sum::<u64>() as usize;
        wait_for(&received, new_words);
        let _ = std::fs::remove_dir_all(&savepoint);
        let (id, _) = job
            .stop_with_savepoint(&StoreLocation::Dir(savepoint.clone()), Duration::from_secs(30))
            .expect("savepoint");
        assert_eq!(received.lock().expect("lock").len(), new_words, "{count}: only the new lines are read");
        let totals = word_totals(&input);
        let expected: BTreeMap<String, u64> = word_totals(part).keys().map(|w| (w.clone(), totals[w])).collect();
        assert_eq!(last_counts(&received), expected, "{count} continues every count");
        restored = Some(id);
    }
}

/// Window accumulators outlive the language that wrote them: purchases are folded into hourly
/// windows by one language's aggregate, the job stops with a savepoint before the hour closes,
/// and another language's twin resumes, folds the rest and fires the windows. The totals are a plain
/// sum per (user, hour) of every purchase.
#[test]
fn open_windows_resume_in_another_language_with_their_accumulators() {
    use eddy_guest_artifacts as g;
    // Every language writes an accumulator and every language reads one.
    for (from, to) in [
        (g::PURCHASE_TOTALS, g::JS_PURCHASE_TOTALS),
        (g::PYTHON_PURCHASE_TOTALS, g::GO_PURCHASE_TOTALS),
        (g::GO_PURCHASE_TOTALS, g::PURCHASE_TOTALS),
        (g::TS_PURCHASE_TOTALS, g::PYTHON_PURCHASE_TOTALS),
    ] {
        open_windows_resume(from, to);
    }
}

/// Hour 0 is open when `from` stops with a savepoint; `to` resumes it, closes it and emits
/// totals equal to the whole hour's.
fn open_windows_resume(from: &str, to: &str) {
    const HOUR: i64 = 3_600_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let purchase =
        |user: &str, cents: i64, ts: i64| format!("{{\"user_id\":\"{user}\",\"amount_cents\":{cents},\"ts\":{ts}}}\n");
    let first: String =
        (0..30).map(|i| purchase(["ann", "bob", "cy"][i % 3], 100 + i as i64, 1_000 * i as i64)).collect();
    // The rest of hour 0, then one purchase two hours later: the watermark passes hour 0.
    let mut second: String =
        (0..20).map(|i| purchase(["ann", "dee"][i % 2], 7 * i as i64, 40_000 + i as i64)).collect();
    second.push_str(&purchase("ann", 1, 2 * HOUR + 10));
    let yaml = |wasm: &str| {
        format!(
            "name: totals-resume\nbatch_size: 4\nsources: [{{type: file, name: purchases, path: input.jsonl, format: json_lines, \
             timestamp: /ts, follow: true}}]\nsteps:\n  - {{name: hourly, wasm: {wasm}, key_by: /user_id, \
             window: {{type: tumbling, size_ms: {HOUR}}}}}\ncheckpoints: {{dir: checkpoints, interval_ms: 50}}\nsink: {{type: print}}\n"
        )
    };
    std::fs::write(dir.path().join("input.jsonl"), &first).expect("input");
    let (job, received) = start_wordcount(dir.path(), &yaml(from), None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.metrics().tasks.iter().all(|t| t.records_in < 30) {
        assert!(Instant::now() < deadline, "{from}: the aggregate never saw the first purchases");
        std::thread::sleep(Duration::from_millis(10));
    }
    let savepoint = dir.path().join("savepoint");
    let (id, _) =
        job.stop_with_savepoint(&StoreLocation::Dir(savepoint.clone()), Duration::from_secs(30)).expect("savepoint");
    assert!(received.lock().expect("lock").is_empty(), "hour 0 is still open");

    let mut all = first.clone();
    all.push_str(&second);
    std::fs::write(dir.path().join("input.jsonl"), &all).expect("append");
    std::fs::remove_dir_all(dir.path().join("checkpoints")).expect("fresh checkpoint dir");
    let (job, received) = start_wordcount(dir.path(), &yaml(to), Some(savepoint));
    assert_eq!(job.restored_from(), Some(id));
    wait_for(&received, 4);
    // The first purchases live on only in the accumulators: the source reads just the new ones.
    assert_eq!(job.metrics().source_records, 21, "only the new purchases are read");
    job.cancel();
    job.wait().expect("second run");
    let mut oracle: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for line in all.lines() {
        let p: serde_json::Value = serde_json::from_str(line).expect("purchase");
        if p["ts"].as_i64().expect("ts") < HOUR {
            let e = oracle.entry(p["user_id"].as_str().expect("user").to_string()).or_default();
            e.0 += 1;
            e.1 += p["amount_cents"].as_i64().expect("cents");
        }
    }
    let got: BTreeMap<String, (u64, i64)> = received
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, r)| {
            let user: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("user");
            let totals: serde_json::Value = eddy_tests::value_json(&r.value);
            assert_eq!(totals["start"], 0, "hour 0 only");
            let result = &totals["result"];
            (user, (result["purchases"].as_u64().expect("n"), result["total_cents"].as_i64().expect("cents")))
        })
        .collect();
    assert_eq!(got, oracle, "{from} -> {to}");
}

/// A RocksDB subtask resuming at its key-group range opens its checkpointed database and takes
/// the state quota's count from the checkpoint instead of scanning: the quota must bite
/// exactly where it would have without the restart. 10 words are counted (one `count` entry
/// each) under `state_max_entries: 12`; after the resume two new words fit and the third
/// fails the job. A count lost on the way (0) would let the third through; one counted twice
/// (20) would refuse the first.
#[test]
fn the_state_quota_holds_across_a_resume_that_opens_the_checkpointed_database() {
    use eddy_checkpoint::{CheckpointStore, metadata::CheckpointMetadata};
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "name: wc-quota\nbatch_size: 1\nsources: [{{type: file, name: lines, path: input.txt, follow: true}}]\n\
         steps:\n  - {{name: split, wasm: {split}}}\n  - {{name: count, wasm: {count}, key_by: key, state_max_entries: 12}}\n\
         state: {{backend: rocksdb, dir: state}}\ncheckpoints: {{dir: checkpoints, interval_ms: 50}}\nsink: {{type: print}}\n",
        split = eddy_guest_artifacts::WORDCOUNT_SPLIT,
        count = eddy_guest_artifacts::WORDCOUNT_COUNT,
    );
    let words = |range: std::ops::Range<u32>| range.map(|i| format!("w{i}\n")).collect::<String>();
    std::fs::write(dir.path().join("input.txt"), words(0..10)).expect("input");
    let (job, received) = start_wordcount(dir.path(), &yaml, None);
    wait_for(&received, 10);
    let savepoint = dir.path().join("savepoint");
    let (id, _) =
        job.stop_with_savepoint(&StoreLocation::Dir(savepoint.clone()), Duration::from_secs(30)).expect("savepoint");
    let meta = CheckpointMetadata::read(&CheckpointStore::local(&savepoint).expect("store"), id).expect("metadata");
    let count = meta.subtasks.iter().flat_map(|s| &s.operators).find(|o| o.step == "count").expect("count state");
    assert_eq!(count.usage.map(|u| u.entries), Some(10), "the savepoint carries the quota's count");

    std::fs::remove_dir_all(dir.path().join("checkpoints")).expect("fresh checkpoint dir");
    std::fs::write(dir.path().join("input.txt"), words(0..12)).expect("two new words");
    let (job, received) = start_wordcount(dir.path(), &yaml, Some(savepoint));
    assert_eq!(job.restored_from(), Some(id));
    wait_for(&received, 2);
    std::fs::write(dir.path().join("input.txt"), words(0..13)).expect("a third new word");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !job.is_done() {
        assert!(Instant::now() < deadline, "the 13th entry must fail the job");
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = job.wait().expect_err("over the quota").to_string();
    assert!(err.contains("13 entries, over its limit of 12 entries"), "{err}");
    assert_eq!(
        last_counts(&received).keys().cloned().collect::<Vec<_>>(),
        ["w10", "w11"],
        "both fitting words counted"
    );
}

/// The highest count emitted per word.
fn last_counts(received: &eddy_tests::Received) -> BTreeMap<String, u64> {
    let mut last = BTreeMap::new();
    for (_, r) in received.lock().expect("lock").iter() {
        let word: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("word");
        let count: u64 = eddy_tests::value_json(&r.value);
        let entry = last.entry(word).or_insert(0);
        *entry = count.max(*entry);
    }
    last
}

/// The idempotent upsert sink: stopped midway and resumed, its table ends up holding, per
/// user, exactly the user's last window result.
#[test]
fn an_upsert_sink_converges_to_the_fault_free_table_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), &Setup { sink: "upsert", ..Setup::default() });
    run_until(&path, |job| job.completed_checkpoints().len() >= 3).expect("first run");
    let second = run_until(&path, |_| false).expect("second run");
    assert!(second.restored_from.is_some() && second.finished);
    let mut expected: BTreeMap<String, (i64, u64, i64)> = BTreeMap::new();
    for (user, start, n, sum) in oracle(&PipelineSpec::from_file(&path).expect("spec")) {
        expected.insert(user, (start, n, sum));
    }
    let table = eddy_connectors::UpsertSink::read_table(&dir.path().join("out")).expect("table");
    let got: BTreeMap<String, (i64, u64, i64)> = table
        .iter()
        .map(|(k, v)| {
            let user: String = serde_json::from_slice(k).expect("key");
            let v: Value = eddy_tests::value_json(v);
            let row = (
                v["start"].as_i64().expect("start"),
                v["result"]["purchases"].as_u64().expect("n"),
                v["result"]["total_cents"].as_i64().expect("sum"),
            );
            (user, row)
        })
        .collect();
    assert_eq!(got, expected);
}

/// The object keys under `prefix` of `s3`'s `bucket`, read with the same credentials the job gets.
fn keys(s3: &S3Service, bucket: &str, prefix: &str) -> Vec<String> {
    bucket_store(s3, bucket).list(prefix).expect("list").into_iter().map(|(k, _)| k).collect()
}

/// `s3`'s `bucket` as a store, with the credentials the jobs get.
fn bucket_store(s3: &S3Service, bucket: &str) -> eddy_checkpoint::CheckpointStore {
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_endpoint(&s3.endpoint)
        .with_allow_http(true)
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()
        .expect("s3 client");
    eddy_checkpoint::CheckpointStore::over(std::sync::Arc::new(store), "moto".into()).expect("store")
}

/// Downloads from a bucket (a file source's object on restart): from an offset, each byte lands
/// at its own offset behind a hole; from the end or past it nothing is fetched; a download told
/// it has enough stops; a missing object says so.
#[test]
fn a_download_from_a_bucket_starts_at_an_offset_and_stops_when_told() {
    use std::io::Read;
    let s3 = S3Service::start();
    s3.create_bucket("files");
    let store = bucket_store(&s3, "files");
    let object: Vec<u8> = (0..3_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    store.put("in", object.clone()).expect("put");
    let read_back = |file: &mut std::fs::File| {
        let mut bytes = Vec::new();
        std::io::Seek::rewind(file).expect("rewind");
        file.read_to_end(&mut bytes).expect("read");
        bytes
    };
    for from in [0usize, 1, 1_234_567, 2_999_999] {
        let mut file = tempfile::tempfile().expect("tempfile");
        assert_eq!(store.download("in", from as u64, &mut file, |_| false).expect("download"), 3_000_000);
        let bytes = read_back(&mut file);
        assert_eq!(bytes.len(), 3_000_000, "from {from}");
        assert!(bytes[..from].iter().all(|&b| b == 0), "from {from}: a hole before it");
        assert!(bytes[from..] == object[from..], "from {from}: the rest, in place");
    }
    for from in [3_000_000, 3_000_005] {
        let mut file = tempfile::tempfile().expect("tempfile");
        assert_eq!(store.download("in", from, &mut file, |_| false).expect("download"), 3_000_000);
        assert!(read_back(&mut file).is_empty(), "from {from}: nothing fetched");
    }
    let mut file = tempfile::tempfile().expect("tempfile");
    let mut chunks = 0;
    store
        .download("in", 0, &mut file, |_| {
            chunks += 1;
            true
        })
        .expect("download");
    let bytes = read_back(&mut file);
    assert_eq!(chunks, 1);
    assert!(!bytes.is_empty() && bytes.len() < object.len() && bytes[..] == object[..bytes.len()], "one chunk");
    let err = store.download("gone", 5, &mut file, |_| false).expect_err("missing").to_string();
    assert!(err.contains("gone") && err.contains("missing"), "{err}");
}

/// A files sink whose output is a bucket (as a cluster's jobs write it): a staged file larger
/// than one request goes up in parts, is published whole, and nothing stays staged.
#[test]
fn a_files_sink_in_a_bucket_publishes_a_large_file_whole() {
    use eddy_connectors::{FilesSink, OutputDir, StoreDir};
    let s3 = S3Service::start();
    s3.create_bucket("eddy-output");
    let out: Arc<dyn OutputDir> = Arc::new(StoreDir::new(bucket_store(&s3, "eddy-output")));
    FilesSink::recover(out.as_ref(), None).expect("recover");
    let mut staged = out.stage("big.jsonl").expect("stage");
    let line = format!("{{\"value\":\"{}\"}}\n", "x".repeat(1000));
    for _ in 0..(12 << 20) / line.len() {
        std::io::Write::write_all(&mut staged, line.as_bytes()).expect("write");
    }
    staged.seal().expect("upload in parts");
    FilesSink::commit(out.as_ref(), &[(3, "big.jsonl".into())]).expect("publish");
    let names = FilesSink::committed(out.as_ref()).expect("list");
    assert_eq!(names.len(), 1, "{names:?}");
    // Read back a chunk at a time, as the service streams a job's output.
    let (mut bytes, mut chunks) = (Vec::new(), 0);
    out.read_chunks(&names[0], &mut |chunk| {
        bytes.extend_from_slice(chunk);
        chunks += 1;
        true
    })
    .expect("read");
    assert!(chunks > 1, "a 12 MiB object arrives in chunks, not whole");
    assert_eq!(bytes.len(), (12 << 20) / line.len() * line.len());
    assert!(bytes.chunks(line.len()).all(|l| l == line.as_bytes()), "every line arrived intact");
    assert!(out.staged().expect("staged").is_empty(), "the staged copy is gone");
}

/// Checkpoints to an S3-compatible store: the job (in a child process, credentials from its
/// environment) is killed once mid-run and restarted; the output is exact and the checkpoints
/// are objects in the bucket, not local files.
#[test]
fn checkpoints_in_an_s3_compatible_store_survive_a_kill() {
    let s3 = S3Service::start();
    s3.create_bucket("eddy-checkpoints");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), &Setup { events: 16_000, ..Setup::default() });
    let text = std::fs::read_to_string(&path).expect("read").replace(
        "checkpoints:\n  dir: checkpoints\n",
        &format!(
            "checkpoints:\n  s3: {{bucket: eddy-checkpoints, prefix: exactly-once-test, endpoint: \"{}\", allow_http: true}}\n",
            s3.endpoint
        ),
    );
    assert!(text.contains("s3:"), "the pipeline names the bucket");
    std::fs::write(&path, text).expect("write");
    let credentials = [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test")];
    let mut child = start_child_with(&path, &credentials);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !keys(&s3, "eddy-checkpoints", "exactly-once-test").iter().any(|k| k.ends_with("_metadata")) {
        assert!(Instant::now() < deadline, "no checkpoint completed in the bucket");
        assert!(child.try_wait().expect("poll").is_none(), "the job ended before its first checkpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let status = start_child_with(&path, &credentials).wait().expect("second run");
    assert!(status.success(), "the resumed job failed");
    assert!(!dir.path().join("checkpoints").exists(), "nothing checkpointed locally");
    assert!(keys(&s3, "eddy-checkpoints", "exactly-once-test").iter().any(|k| k.ends_with("_metadata")));
    assert_exactly_once(&path, "s3 checkpoints");
}

/// A sink that is slow for its first `slow_batches` batches, then fast: backpressure long
/// enough for checkpoints to time out, then room for later ones to complete.
struct SlowAtFirst {
    slow_batches: usize,
    delay: Duration,
    records: Arc<Mutex<usize>>,
}

impl eddy_connectors::Sink for SlowAtFirst {
    fn write(&mut self, _: Option<&str>, batch: &eddy_core::RecordBatch) -> std::io::Result<()> {
        if self.slow_batches > 0 {
            self.slow_batches -= 1;
            std::thread::sleep(self.delay);
        }
        *self.records.lock().expect("count") += batch.len();
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Two sources meet at a keyed step; the downstream is so slow at first that checkpoints time
/// out while the fast source is stuck in `send`, so it skips to a newer checkpoint than the one
/// whose barrier the slow source already sent. The step's alignment restarts for the newer
/// barrier; the job must keep reading both inputs, complete later checkpoints and finish.
#[test]
fn a_source_that_skips_a_timed_out_checkpoint_does_not_stall_alignment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = |name: &str, events: u64, rate: u64| {
        format!(
            "{{type: generator, name: {name}, seed: 3, events: {events}, keys: 10, key_field: user_id, value_field: v, \
             rate_per_sec: {rate}}}"
        )
    };
    let yaml = format!(
        "name: skipped-barrier\nbatch_size: 8\nsources:\n  - {}\n  - {}\nsteps:\n  - {{name: count, wasm: {}, key_by: \
         /user_id}}\ncheckpoints: {{dir: checkpoints, interval_ms: 10, timeout_ms: 60}}\nrestart: {{strategy: none}}\n\
         sink: {{type: print}}\n",
        generator("fast", 3_000, 100_000),
        generator("slow", 800, 100),
        eddy_guest_artifacts::RUNNING_COUNT,
    );
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("spec");
    let records = Arc::new(Mutex::new(0));
    let sink = SlowAtFirst { slow_batches: 12, delay: Duration::from_millis(150), records: records.clone() };
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let job = Job::start(&spec, runtime(), JobOptions { sink: Some(Box::new(sink)), ..JobOptions::default() })
        .expect("starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !job.is_done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stalled = !job.is_done();
    job.cancel();
    let summary = job.wait().expect("no failure");
    assert!(!stalled, "the job stalled: {} of 3800 records reached the sink", records.lock().expect("count"));
    assert!(summary.finished);
    assert_eq!(*records.lock().expect("count"), 3_800, "every record of both sources");
    assert!(!summary.checkpoints.is_empty(), "checkpoints complete once the backpressure ends");
}

/// List, map and value state outlive the language that wrote them: a user's tags (list state),
/// per-tag counts (map state) and first tag with its record count (value state, a struct: a row
/// as the Rust SDK writes it, JSON as the others do) are kept by the Rust operator, then by its
/// Python, JavaScript, TypeScript and Go twins, each resuming from the savepoint of the one
/// before at another parallelism. The Rust operator runs before each of the others, so each reads
/// the rows it wrote: Python and JavaScript one by one, TypeScript prefetched (rendered by the
/// host) and Go from the batch's bytes. Every record's output (the user's tags so far, this
/// tag's count, the distinct tags, the first tag, the records so far) is what a plain replay of
/// the whole input gives.
#[test]
fn list_map_and_value_state_resume_in_every_language() {
    type Seen = (String, Vec<String>, u64, u64, String, u64);
    let dir = tempfile::tempdir().expect("tempdir");
    let users = ["ann", "bob", "cy", "dee", "eve"];
    let colours = ["red", "green", "blue", "red", "teal", "green", "red"];
    let line = |i: usize| format!("{{\"user\":\"{}\",\"tag\":\"{}\"}}\n", users[i % 5], colours[(i * 3 + i / 5) % 7]);
    let bounds = [0, 40, 70, 95, 110, 130, 150, 175, 200];
    let parts: Vec<String> = bounds.windows(2).map(|w| (w[0]..w[1]).map(line).collect()).collect();
    let versions = [
        (eddy_guest_artifacts::TAGS, 2),
        (eddy_guest_artifacts::PYTHON_TAGS, 3),
        (eddy_guest_artifacts::TAGS, 1),
        (eddy_guest_artifacts::JS_TAGS, 1),
        (eddy_guest_artifacts::TAGS, 2),
        (eddy_guest_artifacts::TS_TAGS, 2),
        (eddy_guest_artifacts::TAGS, 3),
        (eddy_guest_artifacts::GO_TAGS, 3),
    ];
    // The oracle: the whole input replayed with a vector and a map per user.
    let mut oracle: std::collections::BTreeSet<Seen> = std::collections::BTreeSet::new();
    let mut lists: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut maps: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut firsts: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..bounds[bounds.len() - 1] {
        let (user, tag) = (users[i % 5].to_string(), colours[(i * 3 + i / 5) % 7].to_string());
        let list = lists.entry(user.clone()).or_default();
        list.push(tag.clone());
        let map = maps.entry(user.clone()).or_default();
        *map.entry(tag.clone()).or_default() += 1;
        let first = firsts.entry(user.clone()).or_insert_with(|| tag.clone()).clone();
        oracle.insert((user, list.clone(), map[&tag], map.len() as u64, first, list.len() as u64));
    }
    let savepoint = dir.path().join("savepoint");
    let mut input = String::new();
    let mut restored = None;
    let mut got = std::collections::BTreeSet::new();
    for (part, (wasm, parallelism)) in parts.iter().zip(versions) {
        input.push_str(part);
        std::fs::write(dir.path().join("input.jsonl"), &input).expect("input");
        let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
        let yaml = format!(
            "name: tags\nbatch_size: 8\nsources: [{{type: file, name: tags, path: input.jsonl, format: json_lines, follow: true}}]\n\
             steps:\n  - {{name: tags, wasm: {wasm}, key_by: /user, parallelism: {parallelism}}}\n\
             checkpoints: {{dir: checkpoints, interval_ms: 50}}\nsink: {{type: print}}\n"
        );
        let (job, received) = start_wordcount(dir.path(), &yaml, restored.map(|_| savepoint.clone()));
        assert_eq!(job.restored_from(), restored, "{wasm}");
        wait_for(&received, part.lines().count());
        let _ = std::fs::remove_dir_all(&savepoint);
        let (id, _) = job
            .stop_with_savepoint(&StoreLocation::Dir(savepoint.clone()), Duration::from_secs(30))
            .expect("savepoint");
        for (_, r) in received.lock().expect("lock").iter() {
            let user: String = serde_json::from_slice(r.key.as_deref().expect("keyed")).expect("user");
            let v: serde_json::Value = eddy_tests::value_json(&r.value);
            let tags: Vec<String> = serde_json::from_value(v["tags"].clone()).expect("tags");
            assert!(
                got.insert((
                    user,
                    tags,
                    v["count"].as_u64().expect("count"),
                    v["distinct"].as_u64().expect("distinct"),
                    v["first"].as_str().expect("first").to_string(),
                    v["records"].as_u64().expect("records"),
                )),
                "{wasm}: a record twice"
            );
        }
        restored = Some(id);
    }
    assert_eq!(got, oracle);
}
