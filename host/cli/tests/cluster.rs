//! The cluster's processes on this machine: a coordinator and workers as real `eddy`
//! processes. Workers register and beat; a worker killed with SIGKILL is declared dead after
//! the heartbeat timeout; a coordinator killed and restarted is found again by its workers;
//! a worker whose certificate another CA signed never joins; a peer that speaks nonsense to a
//! worker's data plane is dropped with a logged reason while the worker carries on.
#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::fleet::{Worker, eventually, names, workers};
use common::{Server, client};

#[test]
fn workers_register_beat_die_when_killed_and_find_a_restarted_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("coordinator");
    let coordinator = Server::start_as("coordinator", &data, &["--heartbeat-timeout-ms", "1500"]);
    let mut fleet: Vec<Option<Worker>> =
        (1..=3).map(|i| Some(Worker::start(&coordinator, &format!("worker-{i}"), dir.path(), &[]))).collect();
    eventually("three workers", || names(&coordinator) == ["worker-1", "worker-2", "worker-3"]);
    for w in workers(&coordinator) {
        assert_eq!((w["slots"].as_u64(), w["free_slots"].as_u64()), (Some(2), Some(2)), "{w}");
        assert!(w["data_addr"].as_str().unwrap().starts_with("127.0.0.1:"), "{w}");
    }
    // Tenants see the workers too; nobody without a token does.
    assert_eq!(client().get(coordinator.url("/v1/workers")).send().unwrap().status(), 401);
    // A live worker's name, or the coordinator's, cannot be enrolled again.
    for taken in ["worker-1", "coordinator"] {
        let response = client()
            .post(coordinator.url("/v1/cluster/enroll"))
            .json(&serde_json::json!({ "name": taken }))
            .send()
            .unwrap();
        assert_eq!(response.status(), 409, "{taken}");
    }

    fleet[1].take().unwrap().kill_9();
    eventually("worker-2 declared dead", || names(&coordinator) == ["worker-1", "worker-3"]);
    assert!(coordinator.log().contains("worker missed its heartbeats"), "{}", coordinator.log());

    fleet[1] = Some(Worker::start(&coordinator, "worker-2", dir.path(), &[]));
    eventually("worker-2 back", || names(&coordinator) == ["worker-1", "worker-2", "worker-3"]);
    let before: Vec<u64> = workers(&coordinator).iter().map(|w| w["incarnation"].as_u64().unwrap()).collect();

    // The coordinator dies and comes back on its address: every worker registers again.
    let port = coordinator.port();
    coordinator.kill_9();
    let coordinator = Server::start_on("coordinator", port, &data, &["--heartbeat-timeout-ms", "1500"]).unwrap();
    eventually("the workers to find the restarted coordinator", || names(&coordinator).len() == 3);
    let after: Vec<u64> = workers(&coordinator).iter().map(|w| w["incarnation"].as_u64().unwrap()).collect();
    assert_ne!(before, after, "a new coordinator hands out new incarnations");
    for w in fleet.iter().flatten() {
        assert!(w.log().contains("registering again"), "{}", w.log());
    }
}

fn eddy(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_eddy")).args(args).output().unwrap()
}

#[test]
fn with_a_cluster_ca_only_its_certificates_join() {
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_owned();
    for ca in ["ca", "other-ca"] {
        assert!(eddy(&["cluster", "init", "--out", &path(ca)]).status.success());
    }
    let issue = |ca: &str, name: &str| {
        let out =
            eddy(&["cluster", "cert", "--ca", &path(ca), "--name", name, "--alias", "localhost", "--out", &path(name)]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    issue("ca", "coordinator");
    issue("ca", "worker-1");
    issue("other-ca", "worker-x");
    let init_again = eddy(&["cluster", "init", "--out", &path("ca")]);
    assert!(!init_again.status.success() && String::from_utf8_lossy(&init_again.stderr).contains("already holds a CA"));

    let coordinator = Server::start_as("coordinator", &dir.path().join("data"), &["--tls", &path("coordinator")]);
    let member = Worker::start(&coordinator, "worker-1", dir.path(), &["--tls", &path("worker-1")]);
    let intruder = Worker::start(&coordinator, "worker-x", dir.path(), &["--tls", &path("worker-x")]);
    eventually("worker-1 to join", || names(&coordinator) == ["worker-1"]);
    eventually("the intruder to be refused", || coordinator.log().contains("refused a control connection"));
    assert_eq!(names(&coordinator), ["worker-1"], "a certificate of another CA never joins");
    assert!(intruder.log().contains("lost the coordinator"), "{}", intruder.log());
    drop(member);

    // A certificate names one node: starting as another is refused before anything is sent.
    let out = eddy(&[
        "worker",
        "--coordinator",
        &format!("127.0.0.1:{}", coordinator.port()),
        "--name",
        "worker-2",
        "--data-dir",
        &path("w2"),
        "--tls",
        &path("worker-1"),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not name `worker-2`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A coordinator with its own CA given enrolls nobody.
    let response = client()
        .post(coordinator.url("/v1/cluster/enroll"))
        .json(&serde_json::json!({ "name": "worker-9" }))
        .send()
        .unwrap();
    assert_eq!(response.status(), 403);
}

/// Dials `to` as `identity` and writes `bytes` on a new stream; returns once the peer closed.
fn hostile_stream(
    rt: &tokio::runtime::Runtime,
    identity: &eddy_transport::quic::NodeIdentity,
    to: &str,
    name: &str,
    bytes: &[u8],
) {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(identity.client_config().unwrap()).unwrap();
    rt.block_on(async {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(crypto)));
        let Ok(conn) = endpoint.connect(to.parse().unwrap(), name).unwrap().await else { return };
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let _ = send.write_all(bytes).await;
        while let Ok(Some(_)) = recv.read_chunk(1 << 16, true).await {}
    });
}

#[test]
fn a_worker_drops_hostile_peers_with_a_reason_and_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("coordinator");
    let coordinator = Server::start_as("coordinator", &data, &[]);
    let mut worker = Worker::start(&coordinator, "worker-1", dir.path(), &[]);
    eventually("worker-1 to join", || names(&coordinator) == ["worker-1"]);
    let data_addr = workers(&coordinator)[0]["data_addr"].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();

    // A member's certificate (the coordinator's own CA issues it), speaking nonsense.
    let ca = eddy_transport::quic::ClusterCa::load(&data.join("tls")).unwrap();
    let member = ca.issue("worker-h").unwrap();
    hostile_stream(&rt, &member, &data_addr, "worker-1", b"GET / HTTP/1.1\r\n\r\n");
    eventually("the nonsense to be refused", || worker.log().contains("does not start with a link header"));
    let mut header = b"EDL1".to_vec();
    header.extend_from_slice(&u16::MAX.to_le_bytes());
    hostile_stream(&rt, &member, &data_addr, "worker-1", &header);
    eventually("the oversized job id to be refused", || worker.log().contains("65535 bytes"));
    // A certificate of another CA never gets a stream.
    let stranger = eddy_transport::quic::ClusterCa::generate().unwrap().issue("worker-s").unwrap();
    hostile_stream(&rt, &stranger, &data_addr, "worker-1", b"EDL1");
    eventually("the stranger to be refused", || worker.log().contains("refused a connection"));

    assert!(worker.log().contains("dropping peer"), "{}", worker.log());
    assert!(worker.child.try_wait().unwrap().is_none(), "the worker must survive: {}", worker.log());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(names(&coordinator), ["worker-1"], "still registered and beating");
}
