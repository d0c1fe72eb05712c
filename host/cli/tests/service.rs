//! `eddy serve` as a user meets it: a real server process, real HTTP requests from this one.

// Helpers outside `#[test]` functions fail the test they serve when they panic.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    PANIC_JOB, Server, assert_counted_once, assert_output_swapped_at, assert_panic_failure, client, counts_job, expect,
    job, output_lines, post, submit, swap_point, tenant, upload, wait_job,
};
use reqwest::blocking::Response;
use serde_json::{Value, json};

const WORDCOUNT: &str = "name: wordcount
sources:
  - {type: file, name: lines, path: input.txt, format: lines}
steps:
  - {name: split, wasm: split@1}
  - {name: count, wasm: count@1, key_by: key, parallelism: 2}
sink: {type: print}
";

#[test]
fn a_tenant_uploads_the_word_count_submits_it_and_reads_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(server.dir.join("admin.token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the admin token is readable by its owner only");
    }
    let (tenant_id, token) = tenant(&server, "acme");
    let split = expect(upload(&server, &token, eddy_guest_artifacts::WORDCOUNT_SPLIT, Some(("split", "1"))), 201);
    assert_eq!(split["world"], "keyed-operator");
    assert!(split["digest"].as_str().unwrap().starts_with("sha256:"));
    let again = expect(upload(&server, &token, eddy_guest_artifacts::WORDCOUNT_SPLIT, None), 200);
    assert_eq!(again["digest"], split["digest"], "the same bytes are one artifact");
    expect(upload(&server, &token, eddy_guest_artifacts::WORDCOUNT_COUNT, Some(("count", "1"))), 201);
    let listed = expect(client().get(server.url("/v1/artifacts")).bearer_auth(&token).send().unwrap(), 200);
    assert_eq!(listed.as_array().unwrap().len(), 2);

    let text = "the quick fox\nthe lazy dog\nthe fox\n";
    let files = server.dir.join("tenants").join(&tenant_id).join("files");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("input.txt"), text).unwrap();
    let journaled = WORDCOUNT.replace("parallelism: 2}", "parallelism: 2, debug: {journal: true}}");
    let submitted = expect(submit(&server, &token, &journaled), 201);
    let id = submitted["id"].as_str().unwrap();
    let done = wait_job(&server, &token, id, "finished", |j| j["status"] != "running" && j["status"] != "created");
    assert_eq!(done["status"], "finished", "{done}");

    // The oracle: a running count per word emits 1..=n for a word seen n times.
    assert_eq!(common::output_counts(&server, &token, id), common::running_word_counts(text));

    // The state behind it, from the final checkpoint: each word's `count` is how often it
    // occurs (counted here, from the text).
    let mut occurrences: BTreeMap<String, u64> = BTreeMap::new();
    for word in text.split_whitespace() {
        *occurrences.entry(word.to_owned()).or_default() += 1;
    }
    let state = |token: &str, query: &str| {
        client().get(server.url(&format!("/v1/jobs/{id}/state?{query}"))).bearer_auth(token).send().unwrap()
    };
    let read = expect(state(&token, "step=count"), 200);
    let counts: BTreeMap<String, u64> = read["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!((&e["state"], &e["kind"]), (&json!("count"), &json!("value")), "{e}");
            (e["key"].as_str().unwrap().to_owned(), e["value"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(counts, occurrences);
    assert_eq!(read["truncated"], false);
    let one = expect(state(&token, "step=count&key=the"), 200);
    assert_eq!(
        one["entries"],
        json!([{"key": "the", "key_group": one["entries"][0]["key_group"], "state": "count", "kind": "value", "value": 3}])
    );
    let two = expect(state(&token, "step=count&limit=2"), 200);
    assert_eq!((two["entries"].as_array().unwrap().len(), &two["truncated"]), (2, &json!(true)));
    // Wrong step, wrong state, bad queries: each named; another tenant sees no such job.
    let missing = expect(state(&token, "step=nope"), 404);
    assert!(
        missing["detail"].as_str().unwrap().contains("no state of step `nope`; steps with state: count, split"),
        "{missing}"
    );
    let missing = expect(state(&token, "step=count&state=nope"), 404);
    assert!(missing["detail"].as_str().unwrap().contains("declares no state `nope`"), "{missing}");
    assert!(!missing["detail"].as_str().unwrap().contains(server.dir.to_str().unwrap()), "no server path: {missing}");
    expect(state(&token, "step=count&limit=0"), 422);
    expect(state(&token, "step=count&limit=1000001"), 422);
    expect(state(&token, &format!("step=count&key={}", "k".repeat(5000))), 422);
    expect(state(&token, "step=count&what=1"), 400);
    expect(state(&token, "key=the"), 400);
    expect(state(&token, "step=count&limit=-1"), 400);
    let (_, other) = tenant(&server, "other");
    expect(state(&other, "step=count"), 404);
    expect(state("eddy_wrong", "step=count"), 401);

    // Replayed from the journal in the server: both subtasks together emit each word's
    // running count (the oracle above), a key shows only its records, and requests are bounded.
    let replay = |token: &str, query: &str| {
        client().get(server.url(&format!("/v1/jobs/{id}/replay?{query}"))).bearer_auth(token).send().unwrap()
    };
    let mut replayed = Vec::new();
    for subtask in 0..2 {
        let r = expect(replay(&token, &format!("step=count&subtask={subtask}")), 200);
        assert_eq!((&r["summary"]["end"]["end"], &r["failure"]), (&json!("finished"), &json!(null)), "{r}");
        for e in r["events"].as_array().unwrap().iter().filter(|e| e["event"] == "output") {
            replayed.push((e["key"].as_str().unwrap().to_owned(), e["value"].as_u64().unwrap()));
        }
    }
    replayed.sort();
    assert_eq!(replayed, common::running_word_counts(text));
    let owner = expect(replay(&token, "step=count&subtask=0&key=the"), 200)["summary"]["key_subtask"].clone();
    let the = expect(replay(&token, &format!("step=count&subtask={owner}&key=the")), 200);
    let inputs: Vec<&Value> = the["events"].as_array().unwrap().iter().filter(|e| e["event"] == "input").collect();
    assert_eq!(inputs.len(), 3, "`the` occurs three times: {the}");
    assert!(inputs.iter().all(|e| e["key"] == "the"), "{the}");
    let three = expect(replay(&token, "step=count&subtask=0&limit=3"), 200);
    assert_eq!(
        (three["events"].as_array().unwrap().len(), &three["summary"]["end"]["end"]),
        (3, &json!("event_limit"))
    );
    let unjournaled = expect(replay(&token, "step=split&subtask=0"), 404);
    let detail = unjournaled["detail"].as_str().unwrap();
    assert!(detail.contains("debug: {journal: true}") && !detail.contains(server.dir.to_str().unwrap()), "{detail}");
    expect(replay(&token, "step=count&subtask=0&limit=0"), 422);
    expect(replay(&token, "step=count&subtask=0&until=1000001"), 422);
    expect(replay(&token, "step=count"), 400);
    expect(replay(&other, "step=count&subtask=0"), 404);
    // A step is a name, never a path out of the job's journal; a subtask it never had has none.
    let escape = expect(replay(&token, "step=..%2F..%2F..%2Fcount&subtask=0"), 422);
    assert!(escape["detail"].as_str().unwrap().contains("is not a name"), "{escape}");
    expect(replay(&token, "step=count&subtask=4000000000"), 404);

    assert!(job(&server, &token, id)["plan"].as_str().unwrap().contains("count"), "the job shows its plan");
    let shown = expect(
        client()
            .get(server.url(&format!("/v1/artifacts/{}", split["digest"].as_str().unwrap())))
            .bearer_auth(&token)
            .send()
            .unwrap(),
        200,
    );
    assert_eq!(shown["used_by"], json!([id]));
}

#[test]
fn tokens_and_tenants_keep_callers_apart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, a) = tenant(&server, "a");
    let (b_id, b) = tenant(&server, "b");
    let jobs = server.url("/v1/jobs");

    let none = expect(client().get(&jobs).send().unwrap(), 401);
    assert_eq!(none["field"], "Authorization");
    let wrong = expect(client().get(&jobs).bearer_auth("eddy_not-a-token").send().unwrap(), 401);
    assert!(wrong["detail"].as_str().unwrap().contains("unknown token"), "{wrong}");
    let admin = expect(client().get(&jobs).bearer_auth(server.admin()).send().unwrap(), 403);
    assert!(admin["detail"].as_str().unwrap().contains("tenant"), "{admin}");
    expect(client().get(server.url("/v1/tenants")).bearer_auth(&a).send().unwrap(), 403);
    let dup = client().post(server.url("/v1/tenants")).bearer_auth(server.admin()).json(&json!({"name": "a"})).send();
    expect(dup.unwrap(), 409);

    // A's artifact and job are invisible to B: the same 404 as something missing.
    let art = expect(upload(&server, &a, eddy_guest_artifacts::WORDCOUNT_SPLIT, Some(("split", "1"))), 201);
    expect(upload(&server, &a, eddy_guest_artifacts::WORDCOUNT_COUNT, Some(("count", "1"))), 201);
    let digest = art["digest"].as_str().unwrap();
    let from_b =
        expect(client().get(server.url(&format!("/v1/artifacts/{digest}"))).bearer_auth(&b).send().unwrap(), 404);
    assert!(from_b["detail"].as_str().unwrap().contains(digest));
    assert_eq!(expect(client().get(server.url("/v1/artifacts")).bearer_auth(&b).send().unwrap(), 200), json!([]));
    let refused = expect(submit(&server, &b, WORDCOUNT), 422);
    assert_eq!(refused["field"], "steps[0].wasm", "B cannot run A's artifacts: {refused}");
    let id = expect(submit(&server, &a, WORDCOUNT), 201)["id"].as_str().unwrap().to_string();
    expect(client().get(server.url(&format!("/v1/jobs/{id}"))).bearer_auth(&b).send().unwrap(), 404);
    expect(client().delete(server.url(&format!("/v1/jobs/{id}"))).bearer_auth(&b).send().unwrap(), 404);
    expect(client().post(server.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(&b).send().unwrap(), 404);
    expect(client().get(server.url(&format!("/v1/jobs/{id}/output"))).bearer_auth(&b).send().unwrap(), 404);

    // A second token for B works until revoked.
    let issued = expect(
        client().post(server.url(&format!("/v1/tenants/{b_id}/tokens"))).bearer_auth(server.admin()).send().unwrap(),
        201,
    );
    let second = issued["token"].as_str().unwrap();
    expect(client().get(&jobs).bearer_auth(second).send().unwrap(), 200);
    let revoke = server.url(&format!("/v1/tenants/{b_id}/tokens/{}", issued["token_id"].as_str().unwrap()));
    expect(client().delete(revoke).bearer_auth(server.admin()).send().unwrap(), 204);
    let revoked = expect(client().get(&jobs).bearer_auth(second).send().unwrap(), 401);
    assert!(revoked["detail"].as_str().unwrap().contains("revoked"));
    expect(client().get(&jobs).bearer_auth(&b).send().unwrap(), 200);
}

#[test]
fn bad_uploads_and_specs_are_refused_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--max-artifact-bytes", "300000"]);
    let (_, token) = tenant(&server, "acme");
    let post =
        |body: Vec<u8>| client().post(server.url("/v1/artifacts")).bearer_auth(&token).body(body).send().unwrap();
    let garbage = expect(post(b"this is not wasm at all".to_vec()), 422);
    assert!(garbage["detail"].as_str().unwrap().contains("not a WebAssembly binary"), "{garbage}");
    let core = expect(post(b"\0asm\x01\0\0\0".to_vec()), 422);
    assert!(core["detail"].as_str().unwrap().contains("core WebAssembly module"), "{core}");
    let wrong_world = expect(post(std::fs::read(eddy_guest_artifacts::MISSING_EXPORT).unwrap()), 422);
    assert!(wrong_world["detail"].as_str().unwrap().contains("wit/dataflow.wit"), "{wrong_world}");
    expect(post(Vec::new()), 422);
    let label =
        client().post(server.url("/v1/artifacts?name=Split&version=1")).bearer_auth(&token).body(vec![1]).send();
    assert_eq!(expect(label.unwrap(), 422)["field"], "name");

    // Over the limit: refused from the declared length, before the body is read ...
    let declared =
        raw_upload(&server, &token, &format!("Content-Length: {}\r\n", 50u64 << 20), |s| s.write_all(&[0u8; 4096]));
    assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");
    assert!(declared.contains("at most 300000 bytes"), "{declared}");
    // ... and without one, cut off once past the limit (the rest is never read).
    let chunked = raw_upload(&server, &token, "Transfer-Encoding: chunked\r\n", |s| {
        for _ in 0..200 {
            s.write_all(b"1000\r\n")?;
            s.write_all(&[0u8; 4096])?;
            s.write_all(b"\r\n")?;
        }
        s.write_all(b"0\r\n\r\n")
    });
    assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
    let incoming = std::fs::read_dir(server.dir.join("artifacts/.incoming")).unwrap().count();
    assert_eq!(incoming, 0, "a refused upload leaves nothing behind");

    // Each refusal names what was wrong: the field, or the unknown key in the detail.
    let spec_error = |yaml: &str, status: u16, names: &str| {
        let problem = expect(submit(&server, &token, yaml), status);
        assert!(problem["field"] == names || problem["detail"].as_str().unwrap().contains(names), "{problem}");
    };
    spec_error(&WORDCOUNT.replace("format: lines}", "format: lines, colour: red}"), 422, "colour");
    spec_error(WORDCOUNT, 422, "steps[0].wasm");
    expect(upload(&server, &token, eddy_guest_artifacts::WORDCOUNT_SPLIT, Some(("split", "1"))), 201);
    expect(upload(&server, &token, eddy_guest_artifacts::WORDCOUNT_COUNT, Some(("count", "1"))), 201);
    spec_error(&WORDCOUNT.replace("path: input.txt", "path: ../../admin.token"), 422, "sources[0].path");
    spec_error(&WORDCOUNT.replace("path: input.txt", "path: /etc/passwd"), 422, "sources[0].path");
    // A Kafka source may not read the server's environment, nor a sink reach the server itself
    // (connections.rs tests the rest of what connectors may not do).
    let kafka = "{type: kafka, name: lines, brokers: \"127.0.0.1:9\", topics: [t], format: lines, properties: \
                 {sasl.password: {env: EDDY_ADMIN_TOKEN}}}";
    spec_error(
        &WORDCOUNT.replace("{type: file, name: lines, path: input.txt, format: lines}", kafka),
        422,
        "sources[0].properties.sasl.password",
    );
    let to_kafka = format!("{{type: kafka, brokers: \"127.0.0.1:{}\", topic: t}}", server.port());
    spec_error(&WORDCOUNT.replace("{type: print}", &to_kafka), 422, "sink.brokers");
    spec_error(&WORDCOUNT.replace("parallelism: 2}", "parallelism: 5}"), 409, "parallelism");
    spec_error(
        &WORDCOUNT.replace("parallelism: 2}", "parallelism: 2, debug: {journal_max_mb: 0}}"),
        422,
        "steps[1].debug.journal_max_mb",
    );
    let json_type = client()
        .post(server.url("/v1/jobs"))
        .bearer_auth(&token)
        .header("content-type", "text/plain")
        .body(WORDCOUNT)
        .send();
    assert_eq!(expect(json_type.unwrap(), 415)["field"], "Content-Type");
    for name in ["..%2Fadmin.token", ".hidden", "a%2Fb"] {
        let put = client().put(server.url(&format!("/v1/files/{name}"))).bearer_auth(&token).body("x").send();
        assert_eq!(expect(put.unwrap(), 422)["field"], "name", "{name}");
    }
    let other_version = upload(&server, &token, eddy_guest_artifacts::WORDCOUNT_COUNT, Some(("split", "1")));
    assert_eq!(expect(other_version, 409)["field"], "version");
}

