//! Replay of one journaled subtask (`debug: {journal: true}`, `eddy_engine::replay`): a
//! running count over generated purchases at parallelism 2. What a replay emits is compared
//! with what the subtask emitted in the run (the sink's records of its keys, in order) and with
//! an oracle counted here from the generator's events; a replay from a middle checkpoint must
//! emit exactly what the full replay emitted after that checkpoint's barrier; after a failed
//! attempt and a restore, the journal follows the attempt that counts; a torn journal tail
//! replays up to its last whole frame, and a damaged byte is an error naming the frame.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use eddy_connectors::generator_event;
use eddy_engine::replay::{ReplayEnd, ReplayError, ReplayRequest, ReplaySummary, TraceEvent, replay};
use eddy_engine::{Job, JobOptions};
use eddy_guest_artifacts as guests;
use eddy_plan::{PipelineSpec, SourceSpec, StoreLocation};
use eddy_tests::{MemorySink, Received, runtime};
use serde_json::Value;

/// `events` generated purchases by 30 users into the running count at parallelism 2, the
/// count step journaled; `rate` paces the source (0: as fast as it goes).
fn pipeline(dir: &Path, events: u64, rate: u64, backend: &str) -> PathBuf {
    let rate = if rate == 0 { String::new() } else { format!(", rate_per_sec: {rate}") };
    let yaml = format!(
        "name: replay\nparallelism: 2\nbatch_size: 64\nsources:\n  - {{type: generator, name: purchases, seed: 11, \
         events: {events}, keys: 30, key_field: user_id, key_prefix: user-, value_field: amount_cents, min_value: 1, \
         max_value: 100, start_ms: 0, interval_ms: 5, parallelism: 1{rate}}}\nsteps:\n  - {{name: count, wasm: \
         {count}, key_by: /user_id, debug: {{journal: true}}}}\nstate: {{backend: {backend}, dir: {dir}/state}}\n\
         checkpoints: {{dir: {dir}/checkpoints, interval_ms: 100, retained: 1000}}\nrestart: {{strategy: none}}\n\
         sink: {{type: print}}\n",
        count = guests::RUNNING_COUNT,
        dir = dir.display(),
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write pipeline");
    path
}

fn start(path: &Path) -> (PipelineSpec, Job, Received) {
    let spec = PipelineSpec::from_file(path).expect("spec");
    let sink = MemorySink::default();
    let received = sink.received.clone();
    let job = Job::start(&spec, runtime(), JobOptions { sink: Some(Box::new(sink)), ..JobOptions::default() })
        .expect("start");
    (spec, job, received)
}

/// Each user's purchases in the generator's order, counted here from the generator.
fn purchases(spec: &PipelineSpec) -> BTreeMap<String, u64> {
    let SourceSpec::Generator(g) = &spec.sources[0] else { panic!("generator source") };
    let mut per_user = BTreeMap::new();
    for i in 0..g.events.expect("bounded") {
        let value: Value = eddy_tests::value_json(&generator_event(g, i).value);
        *per_user.entry(format!("\"{}\"", value["user_id"].as_str().expect("user"))).or_default() += 1;
    }
    per_user
}

fn request(dir: &Path, subtask: u32) -> ReplayRequest {
    ReplayRequest::new(StoreLocation::Dir(dir.join("checkpoints")), "count", subtask)
}

fn run(request: &ReplayRequest) -> (Vec<TraceEvent>, ReplaySummary) {
    let mut events = Vec::new();
    let summary = replay(request, runtime(), &mut |e| events.push(e)).expect("replays");
    (events, summary)
}

/// The (key, value) of every output event, in order.
fn outputs(events: &[TraceEvent]) -> Vec<(String, Value)> {
    events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::Output { key: Some(k), value, .. } => Some((k.to_string(), value.clone())),
            _ => None,
        })
        .collect()
}

/// The input channels the replayed batches came over.
fn input_channels(events: &[TraceEvent]) -> BTreeSet<Option<u32>> {
    events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::Input { channel, .. } => Some(*channel),
            _ => None,
        })
        .collect()
}

/// The sink's records as (key, value).
fn received(received: &Received) -> Vec<(String, Value)> {
    received
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, r)| {
            let key = String::from_utf8(r.key.clone().expect("keyed")).expect("utf-8");
            (key, eddy_tests::value_json(&r.value))
        })
        .collect()
}

/// Each key's outputs must run 1, 2, 3, ... in order (the running count's definition), up to
/// `totals` when given.
fn assert_counts_run_up(outputs: &[(String, Value)], totals: Option<&BTreeMap<String, u64>>, by: u64) {
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (key, value) in outputs {
        let n = last.entry(key).or_default();
        *n += by;
        assert_eq!(value.as_u64(), Some(*n), "{key}'s running count");
    }
    if let Some(totals) = totals {
        for (key, n) in &last {
            assert_eq!(totals.get(*key).map(|t| t * by), Some(*n), "{key}'s last count");
        }
    }
}

