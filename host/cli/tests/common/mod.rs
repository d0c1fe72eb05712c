//! What the tests of `eddy serve` share: a real server process, and the requests a user makes.

// Each test file uses some of these helpers, and the rest would be dead code in it.
#![allow(dead_code, reason = "each test crate uses only some of the helpers")]
// Helpers outside `#[test]` functions fail the test they serve when they panic.
#![allow(clippy::unwrap_used)]

pub mod fleet;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

/// Every process a test starts gets these: the local S3 service (moto) takes any keys, and a
/// process that uses no bucket ignores them.
pub const S3_CREDENTIALS: [(&str, &str); 2] = [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test")];

/// Runs the `eddy` binary with `args` and waits for it.
pub fn eddy(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_eddy")).args(args).output().unwrap()
}

/// The standard output of a run that must succeed; `what` names it in the failure, with both
/// outputs.
pub fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A server process on a free port over `dir`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub dir: PathBuf,
}

impl Server {
    pub fn start(dir: &Path, extra: &[&str]) -> Server {
        Self::start_as("serve", dir, extra)
    }

    /// `eddy <command> --listen 127.0.0.1:<free port> --data-dir <dir> <extra>` (`serve` or
    /// `coordinator`), its log in `<dir>.log`.
    pub fn start_as(command: &str, dir: &Path, extra: &[&str]) -> Server {
        Self::start_with_env(command, dir, extra, &[])
    }