/// Sends an upload by hand (to control framing) and returns the answer as text. Writing may
/// fail once the server refused and closed: that is the point, so only the answer counts.
fn raw_upload(
    server: &Server,
    token: &str,
    framing: &str,
    body: impl FnOnce(&mut TcpStream) -> std::io::Result<()>,
) -> String {
    let mut stream = TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!("POST /v1/artifacts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n{framing}\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let _ = body(&mut stream);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn savepoints_stops_rescales_and_upgrades_keep_state_and_output_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    let first = expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let events = 9_000;
    let id = expect(submit(&server, &token, &counts_job(events)), 201)["id"].as_str().unwrap().to_string();
    let checkpointed = |j: &Value| j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty());
    wait_job(&server, &token, &id, "checkpointed", checkpointed);

    let taken = expect(post(&server, &token, &format!("/v1/jobs/{id}/savepoints"), json!({})), 201);
    assert_eq!(taken["reason"], "requested");
    assert_eq!(job(&server, &token, &id)["status"], "running", "a savepoint does not stop the job");

    let refused = expect(post(&server, &token, &format!("/v1/jobs/{id}/rescale"), json!({"parallelism": 0})), 422);
    assert_eq!(refused["field"], "parallelism");
    expect(post(&server, &token, &format!("/v1/jobs/{id}/rescale"), json!({"parallelism": 2})), 200);
    let rescaled = wait_job(&server, &token, &id, "running at parallelism 2", |j| {
        j["live"]["tasks"].as_array().is_some_and(|t| t.iter().any(|t| t["parallelism"] == 2))
    });
    assert_eq!(rescaled["generation"], 1);
    assert_eq!(rescaled["slots"], 2);

    // The same component under a new name: the step restarts from a savepoint on it.
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "2"))), 200);
    let bad = expect(
        post(&server, &token, &format!("/v1/jobs/{id}/upgrade"), json!({"step": "cnt", "wasm": "count@2"})),
        422,
    );
    assert_eq!(bad["field"], "step");
    let up = expect(
        post(&server, &token, &format!("/v1/jobs/{id}/upgrade"), json!({"step": "count", "wasm": "count@2"})),
        200,
    );
    assert_eq!(up["reason"], "upgrade");
    let done = wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    assert_eq!(done["generation"], 2);
    let reasons: Vec<&str> =
        done["savepoints"].as_array().unwrap().iter().map(|s| s["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["requested", "rescale", "upgrade"]);
    assert_counted_once(&server, &token, &id, events);
    assert_eq!(first["digest"], done["artifacts"][0]);

    // Stop: a savepoint, then status `stopped`; nothing more can be asked of it.
    let second = expect(submit(&server, &token, &counts_job(100_000)), 201)["id"].as_str().unwrap().to_string();
    wait_job(&server, &token, &second, "checkpointed", checkpointed);
    let stopped = expect(post(&server, &token, &format!("/v1/jobs/{second}/stop"), json!({})), 200);
    assert_eq!(stopped["reason"], "stop");
    assert_eq!(job(&server, &token, &second)["status"], "stopped");
    let again = expect(post(&server, &token, &format!("/v1/jobs/{second}/savepoints"), json!({})), 409);
    assert!(again["detail"].as_str().unwrap().contains("stopped"), "{again}");
}

#[test]
fn sigterm_takes_savepoints_and_the_next_start_resumes_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let events = 6_000;
    let id = expect(submit(&server, &token, &counts_job(events)), 201)["id"].as_str().unwrap().to_string();
    wait_job(&server, &token, &id, "checkpointed", |j| {
        j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
    });
    server.terminate();

    let server = Server::start(&data, &[]);
    let resumed = wait_job(&server, &token, &id, "resumed", |j| j["live"]["restored_from"].is_u64());
    assert_eq!(resumed["savepoints"][0]["reason"], "shutdown", "{resumed}");
    assert_eq!(resumed["live"]["restored_from"], resumed["savepoints"][0]["id"], "resumed from the savepoint");
    let done = wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    assert_counted_once(&server, &token, &id, events);
}

