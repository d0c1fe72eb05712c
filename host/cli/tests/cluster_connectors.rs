//! Kafka in, PostgreSQL and Kafka out, on a cluster of real processes (a coordinator and three
//! workers) while workers die: a topic keeps growing as two jobs read it through a tenant's
//! connections, a running count per user each, one into a PostgreSQL table exactly once and
//! one into a topic at least once, and 30 SIGKILLs of the workers running them change nothing
//! in the table and lose nothing in the topic.
#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::fleet::{Rng, Worker, eventually, names, used_workers};
use common::{Server, client, expect, job, submit, tenant, upload, wait_job};
use eddy_tests::{KafkaBroker, KafkaRecord, PgServer};
use serde_json::{Value, json};

const WORKER_KILLS: usize = 30;
const USERS: u64 = 7;

/// Purchase `i`: user `u<i % 7>`, keyed by user, in partition `i % 3`.
fn purchase(i: u64) -> KafkaRecord {
    let user = format!("u{}", i % USERS);
    let value = json!({"user_id": user, "ts": i * 10});
    ((i % 3) as i32, Some(serde_json::to_vec(&user).unwrap()), serde_json::to_vec(&value).unwrap())
}

/// Each user's running counts 1..=n for the first `n` purchases: computed from the definition.
fn oracle(n: u64) -> BTreeMap<String, Vec<u64>> {
    (0..USERS.min(n))
        .map(|u| {
            let count = (n - u).div_ceil(USERS);
            (format!("u{u}"), (1..=count).collect())
        })
        .collect()
}

/// Each user's distinct counts in the topic (at least once: a count may come more than once).
fn distinct_counts(written: &[eddy_tests::Consumed]) -> BTreeMap<String, Vec<u64>> {
    let mut topic: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (key, value, _) in written {
        let user: String = serde_json::from_slice(key.as_deref().unwrap()).unwrap();
        topic.entry(user).or_default().push(serde_json::from_slice(value).unwrap());
    }
    topic.values_mut().for_each(|c| {
        c.sort_unstable();
        c.dedup();
    });
    topic
}

fn counting_job(name: &str, sink: &str) -> String {
    format!(
        "name: {name}\nparallelism: 2\nsources: [{{type: kafka, name: purchases, connection: events, \
         topics: [purchases], parallelism: 2, key: true, timestamp: /ts}}]\n\
         steps: [{{name: count, wasm: count@1, key_by: key}}]\ncheckpoints: {{interval_ms: 200}}\n\
         restart: {{strategy: fixed_delay, attempts: 100, delay_ms: 500}}\nsink: {sink}\n"
    )
}

fn put_connection(server: &Server, token: &str, name: &str, body: Value) {
    let r = client().put(server.url(&format!("/v1/connections/{name}"))).bearer_auth(token).json(&body).send();
    expect(r.unwrap(), 201);
}

