//! The web UI in a real browser: a real `eddy serve` process with a running job, and headless
//! Chromium signing in, watching the job's graph and checkpoints, and cancelling it.
//!
//! Chromium is driven over the DevTools protocol by `tests/ui/driver.mjs` (Node and
//! playwright-core); this file keeps the scenario and every assertion. `deploy/setup.sh`
//! installs Chromium and the driver's package. Screenshots go to `target/ui-artifacts/`.

// Helpers outside `#[test]` functions fail the test they serve when they panic.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{PANIC_JOB, Server, client, expect, upload};
use serde_json::{Value, json};

/// How long the UI may take to show something. Only turns a hang into a failure: every wait
/// returns as soon as its condition holds.
const UI_DEADLINE: Duration = Duration::from_secs(60);

/// An unbounded generator (no `events:`), paced, checkpointing often: it runs until cancelled.
const COUNTS: &str = "name: counts
sources:
  - {type: generator, name: g, seed: 7, keys: 30, key_field: user, key_prefix: u-, value_field: v, min_value: 1, max_value: 9, start_ms: 0, interval_ms: 5, rate_per_sec: 2000}
steps:
  - {name: count, wasm: count@1, key_by: /user, parallelism: 2}
checkpoints: {interval_ms: 500, retained: 200}
debug: {journal: true}
sink: {type: files, dir: out}
";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// `target/ui-artifacts/`, next to the profile directory that holds the `eddy` binary (so it
/// follows `CARGO_TARGET_DIR`).
fn artifacts_dir() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_eddy"));
    let target = exe.parent().and_then(Path::parent).unwrap();
    let dir = target.join("ui-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Says where a file was written even when libtest captures the output of passing tests.
fn announce(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// A tenant named `name` with a running-count artifact and the unbounded job; returns (token,
/// job id).
fn tenant_with_a_running_job(server: &Server, name: &str) -> (String, String) {
    let created = client().post(server.url("/v1/tenants")).bearer_auth(server.admin()).json(&json!({"name": name}));
    let token = expect(created.send().unwrap(), 201)["token"].as_str().unwrap().to_string();
    let wasm = std::fs::read(eddy_guest_artifacts::RUNNING_COUNT).unwrap();
    let upload = client().post(server.url("/v1/artifacts?name=count&version=1")).bearer_auth(&token).body(wasm);
    expect(upload.send().unwrap(), 201);
    let submit = client()
        .post(server.url("/v1/jobs"))
        .bearer_auth(&token)
        .header("content-type", "application/yaml")
        .body(COUNTS);
    let id = expect(submit.send().unwrap(), 201)["id"].as_str().unwrap().to_string();
    (token, id)
}

fn job(server: &Server, token: &str, id: &str) -> Value {
    expect(client().get(server.url(&format!("/v1/jobs/{id}"))).bearer_auth(token).send().unwrap(), 200)
}

/// Polls the API until the job shows live tasks; returns their labels.
fn live_labels(server: &Server, token: &str, id: &str) -> Vec<String> {
    let deadline = Instant::now() + UI_DEADLINE;
    loop {
        let j = job(server, token, id);
        if let Some(tasks) = j["live"]["tasks"].as_array().filter(|t| !t.is_empty()) {
            return tasks.iter().map(|t| t["label"].as_str().unwrap().to_string()).collect();
        }
        assert!(Instant::now() < deadline, "the job never showed live tasks: {j}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The selector of the elements marked `data-testid="id"`.
fn tid(id: &str) -> String {
    format!("[data-testid=\"{id}\"]")
}

/// What the browser test needs on this machine, or a panic saying how to get it: a missing
/// browser must fail the test, never skip it.
struct Prerequisites {
    chromium: PathBuf,
    driver: PathBuf,
}

fn prerequisites() -> Prerequisites {
    let chromium = std::env::var_os("EDDY_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    let driver_dir = repo_root().join("tests/ui");
    let mut missing = Vec::new();
    if !chromium.is_file() {
        missing.push(format!("Chromium at {} (or set EDDY_CHROMIUM)", chromium.display()));
    }
    if !Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success()) {
        missing.push("Node.js (`node` on PATH)".to_string());
    }
    if !driver_dir.join("node_modules/playwright-core/package.json").is_file() {
        missing.push(format!("the npm package playwright-core in {}/node_modules", driver_dir.display()));
    }
    assert!(missing.is_empty(), "the browser test needs {}: run deploy/setup.sh", missing.join(", "));
    Prerequisites { chromium, driver: driver_dir.join("driver.mjs") }
}

/// Headless Chromium behind `tests/ui/driver.mjs`, one JSON command and answer per line.
struct Browser {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
    artifacts: PathBuf,
}

impl Browser {
    fn launch(artifacts: &Path) -> Browser {
        let needs = prerequisites();
        let log = artifacts.join("driver.log");
        let mut child = Command::new("node")
            .arg(&needs.driver)
            .arg(&needs.chromium)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("start node tests/ui/driver.mjs");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Browser { child, stdin, stdout, log, artifacts: artifacts.to_owned() }
    }

    /// Sends one command and returns its value; a failed command fails the test.
    fn call(&mut self, command: Value) -> Value {
        let stdin = self.stdin.as_mut().unwrap();
        let sent = writeln!(stdin, "{command}").and_then(|()| stdin.flush());
        let mut line = String::new();
        let read = sent.and_then(|()| self.stdout.read_line(&mut line));
        if read.is_err() || line.is_empty() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!("the browser driver stopped at {command}; its log ({}):\n{log}", self.log.display());
        }
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["ok"], true, "browser command {command} failed: {}", answer["error"]);
        answer["value"].clone()
    }

    fn goto(&mut self, url: &str) {
        self.call(json!({"op": "goto", "url": url}));
    }

    fn fill(&mut self, sel: &str, text: &str) {
        self.call(json!({"op": "fill", "sel": sel, "text": text}));
    }

    fn click(&mut self, sel: &str) {
        self.call(json!({"op": "click", "sel": sel}));
    }

    fn count(&mut self, sel: &str) -> usize {
        self.call(json!({"op": "count", "sel": sel})).as_u64().unwrap() as usize
    }

    /// The text of the `nth` match, if it is there and visible.
    fn text(&mut self, sel: &str, nth: usize) -> Option<String> {
        self.call(json!({"op": "text", "sel": sel, "nth": nth})).as_str().map(str::to_string)
    }

    /// A metric's raw number (the UI keeps it in `data-value` next to the formatted text).
    fn number(&mut self, sel: &str, nth: usize) -> Option<f64> {
        self.attr(sel, nth, "data-value").and_then(|v| v.parse().ok())
    }

    /// The attribute `name` of the `nth` match, if both are there.
    fn attr(&mut self, sel: &str, nth: usize, name: &str) -> Option<String> {
        self.call(json!({"op": "attr", "sel": sel, "nth": nth, "name": name})).as_str().map(str::to_string)
    }

    /// An input's current value.
    fn value(&mut self, sel: &str) -> String {
        self.call(json!({"op": "value", "sel": sel})).as_str().unwrap().to_string()
    }

    fn screenshot(&mut self, name: &str) -> PathBuf {
        let path = self.artifacts.join(name);
        self.call(json!({"op": "screenshot", "path": path}));
        path
    }

    /// Polls `read` until it gives a value. At the deadline the page is saved as a screenshot
    /// and the test fails naming `what` and the last reading.
    fn wait_for<T>(&mut self, what: &str, mut read: impl FnMut(&mut Browser) -> Result<T, String>) -> T {
        let deadline = Instant::now() + UI_DEADLINE;
        loop {
            let last = match read(self) {
                Ok(value) => return value,
                Err(last) => last,
            };
            if Instant::now() >= deadline {
                let shot = self.screenshot("failure.png");
                panic!("the UI never showed {what} (last: {last}); screenshot: {}", shot.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The text of the `nth` match, read again while the page is replacing it (a periodic
    /// render swaps whole tables and boxes, and a read in that moment finds nothing).
    fn shown(&mut self, sel: &str, nth: usize) -> String {
        self.wait_for(&format!("{sel} #{nth}"), |b| b.text(sel, nth).ok_or_else(|| "not there".to_owned()))
    }

    /// Waits until the element's text satisfies `ok`; returns it.
    fn wait_text(&mut self, what: &str, sel: &str, ok: impl Fn(&str) -> bool) -> String {
        self.wait_for(what, |b| match b.text(sel, 0) {
            Some(text) if ok(&text) => Ok(text),
            other => Err(format!("{other:?}")),
        })
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closing stdin ends the driver, which closes Chromium; a kill covers a driver that hangs.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The API serves the UI's files with the right types.
fn check_assets(server: &Server) {
    for (path, media) in [
        ("/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        let r = client().get(server.url(path)).send().unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let content_type = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(content_type.starts_with(media), "{path} is served as {content_type}");
    }
}

/// A wrong token shows the API's own detail on the sign-in form.
fn wrong_token_shows_the_detail(browser: &mut Browser, server: &Server) {
    let answer = client().get(server.url("/v1/whoami")).bearer_auth("not-a-token").send().unwrap();
    let detail = expect(answer, 401)["detail"].as_str().unwrap().to_string();
    browser.fill(&tid("token-input"), "not-a-token");
    browser.click(&tid("signin-button"));
    browser.wait_text("the API's error detail for a wrong token", &tid("signin-error"), |t| t.contains(&detail));
    assert_eq!(browser.text(&tid("session"), 0), None, "a wrong token does not sign in");
    browser.screenshot("signin-error.png");
}

/// The job page shows one box per task, in plan order, with an arrow between consecutive ones.
fn graph_matches_the_plan(browser: &mut Browser, labels: &[String]) {
    let n = labels.len();
    browser.wait_for("one box per task", |b| {
        let boxes = b.count(&tid("task"));
        if boxes == n { Ok(()) } else { Err(format!("{boxes} boxes for {n} tasks")) }
    });
    assert_eq!(browser.count(&tid("exchange")), n - 1, "an arrow between consecutive tasks");
    for (i, label) in labels.iter().enumerate() {
        let shown = browser.shown(&tid("task-label"), i);
        for step in label.split(" -> ") {
            assert!(shown.contains(step), "task {i} shows {shown:?}, not its step {step}");
        }
    }
}

/// One row per subtask of every task, each with its worker; the rows of a task add up to its
/// box's records in (read from one render: a refresh between two readings is retried). The
/// arrow into the keyed task names its exchange.
fn subtasks_add_up_to_their_task(browser: &mut Browser, parallelisms: &[u64]) {
    let rows = browser.wait_for("a row per subtask", |b| {
        let rows = b.count(&tid("subtask-row"));
        let want = parallelisms.iter().sum::<u64>() as usize;
        if rows == want { Ok(rows) } else { Err(format!("{rows} rows for {want} subtasks")) }
    });
    let last = parallelisms.len() - 1;
    let first_row = rows - parallelisms[last] as usize;
    browser.wait_for("the last task's subtasks adding up to its records in", |b| {
        let total = b.number(&tid("task-records-in"), last);
        let parts: Vec<Option<f64>> = (first_row..rows).map(|r| b.number(&tid("subtask-records-in"), r)).collect();
        let again = b.number(&tid("task-records-in"), last);
        let sum: Option<f64> = parts.iter().copied().sum();
        match (total, sum, again) {
            (Some(t), Some(s), Some(a)) if t == a && t == s && t > 0.0 => Ok(()),
            other => Err(format!("task and subtasks' sum (task, sum, task again): {other:?}")),
        }
    });
    assert_eq!(browser.shown(&tid("subtask-worker"), 0), "this server");
    assert_eq!(browser.shown(&tid("exchange-type"), 0), "hash(/user)");
}

/// The last task receives the counted records over an exchange: its counter rises between two
/// readings and its rate reads above zero.
fn records_flow(browser: &mut Browser, task: usize) {
    let first =
        browser.wait_for("records arriving at the last task", |b| match b.number(&tid("task-records-in"), task) {
            Some(n) if n > 0.0 => Ok(n),
            other => Err(format!("{other:?}")),
        });
    browser.wait_for("the records counter rising with a positive rate", |b| {
        let later = b.number(&tid("task-records-in"), task);
        let rate = b.number(&tid("task-in-rate"), task);
        match (later, rate) {
            (Some(later), Some(rate)) if later > first && rate > 0.0 => Ok(()),
            other => Err(format!("records in {first} then {other:?}")),
        }
    });
    let rate = browser.shown(&tid("task-in-rate"), task);
    assert!(rate.ends_with("/s"), "the rate reads as records per second: {rate}");
    let backpressure = browser.shown(&tid("task-backpressure"), task);
    assert!(backpressure.ends_with('%'), "backpressure reads as a percentage: {backpressure}");
    browser.shown(&tid("task-watermark"), task);
}

/// The job's last minutes: a throughput line of as many points as the API's timeline holds
/// (at most a few seconds behind: the page polls), whose newest value is one the API
/// reported and above zero; backpressure reads as a percentage. The generator's event time
/// starts near 0, so its lag is not drawn.
fn timelines_follow_the_api(browser: &mut Browser, server: &Server, token: &str, id: &str) {
    browser.wait_for("two points on the throughput timeline", |b| {
        match b.attr(&tid("timeline-throughput"), 0, "data-points").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n >= 2 => Ok(()),
            other => Err(format!("{other:?} points")),
        }
    });
    let points = |j: Value| j["live"]["timeline"].as_array().cloned().unwrap_or_default();
    let before = points(job(server, token, id));
    let drawn: usize = browser.attr(&tid("timeline-throughput"), 0, "data-points").unwrap().parse().unwrap();
    let newest = browser.number(&tid("timeline-throughput-now"), 0).unwrap();
    let after = points(job(server, token, id));
    assert!(
        before.len().saturating_sub(3) <= drawn && drawn <= after.len(),
        "{drawn} points drawn, the API held {} then {}",
        before.len(),
        after.len()
    );
    let rates: Vec<f64> = before.iter().chain(&after).filter_map(|p| p["source_records_per_sec"].as_f64()).collect();
    // serde_json parses floats to within an ulp (no `float_roundtrip`), the browser's text exactly.
    let same = |r: &f64| (r - newest).abs() <= newest.abs() * 1e-12;
    assert!(rates.iter().any(same), "the newest throughput {newest} is one the API reported: {rates:?}");
    assert!(rates.iter().any(|r| *r > 0.0), "records were read: {rates:?}");
    let shown = browser.shown(&tid("timeline-throughput-now"), 0);
    assert!(shown.ends_with("/s"), "throughput reads as records per second: {shown}");
    let backpressure = browser.shown(&tid("timeline-backpressure-now"), 0);
    assert!(backpressure.ends_with('%'), "backpressure reads as a percentage: {backpressure}");
    assert_eq!(browser.shown(&tid("timeline-lag-now"), 0), "—", "no lag behind a generator's clock");
}

/// Each subtask's state size: through the API, the subtasks' sizes and the records in flight
/// add up to the newest checkpoint's size (both from one live view; a checkpoint completing
/// between the two readings is retried); on the page, the keyed subtasks show theirs and an
/// aligned checkpoint stores nothing in flight.
fn state_sizes_add_up_to_the_checkpoint(browser: &mut Browser, server: &Server, token: &str, id: &str) {
    let deadline = Instant::now() + UI_DEADLINE;
    loop {
        let live = job(server, token, id)["live"].clone();
        let sizes: Vec<u64> = live["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["subtasks"].as_array().unwrap().iter().filter_map(|s| s["state_bytes"].as_u64()))
            .collect();
        let newest = live["checkpoints"].as_array().and_then(|c| c.last()).cloned().unwrap_or_default();
        let full = newest["full_bytes"].as_u64();
        let sum = sizes.iter().sum::<u64>() + newest["in_flight_bytes"].as_u64().unwrap_or(0);
        if full == Some(sum) && sum > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "subtask sizes {sizes:?} never added up to the checkpoint {newest}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let last_row = browser.count(&tid("subtask-row")) - 1;
    browser.wait_for("the keyed subtask's state size", |b| match b.number(&tid("subtask-state"), last_row) {
        Some(n) if n > 0.0 => Ok(()),
        other => Err(format!("{other:?}")),
    });
    assert_eq!(browser.shown(&tid("checkpoint-in-flight"), 0), "—", "aligned: nothing in flight");
    let stats = browser.shown(&tid("checkpoint-stats"), 0);
    assert!(stats.contains("in flight 0 B (0 unaligned)"), "the checkpoint summary: {stats}");
}

/// A job whose guest panics: its page shows the guest's words apart and the host's causes in
/// the order the API gives them.
fn a_failure_shows_the_guests_words_and_the_cause_chain(browser: &mut Browser, server: &Server, token: &str) {
    expect(upload(server, token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    let submit = client()
        .post(server.url("/v1/jobs"))
        .bearer_auth(token)
        .header("content-type", "application/yaml")
        .body(PANIC_JOB);
    let id = expect(submit.send().unwrap(), 201)["id"].as_str().unwrap().to_string();
    browser.goto(&server.url(&format!("/#/jobs/{id}")));
    browser.wait_text("the job failed", &tid("job-status"), |t| t == "failed");
    let failure = job(server, token, &id)["failures"][0].clone();
    let causes: Vec<String> =
        failure["causes"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_owned()).collect();
    assert!(causes.len() >= 3, "{failure}");
    let shown = browser.wait_for("the causes listed", |b| {
        let shown: Vec<String> =
            (0..b.count(&tid("failure-cause"))).filter_map(|i| b.text(&tid("failure-cause"), i)).collect();
        if shown.len() == causes.len() { Ok(shown) } else { Err(format!("{shown:?}")) }
    });
    assert_eq!(shown, causes, "the page lists the API's causes in order");
    let guest = browser.shown(&tid("failure-guest"), 0);
    assert_eq!(guest, format!("The operator said: {}", failure["guest_message"].as_str().unwrap()));
    assert!(guest.contains("hostile operator gave up on purpose"), "{guest}");
    browser.screenshot("failure.png");
}

/// The count of `key` in the job's newest checkpoint, read through the API.
fn checkpointed_count(server: &Server, token: &str, id: &str, key: &str) -> u64 {
    let url = server.url(&format!("/v1/jobs/{id}/state?step=count&key={key}"));
    let read = expect(client().get(url).bearer_auth(token).send().unwrap(), 200);
    read["entries"][0]["value"].as_u64().unwrap_or_else(|| panic!("no count for {key}: {read}"))
}

/// The state lookup shows a key's count from the newest checkpoint: the job keeps running, so
/// the count shown lies between the API's answers just before and just after. A step without
/// state is named in the error.
fn state_lookup_shows_a_keys_count(browser: &mut Browser, server: &Server, token: &str, id: &str) {
    let step = browser.wait_for("the step offered for a state lookup", |b| match b.value(&tid("state-step")) {
        v if v.is_empty() => Err("empty".into()),
        v => Ok(v),
    });
    assert_eq!(step, "count", "the keyed step is offered");
    let before = checkpointed_count(server, token, id, "u-3");
    browser.fill(&tid("state-key"), "u-3");
    browser.click(&tid("state-lookup"));
    browser.wait_for("one state row", |b| match b.count(&tid("state-row")) {
        1 => Ok(()),
        n => Err(format!("{n} rows")),
    });
    let shown: u64 = browser.shown(&tid("state-row-value"), 0).parse().unwrap();
    let after = checkpointed_count(server, token, id, "u-3");
    assert!(before <= shown && shown <= after, "shown {shown}, the API said {before} before and {after} after");
    assert_eq!(browser.shown(&tid("state-row-key"), 0), "\"u-3\"");
    assert_eq!(browser.shown(&tid("state-row-state"), 0), "count");
    let summary = browser.shown(&tid("state-summary"), 0);
    assert!(summary.starts_with("Checkpoint ") && summary.contains("1 entry."), "{summary}");
    browser.screenshot("state.png");
    browser.fill(&tid("state-step"), "nope");
    browser.click(&tid("state-lookup"));
    browser.wait_text("the error for a step without state", &tid("state-error"), |t| {
        t.contains("no state of step `nope`")
    });
    let stale = browser.text(&tid("state-summary"), 0).filter(|t| !t.is_empty());
    assert_eq!(stale, None, "a failed lookup leaves no stale summary");
}

/// Replay from the job page: one key's records, state and outputs, the same first events the
/// API answers for the same query (the journal keeps the job's start, so both replay from it);
/// asked of the other subtask, the summary names the key's.
fn replay_from_the_job_page(browser: &mut Browser, server: &Server, token: &str, id: &str) {
    let api = |subtask: u64| {
        let url = format!("/v1/jobs/{id}/replay?step=count&subtask={subtask}&key=u-3&limit=40");
        expect(client().get(server.url(&url)).bearer_auth(token).send().unwrap(), 200)
    };
    let owner = api(0)["summary"]["key_subtask"].as_u64().unwrap();
    assert_eq!(browser.value(&tid("replay-step")), "count", "the keyed step is offered");
    browser.fill(&tid("replay-key"), "u-3");
    browser.fill(&tid("replay-subtask"), &(1 - owner).to_string());
    browser.click(&tid("replay-run"));
    let elsewhere = browser
        .wait_text("the replay of the other subtask", &tid("replay-summary"), |t| t.starts_with("Step count, subtask"));
    assert!(elsewhere.contains(&format!("The key is in subtask {owner}'s key groups")), "{elsewhere}");
    browser.fill(&tid("replay-subtask"), &owner.to_string());
    browser.click(&tid("replay-run"));
    let summary = browser.wait_text("the replay", &tid("replay-summary"), |t| {
        t.starts_with(&format!("Step count, subtask {owner}, from the job's start"))
    });
    assert!(!summary.contains("The key is in"), "{summary}");
    let answer = api(owner);
    let events = answer["events"].as_array().unwrap();
    assert_eq!(events.len(), 40, "{answer}");
    let mut count = 0;
    for (i, e) in events.iter().enumerate() {
        let what = browser.shown(&tid("replay-row-what"), i);
        assert_eq!(what, e["event"].as_str().unwrap().replacen('_', " ", 1), "row {i}: {e}");
        let key = browser.text(&tid("replay-row-key"), i).unwrap_or_default();
        assert_eq!(key, if e["key"].is_null() { String::new() } else { e["key"].to_string() }, "row {i}");
        if e["event"] == "output" {
            count += 1;
            assert_eq!(e["value"], json!(count), "the running count of u-3 goes up by one per record");
            assert_eq!(browser.text(&tid("replay-row-detail"), i), Some(count.to_string()));
        }
        if e["event"] == "input" {
            assert_eq!(e["key"], json!("u-3"), "only the key asked for");
        }
    }
    assert!(count > 0, "the first 40 events hold outputs: {answer}");
    browser.screenshot("replay.png");
}

/// A live upgrade from the job page: the answer names the checkpoint, the job (same
/// generation) runs the new artifact; an unknown artifact shows the server's problem.
fn live_upgrade_from_the_job_page(browser: &mut Browser, server: &Server, token: &str, id: &str) {
    let wasm = std::fs::read(eddy_guest_artifacts::RUNNING_COUNT_V2).unwrap();
    let upload = client().post(server.url("/v1/artifacts?name=count&version=2")).bearer_auth(token).body(wasm);
    let v2 = expect(upload.send().unwrap(), 201)["digest"].as_str().unwrap().to_string();
    assert_eq!(browser.value(&tid("upgrade-step")), "count", "the keyed step is offered");
    browser.fill(&tid("upgrade-wasm"), "count@9");
    browser.click(&tid("upgrade-live"));
    browser.wait_text("the problem with an unknown artifact", &tid("upgrade-error"), |t| {
        t.contains("not one of your artifacts")
    });
    browser.fill(&tid("upgrade-wasm"), "count@2");
    browser.click(&tid("upgrade-live"));
    let summary =
        browser.wait_text("the swap's checkpoint", &tid("upgrade-summary"), |t| t.contains("from checkpoint"));
    assert!(summary.contains(&v2) && summary.contains("subtasks swapped: 2"), "{summary}");
    let after = job(server, token, id);
    assert_eq!((&after["artifacts"][0], &after["generation"]), (&json!(v2), &json!(0)), "swapped, not restarted");
    browser.screenshot("upgrade.png");
}

#[test]
fn a_tenant_signs_in_watches_a_running_job_and_cancels_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    check_assets(&server);
    let (token, id) = tenant_with_a_running_job(&server, "acme");
    let labels = live_labels(&server, &token, &id);
    let artifacts = artifacts_dir();
    let mut browser = Browser::launch(&artifacts);

    browser.goto(&server.url("/"));
    browser.wait_text("the sign-in form", &tid("signin"), |_| true);
    wrong_token_shows_the_detail(&mut browser, &server);

    browser.fill(&tid("token-input"), &token);
    browser.click(&tid("signin-button"));
    browser.wait_text("who is signed in", &tid("whoami"), |t| t.contains("acme"));

    let row = format!("{}[data-job-id=\"{id}\"]", tid("job-row"));
    browser.wait_text("the job running in the list", &format!("{row} {}", tid("job-row-status")), |t| t == "running");
    browser.screenshot("jobs.png");
    browser.click(&format!("{row} {}", tid("job-link")));
    browser.wait_text("the job's page", &tid("job-name"), |t| t == "counts");
    browser.wait_text("the job's status", &tid("job-status"), |t| t == "running");

    graph_matches_the_plan(&mut browser, &labels);
    let parallelisms: Vec<u64> = job(&server, &token, &id)["live"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["parallelism"].as_u64().unwrap())
        .collect();
    assert_eq!(parallelisms.last(), Some(&2), "the keyed task runs two subtasks");
    subtasks_add_up_to_their_task(&mut browser, &parallelisms);
    records_flow(&mut browser, labels.len() - 1);
    timelines_follow_the_api(&mut browser, &server, &token, &id);
    browser.wait_for("a completed checkpoint", |b| match b.count(&tid("checkpoint-row")) {
        0 => Err("no rows".to_string()),
        _ => Ok(()),
    });
    browser.shown(&tid("checkpoint-chart"), 0);
    let stats = browser.shown(&tid("checkpoint-stats"), 0);
    assert!(
        stats.contains("duration min / avg / max") && stats.contains("longest alignment"),
        "the checkpoint summary: {stats}"
    );
    state_sizes_add_up_to_the_checkpoint(&mut browser, &server, &token, &id);
    state_lookup_shows_a_keys_count(&mut browser, &server, &token, &id);
    replay_from_the_job_page(&mut browser, &server, &token, &id);
    live_upgrade_from_the_job_page(&mut browser, &server, &token, &id);
    let shot = browser.screenshot("job.png");
    announce(&format!("ui test: screenshot of the job page at {} (more in that directory)", shot.display()));

    // An upload compiling in the background that fails shows up with its status and reason.
    let broken = client()
        .post(server.url("/v1/artifacts?wait=false"))
        .bearer_auth(&token)
        .body(b"\0asm\x0d\0\x01\0garbage".to_vec())
        .send()
        .unwrap();
    assert_eq!(broken.status(), 202);
    browser.click(&format!("{} [data-nav=\"artifacts\"]", tid("nav")));
    browser.wait_text("the failed compile", &tid("compile-status"), |t| t == "failed");
    assert!(!browser.text(&tid("compile-error"), 0).unwrap_or_default().is_empty(), "the reason is shown");
    browser.wait_for("both uploaded artifacts", |b| match b.count(&tid("artifact-row")) {
        2 => Ok(()),
        n => Err(format!("{n} rows")),
    });
    let names: Vec<String> = (0..2).filter_map(|i| browser.text(&tid("artifact-names"), i)).collect();
    assert!(names.iter().any(|n| n.contains("count@1")) && names.iter().any(|n| n.contains("count@2")), "{names:?}");
    let digest = browser.shown(&tid("artifact-digest"), 0);
    assert!(digest.starts_with("sha256:") && digest.ends_with('…'), "the digest is shortened: {digest}");
    assert_eq!(browser.shown(&tid("artifact-world"), 0), "keyed-operator");
    browser.screenshot("artifacts.png");

    browser.goto(&server.url(&format!("/#/jobs/{id}")));
    browser.wait_text("the job's page again", &tid("job-status"), |t| t == "running");
    browser.click(&tid("cancel-job"));
    browser.wait_text("the cancel button asking to confirm", &tid("cancel-job"), |t| t.contains("again"));
    browser.click(&tid("cancel-job"));
    browser.wait_text("the job canceled", &tid("job-status"), |t| t == "canceled");
    assert_eq!(job(&server, &token, &id)["status"], "canceled");

    a_failure_shows_the_guests_words_and_the_cause_chain(&mut browser, &server, &token);

    browser.click(&tid("sign-out"));
    browser.wait_text("the sign-in form after signing out", &tid("signin"), |_| true);
    browser.goto(&server.url("/"));
    browser.wait_text("the sign-in form after a reload (the token is forgotten)", &tid("signin"), |_| true);

    // A second tenant signs in and sees its own job, never the first tenant's.
    let (other_token, other_id) = tenant_with_a_running_job(&server, "globex");
    browser.fill(&tid("token-input"), &other_token);
    browser.click(&tid("signin-button"));
    browser.wait_text("the second tenant signed in", &tid("whoami"), |t| t.contains("globex"));
    let other_row = format!("{}[data-job-id=\"{other_id}\"]", tid("job-row"));
    browser.wait_text("its own job running", &format!("{other_row} {}", tid("job-row-status")), |t| t == "running");
    assert_eq!(browser.count(&row), 0, "the first tenant's job is not listed for the second");
    browser.screenshot("jobs-second-tenant.png");
    let cancel = client().post(server.url(&format!("/v1/jobs/{other_id}/cancel"))).bearer_auth(&other_token);
    expect(cancel.send().unwrap(), 202);

    let errors = browser.call(json!({"op": "errors"}));
    assert_eq!(errors, json!([]), "the page raised errors");
}

/// The admin's workers page on a coordinator with two worker processes: it is the admin's
/// home, its rows match `GET /v1/workers`, and a worker killed with SIGKILL leaves the page
/// once the coordinator declares it lost. A tenant is offered no workers page.
#[test]
fn the_admin_watches_the_workers_and_a_killed_one_leaves() {
    use common::fleet::{Worker, names, workers};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_as("coordinator", &dir.path().join("data"), &["--heartbeat-timeout-ms", "2000"]);
    let alpha = Worker::start(&server, "alpha", dir.path(), &[]);
    let _beta = Worker::start(&server, "beta", dir.path(), &[]);
    common::fleet::eventually("two workers registered", || names(&server) == ["alpha", "beta"]);
    let mut browser = Browser::launch(&artifacts_dir());

    browser.goto(&server.url("/"));
    browser.fill(&tid("token-input"), &server.admin());
    browser.click(&tid("signin-button"));
    browser.wait_text("the admin signed in", &tid("whoami"), |t| t.contains("admin"));
    // A row read while the page replaces the table reads as missing: that read is no answer
    // (dropping it once made a listing of both workers look like one without `alpha`).
    let shown = |b: &mut Browser| -> Vec<String> {
        let names: Option<Vec<String>> =
            (0..b.count(&tid("worker-row"))).map(|i| b.text(&tid("worker-name"), i)).collect();
        names.unwrap_or_else(|| vec!["(the table was being replaced)".into()])
    };
    browser.wait_for("both workers listed", |b| match shown(b) {
        names if names == ["alpha", "beta"] => Ok(()),
        names => Err(format!("{names:?}")),
    });
    for (i, listed) in workers(&server).iter().enumerate() {
        let row = format!("{}[data-worker=\"{}\"]", tid("worker-row"), listed["name"].as_str().unwrap());
        // Read again while the page replaces the table (the cell is missing for that moment).
        let cell = |b: &mut Browser, id: &str| {
            b.wait_text(&format!("worker {i}'s {id}"), &format!("{row} {}", tid(id)), |_| true)
        };
        assert_eq!(cell(&mut browser, "worker-slots"), listed["slots"].to_string(), "worker {i}");
        assert_eq!(cell(&mut browser, "worker-data-addr"), listed["data_addr"].as_str().unwrap(), "worker {i}");
        let free = cell(&mut browser, "worker-free-slots");
        assert_eq!(free, listed["free_slots"].to_string(), "no job runs: every slot is free");
        let beat_cell = format!("{row} {}", tid("worker-heartbeat"));
        let beat = browser.wait_for("a heartbeat's age", |b| b.number(&beat_cell, 0).ok_or("missing".to_string()));
        assert!(beat < 2000.0, "a live worker's heartbeat is younger than the timeout: {beat} ms");
    }
    browser.screenshot("workers.png");

    alpha.kill_9();
    browser.wait_for("the killed worker gone from the page", |b| match shown(b) {
        names if names == ["beta"] => Ok(()),
        names => Err(format!("{names:?}")),
    });
    assert_eq!(names(&server), ["beta"], "the page follows the API");

    let created = client().post(server.url("/v1/tenants")).bearer_auth(server.admin()).json(&json!({"name": "acme"}));
    let token = expect(created.send().unwrap(), 201)["token"].as_str().unwrap().to_string();
    browser.click(&tid("sign-out"));
    browser.fill(&tid("token-input"), &token);
    browser.click(&tid("signin-button"));
    browser.wait_text("the tenant signed in", &tid("whoami"), |t| t.contains("acme"));
    assert_eq!(browser.text(&tid("nav-workers"), 0), None, "a tenant is offered no workers page");
    let errors = browser.call(json!({"op": "errors"}));
    assert_eq!(errors, json!([]), "the page raised errors");
}