#[test]
fn a_server_killed_with_sigkill_resumes_its_jobs_from_their_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let events = 6_000u64;
    let yaml = counts_job(events);
    let id = expect(submit(&server, &token, &yaml), 201)["id"].as_str().unwrap().to_string();
    wait_job(&server, &token, &id, "checkpointed", |j| {
        j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
    });
    server.kill_9();

    let server = Server::start(&data, &[]);
    // The generator paces 6 000 events over 4 s and the kill came at the first checkpoint, so
    // the resumed attempt runs long enough to be seen restored.
    wait_job(&server, &token, &id, "resumed from a checkpoint", |j| j["live"]["restored_from"].is_u64());
    let done = wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");

    // Exactly once across the kill.
    assert_counted_once(&server, &token, &id, events);
}

#[test]
fn the_openapi_document_lists_every_route_and_every_route_answers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let doc = expect(client().get(server.url("/v1/openapi.json")).send().unwrap(), 200);
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
    let mut routes = Vec::new();
    for (path, methods) in doc["paths"].as_object().unwrap() {
        for method in methods.as_object().unwrap().keys() {
            routes.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    routes.sort();
    let mut expected = [
        "DELETE /v1/artifacts/{reference}",
        "DELETE /v1/files/{name}",
        "DELETE /v1/jobs/{id}",
        "DELETE /v1/jobs/{id}/savepoints/{name}",
        "DELETE /v1/tenants/{id}/tokens/{token_id}",
        "GET /v1/artifacts",
        "GET /v1/files",
        "GET /v1/artifacts/{reference}",
        "GET /v1/jobs",
        "GET /v1/jobs/{id}",
        "GET /v1/jobs/{id}/output",
        "GET /v1/jobs/{id}/replay",
        "GET /v1/jobs/{id}/state",
        "GET /v1/tenants",
        "GET /v1/whoami",
        "GET /v1/workers",
        "GET /v1/quotas",
        "PUT /v1/tenants/{id}/quotas",
        "GET /metrics",
        "POST /v1/artifacts",
        "GET /v1/artifacts/compiles",
        "GET /v1/artifacts/compiles/{digest}",
        "POST /v1/cluster/enroll",
        "POST /v1/cluster/join-tokens",
        "POST /v1/jobs",
        "POST /v1/jobs/{id}/cancel",
        "POST /v1/jobs/{id}/resume",
        "POST /v1/jobs/{id}/rescale",
        "POST /v1/jobs/{id}/savepoints",
        "POST /v1/jobs/{id}/stop",
        "POST /v1/jobs/{id}/upgrade",
        "POST /v1/tenants",
        "POST /v1/tenants/{id}/tokens",
        "PUT /v1/files/{name}",
        "GET /v1/connections",
        "GET /v1/connections/{name}",
        "PUT /v1/connections/{name}",
        "DELETE /v1/connections/{name}",
    ];
    expected.sort();
    assert_eq!(routes, expected);
    // Each documented route is served: without a token it answers 401, not 404 or 405.
    for route in &routes {
        let (method, path) = route.split_once(' ').unwrap();
        let url = server.url(
            &path
                .replace("{id}", "x")
                .replace("{reference}", "x")
                .replace("{token_id}", "x")
                .replace("{name}", "x")
                .replace("{digest}", "x"),
        );
        let response = client().request(method.parse().unwrap(), url).send().unwrap();
        // Served, and wanting a token: 401, or 429 once this source sent many requests without.
        if response.status() == 429 {
            continue;
        }
        if route == "POST /v1/cluster/enroll" {
            // Workers have no API token: enrollment takes a join token, checked after who asks
            // (only a coordinator running its own CA enrolls), here for the missing body first.
            assert!(response.status().is_client_error() && ![404, 405].contains(&response.status().as_u16()));
            continue;
        }
        assert_eq!(response.status(), 401, "{route}");
    }
    // On `eddy serve` (no cluster) enrollment is refused, naming why.
    let refused = client().post(server.url("/v1/cluster/enroll")).json(&json!({ "name": "w" })).send().unwrap();
    assert_eq!(refused.status(), 403);
}

/// Runs the `eddy` client with `args` against `server`, with its login file in `config`.
fn eddy(config: &Path, args: &[&str]) -> std::process::Output {
    let output = Command::new(env!("CARGO_BIN_EXE_eddy")).args(args).env("EDDY_CONFIG", config).output().unwrap();
    assert!(
        output.status.success(),
        "eddy {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap().trim().to_string()
}

#[test]
fn the_cli_logs_in_submits_the_word_count_with_its_files_and_reads_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let config = dir.path().join("login.json");
    let admin = server.admin();
    let created = eddy(&config, &["tenants", "create", "acme", "--server", &server.base, "--token", &admin]);
    let token = stdout(&created);
    assert!(token.starts_with("eddy_"), "{token}");
    let login = eddy(&config, &["login", "--server", &server.base, "--token", &token]);
    assert!(String::from_utf8_lossy(&login.stderr).contains("as tenant acme"));

    // The repository's own word count (the variant that journals its count step): its `.wasm`
    // paths and input file are local, so `submit` uploads them first.
    let pipeline = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/wordcount/replay.yaml");
    let submitted = eddy(&config, &["submit", pipeline.to_str().unwrap(), "--watch"]);
    let log = String::from_utf8_lossy(&submitted.stderr);
    assert!(log.contains("uploaded") && log.contains("input.txt"), "{log}");
    assert!(log.contains("compiled in"), "the upload says how long its compile took: {log}");
    let id = stdout(&submitted).lines().next().unwrap().to_string();
    assert!(stdout(&submitted).contains("status finished"), "{}", stdout(&submitted));

    // The oracle: words are maximal alphanumeric runs, lower-cased; a running count per word
    // emits 1..=n for a word seen n times.
    let input = std::fs::read_to_string(pipeline.with_file_name("input.txt")).unwrap();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for word in input.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        *seen.entry(word.to_lowercase()).or_default() += 1;
    }
    let mut expected: Vec<(String, u64)> =
        seen.iter().flat_map(|(w, n)| (1..=*n).map(move |k| (w.clone(), k))).collect();
    expected.sort();
    let mut got: Vec<(String, u64)> = stdout(&eddy(&config, &["output", &id]))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["key"].as_str().unwrap().to_string(), v["value"].as_u64().unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, expected);
    // `eddy state JOB` reads the state behind it through the server: each word's count.
    let state: BTreeMap<String, u64> =
        stdout(&eddy(&config, &["state", &id, "--step", "count", "--format", "jsonl", "--limit", "1000"]))
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["key"].as_str().unwrap().to_string(), v["value"].as_u64().unwrap()))
            .collect();
    assert_eq!(state, seen);
    let the = stdout(&eddy(&config, &["state", &id, "--step", "count", "--key", "the"]));
    assert!(the.ends_with(&format!("\"the\"  count  = {}", seen["the"])), "{the}");
    // `eddy replay JOB` replays each subtask through the server: together they emit the
    // running counts again.
    let mut replayed: Vec<(String, u64)> = Vec::new();
    for subtask in ["0", "1"] {
        let args = ["replay", &id, "--step", "count", "--subtask", subtask, "--format", "jsonl"];
        let lines: Vec<Value> =
            stdout(&eddy(&config, &args)).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.last().unwrap()["end"]["end"], "finished", "{lines:?}");
        replayed.extend(
            lines
                .iter()
                .filter(|v| v["event"] == "output")
                .map(|v| (v["key"].as_str().unwrap().to_string(), v["value"].as_u64().unwrap())),
        );
    }
    replayed.sort();
    assert_eq!(replayed, expected);
    let jobs = stdout(&eddy(&config, &["jobs"]));
    assert!(jobs.contains(&id) && jobs.contains("finished"), "{jobs}");
    // A step naming a file that is not there is reported before anything is sent.
    let missing = dir.path().join("missing.yaml");
    std::fs::write(&missing, WORDCOUNT.replace("split@1", "no/such.wasm")).unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_eddy"))
        .args(["submit", missing.to_str().unwrap()])
        .env("EDDY_CONFIG", &config)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("steps[0].wasm: `no/such.wasm` is no file here"));
    // A bad token is refused with the server's own words.
    let refused = Command::new(env!("CARGO_BIN_EXE_eddy"))
        .args(["jobs", "--server", &server.base, "--token", "eddy_wrong"])
        .env("EDDY_CONFIG", &config)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401 Unauthorized: unknown token"));
}