    /// As [`Server::start_as`], with `env` in the process's environment.
    pub fn start_with_env(command: &str, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        // A port the OS just handed out and released: free unless raced, which the retry covers.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            if let Some(server) = Self::start_on_with_env(command, port, dir, extra, env) {
                return server;
            }
        }
        panic!("eddy {command} did not start; see {}", dir.with_extension("log").display());
    }

    /// As [`Server::start_as`] on a given port (a restart on the address clients know).
    pub fn start_on(command: &str, port: u16, dir: &Path, extra: &[&str]) -> Option<Server> {
        Self::start_on_with_env(command, port, dir, extra, &[])
    }

    /// As [`Server::start_on`], with `env` in the process's environment.
    pub fn start_on_with_env(
        command: &str,
        port: u16,
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Option<Server> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.with_extension("log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_eddy"))
            .args([command, "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(dir)
            .args(extra)
            .env("EDDY_LOG", "info")
            .envs(S3_CREDENTIALS)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start eddy");
        let mut server = Server { child, base: format!("http://127.0.0.1:{port}"), dir: dir.to_owned() };
        if server.wait_ready() {
            return Some(server);
        }
        let _ = server.child.kill();
        None
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }

    pub fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            if reqwest::blocking::get(format!("{}/v1/openapi.json", self.base)).is_ok_and(|r| r.status() == 200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn admin(&self) -> String {
        std::fs::read_to_string(self.dir.join("admin.token")).unwrap().trim().to_string()
    }

    pub fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits for the server to exit by itself.
    pub fn terminate(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the server did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

/// The JSON of a response with the expected status; the body in the panic message otherwise.
pub fn expect(response: Response, status: u16) -> Value {
    let got = response.status().as_u16();
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    let text = response.text().unwrap();
    assert_eq!(got, status, "body: {text}");
    if got >= 400 {
        assert_eq!(content_type.as_deref(), Some("application/problem+json"), "{text}");
    }
    if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) }
}

/// Creates a tenant; returns (id, token).
pub fn tenant(server: &Server, name: &str) -> (String, String) {
    let r = client().post(server.url("/v1/tenants")).bearer_auth(server.admin()).json(&json!({"name": name})).send();
    let t = expect(r.unwrap(), 201);
    (t["id"].as_str().unwrap().to_string(), t["token"].as_str().unwrap().to_string())
}

pub fn upload(server: &Server, token: &str, wasm: &str, label: Option<(&str, &str)>) -> Response {
    let mut url = server.url("/v1/artifacts");
    if let Some((name, version)) = label {
        url = format!("{url}?name={name}&version={version}");
    }
    client().post(url).bearer_auth(token).body(std::fs::read(wasm).unwrap()).send().unwrap()
}

pub fn submit(server: &Server, token: &str, yaml: &str) -> Response {
    client()
        .post(server.url("/v1/jobs"))
        .bearer_auth(token)
        .header("content-type", "application/yaml")
        .body(yaml.to_string())
        .send()
        .unwrap()
}

pub fn job(server: &Server, token: &str, id: &str) -> Value {
    expect(client().get(server.url(&format!("/v1/jobs/{id}"))).bearer_auth(token).send().unwrap(), 200)
}

/// Polls the job until `done` holds for it. The deadline only turns a hang into a failure.
pub fn wait_job(server: &Server, token: &str, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let j = job(server, token, id);
        if done(&j) {
            return j;
        }
        assert!(Instant::now() < deadline, "job never {what}: {j}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn output_lines(server: &Server, token: &str, id: &str) -> Vec<Value> {
    let r = client().get(server.url(&format!("/v1/jobs/{id}/output"))).bearer_auth(token).send().unwrap();
    assert_eq!(r.status(), 200);
    r.text().unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The oracle of a running word count over `text`: 1..=n for each whitespace-separated word
/// seen n times, as sorted (word, count) pairs.
pub fn running_word_counts(text: &str) -> Vec<(String, u64)> {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for word in text.split_whitespace() {
        *seen.entry(word.to_owned()).or_default() += 1;
    }
    let mut counts: Vec<(String, u64)> = seen.iter().flat_map(|(w, n)| (1..=*n).map(move |k| (w.clone(), k))).collect();
    counts.sort();
    counts
}

/// The job's output as sorted (key, count) pairs.
pub fn output_counts(server: &Server, token: &str, id: &str) -> Vec<(String, u64)> {
    let mut got: Vec<(String, u64)> = output_lines(server, token, id)
        .iter()
        .map(|v| (v["key"].as_str().unwrap().to_owned(), v["value"].as_u64().unwrap()))
        .collect();
    got.sort();
    got
}

/// A running count over `events` generated events paced at 1 500/s, exactly-once files sink.
pub fn counts_job(events: u64) -> String {
    format!(
        "name: counts\nsources:\n  - {{type: generator, name: g, seed: 7, events: {events}, keys: 30, key_field: user, \
         key_prefix: u-, value_field: v, min_value: 1, max_value: 9, start_ms: 0, interval_ms: 5, rate_per_sec: 1500}}\n\
         steps:\n  - {{name: count, wasm: count@1, key_by: /user}}\ncheckpoints: {{interval_ms: 200}}\n\
         sink: {{type: files, dir: out}}\n"
    )
}

/// Exactly once: each user's running counts are 1..=n once each, the n summing to `events`.
pub fn assert_counted_once(server: &Server, token: &str, id: &str, events: u64) {
    assert_eq!(counted_once(server, token, id), events);
}

/// Checks each user's running counts in the job's output are 1..=n once each (nothing lost or
/// duplicated); returns the sum of the n.
pub fn counted_once(server: &Server, token: &str, id: &str) -> u64 {
    let mut per_user: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for v in output_lines(server, token, id) {
        per_user.entry(v["key"].as_str().unwrap().to_string()).or_default().push(v["value"].as_u64().unwrap());
    }
    let mut total = 0;
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        let n = counts.len() as u64;
        assert_eq!(counts, (1..=n).collect::<Vec<_>>(), "user {user}: lost or duplicated counts");
        total += n;
    }
    total
}

pub fn post(server: &Server, token: &str, path: &str, body: Value) -> Response {
    client().post(server.url(path)).bearer_auth(token).json(&body).send().unwrap()
}

/// The admin sets tenant `id`'s quotas (fields left out take the defaults).
pub fn set_quotas(server: &Server, id: &str, quotas: Value) {
    let set = client().put(server.url(&format!("/v1/tenants/{id}/quotas"))).bearer_auth(server.admin()).json(&quotas);
    expect(set.send().unwrap(), 200);
}

/// The most memory the process `pid` has held so far (its `VmHWM`), in bytes.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/<pid>/status");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Writes `request` (bytes as they go on the wire) to `server` and reads the answer until the
/// server closes the connection or `wait` passes; the answer as text (empty if none came).
pub fn raw_exchange(server: &Server, request: &[u8], wait: Duration) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    stream.write_all(request).unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// `examples/polyglot/pipeline.yaml` as a job for `server`: its four components uploaded
/// (`parse@1`, `enrich@1`, `totals@1`, `alert@1`), the generator at `events` (paced at `rate`
/// per second), parallelism 3, checkpoints every 300 ms, restarts, an exactly-once files sink.
/// Returns the spec (JSON, which is YAML too) and the alerts it must commit.
pub fn polyglot_job(
    server: &Server,
    token: &str,
    events: u64,
    rate: Option<u64>,
) -> (String, std::collections::BTreeSet<eddy_tests::Alert>) {
    let steps = [
        ("parse", eddy_guest_artifacts::POLYGLOT_PARSE),
        ("enrich", eddy_guest_artifacts::POLYGLOT_ENRICH),
        ("totals", eddy_guest_artifacts::PURCHASE_TOTALS),
        ("alert", eddy_guest_artifacts::POLYGLOT_ALERT),
    ];
    for (name, wasm) in steps {
        expect(upload(server, token, wasm, Some((name, "1"))), 201);
    }
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/polyglot/pipeline.yaml");
    let mut spec = eddy_plan::PipelineSpec::from_file(&example).unwrap();
    let eddy_plan::SourceSpec::Generator(g) = &mut spec.sources[0] else { panic!("a generator source") };
    g.events = Some(events);
    g.rate_per_sec = rate;
    for (step, (name, _)) in spec.steps.iter_mut().zip(steps) {
        step.wasm = format!("{name}@1").into();
    }
    spec.parallelism = 3;
    spec.sink = eddy_plan::SinkSpec::Files { dir: Some("out".into()), s3: None };
    let oracle = eddy_tests::polyglot_alerts(&spec);
    let mut job = serde_json::to_value(&spec).unwrap();
    job["checkpoints"] = json!({"interval_ms": 300});
    job["restart"] = json!({"strategy": "fixed_delay", "attempts": 50, "delay_ms": 500});
    (job.to_string(), oracle)
}

/// The committed output of polyglot job `id` is `oracle`, each alert once.
pub fn assert_alerts_once(
    server: &Server,
    token: &str,
    id: &str,
    oracle: &std::collections::BTreeSet<eddy_tests::Alert>,
) {
    let got: Vec<eddy_tests::Alert> =
        output_lines(server, token, id).iter().map(|l| eddy_tests::alert_of(&l["value"])).collect();
    let distinct: std::collections::BTreeSet<eddy_tests::Alert> = got.iter().cloned().collect();
    assert_eq!(got.len(), distinct.len(), "an alert committed twice");
    assert_eq!(&distinct, oracle);
}

/// A job whose step `boom` (the hostile guest, uploaded as `hostile@1`) panics at its first
/// record, without restarts.
pub const PANIC_JOB: &str = "name: panics\nsources:\n  - {type: generator, name: g, seed: 1, events: 10}\n\
                             steps:\n  - {name: boom, wasm: hostile@1, config: {mode: panic}}\n\
                             restart: {strategy: none}\nsink: {type: blackhole}\n";

/// The failure of [`PANIC_JOB`] as the API shows it, checked against what the failure is by
/// definition: the guest's panic message apart, and the host's causes outermost first —
/// `leading` (where it ran), the subtask, the failed call, the trap — each also in the whole
/// message.
pub fn assert_panic_failure(j: &Value, leading: &[String]) {
    assert_eq!(j["status"], "failed", "{j}");
    let failure = &j["failures"][0];
    let guest = failure["guest_message"].as_str().unwrap_or_else(|| panic!("no guest message: {failure}"));
    assert!(guest.contains("hostile operator gave up on purpose"), "the guest's own words: {guest}");
    let causes: Vec<&str> = failure["causes"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(causes.len(), leading.len() + 3, "{causes:?}");
    assert_eq!(causes[..leading.len()], leading.iter().map(String::as_str).collect::<Vec<_>>()[..], "{causes:?}");
    let [subtask, call, trap] = causes[leading.len()..] else { unreachable!("three causes checked above") };
    assert!(subtask.starts_with("task `") && subtask.contains("boom") && subtask.ends_with(" subtask 0"), "{subtask}");
    assert_eq!(call, "operator `boom` failed in process");
    assert!(trap.starts_with("trapped: "), "{trap}");
    let message = failure["message"].as_str().unwrap();
    for cause in &causes {
        assert!(message.contains(cause), "the whole message holds `{cause}`: {message}");
    }
}

/// The users of `yaml`'s generator events, in event order.
fn generated_users(yaml: &str) -> Vec<String> {
    // The server names the checkpoint directory; a local parse needs one.
    let spec = eddy_plan::PipelineSpec::from_yaml(&yaml.replace("checkpoints: {", "checkpoints: {dir: c, ")).unwrap();
    let eddy_plan::SourceSpec::Generator(g) = &spec.sources[0] else { panic!("a generator source") };
    (0..g.events.unwrap())
        .map(|i| {
            let value: Value = eddy_tests::value_json(&eddy_connectors::generator_event(g, i).value);
            value["user"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The running counts of `users` when events before index `swap_at` add one and the rest
/// add two (the old code, then the new), as sorted (user, count) pairs.
fn swapped_counts(users: &[String], swap_at: usize) -> Vec<(String, u64)> {
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    let mut rows: Vec<(String, u64)> = users
        .iter()
        .enumerate()
        .map(|(i, user)| {
            let total = totals.entry(user).or_default();
            *total += if i < swap_at { 1 } else { 2 };
            (user.clone(), *total)
        })
        .collect();
    rows.sort();
    rows
}

/// Each user's running counts over `yaml`'s generator events, sorted.
pub fn generated_counts(yaml: &str) -> Vec<(String, u64)> {
    swapped_counts(&generated_users(yaml), usize::MAX)
}

/// Where a live swap of step `count` happened, from checkpoint `checkpoint` of tenant
/// `tenant_id`'s job `id` (generation 0) in the server's data directory `data`: the
/// generator's position at that barrier, and the code each `count` subtask's state goes on
/// with.
pub fn swap_point(data: &Path, tenant_id: &str, id: &str, checkpoint: u64) -> (usize, Vec<Option<String>>) {
    let store = data.join(format!("tenants/{tenant_id}/jobs/{id}/checkpoints/0"));
    let store = eddy_checkpoint::CheckpointStore::local(&store).unwrap();
    let meta = eddy_checkpoint::metadata::CheckpointMetadata::read(&store, checkpoint).unwrap();
    let at = meta
        .subtasks
        .iter()
        .find_map(|s| match &s.source {
            Some((_, eddy_checkpoint::SourcePosition::Generator { next_index })) => Some(*next_index as usize),
            _ => None,
        })
        .unwrap();
    let artifacts =
        meta.subtasks.iter().flat_map(|s| &s.operators).filter(|o| o.step == "count").map(|o| o.artifact.clone());
    (at, artifacts.collect())
}

/// The job's committed output is the running count of `yaml`'s events counted by one before
/// event `swap_at` and by two from it on (a live swap to `RUNNING_COUNT_V2` at that barrier).
pub fn assert_output_swapped_at(server: &Server, token: &str, id: &str, yaml: &str, swap_at: usize) {
    let mut rows: Vec<(String, u64)> = output_lines(server, token, id)
        .iter()
        .map(|v| (v["key"].as_str().unwrap().to_owned(), v["value"].as_u64().unwrap()))
        .collect();
    rows.sort();
    let users = generated_users(yaml);
    assert!(0 < swap_at && swap_at < users.len(), "the swap fell inside the input: {swap_at}");
    let expected = swapped_counts(&users, swap_at);
    let first_difference = rows.iter().zip(&expected).position(|(a, b)| a != b);
    assert!(
        rows == expected,
        "the output differs from the oracle for a swap at event {swap_at}: {} rows, {} expected, first difference at \
         {first_difference:?}: {:?} vs {:?}",
        rows.len(),
        expected.len(),
        first_difference.map(|i| &rows[i]),
        first_difference.map(|i| &expected[i]),
    );
}
