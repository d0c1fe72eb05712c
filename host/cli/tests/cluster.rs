//! The cluster's processes on this machine: a coordinator and workers as real `eddy`
//! processes. Workers register and beat; a worker killed with SIGKILL is declared dead after
//! the heartbeat timeout; a coordinator killed and restarted is found again by its workers;
//! a worker whose certificate another CA signed never joins; a peer that speaks nonsense to a
//! worker's data plane is dropped with a logged reason while the worker carries on. A worker's
//! I/O threads run under `SCHED_BATCH` (they carry the data plane), a coordinator's do not.
#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::time::Duration;

use common::fleet::{Worker, eventually, join_token, names, workers};
use common::{Server, client, eddy};

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
    // Only the admin sees the workers: a tenant has no business with the machines.
    assert_eq!(client().get(coordinator.url("/v1/workers")).send().unwrap().status(), 401);
    let (_, tenant) = common::tenant(&coordinator, "acme");
    assert_eq!(client().get(coordinator.url("/v1/workers")).bearer_auth(&tenant).send().unwrap().status(), 403);
    // A live worker's name, or the coordinator's, cannot be enrolled again, even with a token.
    for taken in ["worker-1", "coordinator"] {
        let response = client()
            .post(coordinator.url("/v1/cluster/enroll"))
            .bearer_auth(join_token(&coordinator, None))
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

/// Asks `coordinator` to enroll `name` with `token` (if any); the status and the body.
#[test]
fn a_workers_io_threads_run_under_sched_batch_and_the_coordinators_keep_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = Server::start_as("coordinator", &dir.path().join("coordinator"), &[]);
    let worker = Worker::start(&coordinator, "worker-1", dir.path(), &[]);
    eventually("the worker", || names(&coordinator) == ["worker-1"]);
    let policies = |pid: u32| eddy_tests::thread_policies(&pid.to_string(), "eddy-io");
    let on_worker = policies(worker.child.id());
    assert!(!on_worker.is_empty(), "the worker runs its I/O on eddy-io threads");
    assert!(on_worker.iter().all(|(_, p)| *p == eddy_tests::SCHED_BATCH), "the data plane: {on_worker:?}");
    let on_coordinator = policies(coordinator.child.id());
    assert!(!on_coordinator.is_empty(), "the coordinator runs its I/O on eddy-io threads");
    assert!(on_coordinator.iter().all(|(_, p)| *p == 0), "requests keep SCHED_OTHER: {on_coordinator:?}");
}