/// The value of the first sample of `metric` whose labels contain `label`.
fn sample(text: &str, metric: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn metrics_show_each_tenant_its_own_jobs_and_the_admin_all() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (a_id, a) = tenant(&server, "a");
    let (b_id, b) = tenant(&server, "b");
    let mut jobs = Vec::new();
    for token in [&a, &b] {
        expect(upload(&server, token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
        let id = expect(submit(&server, token, &counts_job(1_000_000)), 201)["id"].as_str().unwrap().to_string();
        wait_job(&server, token, &id, "checkpointed", |j| {
            j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
        });
        jobs.push(id);
    }
    let scrape = |token: &str| {
        let r = client().get(server.url("/metrics")).bearer_auth(token).send().unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
        r.text().unwrap()
    };
    let a_label = format!("tenant=\"{a_id}\"");
    let first = scrape(&a);
    assert!(first.contains(&a_label) && !first.contains(&b_id), "a tenant sees only its own series:\n{first}");
    let before = sample(&first, "eddy_task_records_in_total", &a_label).expect("a records-in sample");
    assert!(sample(&first, "eddy_job_last_checkpoint_size_bytes", &a_label).is_some_and(|b| b > 0.0), "{first}");
    let count_task = format!("{a_label},job=\"{}\",name=\"counts\",task=\"1\"", jobs[0]);
    assert!(sample(&first, "eddy_task_wasm_memory_bytes", &count_task).is_some_and(|b| b > 0.0), "{first}");
    assert!(sample(&first, "eddy_task_cpu_seconds_total", &count_task).is_some_and(|s| s > 0.0), "{first}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sample(&scrape(&a), "eddy_task_records_in_total", &a_label).unwrap_or(0.0) <= before {
        assert!(Instant::now() < deadline, "records in never rose");
        std::thread::sleep(Duration::from_millis(100));
    }
    let all = scrape(&server.admin());
    assert!(all.contains(&a_label) && all.contains(&format!("tenant=\"{b_id}\"")), "{all}");
    for (token, id) in [&a, &b].into_iter().zip(&jobs) {
        expect(client().post(server.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(token).send().unwrap(), 202);
    }
}

#[test]
fn quotas_refuse_what_would_pass_them_naming_the_quota_and_nothing_else_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (id, token) = tenant(&server, "acme");
    let count_size = std::fs::metadata(eddy_guest_artifacts::RUNNING_COUNT).unwrap().len();
    let set = |quotas: Value| {
        let r = client().put(server.url(&format!("/v1/tenants/{id}/quotas"))).bearer_auth(server.admin()).json(&quotas);
        expect(r.send().unwrap(), 200)
    };
    let refused = |response: Response, quota: &str| {
        let problem = expect(response, 403);
        assert_eq!(problem["field"], format!("quotas.{quota}"), "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("exceeded"), "{problem}");
    };
    expect(
        client()
            .put(server.url(&format!("/v1/tenants/{id}/quotas")))
            .bearer_auth(&token)
            .json(&json!({}))
            .send()
            .unwrap(),
        403,
    );
    set(json!({"jobs": 1, "slots": 1, "artifact_bytes": count_size + 10}));

    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    refused(upload(&server, &token, eddy_guest_artifacts::WORDCOUNT_SPLIT, None), "artifact_bytes");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, None), 200);

    let first = expect(submit(&server, &token, &counts_job(1_000_000)), 201)["id"].as_str().unwrap().to_string();
    refused(submit(&server, &token, &counts_job(10)), "jobs");
    set(json!({"jobs": 2, "slots": 1}));
    refused(submit(&server, &token, &counts_job(10)), "slots");
    refused(post(&server, &token, &format!("/v1/jobs/{first}/rescale"), json!({"parallelism": 2})), "slots");
    set(json!({"jobs": 2, "slots": 2, "state_bytes": 1 << 20}));
    // State on disk (RocksDB) counts against `state_bytes`; state on the heap is memory.
    let on_disk = counts_job(10).replace("checkpoints:", "state: {backend: rocksdb}\ncheckpoints:");
    refused(submit(&server, &token, &on_disk), "state_bytes");
    set(json!({"jobs": 2, "slots": 2, "state_bytes": 1 << 20, "memory_bytes": 1 << 20}));
    refused(submit(&server, &token, &counts_job(10)), "memory_bytes");
    set(json!({"jobs": 2, "slots": 2, "state_bytes": 1 << 20}));

    let report = expect(client().get(server.url("/v1/quotas")).bearer_auth(&token).send().unwrap(), 200);
    assert_eq!(report["usage"]["jobs"], 1, "{report}");
    assert_eq!(report["usage"]["slots"], 1, "{report}");
    assert_eq!(report["usage"]["artifact_bytes"], count_size, "{report}");
    assert_eq!(report["quotas"]["state_bytes"], 1 << 20);
    // The refusals touched nothing: the first job still runs and counts.
    let running =
        wait_job(&server, &token, &first, "counting", |j| j["live"]["sink_records"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(running["status"], "running");
    expect(client().post(server.url(&format!("/v1/jobs/{first}/cancel"))).bearer_auth(&token).send().unwrap(), 202);
}

#[test]
fn every_log_line_of_a_job_names_its_tenant_job_task_and_operator_guest_logs_included() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let (tenant_id, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    let yaml = "name: chatty\nsources:\n  - {type: generator, name: g, seed: 1, events: 1, keys: 1, key_field: user, \
                value_field: v}\nsteps:\n  - {name: talk, wasm: hostile@1, config: {mode: log-flood, count: 3}}\n\
                sink: {type: blackhole}\n";
    let id = expect(submit(&server, &token, yaml), 201)["id"].as_str().unwrap().to_string();
    wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    let guest: Vec<&str> = log.lines().filter(|l| l.contains("flood line")).collect();
    assert_eq!(guest.len(), 3, "the guest's three lines:\n{log}");
    for line in guest.iter().chain(log.lines().filter(|l| l.contains("job running")).collect::<Vec<_>>().iter()) {
        for field in [format!("tenant={tenant_id}"), format!("job={id}")] {
            assert!(line.contains(&field), "`{field}` missing from: {line}");
        }
    }
    for line in guest {
        assert!(line.contains("task=") && line.contains("operator=\"talk\""), "{line}");
    }
}

/// A guest that panics: the job's failure keeps the guest's own message apart from the host's
/// cause chain (subtask, call, trap), and the whole message still holds each.
#[test]
fn a_guests_panic_is_shown_apart_from_the_hosts_cause_chain() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    let id = expect(submit(&server, &token, PANIC_JOB), 201)["id"].as_str().unwrap().to_string();
    let failed = wait_job(&server, &token, &id, "failed", |j| j["status"] == "failed" || j["status"] == "finished");
    assert_panic_failure(&failed, &[]);
}

#[test]
fn memory_quotas_bound_each_instance_and_all_of_a_tenants_instances() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (id, token) = tenant(&server, "acme");
    let quotas = json!({"instance_memory_bytes": 64 << 20, "memory_bytes": 700 << 20});
    let set = client().put(server.url(&format!("/v1/tenants/{id}/quotas"))).bearer_auth(server.admin()).json(&quotas);
    expect(set.send().unwrap(), 200);
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    // A memory bomb traps at the tenant's 64 MiB per instance, not the server's 256 MiB.
    let bomb = "name: bomb\nsources:\n  - {type: generator, name: g, seed: 1, events: 10, keys: 1, key_field: user, \
                value_field: v}\nsteps:\n  - {name: hoard, wasm: hostile@1, config: {mode: allocate}}\n\
                restart: {strategy: none}\nsink: {type: blackhole}\n";
    let bomb_id = expect(submit(&server, &token, bomb), 201)["id"].as_str().unwrap().to_string();
    let failed =
        wait_job(&server, &token, &bomb_id, "failed", |j| j["status"] == "failed" || j["status"] == "finished");
    assert_eq!(failed["status"], "failed");
    let message = failed["failures"][0]["message"].as_str().unwrap();
    assert!(message.contains(&(64u64 << 20).to_string()), "the failure names the 64 MiB limit: {message}");
    // One job fits in 700 MiB (an instance of 64 MiB, and the memory the service's default
    // 128 MiB of heap state stands for, about 390 MiB), a second does not.
    let first = expect(submit(&server, &token, &counts_job(1_000_000)), 201)["id"].as_str().unwrap().to_string();
    let refused = expect(submit(&server, &token, &counts_job(10)), 403);
    assert_eq!(refused["field"], "quotas.memory_bytes", "{refused}");
    expect(client().post(server.url(&format!("/v1/jobs/{first}/cancel"))).bearer_auth(&token).send().unwrap(), 202);
}

#[test]
fn two_tenants_run_the_word_count_in_rust_and_in_python_with_equal_output() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut outputs = Vec::new();
    for (name, pipeline) in [("rust", "wordcount/pipeline.yaml"), ("python", "wordcount/pipeline-python.yaml")] {
        let config = dir.path().join(format!("{name}.json"));
        let token =
            stdout(&eddy(&config, &["tenants", "create", name, "--server", &server.base, "--token", &server.admin()]));
        eddy(&config, &["login", "--server", &server.base, "--token", &token]);
        let submitted = eddy(&config, &["submit", examples.join(pipeline).to_str().unwrap(), "--watch"]);
        assert!(stdout(&submitted).contains("status finished"), "{}", stdout(&submitted));
        let id = stdout(&submitted).lines().next().unwrap().to_string();
        let mut lines: Vec<String> = stdout(&eddy(&config, &["output", &id])).lines().map(str::to_owned).collect();
        lines.sort();
        assert!(!lines.is_empty());
        outputs.push(lines);
    }
    assert_eq!(outputs[0], outputs[1], "the Python twin counts as the Rust counter does");
}

