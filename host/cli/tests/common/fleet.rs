//! A cluster's worker processes, for the tests that start a coordinator and workers.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Server, client};

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
    pub fn start(coordinator: &Server, name: &str, dir: &Path, extra: &[&str]) -> Worker {
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_eddy"))
            .args(["worker", "--coordinator", &format!("127.0.0.1:{}", coordinator.port()), "--name", name])
            .args(["--slots", "2", "--data-dir"])
            .arg(dir.join(name))
            .args(extra)
            .env("EDDY_LOG", "info")
            .stdout(Stdio::null())
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
