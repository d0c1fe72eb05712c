//! Jobs on a cluster of real processes: a coordinator (no slots of its own) and three workers on
//! this machine. Nexmark q5 and q8 spread over the three workers produce exactly the rows of
//! the native baseline (an independent oracle); `GET /v1/jobs/{id}` names each subtask's
//! worker and `GET /v1/workers` counts the slots the job holds.
#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::fleet::{Rng, Worker, eventually, names, nexmark_query, used_workers, workers};
use common::{PANIC_JOB, Server, assert_panic_failure, expect, job, output_lines, submit, tenant, upload, wait_job};
use eddy_plan::{SinkSpec, SourceSpec};
use serde_json::Value;

const EVENTS: u64 = 12_000;

/// A coordinator (with `flags` and `env`) and three workers of two slots each, all registered.
fn cluster(dir: &Path, flags: &[&str], env: &[(&str, &str)]) -> (Server, Vec<Worker>) {
    let coordinator = Server::start_with_env("coordinator", &dir.join("coordinator"), flags, env);
    let fleet: Vec<Worker> = (1..=3).map(|i| Worker::start(&coordinator, &format!("worker-{i}"), dir, &[])).collect();
    eventually("three workers", || names(&coordinator).len() == 3);
    (coordinator, fleet)
}

/// A coordinator's flags for a checkpoint store in bucket `eddy`, which every process reaches
/// as across machines.
const STORE_FLAGS: [&str; 4] = ["--heartbeat-timeout-ms", "2000", "--checkpoint-store", "s3://eddy/cluster"];

/// The environment that points a coordinator at `s3`.
fn store_env(s3: &eddy_tests::S3Service) -> [(&'static str, &str); 2] {
    [("AWS_ENDPOINT_URL", s3.endpoint.as_str()), ("AWS_ALLOW_HTTP", "true")]
}

/// A new S3-compatible service (moto) holding an empty bucket `eddy`.
fn bucket() -> eddy_tests::S3Service {
    let s3 = eddy_tests::S3Service::start();
    s3.create_bucket("eddy");
    s3
}

/// A cluster on a new bucket (`cluster` with `STORE_FLAGS`) and tenant `acme`: the bucket, the
/// coordinator, the workers, the tenant's id and token.
fn acme_on_a_bucket(dir: &Path) -> (eddy_tests::S3Service, Server, Vec<Worker>, String, String) {
    let s3 = bucket();
    let (coordinator, fleet) = cluster(dir, &STORE_FLAGS, &store_env(&s3));
    let (tenant_id, token) = tenant(&coordinator, "acme");
    (s3, coordinator, fleet, tenant_id, token)
}

/// `query`'s spec at parallelism 3 over `EVENTS` events with a files sink, its components
/// uploaded; and the native baseline's rows, sorted.
fn query(
    server: &Server,
    token: &str,
    name: &str,
    native: fn(Vec<eddy_nexmark::Event>) -> Vec<Value>,
) -> (String, Vec<String>) {
    let mut spec = nexmark_query(server, token, name, 3, EVENTS);
    let SourceSpec::Nexmark(source) = &spec.sources[0] else { panic!("{name} reads the nexmark source") };
    let events: Vec<eddy_nexmark::Event> = eddy_nexmark::events(&source.config()).collect();
    let mut expected: Vec<String> = native(events).iter().map(Value::to_string).collect();
    expected.sort();
    assert!(!expected.is_empty(), "{name}: the baseline must produce rows");
    spec.sink = SinkSpec::Files { dir: Some("out".into()), s3: None };
    // JSON is YAML too.
    (serde_json::to_string(&spec).unwrap(), expected)
}

#[test]
fn nexmark_q5_and_q8_on_three_workers_equal_the_native_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, _fleet) = cluster(dir.path(), &["--heartbeat-timeout-ms", "2000"], &[]);
    let (_, token) = tenant(&coordinator, "acme");
    for (name, native) in [("q5", eddy_nexmark::native::q5 as fn(_) -> _), ("q8", eddy_nexmark::native::q8)] {
        let (spec, expected) = query(&coordinator, &token, name, native);
        let submitted = expect(submit(&coordinator, &token, &spec), 201);
        let id = submitted["id"].as_str().unwrap().to_owned();
        // While it runs, each subtask names its worker, and the workers count the slots it holds.
        let running = wait_job(&coordinator, &token, &id, "shown running", |j| {
            j["status"] != "created" && (j["live"]["tasks"][0]["workers"].is_array() || j["status"] != "running")
        });
        if running["status"] == "running" {
            let mut placed: BTreeMap<String, u32> = BTreeMap::new();
            for task in running["live"]["tasks"].as_array().unwrap() {
                let on: Vec<&str> = task["workers"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
                assert_eq!(on.len() as u64, task["parallelism"].as_u64().unwrap(), "{task}");
                for w in on {
                    *placed.entry(w.to_owned()).or_default() += 1;
                }
            }
            assert_eq!(placed.len(), 3, "{name} is spread over all three workers: {placed:?}");
        }
        let done = wait_job(&coordinator, &token, &id, "ended", |j| {
            !["created", "running"].contains(&j["status"].as_str().unwrap())
        });
        assert_eq!(done["status"], "finished", "{name}: {done}");
        let mut got: Vec<String> =
            output_lines(&coordinator, &token, &id).iter().map(|l| l["value"].to_string()).collect();
        got.sort();
        assert_eq!(got.len(), expected.len(), "{name}: row count");
        assert!(got == expected, "{name}: rows differ from the native baseline");
        eventually("the slots to be free again", || {
            workers(&coordinator).iter().all(|w| w["free_slots"] == w["slots"])
        });
        assert_eq!(job(&coordinator, &token, &id)["restarts"], 0);
    }
}