#[test]
fn the_cli_takes_savepoints_rescales_upgrades_and_stops_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    let config = dir.path().join("login.json");
    eddy(&config, &["login", "--server", &server.base, "--token", &token]);
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let id = expect(submit(&server, &token, &counts_job(1_000_000)), 201)["id"].as_str().unwrap().to_string();
    let checkpointed = |j: &Value| j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty());
    wait_job(&server, &token, &id, "checkpointed", checkpointed);
    assert!(stdout(&eddy(&config, &["savepoint", &id])).starts_with("savepoints/"));
    eddy(&config, &["rescale", &id, "2"]);
    wait_job(&server, &token, &id, "rescaled", |j| j["generation"] == 1 && checkpointed(j));
    // A local `.wasm` is uploaded first.
    eddy(&config, &["upgrade", &id, "count", eddy_guest_artifacts::RUNNING_COUNT]);
    wait_job(&server, &token, &id, "upgraded", |j| j["generation"] == 2 && checkpointed(j));
    // `--live`: swapped at a checkpoint (printed), no savepoint, no new generation.
    let live = eddy(&config, &["upgrade", &id, "count", eddy_guest_artifacts::RUNNING_COUNT_V2, "--live"]);
    assert!(stdout(&live).parse::<u64>().is_ok_and(|c| c > 0), "{}", stdout(&live));
    assert!(String::from_utf8_lossy(&live.stderr).contains("subtasks swapped: 2"));
    let swapped = job(&server, &token, &id);
    assert_eq!((&swapped["generation"], &swapped["status"]), (&json!(2), &json!("running")));
    eddy(&config, &["stop", &id]);
    let stopped = job(&server, &token, &id);
    assert_eq!(stopped["status"], "stopped");
    let reasons: Vec<&str> =
        stopped["savepoints"].as_array().unwrap().iter().map(|s| s["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["requested", "rescale", "upgrade", "stop"]);
    assert_eq!(stopped["parallelism"], 2);
}

#[test]
fn an_upsert_sinks_table_is_the_output_and_an_artifact_in_use_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    let artifact = expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let digest = artifact["digest"].as_str().unwrap().to_string();
    let events = 3_000;
    let yaml = counts_job(events).replace("sink: {type: files, dir: out}", "sink: {type: upsert, dir: table}");
    let id = expect(submit(&server, &token, &yaml), 201)["id"].as_str().unwrap().to_string();
    let in_use = expect(
        client().delete(server.url(&format!("/v1/artifacts/{digest}"))).bearer_auth(&token).send().unwrap(),
        409,
    );
    assert!(in_use["detail"].as_str().unwrap().contains(&id), "{in_use}");
    let done = wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    // The table keeps each key's last count: the counts of all keys add up to the events.
    let rows = output_lines(&server, &token, &id);
    assert!(rows.len() > 1, "{rows:?}");
    let total: u64 = rows.iter().map(|r| r["value"].as_u64().unwrap()).sum();
    assert_eq!(total, events);
    expect(client().delete(server.url("/v1/artifacts/count@1")).bearer_auth(&token).send().unwrap(), 204);
    expect(client().get(server.url(&format!("/v1/artifacts/{digest}"))).bearer_auth(&token).send().unwrap(), 404);
    let file = server.dir.join("artifacts").join(digest.replace(':', "-") + ".wasm");
    assert!(!file.exists(), "no tenant holds it any more, so its file is gone");
}

