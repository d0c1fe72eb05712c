//! A node that enrolled properly but does not behave, against a real coordinator and worker:
//! it is trusted with what it was given and nothing more. It cannot claim endless slots,
//! report on or fetch the artifacts of a job deployed elsewhere, and one tenant's huge spec
//! costs no other tenant's job on the same worker an attempt.

#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::time::Duration;

use common::fleet::{Worker, eventually, join_token, workers};
use common::{Server, client, counts_job, expect, job, submit, tenant, upload, wait_job};
use eddy_cluster::protocol::{self, CoordinatorMessage, PartState, WorkerMessage};
use eddy_transport::quic::{NodeIdentity, Tuning, dial, endpoint};

/// Enrolls `name` with `coordinator` through its join token; the credentials.
fn enrolled(coordinator: &Server, name: &str) -> NodeIdentity {
    let response = client()
        .post(coordinator.url("/v1/cluster/enroll"))
        .bearer_auth(join_token(coordinator, Some(name)))
        .json(&serde_json::json!({ "name": name }))
        .send()
        .unwrap();
    let credentials = expect(response, 200);
    NodeIdentity {
        name: name.to_owned(),
        ca_pem: credentials["ca_pem"].as_str().unwrap().into(),
        cert_pem: credentials["cert_pem"].as_str().unwrap().into(),
        key_pem: credentials["key_pem"].as_str().unwrap().into(),
    }
}

/// The attempt the real worker runs of job `id`, from its log.
fn attempt_of(worker: &Worker, id: &str) -> u64 {
    let log = worker.log();
    let line =
        log.lines().rev().find(|l| l.contains(&format!("running job {id} attempt"))).expect("the job runs there");
    line.split("attempt ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_rogue_worker_is_trusted_with_what_it_was_given_and_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let coordinator = Server::start_as("coordinator", &dir.path().join("coordinator"), &[]);
    let honest = Worker::start(&coordinator, "worker-1", dir.path(), &[]);
    eventually("worker-1 registered", || workers(&coordinator).len() == 1);
    let (_, a) = tenant(&coordinator, "alice");
    expect(upload(&coordinator, &a, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let id = expect(submit(&coordinator, &a, &counts_job(100_000_000)), 201)["id"].as_str().unwrap().to_owned();
    let running = wait_job(&coordinator, &a, &id, "running on worker-1", |j| {
        j["live"]["tasks"].as_array().is_some_and(|t| t.iter().all(|t| t["workers"] == serde_json::json!(["worker-1"])))
            && j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
    });
    let digest = running["artifacts"][0].as_str().unwrap().to_owned();
    let attempt = attempt_of(&honest, &id);

    let rogue = enrolled(&coordinator, "rogue");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let control: std::net::SocketAddr = format!("127.0.0.1:{}", coordinator.port()).parse().unwrap();
    let said = rt.block_on(async {
        let endpoint =
            endpoint(&rogue, "127.0.0.1:0".parse().unwrap(), &Tuning::control(), &tokio::runtime::Handle::current())
                .unwrap();
        let conn = dial(&endpoint, "coordinator", control).await.unwrap();
        let mut said = Vec::new();
        // Endless slots: refused.
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let greedy = WorkerMessage::Register { name: "rogue".into(), slots: u32::MAX, advertise: None, data_port: 9 };
        protocol::write(&mut send, &greedy).await.unwrap();
        said.push(protocol::read::<CoordinatorMessage>(&mut recv, &mut Vec::new()).await);
        let conn = dial(&endpoint, "coordinator", control).await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let modest = WorkerMessage::Register { name: "rogue".into(), slots: 1, advertise: None, data_port: 9 };
        protocol::write(&mut send, &modest).await.unwrap();
        let mut buf = Vec::new();
        let registered = protocol::read::<CoordinatorMessage>(&mut recv, &mut buf).await;
        let Ok(Some(CoordinatorMessage::Registered { incarnation, .. })) = registered else {
            panic!("a modest registration is taken: {registered:?}")
        };
        // Reports on alice's part, which runs on worker-1: that it failed, that it finished.
        for state in [
            PartState::Failed { reason: "forged by the rogue".into(), detail: Default::default() },
            PartState::Finished,
        ] {
            protocol::write(&mut send, &WorkerMessage::Part { job: id.clone(), attempt, state }).await.unwrap();
        }
        protocol::write(&mut send, &WorkerMessage::Heartbeat { incarnation }).await.unwrap();
        // Alice's artifact, deployed to worker-1 only.
        let (mut fetch, mut answer) = conn.open_bi().await.unwrap();
        protocol::write(&mut fetch, &WorkerMessage::Fetch { digest: digest.clone() }).await.unwrap();
        let _ = fetch.finish();
        said.push(protocol::read::<CoordinatorMessage>(&mut answer, &mut Vec::new()).await);
        tokio::time::sleep(Duration::from_secs(3)).await;
        protocol::write(&mut send, &WorkerMessage::Heartbeat { incarnation }).await.unwrap();
        said
    });
    match &said[0] {
        Ok(Some(CoordinatorMessage::Refused { reason })) => assert!(reason.contains("at most 256"), "{reason}"),
        other => panic!("endless slots were taken: {other:?}"),
    }
    match &said[1] {
        Ok(Some(CoordinatorMessage::Refused { reason })) => assert!(reason.contains("no artifact"), "{reason}"),
        other => panic!("the rogue fetched alice's artifact: {other:?}"),
    }
    // Alice's job never heard of the rogue's reports.
    let j = job(&coordinator, &a, &id);
    assert_eq!((j["status"].as_str(), j["restarts"].as_u64()), (Some("running"), Some(0)), "{j}");
    assert!(j["failures"].as_array().unwrap().is_empty(), "{j}");
    let log = coordinator.log();
    assert!(log.contains("ignored a part report"), "{log}");
    assert!(log.contains("refused a fetch"), "{log}");

    // Bob's spec of the issue (880 KB: a config of 440 000 nulls, whose deployment once ended
    // the worker's session at every attempt) is refused at submit, and costs alice's job (on
    // the same worker) nothing.
    let (_, b) = tenant(&coordinator, "bob");
    expect(upload(&coordinator, &b, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let incarnation =
        |name: &str| workers(&coordinator).iter().find(|w| w["name"] == name).map(|w| w["incarnation"].clone());
    let before = incarnation("worker-1");
    let nulls = format!(
        "name: nulls\nsources: [{{type: generator, name: g}}]\nsteps:\n  - {{name: count, wasm: count@1, config: [{}]}}\n\
         sink: {{type: blackhole}}\n",
        vec!["~"; 440_000].join(",")
    );
    expect(submit(&coordinator, &b, &nulls), 422);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(incarnation("worker-1"), before, "worker-1 lost its session");
    let j = job(&coordinator, &a, &id);
    assert_eq!((j["status"].as_str(), j["restarts"].as_u64()), (Some("running"), Some(0)), "{j}");
    expect(client().post(coordinator.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(&a).send().unwrap(), 202);
    drop(honest);
}