/// A running count per user over `events` generated events paced at `rate` per second, at
/// parallelism 3 (one slot on each worker), checkpointed every 200 ms into an exactly-once
/// files sink, restarting after every failure.
fn crash_job(events: u64, rate: u64) -> String {
    format!(
        "name: counts\nparallelism: 3\nsources:\n  - {{type: generator, name: g, seed: 7, events: {events}, keys: 30, \
         key_field: user, key_prefix: u-, value_field: v, min_value: 1, max_value: 9, start_ms: 0, interval_ms: 5, \
         rate_per_sec: {rate}}}\nsteps:\n  - {{name: count, wasm: count@1, key_by: /user}}\n\
         checkpoints: {{interval_ms: 200}}\nrestart: {{strategy: fixed_delay, attempts: 100, delay_ms: 500}}\n\
         sink: {{type: files, dir: out}}\n"
    )
}

/// The distributed crash test: SIGKILL a random worker of the job 30 times while it runs (each time
/// after the running attempt completed a checkpoint, so the job makes progress), and the
/// coordinator three times (it restarts on its address and resumes the job from its store).
/// The committed output holds each user's running counts 1..=n exactly once, the n summing
/// to the events generated: nothing lost, nothing counted twice. Checkpoints go to an
/// S3-compatible store (moto), as they must when workers run on several machines. `EDDY_CRASH_SEED` replays a
/// schedule; the seed is printed.
#[test]
fn a_counting_job_survives_thirty_worker_kills_and_three_coordinator_kills_exactly_once() {
    const WORKER_KILLS: usize = 30;
    const COORDINATOR_KILLS: [usize; 3] = [8, 17, 26];
    let mut rng = Rng::from_env();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("coordinator");
    // Checkpoints in a bucket every process reaches, as across machines.
    let s3 = bucket();
    let (flags, env) = (STORE_FLAGS, store_env(&s3));
    let (mut coordinator, mut fleet) = cluster(dir.path(), &flags, &env);
    let (tenant_id, token) = tenant(&coordinator, "acme");
    expect(upload(&coordinator, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    // ~80 s at 1 500 events/s: the kills (about a second each) end long before it does.
    let events = 120_000;
    let id = expect(submit(&coordinator, &token, &crash_job(events, 1_500)), 201)["id"].as_str().unwrap().to_owned();
    let started = std::time::Instant::now();
    let (mut kills, mut attempts) = (0, 0);
    let mut coordinator_kills = Vec::new();
    // From each worker kill to the next attempt's first completed checkpoint: the failure
    // seen, the job restored on the replacement, and records flowing again (a figure, not an
    // assertion).
    let (mut recoveries, mut killed_at) = (Vec::new(), None);
    while kills < WORKER_KILLS {
        // Progress first: the failure of the last kill was seen, and the attempt that runs now
        // completed a checkpoint.
        let j = wait_job(&coordinator, &token, &id, "checkpointing again", |j| {
            j["status"] == "finished"
                || (j["attempts"].as_u64() >= Some(attempts)
                    && j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty()))
        });
        assert_ne!(j["status"], "finished", "the job ended after {kills} kills: make it longer");
        if let Some(at) = killed_at.take() {
            recoveries.push(std::time::Instant::now().duration_since(at).as_secs_f64());
        }
        std::thread::sleep(std::time::Duration::from_millis(rng.below(400)));
        if COORDINATOR_KILLS.contains(&kills) && !coordinator_kills.contains(&kills) {
            let port = coordinator.port();
            coordinator.kill_9();
            coordinator = Server::start_on_with_env("coordinator", port, &data, &flags, &env).unwrap();
            println!("killed and restarted the coordinator after {kills} worker kills");
            // The second kill in a row holds the job (a server dying under it again and again
            // is what that guards against): its owner resumes it, as a user would here.
            if job(&coordinator, &token, &id)["status"] == "held" {
                eventually("the workers back", || workers(&coordinator).len() == 3);
                let resume =
                    common::client().post(coordinator.url(&format!("/v1/jobs/{id}/resume"))).bearer_auth(&token);
                expect(resume.send().unwrap(), 202);
                println!("resumed the job the coordinator held after its second death in a row");
            }
            coordinator_kills.push(kills);
            continue;
        }
        // A worker the running attempt uses: after a coordinator restart the job may have been
        // placed before every worker was back, and killing an idle one would cost it nothing.
        let used = used_workers(&j);
        let victim = used[rng.below(used.len() as u64) as usize];
        fleet.remove(victim).kill_9();
        killed_at = Some(std::time::Instant::now());
        fleet.insert(victim, Worker::start(&coordinator, &format!("worker-{}", victim + 1), dir.path(), &[]));
        kills += 1;
        attempts = j["attempts"].as_u64().unwrap() + 1;
        println!("kill {kills} of worker-{} at {:.1} s", victim + 1, started.elapsed().as_secs_f64());
    }
    recoveries.sort_by(f64::total_cmp);
    println!(
        "{kills} worker kills in {:.1} s; kill to the next checkpoint: median {:.2} s, max {:.2} s",
        started.elapsed().as_secs_f64(),
        recoveries[recoveries.len() / 2],
        recoveries[recoveries.len() - 1]
    );
    let done = wait_job(&coordinator, &token, &id, "ended", |j| {
        !["created", "running", "restarting"].contains(&j["status"].as_str().unwrap())
    });
    assert_eq!(done["status"], "finished", "{done}");
    common::assert_counted_once(&coordinator, &token, &id, events);
    // The checkpoints and the committed output were objects in the bucket, which workers on
    // other machines reach too, not files in the coordinator's directory.
    let job_objects = format!("cluster/tenants/{tenant_id}/jobs/{id}");
    assert!(
        s3.list("eddy", &format!("{job_objects}/checkpoints/")).contains("_metadata"),
        "no checkpoint in the bucket"
    );
    assert!(s3.list("eddy", &format!("{job_objects}/output/part-")).contains("<Key>"), "no output in the bucket");
    for kept_elsewhere in ["checkpoints", "output"] {
        let local = data.join("tenants").join(&tenant_id).join("jobs").join(&id).join(kept_elsewhere);
        assert!(!local.exists(), "{kept_elsewhere} written locally to {}", local.display());
    }
    assert!(
        done["attempts"].as_u64().unwrap() >= WORKER_KILLS as u64 - 3,
        "every worker kill cost the attempt: {done}"
    );
    // A lost worker is the cluster's doing, not the tenant's: it costs no restart of the
    // strategy's (a few may still, where a part's failure outran the worker's death by more
    // than the heartbeat timeout).
    let charged = done["restarts"].as_u64().unwrap();
    println!("{} attempts, {charged} restarts charged to the job's strategy", done["attempts"]);
    assert!(charged <= 5, "worker kills were charged to the tenant's restart budget: {done}");
    // A worker killed mid-epoch held a files-sink part spooling in its temporary directory.
    let left: Vec<_> =
        std::fs::read_dir(common::fleet::temp_dir(dir.path())).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "killed workers left temporary files behind: {left:?}");
}