#[test]
fn thirty_worker_kills_leave_the_postgres_table_exact_and_the_kafka_topic_complete() {
    let mut rng = Rng::from_env();
    let seed = rng.0;
    let dir = tempfile::tempdir().unwrap();
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 3);
    broker.create_topic("counts", 2);
    let pg = PgServer::start();
    let coordinator =
        Server::start_as("coordinator", &dir.path().join("coordinator"), &["--heartbeat-timeout-ms", "2000"]);
    let mut fleet: Vec<Worker> =
        (1..=3).map(|i| Worker::start(&coordinator, &format!("worker-{i}"), dir.path(), &[])).collect();
    eventually("three workers", || names(&coordinator).len() == 3);
    let (_, token) = tenant(&coordinator, "acme");
    expect(upload(&coordinator, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    put_connection(&coordinator, &token, "events", json!({"type": "kafka", "brokers": broker.address}));
    put_connection(&coordinator, &token, "db", json!({"type": "postgres", "url": pg.url}));

    let to_table = "{type: postgres, connection: db, table: counts, create: true, columns: {user_id: key, n: value}}";
    let to_topic = "{type: kafka, connection: events, topic: counts, delivery: at_least_once}";
    let table_job = expect(submit(&coordinator, &token, &counting_job("to-table", to_table)), 201);
    let topic_job = expect(submit(&coordinator, &token, &counting_job("to-topic", to_topic)), 201);
    let ids = [table_job["id"].as_str().unwrap().to_owned(), topic_job["id"].as_str().unwrap().to_owned()];

    // The topic grows while workers die: 300 purchases every 200 ms until the kills end.
    let produced = std::sync::atomic::AtomicU64::new(0);
    let killing = AtomicBool::new(true);
    let started = Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while killing.load(Ordering::SeqCst) {
                let from = produced.load(Ordering::SeqCst);
                let batch: Vec<KafkaRecord> = (from..from + 300).map(purchase).collect();
                broker.produce("purchases", &batch);
                produced.store(from + 300, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let mut attempts = 0;
        for kill in 1..=WORKER_KILLS {
            // The table's job got past the last kill: a new attempt completed a checkpoint.
            let j = wait_job(&coordinator, &token, &ids[0], "checkpointing again", |j| {
                j["attempts"].as_u64() >= Some(attempts)
                    && j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
            });
            std::thread::sleep(Duration::from_millis(rng.below(400)));
            // A worker the table's job runs on, so that each kill costs it an attempt.
            let used = used_workers(&j);
            let victim = used[rng.below(used.len() as u64) as usize];
            fleet.remove(victim).kill_9();
            fleet.insert(victim, Worker::start(&coordinator, &format!("worker-{}", victim + 1), dir.path(), &[]));
            attempts = j["attempts"].as_u64().unwrap() + 1;
            println!("kill {kill} of worker-{} at {:.1} s", victim + 1, started.elapsed().as_secs_f64());
        }
        killing.store(false, Ordering::SeqCst);
    });
    let total = produced.load(Ordering::SeqCst);
    let expected = oracle(total);

    // The table fills to exactly the oracle: wait for its last row, then compare all of it.
    let rows = usize::try_from(total).unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let count_rows = || pg.rows("SELECT count(*) FROM counts")[0][0].as_deref().unwrap().parse::<usize>().unwrap();
    while count_rows() < rows {
        assert!(Instant::now() < deadline, "the table holds {} rows of {rows}", count_rows());
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut table: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for row in pg.rows("SELECT user_id, n FROM counts") {
        table.entry(row[0].clone().unwrap()).or_default().push(row[1].as_deref().unwrap().parse().unwrap());
    }
    table.values_mut().for_each(|c| c.sort_unstable());
    assert_eq!(table, expected, "seed {seed}: the table after {WORKER_KILLS} worker kills");

    // The topic holds every count; duplicates (at least once) are counted, not refused. Its job
    // may still be catching up after the last kill, and its duplicates can reach the number of
    // counts before its last records do: read until every count is there.
    let written = broker.consume_until("counts", Duration::from_secs(180), |w| distinct_counts(w) == expected);
    let topic = distinct_counts(&written);
    let attempts: Vec<u64> = ids.iter().map(|id| job(&coordinator, &token, id)["attempts"].as_u64().unwrap()).collect();
    println!(
        "{WORKER_KILLS} worker kills in {:.1} s over {total} purchases: table exact; topic {} records for {rows} \
         counts ({} duplicates); attempts {attempts:?}",
        started.elapsed().as_secs_f64(),
        written.len(),
        written.len() - topic.values().map(Vec::len).sum::<usize>()
    );
    assert_eq!(topic, expected, "seed {seed}: every count in the topic");
    for id in &ids {
        let r = client().post(coordinator.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(&token).send();
        assert!(r.unwrap().status().is_success());
    }
    let left = pg.rows("SELECT gid FROM pg_prepared_xacts");
    println!("prepared transactions left by the cancel: {left:?}");
}