#[test]
fn a_live_upgrade_swaps_code_at_a_checkpoint_barrier_and_a_sigkill_after_it_keeps_the_new_code() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let (tenant_id, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let v2 = expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT_V2, Some(("count", "2"))), 201);
    // Checkpoints kept long enough to read the swap's back.
    let yaml =
        counts_job(9_000).replace("checkpoints: {interval_ms: 200}", "checkpoints: {interval_ms: 200, retained: 500}");
    let id = expect(submit(&server, &token, &yaml), 201)["id"].as_str().unwrap().to_string();
    wait_job(&server, &token, &id, "checkpointed", |j| {
        j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
    });
    let upgrade = |body: Value| post(&server, &token, &format!("/v1/jobs/{id}/upgrade"), body);

    let wrong_step = expect(upgrade(json!({"step": "nope", "wasm": "count@2", "mode": "live"})), 422);
    assert_eq!(wrong_step["field"], "step");
    let same = expect(upgrade(json!({"step": "count", "wasm": "count@1", "mode": "live"})), 422);
    assert!(same["detail"].as_str().unwrap().contains("already runs"), "{same}");
    let swapped = expect(upgrade(json!({"step": "count", "wasm": "count@2", "mode": "live"})), 200);
    assert_eq!(
        (&swapped["mode"], &swapped["step"], &swapped["artifact"]),
        (&json!("live"), &json!("count"), &v2["digest"])
    );
    assert_eq!(swapped["subtasks"], 1);
    let checkpoint = swapped["checkpoint"].as_u64().unwrap();
    let running = job(&server, &token, &id);
    assert_eq!((&running["status"], &running["generation"]), (&json!("running"), &json!(0)), "nothing restarted");
    assert_eq!(running["artifacts"][0], v2["digest"], "the record names the new code");
    let (swap_at, artifacts) = swap_point(&data, &tenant_id, &id, checkpoint);
    let new_code = v2["digest"].as_str().unwrap().strip_prefix("sha256:").map(str::to_owned);
    assert_eq!(artifacts, vec![new_code], "the metadata names the new code");

    // Killed after the swap's checkpoint: the restart restores a checkpoint taken with the new
    // code, and runs the new code.
    server.kill_9();
    let server = Server::start(&data, &[]);
    let done = wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    assert_output_swapped_at(&server, &token, &id, &yaml, swap_at);
}