/// Savepoints of a job on workers: taken while it runs, and a rescale from 1 to 3 restarts it
/// from one, spread over the three workers (whose record counts the job's live view shows);
/// every count is still committed exactly once.
#[test]
fn a_job_on_workers_takes_savepoints_and_rescales_over_more_workers_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    // Savepoints in the bucket every worker reaches, as across machines: the rescaled job's
    // parts restore from there.
    let (s3, coordinator, _fleet, tenant_id, token) = acme_on_a_bucket(dir.path());
    expect(upload(&coordinator, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let events = 9_000;
    let id = expect(submit(&coordinator, &token, &common::counts_job(events)), 201)["id"].as_str().unwrap().to_owned();
    let checkpointed = |j: &Value| j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty());
    wait_job(&coordinator, &token, &id, "checkpointed", checkpointed);
    let path = format!("/v1/jobs/{id}/savepoints");
    assert_eq!(expect(common::post(&coordinator, &token, &path, serde_json::json!({})), 201)["reason"], "requested");
    let path = format!("/v1/jobs/{id}/rescale");
    expect(common::post(&coordinator, &token, &path, serde_json::json!({"parallelism": 3})), 200);
    // Spread over the three workers, whose records the job's live view counts.
    let rescaled = wait_job(&coordinator, &token, &id, "counting on three workers", |j| {
        j["live"]["tasks"].as_array().is_some_and(|t| {
            t.iter().any(|t| {
                t["workers"].as_array().is_some_and(|w| w.len() == 3 && w[0] != w[1] && w[1] != w[2])
                    && t["records_in"].as_u64() > Some(0)
            })
        })
    });
    assert_eq!(rescaled["generation"], 1);
    let done = wait_job(&coordinator, &token, &id, "ended", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    common::assert_counted_once(&coordinator, &token, &id, events);
    let savepoints = s3.list("eddy", &format!("cluster/tenants/{tenant_id}/jobs/{id}/savepoints/"));
    assert_eq!(savepoints.matches("/_metadata</Key>").count(), 2, "the requested and the rescale's savepoint");
    let local = dir.path().join("coordinator/tenants").join(&tenant_id).join("jobs").join(&id).join("savepoints");
    assert!(!local.exists(), "savepoints written locally to {}", local.display());
}

/// A live upgrade of a job spread over the three workers: each worker fetches, compiles and
/// opens the new code before the coordinator's checkpoint carries the swap, every subtask of
/// the step goes over at that one barrier, and nothing restarts. A worker killed with SIGKILL
/// right after: the next attempt restores a checkpoint taken with the new code and runs it.
/// The committed output equals the oracle for the swap's barrier, read from its metadata.
#[test]
fn a_live_upgrade_on_workers_swaps_every_subtask_at_one_barrier_and_a_worker_kill_after_it_keeps_the_new_code() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, mut fleet) = cluster(dir.path(), &["--heartbeat-timeout-ms", "2000"], &[]);
    let (tenant_id, token) = tenant(&coordinator, "acme");
    expect(upload(&coordinator, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let v2 = expect(upload(&coordinator, &token, eddy_guest_artifacts::RUNNING_COUNT_V2, Some(("count", "2"))), 201);
    // Checkpoints kept long enough to read the swap's back.
    let yaml = common::counts_job(15_000)
        .replace("name: counts\n", "name: counts\nparallelism: 3\n")
        .replace("checkpoints: {interval_ms: 200}", "checkpoints: {interval_ms: 200, retained: 500}");
    let id = expect(submit(&coordinator, &token, &yaml), 201)["id"].as_str().unwrap().to_owned();
    let running = wait_job(&coordinator, &token, &id, "counting on three workers, checkpointed", |j| {
        j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
            && j["live"]["tasks"].as_array().is_some_and(|t| {
                t.iter().any(|t| t["workers"].as_array().is_some_and(|w| w.len() == 3 && w[0] != w[1] && w[1] != w[2]))
            })
    });
    let path = format!("/v1/jobs/{id}/upgrade");
    let body = serde_json::json!({"step": "count", "wasm": "count@2", "mode": "live"});
    let swapped = expect(common::post(&coordinator, &token, &path, body), 200);
    assert_eq!((&swapped["artifact"], &swapped["subtasks"]), (&v2["digest"], &serde_json::json!(3)), "{swapped}");
    let after = job(&coordinator, &token, &id);
    assert_eq!(
        (&after["status"], &after["generation"], &after["attempts"]),
        (&running["status"], &running["generation"], &running["attempts"]),
        "nothing restarted"
    );
    assert_eq!(after["artifacts"][0], v2["digest"], "the record names the new code");
    let (swap_at, artifacts) =
        common::swap_point(&dir.path().join("coordinator"), &tenant_id, &id, swapped["checkpoint"].as_u64().unwrap());
    let new_code = v2["digest"].as_str().unwrap().strip_prefix("sha256:").map(str::to_owned);
    assert_eq!(artifacts, vec![new_code; 3], "the metadata names the new code for every subtask");
    for worker in &fleet {
        assert!(worker.log().contains("live swap prepared"), "every worker prepared the new code first");
    }

    fleet.remove(0).kill_9();
    let done = wait_job(&coordinator, &token, &id, "ended", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    assert!(done["attempts"].as_u64() > after["attempts"].as_u64(), "the kill cost the running attempt: {done}");
    eprintln!(
        "live swap on workers: checkpoint {}, source at event {swap_at}, longest swap {} ms, {} ms from the request",
        swapped["checkpoint"], swapped["longest_swap_ms"], swapped["total_ms"]
    );
    common::assert_output_swapped_at(&coordinator, &token, &id, &yaml, swap_at);
}

/// Replay of a job that ran on the three workers, from the coordinator: each worker journaled
/// its subtask of the step into the bucket the checkpoints are in (staged on its own disk, put
/// at each barrier), and the three subtasks' replays together emit every user's running count,
/// computed here from the generator's events.
#[test]
fn subtasks_journaled_on_workers_into_the_bucket_replay_from_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    // The coordinator has no slots: every subtask runs on a worker.
    let (s3, coordinator, _fleet, tenant_id, token) = acme_on_a_bucket(dir.path());
    expect(upload(&coordinator, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    // Every checkpoint kept, so the journal reaches back to the start.
    let yaml = common::counts_job(900)
        .replace("name: counts\n", "name: counts\nparallelism: 3\ndebug: {journal: true}\n")
        .replace("checkpoints: {interval_ms: 200}", "checkpoints: {interval_ms: 200, retained: 100}");
    let id = expect(submit(&coordinator, &token, &yaml), 201)["id"].as_str().unwrap().to_owned();
    let done = wait_job(&coordinator, &token, &id, "ended", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    let mut replayed = Vec::new();
    for subtask in 0..3 {
        let path = format!("/v1/jobs/{id}/replay?step=count&subtask={subtask}&limit=5000");
        let r = expect(common::client().get(coordinator.url(&path)).bearer_auth(&token).send().unwrap(), 200);
        let end = (&r["summary"]["end"]["end"], &r["failure"]);
        assert_eq!(end, (&serde_json::json!("finished"), &Value::Null), "{}", r["summary"]);
        for e in r["events"].as_array().unwrap().iter().filter(|e| e["event"] == "output") {
            replayed.push((e["key"].as_str().unwrap().to_owned(), e["value"].as_u64().unwrap()));
        }
        let listing =
            s3.list("eddy", &format!("cluster/tenants/{tenant_id}/jobs/{id}/checkpoints/0/journal/count/{subtask}/"));
        assert!(listing.contains("after-0.jnl"), "subtask {subtask}'s journal is in the bucket: {listing}");
    }
    replayed.sort();
    assert_eq!(replayed, common::generated_counts(&yaml), "the replays emit every running count once");
    let local = dir.path().join(format!("coordinator/tenants/{tenant_id}/jobs/{id}/checkpoints"));
    assert!(!local.exists(), "nothing is journaled on the coordinator's disk");
}

/// A bounded file source of a job on workers reads the tenant's file from the bucket: the file
/// put through the API is stored there too, and the coordinator's own copy is deleted before
/// the job is submitted, as if the workers ran on other machines. Its `file` sink becomes the
/// files sink in the bucket, which the API reads. The word counts equal a count computed here.
#[test]
fn a_file_source_on_workers_reads_the_tenants_file_from_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let (s3, coordinator, _fleet, tenant_id, token) = acme_on_a_bucket(dir.path());
    expect(upload(&coordinator, &token, eddy_guest_artifacts::WORDCOUNT_SPLIT, Some(("split", "1"))), 201);
    expect(upload(&coordinator, &token, eddy_guest_artifacts::WORDCOUNT_COUNT, Some(("count", "1"))), 201);
    let text: String = (0..3_000).map(|i| format!("w{} v{}\n", i % 200, (i * 7) % 131)).collect();
    let put = common::client().put(coordinator.url("/v1/files/input.txt")).bearer_auth(&token).body(text.clone());
    expect(put.send().unwrap(), 201);
    assert!(s3.list("eddy", &format!("cluster/tenants/{tenant_id}/files/")).contains("/input.txt</Key>"));
    std::fs::remove_file(dir.path().join("coordinator/tenants").join(&tenant_id).join("files/input.txt")).unwrap();
    let spec = "name: words\nsources: [{type: file, name: lines, path: input.txt}]\nsteps:\n  \
                - {name: split, wasm: split@1}\n  - {name: count, wasm: count@1, key_by: key, parallelism: 3}\n\
                sink: {type: file, path: counts.jsonl}\n";
    let id = expect(submit(&coordinator, &token, spec), 201)["id"].as_str().unwrap().to_owned();
    let done = wait_job(&coordinator, &token, &id, "ended", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    let (got, expected) = (common::output_counts(&coordinator, &token, &id), common::running_word_counts(&text));
    assert_eq!(got.len(), expected.len(), "row count");
    assert!(got == expected, "the counts differ from the oracle's");
    // The coordinator reads the state the workers checkpointed into the bucket: each word's
    // `count` is how often it occurs in the text.
    let mut occurrences: std::collections::BTreeMap<String, u64> = Default::default();
    for word in text.split_whitespace() {
        *occurrences.entry(word.to_owned()).or_default() += 1;
    }
    let url = coordinator.url(&format!("/v1/jobs/{id}/state?step=count&limit=1000"));
    let read = expect(common::client().get(url).bearer_auth(&token).send().unwrap(), 200);
    let state: std::collections::BTreeMap<String, u64> = read["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap().to_owned(), e["value"].as_u64().unwrap()))
        .collect();
    assert_eq!(read["truncated"], false);
    assert!(state == occurrences, "the state read from the bucket differs from the oracle's counts");
}

/// A file the store refuses is refused to the tenant too, with a 503 naming the file and the
/// store, and is not kept half-stored: it is not listed. Once the store works, the same request
/// succeeds.
#[test]
fn a_file_the_store_refuses_is_not_kept_and_can_be_put_again() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = eddy_tests::S3Service::start();
    let coordinator =
        Server::start_with_env("coordinator", &dir.path().join("coordinator"), &STORE_FLAGS, &store_env(&s3));
    let (_, token) = tenant(&coordinator, "acme");
    let put = || common::client().put(coordinator.url("/v1/files/input.txt")).bearer_auth(&token).body("a b\n").send();
    let refused = expect(put().unwrap(), 503);
    let detail = refused["detail"].as_str().unwrap();
    assert!(detail.contains("cannot store `input.txt`") && detail.contains("s3://eddy/cluster"), "{detail}");
    let listed = expect(common::client().get(coordinator.url("/v1/files")).bearer_auth(&token).send().unwrap(), 200);
    assert_eq!(listed, serde_json::json!([]), "nothing kept of the refused file");
    s3.create_bucket("eddy");
    assert_eq!(expect(put().unwrap(), 201)["name"], "input.txt");
}

/// Partitions and a slow link between real worker processes: worker-2 and worker-3 are dialed
/// through seeded fault-injecting relays (2% loss, 1% duplicates, 1–4 ms jitter, and a 400 ms
/// cut every 1.5 s), which they advertise as their data addresses. q5 slows down and still
/// produces exactly the native baseline's rows. `EDDY_RELAY_SEED` replays the faults.
#[test]
fn q5_across_worker_processes_behind_a_faulty_network_equals_the_native_baseline() {
    use eddy_transport::Faults;
    use eddy_transport::relay::Relay;
    use std::sync::atomic::Ordering;
    let seed = std::env::var("EDDY_RELAY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let cuts = (0..200).map(|i| (1_500 * i + 1_000, 1_500 * i + 1_400)).collect();
    let faults = Faults { drop: 0.02, duplicate: 0.01, delay_ms: 1, jitter_ms: 3, cuts };
    println!("relay seed {seed}: 2% loss, 1% duplicates, 1-4 ms delay, a 400 ms cut every 1.5 s");
    let net = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let coordinator = Server::start_as("coordinator", &dir.path().join("coordinator"), &[]);
    let mut relays = Vec::new();
    let mut fleet = vec![Worker::start(&coordinator, "worker-1", dir.path(), &[])];
    for i in 2..=3u64 {
        let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let relay = net.block_on(Relay::start(target, faults.clone(), seed + i)).unwrap();
        let (listen, advertise) = (format!("127.0.0.1:{port}"), relay.addr().to_string());
        let flags = ["--data-listen", listen.as_str(), "--advertise", advertise.as_str()];
        fleet.push(Worker::start(&coordinator, &format!("worker-{i}"), dir.path(), &flags));
        relays.push(relay);
    }
    eventually("three workers", || names(&coordinator).len() == 3);
    let advertised: Vec<String> =
        workers(&coordinator).iter().map(|w| w["data_addr"].as_str().unwrap().to_owned()).collect();
    for relay in &relays {
        assert!(advertised.contains(&relay.addr().to_string()), "{advertised:?}");
    }
    let (_, token) = tenant(&coordinator, "acme");
    let (spec, expected) = query(&coordinator, &token, "q5", eddy_nexmark::native::q5);
    let id = expect(submit(&coordinator, &token, &spec), 201)["id"].as_str().unwrap().to_owned();
    let done = wait_job(&coordinator, &token, &id, "ended", |j| {
        !["created", "running"].contains(&j["status"].as_str().unwrap())
    });
    assert_eq!(done["status"], "finished", "{done}");
    let mut got: Vec<String> = output_lines(&coordinator, &token, &id).iter().map(|l| l["value"].to_string()).collect();
    got.sort();
    assert_eq!(got.len(), expected.len(), "row count: {done}");
    assert!(got == expected, "rows differ from the native baseline");
    let lost: u64 = relays.iter().map(|r| r.stats().dropped.load(Ordering::Relaxed)).sum();
    let carried: u64 = relays.iter().map(|r| r.stats().received.load(Ordering::Relaxed)).sum();
    println!("the relays carried {carried} datagrams and lost {lost}");
    assert!(lost > 0, "the faults must have struck for the test to mean anything");
}

/// The polyglot pipeline (TypeScript, Python, Rust and Go steps) on three worker
/// processes, paced so that four SIGKILLs of its workers land while it runs, each after a
/// checkpoint: the committed alerts are exactly those computed plainly from the generator's
/// events, none lost, none twice.
#[test]
fn the_polyglot_pipeline_on_workers_killed_under_it_alerts_exactly_once() {
    const KILLS: usize = 4;
    let mut rng = Rng::from_env();
    let dir = tempfile::tempdir().unwrap();
    let (_s3, coordinator, mut fleet, _tenant, token) = acme_on_a_bucket(dir.path());
    // ~20 s at 1 500 events/s, 60 s of event time: room for the kills.
    let (job_spec, oracle) = common::polyglot_job(&coordinator, &token, 30_000, Some(1_500));
    let id = expect(submit(&coordinator, &token, &job_spec), 201)["id"].as_str().unwrap().to_owned();
    let mut attempts = 0;
    for kill in 1..=KILLS {
        let j = wait_job(&coordinator, &token, &id, "checkpointing again", |j| {
            j["status"] == "finished"
                || (j["attempts"].as_u64() >= Some(attempts)
                    && j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty()))
        });
        assert_ne!(j["status"], "finished", "the job ended after {} kills: make it longer", kill - 1);
        std::thread::sleep(std::time::Duration::from_millis(rng.below(600)));
        let used = used_workers(&j);
        let victim = used[rng.below(used.len() as u64) as usize];
        fleet.remove(victim).kill_9();
        fleet.insert(victim, Worker::start(&coordinator, &format!("worker-{}", victim + 1), dir.path(), &[]));
        attempts = j["attempts"].as_u64().unwrap() + 1;
        println!("kill {kill} of worker-{}", victim + 1);
    }
    let done = wait_job(&coordinator, &token, &id, "ended", |j| {
        !["created", "running", "restarting"].contains(&j["status"].as_str().unwrap())
    });
    assert_eq!(done["status"], "finished", "{done}");
    common::assert_alerts_once(&coordinator, &token, &id, &oracle);
}

/// A guest that panics on a worker: the worker sends its failure taken apart, and the
/// coordinator shows the guest's message apart from the cause chain, led by the worker's part.
#[test]
fn a_guests_panic_on_a_worker_is_shown_apart_from_the_cause_chain_led_by_the_workers_part() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator =
        Server::start_as("coordinator", &dir.path().join("coordinator"), &["--heartbeat-timeout-ms", "2000"]);
    let _worker = Worker::start(&coordinator, "worker-1", dir.path(), &[]);
    eventually("the worker registered", || names(&coordinator) == ["worker-1"]);
    let (_, token) = tenant(&coordinator, "acme");
    expect(upload(&coordinator, &token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    let id = expect(submit(&coordinator, &token, PANIC_JOB), 201)["id"].as_str().unwrap().to_string();
    let failed =
        wait_job(&coordinator, &token, &id, "failed", |j| j["status"] == "failed" || j["status"] == "finished");
    assert_panic_failure(&failed, &["the part on worker `worker-1`".to_owned()]);
}
