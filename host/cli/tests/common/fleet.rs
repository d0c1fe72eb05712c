//! A cluster's worker processes, for the tests that start a coordinator and workers.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Server, client, upload};

/// A worker process, killed when dropped.
pub struct Worker {
    pub child: Child,
    pub log: std::path::PathBuf,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    /// A worker with 2 slots.
    pub fn start(coordinator: &Server, name: &str, dir: &Path, extra: &[&str]) -> Worker {
        Self::start_with(coordinator, name, dir, "2", extra)
    }

    /// A worker with `slots` slots.
    pub fn start_with_slots(coordinator: &Server, name: &str, dir: &Path, slots: &str) -> Worker {
        Self::start_with(coordinator, name, dir, slots, &[])
    }

    /// A worker with `slots` slots whose standard output (a print sink's records) is
    /// `child.stdout`, for the caller to read.
    pub fn start_piped(coordinator: &Server, name: &str, dir: &Path, slots: &str) -> Worker {
        Self::spawn(coordinator, name, dir, slots, &[], Stdio::piped())
    }

    fn start_with(coordinator: &Server, name: &str, dir: &Path, slots: &str, extra: &[&str]) -> Worker {
        Self::spawn(coordinator, name, dir, slots, extra, Stdio::null())
    }

    fn spawn(coordinator: &Server, name: &str, dir: &Path, slots: &str, extra: &[&str], stdout: Stdio) -> Worker {
        let log = dir.join(format!("{name}.log"));
        let tmp = temp_dir(dir);
        std::fs::create_dir_all(&tmp).unwrap();
        // A worker without --tls enrolls: the admin gives it a join token for its name, which
        // also lets a restart with an empty data directory enroll the same name again.
        let enroll = if extra.contains(&"--tls") {
            Vec::new()
        } else {
            vec!["--join-token".to_owned(), join_token(coordinator, Some(name))]
        };
        let child = Command::new(env!("CARGO_BIN_EXE_eddy"))
            .args(["worker", "--coordinator", &format!("127.0.0.1:{}", coordinator.port()), "--name", name])
            .args(["--slots", slots, "--data-dir"])
            .arg(dir.join(name))
            .args(extra)
            .args(&enroll)
            .env("EDDY_LOG", "info")
            .env("TMPDIR", tmp)
            .envs(super::S3_CREDENTIALS)
            .stdout(stdout)
            // Appended: a restarted worker's log follows its predecessor's.
            .stderr(Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap()))
            .spawn()
            .unwrap();
        Worker { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// The temporary directory (`TMPDIR`) of the workers started in `dir`: theirs alone, so a test
/// sees what they leave behind.
pub fn temp_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("tmp")
}

/// A join token of `coordinator`'s for `name` (any new name if none), from its admin.
pub fn join_token(coordinator: &Server, name: Option<&str>) -> String {
    let response = client()
        .post(coordinator.url("/v1/cluster/join-tokens"))
        .bearer_auth(coordinator.admin())
        .json(&serde_json::json!({ "name": name }))
        .send()
        .unwrap();
    assert_eq!(response.status(), 201, "no join token: {}", response.text().unwrap_or_default());
    response.json::<Value>().unwrap()["token"].as_str().unwrap().to_owned()
}

pub fn workers(server: &Server) -> Vec<Value> {
    let response = client().get(server.url("/v1/workers")).bearer_auth(server.admin()).send().unwrap();
    assert_eq!(response.status(), 200);
    response.json::<Vec<Value>>().unwrap()
}

pub fn names(server: &Server) -> Vec<String> {
    let mut names: Vec<String> = workers(server).iter().map(|w| w["name"].as_str().unwrap().to_owned()).collect();
    names.sort();
    names
}

pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The shipped Nexmark `query` (`q5`, `q8`, ...) at `parallelism` over `events` events, each
/// step's component uploaded and named by its digest.
pub fn nexmark_query(
    server: &Server,
    token: &str,
    query: &str,
    parallelism: u32,
    events: u64,
) -> eddy_plan::PipelineSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../examples/nexmark/{query}.yaml"));
    let mut spec = eddy_plan::PipelineSpec::from_file(&path).unwrap();
    spec.parallelism = parallelism;
    for step in &mut spec.steps {
        step.parallelism = None;
        let uploaded = upload(server, token, step.wasm.to_str().unwrap(), None);
        let digest = uploaded.json::<Value>().unwrap()["digest"].as_str().unwrap().to_owned();
        step.wasm = digest.into();
    }
    for source in &mut spec.sources {
        if let eddy_plan::SourceSpec::Nexmark(s) = source {
            s.events = Some(events);
            s.parallelism = parallelism;
        }
    }
    spec
}

/// A small seeded generator (xorshift), so a failing schedule of kills can be replayed
/// (`EDDY_CRASH_SEED`; a new seed, printed, otherwise).
pub struct Rng(pub u64);

impl Rng {
    /// From `EDDY_CRASH_SEED`, or the clock; prints the seed.
    pub fn from_env() -> Rng {
        let seed = std::env::var("EDDY_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
        });
        println!("crash schedule seed {seed} (EDDY_CRASH_SEED={seed} replays it)");
        Rng(seed)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The indexes (0 for `worker-1`) of the workers a job's running attempt uses, from its view.
pub fn used_workers(job: &Value) -> Vec<usize> {
    let mut used: Vec<usize> = job["live"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["workers"].as_array().unwrap().iter())
        .map(|w| w.as_str().unwrap().trim_start_matches("worker-").parse::<usize>().unwrap() - 1)
        .collect();
    used.sort_unstable();
    used.dedup();
    used
}
