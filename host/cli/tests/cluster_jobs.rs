//! Jobs on a cluster of real processes: a coordinator (no slots of its own) and three workers on
//! this machine. Nexmark q5 and q8 spread over the three workers produce exactly the rows of
//! the native baseline (an independent oracle); `GET /v1/jobs/{id}` names each subtask's
//! worker and `GET /v1/workers` counts the slots the job holds.
#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::fleet::{Worker, eventually, names, workers};
use common::{Server, expect, job, output_lines, submit, tenant, upload, wait_job};
use eddy_plan::{PipelineSpec, SinkSpec, SourceSpec};
use serde_json::Value;

const EVENTS: u64 = 12_000;

/// A coordinator and three workers of two slots each, all registered.
fn cluster(dir: &Path) -> (Server, Vec<Worker>) {
    let coordinator = Server::start_as("coordinator", &dir.join("coordinator"), &["--heartbeat-timeout-ms", "2000"]);
    let fleet: Vec<Worker> = (1..=3).map(|i| Worker::start(&coordinator, &format!("worker-{i}"), dir, &[])).collect();
    eventually("three workers", || names(&coordinator).len() == 3);
    (coordinator, fleet)
}

/// `query`'s spec at parallelism 3 over `EVENTS` events with a files sink, each step's
/// component uploaded and named by digest; and the native baseline's rows, sorted.
fn query(
    server: &Server,
    token: &str,
    name: &str,
    native: fn(Vec<eddy_nexmark::Event>) -> Vec<Value>,
) -> (String, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../examples/nexmark/{name}.yaml"));
    let mut spec = PipelineSpec::from_file(&path).unwrap();
    spec.parallelism = 3;
    for step in &mut spec.steps {
        step.parallelism = None;
        let uploaded = upload(server, token, step.wasm.to_str().unwrap(), None);
        let digest = uploaded.json::<Value>().unwrap()["digest"].as_str().unwrap().to_owned();
        step.wasm = digest.into();
    }
    for source in &mut spec.sources {
        if let SourceSpec::Nexmark(s) = source {
            s.events = Some(EVENTS);
            s.parallelism = 3;
        }
    }
    let SourceSpec::Nexmark(source) = &spec.sources[0] else { panic!("{name} reads the nexmark source") };
    let events: Vec<eddy_nexmark::Event> = eddy_nexmark::events(&source.config()).collect();
    let mut expected: Vec<String> = native(events).iter().map(Value::to_string).collect();
    expected.sort();
    assert!(!expected.is_empty(), "{name}: the baseline must produce rows");
    spec.sink = SinkSpec::Files { dir: "out".into() };
    // JSON is YAML too.
    (serde_json::to_string(&spec).unwrap(), expected)
}

#[test]
fn nexmark_q5_and_q8_on_three_workers_equal_the_native_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, _fleet) = cluster(dir.path());
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