#[test]
fn a_replayed_subtask_emits_exactly_what_it_emitted_in_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (spec, job, sink) = start(&pipeline(dir.path(), 4000, 0, "heap"));
    job.wait().expect("the job finishes");
    let totals = purchases(&spec);
    let sink = received(&sink);
    let mut replayed = 0;
    for subtask in 0..2 {
        let (events, summary) = run(&request(dir.path(), subtask));
        assert_eq!((summary.from_checkpoint, &summary.end), (0, &ReplayEnd::Finished), "{summary:?}");
        let keys: BTreeSet<String> = events
            .iter()
            .filter_map(|e| match e {
                TraceEvent::Input { key: Some(k), .. } => Some(k.to_string()),
                _ => None,
            })
            .collect();
        assert!(!keys.is_empty(), "subtask {subtask} saw input");
        let channels = input_channels(&events);
        assert_eq!(channels, BTreeSet::from([Some(0)]), "every batch came over the one channel from the source");
        let emitted: Vec<_> = sink.iter().filter(|(k, _)| keys.contains(k)).cloned().collect();
        let out = outputs(&events);
        assert_eq!(out, emitted, "subtask {subtask}: the replay emits what the run emitted, in order");
        let own: BTreeMap<String, u64> =
            totals.iter().filter(|(k, _)| keys.contains(*k)).map(|(k, n)| (k.clone(), *n)).collect();
        assert_counts_run_up(&out, Some(&own), 1);
        // The host reads and writes a key's state once per batch that holds the key, so the
        // last write of each key is its total.
        let mut written = BTreeMap::new();
        for e in &events {
            if let TraceEvent::StateWrite { entry } = e {
                assert_eq!(entry.state, "count");
                written.insert(entry.key.to_string(), entry.value.as_u64().expect("a count"));
            }
        }
        assert_eq!(written, own, "subtask {subtask}: each key's last write of `count` is its total");
        replayed += out.len();
    }
    assert_eq!(replayed, sink.len(), "the two subtasks together emitted everything the sink received");

    // One key: only its records, reads and writes, and its count up to its total.
    let user = "\"user-3\"";
    let owner = (0..2)
        .find(|&s| {
            run(&request(dir.path(), s))
                .0
                .iter()
                .any(|e| matches!(e, TraceEvent::Input { key: Some(k), .. } if k.as_str() == Some("user-3")))
        })
        .expect("some subtask counts user-3");
    let one = ReplayRequest { key: Some(user.as_bytes().to_vec()), ..request(dir.path(), owner) };
    let (events, summary) = run(&one);
    assert_eq!(summary.key_subtask, Some(owner), "the key's subtask, from its key group");
    let inputs = events.iter().filter(|e| matches!(e, TraceEvent::Input { .. })).count() as u64;
    assert_eq!(inputs, totals[user]);
    for e in &events {
        match e {
            TraceEvent::Input { key, .. } | TraceEvent::Output { key, .. } => {
                assert_eq!(key.as_ref().map(Value::to_string).as_deref(), Some(user))
            }
            TraceEvent::StateRead { entry, .. } | TraceEvent::StateWrite { entry } => {
                assert_eq!((entry.key.to_string().as_str(), entry.state.as_str()), (user, "count"))
            }
            _ => {}
        }
    }
    assert_counts_run_up(&outputs(&events), Some(&BTreeMap::from([(user.to_string(), totals[user])])), 1);

    // Up to a record: exactly that many, and the outputs the full replay began with.
    let (full, _) = run(&request(dir.path(), 0));
    let (cut, summary) = run(&ReplayRequest { until: Some(10), ..request(dir.path(), 0) });
    assert_eq!((summary.records, &summary.end), (10, &ReplayEnd::Until { record: 10 }));
    assert_eq!(outputs(&cut), outputs(&full)[..10]);

    // Other code over the same input: the next version adds two per record.
    let v2 = ReplayRequest { wasm: Some(guests::RUNNING_COUNT_V2.into()), ..request(dir.path(), 0) };
    let (other, _) = run(&v2);
    assert_eq!(outputs(&other).len(), outputs(&full).len());
    assert_counts_run_up(&outputs(&other), None, 2);
    let wrong = ReplayRequest { step: "count".into(), from_checkpoint: Some(99), ..request(dir.path(), 0) };
    match replay(&wrong, runtime(), &mut |_| {}) {
        Err(ReplayError::NoJournal(e)) => assert!(e.contains("no segment after checkpoint 99"), "{e}"),
        other => panic!("a checkpoint the journal does not reach is refused, got {other:?}"),
    }
    let outside = ReplayRequest { step: "../journal/count".into(), ..request(dir.path(), 0) };
    match replay(&outside, runtime(), &mut |_| {}) {
        Err(ReplayError::BadQuery(e)) => assert!(e.contains("is not a name"), "{e}"),
        other => panic!("a step that is a path is refused, got {other:?}"),
    }
}

