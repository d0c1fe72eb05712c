//! `eddy serve` under bad input and abuse: clients that break off, crowds of clients, random
//! bytes and JSON thrown at the parsers, and a tenant whose operator misbehaves. Each test
//! checks the answer (status and message) and that nothing else broke: the server still
//! answers, left nothing behind, logged no internal error, and other jobs kept running.

// Helpers outside `#[test]` functions fail the test they serve when they panic.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use common::{
    Server, client, counted_once, counts_job, expect, job, output_lines, post, raw_exchange, submit, tenant, upload,
    wait_job,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

/// Polls `probe` until it gives something. The deadline only turns a hang into a failure.
fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "never {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server process still runs, answers, and logged no request failing inside it.
fn assert_healthy(server: &mut Server) {
    assert!(server.child.try_wait().unwrap().is_none(), "the server process exited");
    let doc = expect(client().get(server.url("/v1/openapi.json")).send().unwrap(), 200);
    assert!(doc["paths"]["/v1/jobs"].is_object(), "{doc}");
    let log = std::fs::read_to_string(server.dir.with_extension("log")).unwrap();
    for sign in ["request failed inside the server", "panicked"] {
        assert!(!log.contains(sign), "the server log shows `{sign}`:\n{log}");
    }
}

fn incoming_files(server: &Server) -> Vec<String> {
    std::fs::read_dir(server.dir.join("artifacts/.incoming"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Stored artifact files (`sha256-<hex>.wasm`).
fn stored_artifacts(server: &Server) -> Vec<String> {
    std::fs::read_dir(server.dir.join("artifacts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("sha256-"))
        .collect()
}

/// Starts an upload by hand with `framing` and `sent` as all of its body there will ever be,
/// waits until the server is streaming it into `.incoming`, then breaks the connection off.
fn broken_upload(server: &Server, token: &str, framing: &str, sent: &[u8]) {
    let mut stream = TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    let head = format!(
        "POST /v1/artifacts?name=partial&version=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/wasm\r\n{framing}\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(sent).unwrap();
    stream.flush().unwrap();
    // The handler made its temporary file: the upload is under way, and the client vanishes.
    eventually("saw the upload arrive in .incoming", || (!incoming_files(server).is_empty()).then_some(()));
    let _ = stream.shutdown(std::net::Shutdown::Both);
    drop(stream);
}

#[test]
fn a_client_that_disconnects_mid_upload_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    let wasm = std::fs::read(eddy_guest_artifacts::RUNNING_COUNT).unwrap();
    let half = &wasm[..wasm.len() / 2];
    let mut chunked = format!("{:x}\r\n", half.len()).into_bytes();
    chunked.extend_from_slice(half);
    chunked.extend_from_slice(b"\r\n");
    let cases: [(String, &[u8]); 4] = [
        // A large declared length (under the 64 MiB limit) and half of a real component.
        (format!("Content-Length: {}\r\n", 32u64 << 20), half),
        // The component's own length, all but its last byte.
        (format!("Content-Length: {}\r\n", wasm.len()), &wasm[..wasm.len() - 1]),
        // The headers and not a byte more.
        (format!("Content-Length: {}\r\n", wasm.len()), &[]),
        // Chunked: one whole chunk, never the last one.
        ("Transfer-Encoding: chunked\r\n".to_string(), &chunked),
    ];
    for (framing, sent) in &cases {
        broken_upload(&server, &token, framing, sent);
        eventually(&format!("emptied .incoming after a broken-off upload ({})", framing.trim()), || {
            incoming_files(&server).is_empty().then_some(())
        });
        let listed = expect(client().get(server.url("/v1/artifacts")).bearer_auth(&token).send().unwrap(), 200);
        assert_eq!(listed, json!([]), "no artifact was recorded ({})", framing.trim());
        assert_eq!(stored_artifacts(&server), Vec::<String>::new(), "no artifact file was kept");
        let missing =
            expect(client().get(server.url("/v1/artifacts/partial@1")).bearer_auth(&token).send().unwrap(), 404);
        assert!(missing["detail"].as_str().unwrap().contains("partial@1"), "{missing}");
    }
    let quotas = expect(client().get(server.url("/v1/quotas")).bearer_auth(&token).send().unwrap(), 200);
    assert_eq!(quotas["usage"]["artifact_bytes"], 0, "nothing is charged for broken uploads: {quotas}");

    // The same bytes uploaded whole afterwards are a new, working artifact.
    let whole = expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("partial", "1"))), 201);
    assert_eq!(whole["size"], wasm.len());
    assert_eq!(stored_artifacts(&server).len(), 1);
    assert!(incoming_files(&server).is_empty());
    assert_healthy(&mut server);
}

#[test]
fn a_thousand_concurrent_requests_from_fifty_clients_are_all_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("data"), &[]);
    let (tenant_id, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let id = expect(submit(&server, &token, &counts_job(100)), 201)["id"].as_str().unwrap().to_string();
    wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");

    const CLIENTS: usize = 50;
    const REQUESTS: usize = 20;
    let start = Barrier::new(CLIENTS);
    let (server_ref, token, start) = (&server, token.as_str(), &start);
    let outcomes: Vec<Vec<Result<(), String>>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|c| {
                scope.spawn(move || {
                    let http = Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
                    start.wait();
                    (0..REQUESTS).map(|r| one_request(server_ref, &http, token, (c + r) % 5)).collect()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let answered = outcomes.iter().flatten().filter(|o| o.is_ok()).count();
    let failed: Vec<&String> = outcomes.iter().flatten().filter_map(|o| o.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} of {} requests failed, e.g. {:?}", failed.len(), CLIENTS * REQUESTS, &failed[..]);
    assert_eq!(answered, CLIENTS * REQUESTS);

    // Nothing changed by the crowd: the same job, the same artifact, the same tenant.
    let jobs = expect(client().get(server.url("/v1/jobs")).bearer_auth(token).send().unwrap(), 200);
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
    let me = expect(client().get(server.url("/v1/whoami")).bearer_auth(token).send().unwrap(), 200);
    assert_eq!(me["tenant"], tenant_id.as_str());
    assert_healthy(&mut server);
}

/// One request of kind `kind` (0-4) and a check of its answer.
fn one_request(server: &Server, http: &Client, token: &str, kind: usize) -> Result<(), String> {
    let (path, token, status) = match kind {
        0 => ("/v1/jobs", token, 200),
        1 => ("/v1/artifacts", token, 200),
        2 => ("/v1/whoami", token, 200),
        3 => ("/v1/jobs", "eddy_not-a-token", 401),
        _ => ("/metrics", token, 200),
    };
    let response =
        http.get(server.url(path)).bearer_auth(token).send().map_err(|e| format!("GET {path}: no answer: {e}"))?;
    let got = response.status().as_u16();
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let body = response.text().map_err(|e| format!("GET {path}: the body broke off: {e}"))?;
    // A source that keeps sending wrong tokens is answered 429 for those once it passed the
    // throttle's limit; the rest of its requests are answered as usual.
    if got != status && !(kind == 3 && got == 429) {
        return Err(format!("GET {path}: {got} instead of {status}: {body}"));
    }
    let fine = match kind {
        0 | 1 => serde_json::from_str::<Value>(&body).is_ok_and(|v| v.as_array().is_some_and(|a| a.len() == 1)),
        2 => serde_json::from_str::<Value>(&body).is_ok_and(|v| v["kind"] == "tenant"),
        3 => {
            content_type == "application/problem+json"
                && (body.contains("unknown token") || body.contains("too many wrong tokens"))
        }
        _ => content_type.starts_with("application/openmetrics-text") && body.ends_with("# EOF\n"),
    };
    if fine { Ok(()) } else { Err(format!("GET {path}: unexpected answer ({content_type}): {body}")) }
}

// --- Random input to the parsers ---------------------------------------------------------

/// A valid spec, in block style so that line edits make plausible near-misses of it.
const VALID_SPEC: &str = "name: fuzz
max_parallelism: 8
sources:
  - type: generator
    name: g
    seed: 7
    events: 50
    keys: 3
    key_field: user
    key_prefix: u-
    value_field: v
    min_value: 1
    max_value: 9
    start_ms: 0
    interval_ms: 5
    rate_per_sec: 1000
steps:
  - name: count
    wasm: count@1
    key_by: /user
    parallelism: 1
checkpoints:
  interval_ms: 200
restart:
  strategy: none
sink:
  type: files
  dir: out
";

/// Names that mean something somewhere in a spec or a request, so random documents hit fields.
const KEYS: &[&str] = &[
    "name",
    "sources",
    "steps",
    "sink",
    "type",
    "wasm",
    "config",
    "parallelism",
    "max_parallelism",
    "batch_size",
    "buffer_timeout_ms",
    "key_by",
    "checkpoints",
    "interval_ms",
    "dir",
    "s3",
    "restart",
    "strategy",
    "attempts",
    "state",
    "backend",
    "path",
    "format",
    "events",
    "rate_per_sec",
    "keys",
    "window",
    "size_ms",
    "slide_ms",
    "watermarks",
    "state_max_bytes",
    "step",
];

/// Values that are valid somewhere, or almost.
const WORDS: &[&str] = &[
    "generator",
    "file",
    "print",
    "files",
    "blackhole",
    "upsert",
    "count@1",
    "count@2",
    "sha256:00",
    "../../admin.token",
    "/etc/passwd",
    "input.txt",
    "none",
    "fixed_delay",
    "rocksdb",
    "heap",
    "tumbling",
    "session",
    "key",
    "value",
    "/user",
    "lines",
    "json",
    "",
];

/// YAML value texts: edge numbers, tags, anchors, flow collections, long and odd strings.
const YAML_VALUES: &[&str] = &[
    "-1",
    "0",
    "4294967296",
    "18446744073709551616",
    "-9223372036854775809",
    "1e400",
    "-0",
    "0x10",
    ".nan",
    ".inf",
    "~",
    "null",
    "[]",
    "{}",
    "true",
    "''",
    "\"\\u0000\"",
    "../../admin.token",
    "/etc/passwd",
    "count@2",
    "&a {x: *a}",
    "*nowhere",
    "!!binary aGk=",
    "!!str 5",
    "!custom x",
    "[1, [2, [3, [4]]]]",
    "{a: b, a: c}",
    "? complex\n  : key",
    "|\n  block\n  text",
    "\"unterminated",
    "'\u{feff}'",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];

/// Text dropped into a spec at random.
const SNIPPETS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ": ",
    "- ",
    "\t",
    "&a ",
    "*a",
    "!!map ",
    "\"",
    "'",
    "#",
    "---\n",
    "...\n",
    "%YAML 1.2\n",
    "\0",
    "\u{feff}",
    "\r",
    "\n  ",
    "? ",
];

/// One edit of a spec's text.
#[derive(Debug, Clone)]
enum Edit {
    DeleteLine(prop::sample::Index),
    DuplicateLine(prop::sample::Index),
    SwapLines(prop::sample::Index, prop::sample::Index),
    ReplaceValue(prop::sample::Index, &'static str),
    ReplaceKey(prop::sample::Index, &'static str),
    Indent(prop::sample::Index, usize),
    Dedent(prop::sample::Index),
    Insert(prop::sample::Index, &'static str),
    Truncate(prop::sample::Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let at = any::<prop::sample::Index>;
    prop_oneof![
        at().prop_map(Edit::DeleteLine),
        at().prop_map(Edit::DuplicateLine),
        (at(), at()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        (at(), prop::sample::select(YAML_VALUES)).prop_map(|(a, v)| Edit::ReplaceValue(a, v)),
        (at(), prop::sample::select(WORDS)).prop_map(|(a, v)| Edit::ReplaceValue(a, v)),
        (at(), prop::sample::select(KEYS)).prop_map(|(a, k)| Edit::ReplaceKey(a, k)),
        (at(), 1..5usize).prop_map(|(a, n)| Edit::Indent(a, n)),
        at().prop_map(Edit::Dedent),
        (at(), prop::sample::select(SNIPPETS)).prop_map(|(a, s)| Edit::Insert(a, s)),
        at().prop_map(Edit::Truncate),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for edit in edits {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let n = lines.len();
        match edit {
            Edit::DeleteLine(i) => {
                lines.remove(i.index(n));
            }
            Edit::DuplicateLine(i) => {
                let line = lines[i.index(n)].clone();
                lines.insert(i.index(n), line);
            }
            Edit::SwapLines(a, b) => lines.swap(a.index(n), b.index(n)),
            Edit::ReplaceValue(i, value) => {
                let line = &mut lines[i.index(n)];
                let cut = line.find(": ").map_or(line.len(), |p| p + 2);
                line.replace_range(cut.., value);
            }
            Edit::ReplaceKey(i, key) => {
                let line = &mut lines[i.index(n)];
                let start = line.find(|c: char| c != ' ' && c != '-').unwrap_or(line.len());
                let end = line.find(':').filter(|&e| e >= start).unwrap_or(start);
                line.replace_range(start..end, key);
            }
            Edit::Indent(i, spaces) => lines[i.index(n)].insert_str(0, &" ".repeat(*spaces)),
            Edit::Dedent(i) => {
                let line = &mut lines[i.index(n)];
                let trimmed = line.trim_start().to_owned();
                *line = trimmed;
            }
            Edit::Insert(i, snippet) => {
                let line = &mut lines[i.index(n)];
                let mut at = i.index(line.len() + 1);
                while !line.is_char_boundary(at) {
                    at -= 1;
                }
                line.insert_str(at, snippet);
            }
            Edit::Truncate(i) => lines.truncate(i.index(n) + 1),
        }
    }
    lines.join("\n") + "\n"
}

/// Random JSON, its object keys and strings often ones the server knows.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u32..10).prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        "\\PC{0,24}".prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((json_key(), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![3 => prop::sample::select(KEYS).prop_map(str::to_owned), 1 => "\\PC{0,12}"]
}

/// The valid spec as JSON with one random field replaced, removed, or added.
fn mutated_json_spec() -> impl Strategy<Value = Value> {
    let spec: Value = serde_norway::from_str(VALID_SPEC).unwrap();
    let mut pointers = Vec::new();
    collect_pointers(&spec, String::new(), &mut pointers);
    (prop::sample::select(pointers), json_value(), 0..3u8, json_key()).prop_map(move |(at, value, how, key)| {
        let mut spec = spec.clone();
        let (parent, last) = at.rsplit_once('/').unwrap();
        match (how, spec.pointer_mut(parent)) {
            (0, Some(Value::Object(map))) => {
                map.remove(last);
            }
            (1, Some(Value::Object(map))) => {
                map.insert(key, value);
            }
            _ => *spec.pointer_mut(&at).unwrap() = value,
        }
        spec
    })
}

fn collect_pointers(value: &Value, at: String, into: &mut Vec<String>) {
    match value {
        Value::Object(map) => map.iter().for_each(|(k, v)| collect_pointers(v, format!("{at}/{k}"), into)),
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(i, v)| collect_pointers(v, format!("{at}/{i}"), into))
        }
        _ => {}
    }
    if !at.is_empty() {
        into.push(at);
    }
}

/// A fixed-seed runner: the same cases every run, few enough to take seconds.
fn runner(cases: u32) -> TestRunner {
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 200, ..Config::default() };
    TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

/// A client that gives up on an answer after 30 s: a hang is a failure, not a stuck test.
fn impatient() -> Client {
    Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

/// What an answer to hostile input must be: a 4xx problem (+json, with a detail and the same
/// status inside), or one of `also` (e.g. 201 when a mutation happens to be valid).
fn refused(response: reqwest::Result<Response>, also: &[u16], input: &str) -> Result<u16, TestCaseError> {
    let response = response.map_err(|e| TestCaseError::fail(format!("no answer ({e}) to {input}")))?;
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let body = response.text().map_err(|e| TestCaseError::fail(format!("the answer broke off ({e}) for {input}")))?;
    if also.contains(&status) {
        return Ok(status);
    }
    prop_assert!((400..500).contains(&status), "{status} {body} for {input}");
    prop_assert_eq!(&content_type, "application/problem+json", "{} {} for {}", status, body, input);
    let problem: Value = serde_json::from_str(&body).map_err(|e| TestCaseError::fail(format!("{e}: {body}")))?;
    prop_assert_eq!(&problem["status"], &json!(status), "{}", body);
    prop_assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()), "{}", body);
    Ok(status)
}

/// A server with tenant `fuzz` (returned token) holding `count@1`, and one finished job of it.
fn fuzz_server(dir: &Path) -> (Server, String, String) {
    let server = Server::start(&dir.join("data"), &[]);
    let (_, token) = tenant(&server, "fuzz");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    // The unedited spec runs: the edits start from something valid.
    let id = expect(submit(&server, &token, VALID_SPEC), 201)["id"].as_str().unwrap().to_string();
    let done = wait_job(&server, &token, &id, "finished", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");
    (server, token, id)
}

/// Submits `body` as a spec; a job it happens to start is canceled at once.
fn submit_hostile(
    server: &Server,
    http: &Client,
    token: &str,
    media: &str,
    body: Vec<u8>,
) -> Result<(), TestCaseError> {
    let input = format!("POST /v1/jobs ({media}) {:?}", String::from_utf8_lossy(&body));
    let response = http.post(server.url("/v1/jobs")).bearer_auth(token).header("content-type", media).body(body).send();
    // A spec may come out valid, and then the slots or the jobs quota may run out: all fine.
    let status = refused(response, &[201], &input)?;
    if status == 201 {
        let jobs = expect(client().get(server.url("/v1/jobs")).bearer_auth(token).send().unwrap(), 200);
        for j in jobs.as_array().unwrap().iter().filter(|j| j["status"] == "running" || j["status"] == "created") {
            let id = j["id"].as_str().unwrap();
            let r = client().post(server.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(token).send().unwrap();
            prop_assert!(r.status() == 202 || r.status() == 409, "cancel: {}", r.status());
        }
    }
    Ok(())
}

const SPEC_MEDIA: [&str; 3] = ["application/yaml", "application/json", "text/yaml; charset=utf-8"];

#[test]
fn random_specs_are_refused_with_a_problem_and_never_break_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, token, _) = fuzz_server(dir.path());
    let http = impatient();
    let (server_ref, token_ref) = (&server, token.as_str());
    let media = prop::sample::select(&SPEC_MEDIA[..]);

    runner(96)
        .run(&(prop::collection::vec(any::<u8>(), 0..600), media.clone()), |(bytes, media)| {
            submit_hostile(server_ref, &http, token_ref, media, bytes)
        })
        .unwrap();
    runner(96)
        .run(&(json_value(), media.clone()), |(value, media)| {
            submit_hostile(server_ref, &http, token_ref, media, serde_json::to_vec(&value).unwrap())
        })
        .unwrap();
    runner(128)
        .run(&prop::collection::vec(edit(), 1..5), |edits| {
            submit_hostile(server_ref, &http, token_ref, "application/yaml", apply(VALID_SPEC, &edits).into_bytes())
        })
        .unwrap();
    runner(128)
        .run(&mutated_json_spec(), |spec| {
            submit_hostile(server_ref, &http, token_ref, "application/json", serde_json::to_vec(&spec).unwrap())
        })
        .unwrap();

    // Documents made to exhaust a parser: deep nesting, an alias bomb, the size limit. The bomb
    // sits where a spec takes any value (a step's `config`), so that it is refused for being a
    // bomb and not for a field the spec does not have.
    let deep_flow = "[".repeat(100_000);
    let deep_block: String = (0..1_000).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
    let mut bomb = String::from("{a: &a [x, x, x, x, x, x, x, x, x, x]");
    for i in 1..12u8 {
        let (name, previous) = ((b'a' + i) as char, (b'a' + i - 1) as char);
        bomb.push_str(&format!(", {name}: &{name} [{}]", vec![format!("*{previous}"); 10].join(", ")));
    }
    bomb.push('}');
    let spec_with_bomb = VALID_SPEC.replace("    key_by: /user\n", &format!("    key_by: /user\n    config: {bomb}\n"));
    let merge_bomb = VALID_SPEC.replace("    key_by: /user\n", "    key_by: /user\n    config: {<<: {a: 1}}\n");
    let deep_json = format!("{}{}", "{\"name\":".repeat(10_000), "}".repeat(10_000));
    for (what, media, body, says) in [
        ("100 000 open brackets", "application/yaml", deep_flow, "nested deeper than"),
        ("1 000 nested mappings", "application/yaml", deep_block, "nested deeper than"),
        ("an alias bomb in a step's config", "application/yaml", spec_with_bomb, "anchor"),
        ("a merge key in a step's config", "application/yaml", merge_bomb, "merge key"),
        ("10 000 nested objects", "application/json", deep_json, "nested deeper than"),
    ] {
        let started = Instant::now();
        let response = http.post(server.url("/v1/jobs")).bearer_auth(&token).header("content-type", media).body(body);
        let problem = expect(response.send().unwrap(), 422);
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{what}: {detail}");
        println!("{what}: 422 in {:?}", started.elapsed());
    }
    // Over the size limit, refused from the declared length: by hand, since the server answers
    // and closes before the body is read, and a client still writing it sees a broken pipe.
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/yaml\r\n\
         Content-Length: {}\r\n\r\nname: big\n",
        (1u64 << 20) + 100
    );
    let answer = raw_exchange(&server, head.as_bytes(), Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("at most 1048576 bytes"), "{answer}");
    assert_healthy(&mut server);
}

#[test]
fn random_json_to_tenants_and_rescale_is_refused_with_a_problem_and_never_breaks_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, token, finished) = fuzz_server(dir.path());
    let http = impatient();
    let admin = server.admin();
    let (server_ref, token_ref, admin_ref) = (&server, token.as_str(), admin.as_str());
    let rescale = server.url(&format!("/v1/jobs/{finished}/rescale"));
    // Objects with a `name` (often valid, sometimes taken) besides any JSON at all.
    let tenant_body = prop_oneof![
        json_value(),
        "[a-z0-9_-]{0,70}".prop_map(|name| json!({ "name": name })),
        ("[a-z]{1,8}", json_key(), json_value()).prop_map(|(name, k, v)| {
            let mut body = serde_json::Map::new();
            body.insert(k, v);
            body.insert("name".into(), Value::from(name));
            Value::Object(body)
        }),
    ];
    runner(96)
        .run(&tenant_body, |body| {
            let input = format!("POST /v1/tenants {body}");
            let response = http.post(server_ref.url("/v1/tenants")).bearer_auth(admin_ref).json(&body).send();
            refused(response, &[201], &input).map(drop)
        })
        .unwrap();
    let rescale_body = prop_oneof![json_value(), json_value().prop_map(|p| json!({ "parallelism": p }))];
    runner(96)
        .run(&rescale_body, |body| {
            let input = format!("POST /v1/jobs/{finished}/rescale {body}");
            refused(http.post(&rescale).bearer_auth(token_ref).json(&body).send(), &[], &input).map(drop)
        })
        .unwrap();
    runner(64)
        .run(&prop::collection::vec(any::<u8>(), 0..300), |bytes| {
            let input = format!("POST /v1/jobs/{finished}/rescale {:?}", String::from_utf8_lossy(&bytes));
            let response =
                http.post(&rescale).bearer_auth(token_ref).header("content-type", "application/json").body(bytes);
            refused(response.send(), &[], &input).map(drop)
        })
        .unwrap();

    // The finished job is untouched, and its output still reads.
    let shown = job(&server, &token, &finished);
    assert_eq!(shown["status"], "finished", "{shown}");
    assert_eq!(shown["generation"], 0, "{shown}");
    assert_eq!(output_lines(&server, &token, &finished).len(), 50);
    assert_healthy(&mut server);
}

// --- A hostile tenant ----------------------------------------------------------------------

/// The hostile guest in `mode` on generated records, failing at the first failure.
fn hostile_job(mode: &str) -> String {
    format!(
        "name: hostile-{mode}\nsources:\n  - {{type: generator, name: g, seed: 1, events: 1000, keys: 5, key_field: user, \
         key_prefix: u-, value_field: v, min_value: 1, max_value: 9, start_ms: 0, interval_ms: 5, rate_per_sec: 100}}\n\
         steps:\n  - {{name: hostile, wasm: hostile@1, key_by: /user, config: {{mode: {mode}}}}}\n\
         checkpoints: {{interval_ms: 200}}\nrestart: {{strategy: none}}\nsink: {{type: files, dir: out}}\n"
    )
}

/// The newest failure message of a job.
fn last_failure(j: &Value) -> String {
    j["failures"].as_array().and_then(|f| f.last()).and_then(|f| f["message"].as_str()).unwrap_or("").to_string()
}

fn newest_checkpoint(j: &Value) -> u64 {
    j["live"]["checkpoints"].as_array().and_then(|c| c.last()).and_then(|c| c["id"].as_u64()).unwrap_or(0)
}

#[test]
fn a_hostile_operator_fails_only_its_own_job_while_another_tenants_job_keeps_counting() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("data"), &[]);
    let (_, a) = tenant(&server, "mallory");
    let (_, b) = tenant(&server, "bob");
    expect(upload(&server, &a, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    expect(upload(&server, &b, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);

    // B counts a stream far longer than the test: it is stopped with a savepoint at the end.
    let counting = expect(submit(&server, &b, &counts_job(100_000_000)), 201)["id"].as_str().unwrap().to_string();
    let b_view = |server: &Server| {
        let j = job(server, &b, &counting);
        assert_eq!(j["status"], "running", "B's job stopped running: {j}");
        assert_eq!(j["restarts"], 0, "B's job restarted: {j}");
        j
    };
    let sink = |j: &Value| j["live"]["sink_records"].as_u64().unwrap_or(0);
    let before =
        wait_job(&server, &b, &counting, "counting and checkpointed", |j| sink(j) > 0 && newest_checkpoint(j) > 0);

    // A's endless loop and memory bomb.
    let spinning = expect(submit(&server, &a, &hostile_job("loop")), 201)["id"].as_str().unwrap().to_string();
    let hoarding = expect(submit(&server, &a, &hostile_job("allocate")), 201)["id"].as_str().unwrap().to_string();
    let ended = |j: &Value| j["status"] != "running" && j["status"] != "created";
    let mut b_seen = sink(&before);
    let (spun, hoarded) = eventually("saw both hostile jobs end", || {
        // B is sampled all along: running, never restarted, never going back.
        let now = sink(&b_view(&server));
        assert!(now >= b_seen, "B's sink records went back from {b_seen} to {now}");
        b_seen = now;
        let (spun, hoarded) = (job(&server, &a, &spinning), job(&server, &a, &hoarding));
        (ended(&spun) && ended(&hoarded)).then_some((spun, hoarded))
    });
    assert_eq!(spun["status"], "failed", "{spun}");
    assert_eq!(hoarded["status"], "failed", "{hoarded}");
    assert_eq!((spun["restarts"].as_u64(), hoarded["restarts"].as_u64()), (Some(0), Some(0)));
    let (timeout, memory) = (last_failure(&spun), last_failure(&hoarded));
    assert!(timeout.contains("hostile") && timeout.contains("interrupted"), "the loop's failure: {timeout}");
    assert!(timeout.contains("ran longer than"), "the loop's failure names the timeout: {timeout}");
    assert!(memory.contains("linear memory bytes"), "the bomb's failure names the memory cap: {memory}");

    // B counted while A's jobs ran and failed, and keeps counting after.
    let at_failure = b_view(&server);
    assert!(sink(&at_failure) > sink(&before), "B made no progress while A's jobs ran: {at_failure}");
    let (seen, checkpoint) = (sink(&at_failure), newest_checkpoint(&at_failure));
    // Three checkpoints later, the one triggered after this view has completed (one runs at a
    // time), so its barrier follows every record counted in it.
    eventually("saw B count on after A's failures", || {
        let j = b_view(&server);
        (sink(&j) > seen && newest_checkpoint(&j) >= checkpoint + 3).then_some(())
    });

    // A's failures left A able to work and B's data alone.
    let a_jobs = expect(client().get(server.url("/v1/jobs")).bearer_auth(&a).send().unwrap(), 200);
    assert_eq!(a_jobs.as_array().unwrap().len(), 2, "{a_jobs}");
    let stopped = expect(post(&server, &b, &format!("/v1/jobs/{counting}/stop"), json!({})), 200);
    assert_eq!(stopped["reason"], "stop");
    assert_eq!(job(&server, &b, &counting)["status"], "stopped");

    // Exactly once: each user's running counts are 1..=n once each.
    let total = counted_once(&server, &b, &counting);
    assert!(total >= seen, "the committed output ({total}) lacks records counted before ({seen})");
    assert_healthy(&mut server);
}

/// The documented error format (`application/problem+json`, naming the field) for bodies that
/// are not the JSON a route takes.
#[test]
fn a_body_that_is_not_the_json_a_route_takes_is_answered_as_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, token, finished) = fuzz_server(dir.path());
    let admin = server.admin();
    let (tenant_id, _) = tenant(&server, "other");
    let routes = [
        ("POST", "/v1/tenants".to_string(), admin.clone()),
        ("PUT", format!("/v1/tenants/{tenant_id}/quotas"), admin.clone()),
        ("POST", format!("/v1/jobs/{finished}/rescale"), token.clone()),
        ("POST", format!("/v1/jobs/{finished}/upgrade"), token.clone()),
    ];
    let bodies: [(&str, Option<&str>, u16); 5] = [
        ("not json", Some("application/json"), 400),
        ("null", Some("application/json"), 422),
        (r#"{"name": 5, "parallelism": "two", "jobs": -1, "step": [], "wasm": {}}"#, Some("application/json"), 422),
        (r#"{"colour": "red"}"#, Some("application/json"), 422),
        ("{}", None, 415),
    ];
    let mut wrong = Vec::new();
    for (method, path, bearer) in &routes {
        for (body, media, status) in bodies {
            let mut request = client().request(method.parse().unwrap(), server.url(path)).bearer_auth(bearer);
            if let Some(media) = media {
                request = request.header("content-type", media);
            }
            let response = request.body(body).send().unwrap();
            let got = response.status().as_u16();
            let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
            let text = response.text().unwrap();
            if got != status || content_type.as_deref() != Some("application/problem+json") {
                wrong.push(format!("{method} {path} {body:?} ({media:?}): {got} {content_type:?} {text}"));
            }
        }
    }
    assert!(wrong.is_empty(), "answered without a problem document:\n{}", wrong.join("\n"));
    assert_healthy(&mut server);
}

/// A spec as large as the server takes: a step's `config` holding 99 000 numbers (about
/// 200 KB, under the 256 KiB and 100 000-node limits), which takes the parser a good part of
/// a second in a test build.
fn largest_spec() -> String {
    VALID_SPEC
        .replace("    key_by: /user\n", &format!("    key_by: /user\n    config: [{}]\n", vec!["1"; 99_000].join(",")))
}

/// A hundred and twenty requests that parse and place the largest spec a server takes
/// (upgrades naming no such step, rescales to parallelism 0: both refused only after the spec
/// was parsed), sent at once, must not stop anyone else's requests meanwhile. Before, rescale
/// and upgrade parsed on the two async threads that answer every request, and a whoami waited
/// seconds behind them; parsed on blocking threads without a bound, they took every core and
/// a whoami still waited seconds: at most one runs per core (`eddy_service::heavy`).
#[test]
fn requests_that_parse_large_specs_hold_up_no_other_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    // The job need not run (its operator takes no config and fails): both requests parse its
    // spec before anything else.
    let id = expect(submit(&server, &token, &largest_spec()), 201)["id"].as_str().unwrap().to_string();
    let in_flight = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(120));
    let started = Instant::now();
    let slow: Vec<std::thread::JoinHandle<u16>> = (0..120)
        .map(|i| {
            let (url, token, in_flight) = (server.base.clone(), token.clone(), in_flight.clone());
            let id = id.clone();
            std::thread::spawn(move || {
                let (path, body) = if i % 2 == 0 {
                    (format!("/v1/jobs/{id}/upgrade"), json!({"step": "nowhere", "wasm": "count@1"}))
                } else {
                    (format!("/v1/jobs/{id}/rescale"), json!({"parallelism": 0}))
                };
                let status =
                    client().post(format!("{url}{path}")).bearer_auth(&token).json(&body).send().unwrap().status();
                in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                status.as_u16()
            })
        })
        .collect();
    // Every request made while the slow ones are in flight is answered promptly.
    let mut waits = Vec::new();
    while in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        let sent = Instant::now();
        expect(client().get(server.url("/v1/whoami")).bearer_auth(&token).send().unwrap(), 200);
        waits.push(sent.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = started.elapsed();
    let statuses: Vec<u16> = slow.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 422), "each was refused after parsing: {statuses:?}");
    // The slow requests did keep the server busy: otherwise this test proves nothing.
    assert!(busy > Duration::from_millis(500) && waits.len() >= 3, "120 parses took {busy:?}, {} probes", waits.len());
    let longest = waits.iter().max().copied().unwrap_or_default();
    assert!(longest < Duration::from_secs(2), "a whoami waited {longest:?} behind the parsing: {waits:?}");
    println!("120 large parses in {busy:?}; {} whoami answered meanwhile, the slowest in {longest:?}", waits.len());
    assert_healthy(&mut server);
}