fn enroll(coordinator: &Server, token: Option<&str>, name: &str) -> (u16, serde_json::Value) {
    let mut request = client().post(coordinator.url("/v1/cluster/enroll")).json(&serde_json::json!({ "name": name }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().unwrap();
    let status = response.status().as_u16();
    (status, response.json().unwrap_or_default())
}

/// The admin's join token of `coordinator` for `body` (`name`, `uses`, `ttl_s`).
fn join_token_with(coordinator: &Server, body: serde_json::Value) -> String {
    let response =
        client().post(coordinator.url("/v1/cluster/join-tokens")).bearer_auth(coordinator.admin()).json(&body).send();
    let answer: serde_json::Value = common::expect(response.unwrap(), 201);
    answer["token"].as_str().unwrap().to_owned()
}

/// Enrollment is what makes a node a member, so it needs the admin's join token, spends it,
/// refuses every spelling of the coordinator's names and names issued before, and issues
/// certificates that expire. (Before: any local process enrolled with no credential, and
/// `COORDINATOR` and `Localhost` were issued, which TLS matches as the coordinator's names.)
#[test]
fn enrolling_takes_a_join_token_once_and_refuses_the_coordinators_names_in_any_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = Server::start_as("coordinator", &dir.path().join("coordinator"), &[]);
    let (status, problem) = enroll(&coordinator, None, "worker-a");
    assert_eq!(status, 401, "no token: {problem}");
    assert!(problem["detail"].as_str().unwrap().contains("join token"), "{problem}");
    assert_eq!(enroll(&coordinator, Some("eddy_join_00"), "worker-a").0, 401, "an unknown token");
    // A tenant's API token is no join token, nor may a tenant issue one.
    let (_, tenant) = common::tenant(&coordinator, "acme");
    assert_eq!(enroll(&coordinator, Some(&tenant), "worker-a").0, 401);
    let by_tenant =
        client().post(coordinator.url("/v1/cluster/join-tokens")).bearer_auth(&tenant).json(&serde_json::json!({}));
    assert_eq!(by_tenant.send().unwrap().status(), 403);

    let token = join_token_with(&coordinator, serde_json::json!({}));
    for spelled in ["COORDINATOR", "Coordinator", "Localhost", "LOCALHOST", "Worker-A", "worker.a", "-a", ""] {
        assert_eq!(enroll(&coordinator, Some(&token), spelled).0, 422, "`{spelled}` is no lowercase DNS label");
    }
    for reserved in ["coordinator", "localhost"] {
        assert_eq!(enroll(&coordinator, Some(&token), reserved).0, 409, "{reserved}");
    }
    // None of those refusals spent the token; enrolling does, once.
    let (status, credentials) = enroll(&coordinator, Some(&token), "worker-a");
    assert_eq!(status, 200, "{credentials}");
    assert_eq!(enroll(&coordinator, Some(&token), "worker-b").0, 401, "a single-use token works once");
    let identity = eddy_transport::quic::NodeIdentity {
        name: "worker-a".into(),
        ca_pem: credentials["ca_pem"].as_str().unwrap().into(),
        cert_pem: credentials["cert_pem"].as_str().unwrap().into(),
        key_pem: credentials["key_pem"].as_str().unwrap().into(),
    };
    let left = identity.expires_at().unwrap().duration_since(std::time::SystemTime::now()).unwrap();
    assert!((29 * 86_400..=30 * 86_400).contains(&left.as_secs()), "an enrolled certificate lasts 30 days: {left:?}");

    // A name issued once is not issued again to whoever asks; a token for that very name
    // (the admin's renewal) issues it; a token for one name enrolls no other.
    let any = join_token_with(&coordinator, serde_json::json!({}));
    assert_eq!(enroll(&coordinator, Some(&any), "worker-a").0, 409, "enrolled before");
    let renewal = join_token_with(&coordinator, serde_json::json!({ "name": "worker-a" }));
    assert_eq!(enroll(&coordinator, Some(&renewal), "worker-a").0, 200);
    let for_b = join_token_with(&coordinator, serde_json::json!({ "name": "worker-b" }));
    assert_eq!(enroll(&coordinator, Some(&for_b), "worker-c").0, 403);
    // An expired token is refused.
    let short = join_token_with(&coordinator, serde_json::json!({ "ttl_s": 1 }));
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(enroll(&coordinator, Some(&short), "worker-d").0, 401, "expired");
    // `eddy cluster cert` refuses the same spellings.
    let ca = dir.path().join("ca").to_str().unwrap().to_owned();
    assert!(eddy(&["cluster", "init", "--out", &ca]).status.success());
    let upper = eddy(&["cluster", "cert", "--ca", &ca, "--name", "COORDINATOR", "--out", &format!("{ca}/x")]);
    assert!(!upper.status.success(), "an uppercase name was issued");

    // A source that keeps sending wrong join tokens is answered 429 for a while (last: every
    // request of this test comes from the same address).
    let statuses: Vec<u16> = (0..25).map(|_| enroll(&coordinator, Some("eddy_join_bad"), "worker-e").0).collect();
    let first_429 = statuses.iter().position(|s| *s == 429).expect("shut out at last");
    assert!(
        statuses[..first_429].iter().all(|s| *s == 401) && statuses[first_429..].iter().all(|s| *s == 429),
        "{statuses:?}"
    );
    assert!(coordinator.log().contains("requests with wrong tokens"), "{}", coordinator.log());
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
    let mut header = b"EDL2".to_vec();
    header.extend_from_slice(&u16::MAX.to_le_bytes());
    hostile_stream(&rt, &member, &data_addr, "worker-1", &header);
    eventually("the oversized job id to be refused", || worker.log().contains("65535 bytes"));
    // A certificate of another CA never gets a stream.
    let stranger = eddy_transport::quic::ClusterCa::generate().unwrap().issue("worker-s").unwrap();
    hostile_stream(&rt, &stranger, &data_addr, "worker-1", b"EDL2");
    eventually("the stranger to be refused", || worker.log().contains("refused a connection"));

    assert!(worker.log().contains("dropping peer"), "{}", worker.log());
    assert!(worker.child.try_wait().unwrap().is_none(), "the worker must survive: {}", worker.log());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(names(&coordinator), ["worker-1"], "still registered and beating");
}