/// A finished job whose retention dropped its first checkpoints (and the journal before them)
/// replays from the oldest checkpoint it kept: the final checkpoint keeps the retained ones.
/// Each subtask's replay emits exactly the tail of what the sink received for its keys, and
/// ends at each key's total.
#[test]
fn a_finished_job_that_dropped_checkpoints_replays_from_the_oldest_it_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = pipeline(dir.path(), 4000, 4000, "heap");
    std::fs::write(&path, std::fs::read_to_string(&path).expect("read").replace("retained: 1000", "retained: 2"))
        .expect("write");
    let (spec, job, sink) = start(&path);
    job.wait().expect("the job finishes");
    let totals = purchases(&spec);
    let sink = received(&sink);
    for subtask in 0..2 {
        let (events, summary) = run(&request(dir.path(), subtask));
        assert!(summary.from_checkpoint > 0, "the start was pruned with the dropped checkpoints: {summary:?}");
        assert_eq!(summary.end, ReplayEnd::Finished, "{summary:?}");
        let out = outputs(&events);
        assert!(!out.is_empty(), "subtask {subtask} emitted after checkpoint {}", summary.from_checkpoint);
        let keys: BTreeSet<&String> = out.iter().map(|(k, _)| k).collect();
        let emitted: Vec<_> = sink.iter().filter(|(k, _)| keys.contains(k)).cloned().collect();
        assert_eq!(out, emitted[emitted.len() - out.len()..], "subtask {subtask}: the tail of what the run emitted");
        let mut last = BTreeMap::new();
        for (key, value) in &out {
            last.insert(key.clone(), value.as_u64().expect("a count"));
        }
        for (key, n) in last {
            assert_eq!(totals.get(&key), Some(&n), "{key}'s last replayed count is its total");
        }
    }
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn replay_goes_on_from_a_checkpoint_and_follows_the_attempt_that_counts() {
    // A replay reads state on the heap whatever the job used: RocksDB's checkpoints too.
    for backend in ["heap", "rocksdb"] {
        goes_on_from_a_checkpoint(backend);
    }
}

fn goes_on_from_a_checkpoint(backend: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = pipeline(dir.path(), 6000, 6000, backend);
    let (spec, job, _) = start(&path);
    wait_until("three checkpoints", || job.checkpoints_completed() >= 3);
    job.cancel();
    let _ = job.wait();

    // The first attempt, cancelled: a replay from the start ends where its journal does, and
    // one from a middle checkpoint emits exactly what the full one emitted after its barrier.
    let (full, summary) = run(&request(dir.path(), 0));
    assert_eq!(summary.end, ReplayEnd::JournalEnds { after_checkpoint: last_barrier(&full) });
    let middle = barriers(&full)[1];
    let (rest, summary) = run(&ReplayRequest { from_checkpoint: Some(middle), ..request(dir.path(), 0) });
    assert_eq!(summary.from_checkpoint, middle);
    let at = full.iter().position(|e| *e == TraceEvent::Barrier { checkpoint: middle }).expect("barrier");
    assert_eq!(outputs(&rest), outputs(&full[at..]), "from checkpoint {middle}");
    assert!(!outputs(&rest).is_empty());

    // A torn tail reads up to its last whole frame; a damaged byte is an error naming the frame.
    let first = eddy_engine::journal::segment_path("count", 0, 0);
    // The first segment ends in its barrier's frame, which the cut tears.
    let copy = dir.path().join("copy");
    copy_dir(&dir.path().join("checkpoints/journal"), &copy.join("journal"));
    let bytes = std::fs::read(dir.path().join("checkpoints").join(&first)).expect("read");
    std::fs::write(copy.join(&first), &bytes[..bytes.len() - 3]).expect("tear");
    let in_copy = || ReplayRequest { checkpoints: StoreLocation::Dir(copy.clone()), ..request(dir.path(), 0) };
    let (cut, summary) = run(&in_copy());
    assert_eq!(summary.end, ReplayEnd::JournalEnds { after_checkpoint: 0 }, "the torn barrier ends the journal");
    let all = outputs(&full);
    assert!(outputs(&cut).len() <= all.len() && outputs(&cut) == all[..outputs(&cut).len()], "a prefix");
    let first = copy.join(first);
    // A byte of the header's JSON: damage inside a segment, not at its end (where a cut last
    // frame is a torn tail, read up to).
    let mut bytes = std::fs::read(&first).expect("read");
    let frames = eddy_engine::journal::parse_segment(&bytes, "first").expect("read").frames.len();
    assert!(frames > 0, "the first segment holds more than its header");
    bytes[20] ^= 0x55;
    std::fs::write(&first, &bytes).expect("damage");
    match replay(&in_copy(), runtime(), &mut |_| {}) {
        Err(ReplayError::Journal(e)) => {
            assert!(e.contains("the frame at byte 0 fails its checksum") && e.contains("after-0.jnl"), "{e}")
        }
        other => panic!("damage is an error, got {other:?}"),
    }

    // The second attempt restores the newest checkpoint and runs to the end. Its journal
    // replaces what the first attempt saw after that checkpoint, so a replay from the start
    // counts every purchase exactly once.
    let (_, job, _) = start(&path);
    let restored = job.restored_from().expect("restores");
    job.wait().expect("the second attempt finishes");
    let totals = purchases(&spec);
    for subtask in 0..2 {
        let (events, summary) = run(&request(dir.path(), subtask));
        assert_eq!(summary.end, ReplayEnd::Finished, "subtask {subtask}");
        assert!(barriers(&events).contains(&restored));
        let out = outputs(&events);
        let keys: BTreeSet<&String> = out.iter().map(|(k, _)| k).collect();
        let own: BTreeMap<String, u64> =
            totals.iter().filter(|(k, _)| keys.contains(k)).map(|(k, n)| (k.clone(), *n)).collect();
        assert_counts_run_up(&out, Some(&own), 1);
    }
}

fn barriers(events: &[TraceEvent]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::Barrier { checkpoint } => Some(*checkpoint),
            _ => None,
        })
        .collect()
}

fn last_barrier(events: &[TraceEvent]) -> u64 {
    barriers(events).last().copied().unwrap_or(0)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// A window step replays its firings: both subtasks' replayed results are the windows computed
/// here from the generator's events, and each subtask's equal what the sink received of its
/// keys, in order; the trace shows no backend reads (the write-back buffer knows what is absent).
/// (Its journal is LZ4-compressed; the other tests' store batches as they are.)
#[test]
fn a_window_step_replays_the_results_it_fired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "name: replay-window\nparallelism: 2\nbatch_size: 32\nsources:\n  - {{type: generator, name: purchases, seed: \
         5, events: 3000, keys: 40, key_field: user_id, key_prefix: user-, value_field: amount_cents, min_value: 1, \
         max_value: 1000, start_ms: 0, interval_ms: 5, max_disorder_ms: 300, parallelism: 2}}\nwatermarks: \
         {{out_of_orderness_ms: 300}}\nsteps:\n  - {{name: totals, wasm: {wasm}, key_by: /user_id, window: {{type: \
         tumbling, size_ms: 10000}}, debug: {{journal: true, journal_compression: lz4}}}}\ncheckpoints: {{dir: \
         {dir}/checkpoints}}\nsink: \
         {{type: print}}\n",
        wasm = guests::PURCHASE_TOTALS,
        dir = dir.path().display(),
    );
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write pipeline");
    let (spec, job, sink) = start(&path);
    job.wait().expect("the job finishes");
    let sink = received(&sink);
    let mut rows = Vec::new();
    for subtask in 0..2 {
        let checkpoints = StoreLocation::Dir(dir.path().join("checkpoints"));
        let (events, summary) = run(&ReplayRequest::new(checkpoints, "totals", subtask));
        assert_eq!(summary.end, ReplayEnd::Finished);
        let out = outputs(&events);
        let keys: BTreeSet<&String> = out.iter().map(|(k, _)| k).collect();
        let mine: Vec<_> = sink.iter().filter(|(k, _)| keys.contains(k)).cloned().collect();
        assert_eq!(out, mine, "subtask {subtask} replays the results it fired, in order");
        // The window keeps accumulators in a write-back buffer in front of a backend that
        // starts empty, so a window new to the buffer is known absent: the replay, as the run,
        // reads nothing from the backend.
        assert!(
            !events.iter().any(|e| matches!(e, TraceEvent::StateRead { .. })),
            "no window is read from a backend that holds only what the buffer holds"
        );
        let channels = input_channels(&events);
        assert_eq!(channels, BTreeSet::from([Some(0), Some(1)]), "batches came from both source subtasks");
        rows.extend(out.into_iter().map(|(user, v)| {
            let user = user.trim_matches('"').to_owned();
            let start = v["start"].as_i64().expect("start");
            (
                user,
                start,
                v["result"]["purchases"].as_u64().expect("n"),
                v["result"]["total_cents"].as_i64().expect("sum"),
            )
        }));
    }
    rows.sort();
    assert_eq!(rows, crate::checkpoints::oracle(&spec));
}
