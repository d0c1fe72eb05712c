//! Named connections and the egress policy, against a real server process, a Kafka-protocol
//! broker (tansu) and PostgreSQL: a tenant's job reads a topic and writes a table through
//! connections it stored, whose secrets no answer shows; targets outside `--egress-allow`,
//! the server's own port and properties that reach into the server's machine are refused.

#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::collections::BTreeMap;

use common::{Server, client, expect, submit, tenant, upload, wait_job};
use eddy_tests::{KafkaBroker, PgServer};
use serde_json::{Value, json};

const SECRET: &str = "s3cret-never-shown";

fn put(server: &Server, token: &str, name: &str, body: &Value) -> reqwest::blocking::Response {
    client().put(server.url(&format!("/v1/connections/{name}"))).bearer_auth(token).json(body).send().unwrap()
}

fn get(server: &Server, token: &str, path: &str) -> String {
    client().get(server.url(path)).bearer_auth(token).send().unwrap().text().unwrap()
}

/// `n` purchases over 5 users, keyed by user, in 3 partitions.
fn produce(broker: &KafkaBroker, n: u64) -> BTreeMap<String, u64> {
    broker.create_topic("purchases", 3);
    let mut expected = BTreeMap::new();
    let records: Vec<_> = (0..n)
        .map(|i| {
            let user = format!("u{}", i % 5);
            *expected.entry(user.clone()).or_default() += 1;
            let value = json!({"user_id": user, "ts": i * 10});
            ((i % 3) as i32, Some(serde_json::to_vec(&user).unwrap()), serde_json::to_vec(&value).unwrap())
        })
        .collect();
    broker.produce("purchases", &records);
    expected
}

fn counting_job(source: &str, sink: &str) -> String {
    format!(
        "name: counts\nsources: [{{type: kafka, name: purchases, {source}, topics: [purchases], key: true, \
         end: at_start, timestamp: /ts}}]\n\
         steps: [{{name: count, wasm: count@1, key_by: key}}]\ncheckpoints: {{interval_ms: 200}}\nsink: {sink}\n"
    )
}

#[test]
fn a_job_reads_kafka_and_writes_postgres_through_connections_whose_secrets_never_show() {
    let dir = tempfile::tempdir().unwrap();
    let broker = KafkaBroker::start();
    let pg = PgServer::start();
    let expected = produce(&broker, 3_000);
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);

    let kafka = json!({"type": "kafka", "brokers": broker.address, "properties": {"client.id": "acme"}});
    let stored = expect(put(&server, &token, "events", &kafka), 201);
    assert_eq!(stored["brokers"], broker.address.as_str());
    // The server trusts PostgreSQL's local connections, so the password is stored and sent, and
    // never needed: what counts is that no answer holds it.
    let db = json!({"type": "postgres", "url": pg.url, "password": SECRET});
    let stored = expect(put(&server, &token, "db", &db), 201);
    assert_eq!(stored["secrets"], json!(["password"]), "{stored}");
    let again = expect(put(&server, &token, "db", &db), 200);
    assert_eq!(again["url"], pg.url.as_str(), "a PUT of the same name replaces it");
    let secret_kafka = json!({"type": "kafka", "brokers": "10.9.9.9:9092",
        "properties": {"security.protocol": "sasl_ssl"}, "secrets": {"sasl.password": SECRET}});
    expect(put(&server, &token, "remote", &secret_kafka), 201);

    let sink = "{type: postgres, connection: db, table: counts, mode: exactly_once, create: true, \
                columns: {user_id: key, n: value}}";
    let submitted = expect(submit(&server, &token, &counting_job("connection: events", sink)), 201);
    let id = submitted["id"].as_str().unwrap().to_string();
    let done = wait_job(&server, &token, &id, "ended", |j| j["status"] == "finished" || j["status"] == "failed");
    assert_eq!(done["status"], "finished", "{done}");

    // Every user's running counts 1..=n once each, n from the produced records.
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for row in pg.rows("SELECT user_id, n FROM counts") {
        counts.entry(row[0].clone().unwrap()).or_default().push(row[1].as_deref().unwrap().parse().unwrap());
    }
    counts.values_mut().for_each(|c| c.sort_unstable());
    let oracle: BTreeMap<String, Vec<u64>> = expected.iter().map(|(u, n)| (u.clone(), (1..=*n).collect())).collect();
    assert_eq!(counts, oracle);

    // No answer, metric or log line holds a secret.
    let seen = [
        get(&server, &token, "/v1/connections"),
        get(&server, &token, "/v1/connections/db"),
        get(&server, &token, "/v1/connections/remote"),
        get(&server, &token, &format!("/v1/jobs/{id}")),
        get(&server, &token, "/v1/jobs"),
        get(&server, server.admin().as_str(), "/metrics"),
        server.log(),
    ];
    for text in &seen {
        assert!(!text.contains(SECRET), "a secret shows: {text}");
    }
    assert!(seen[0].contains("sasl.password") && seen[0].contains("\"events\""), "{}", seen[0]);

    // Another tenant cannot use acme's connections; a connection of the wrong kind is named.
    let (_, other) = tenant(&server, "globex");
    expect(upload(&server, &other, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let stolen = expect(submit(&server, &other, &counting_job("connection: events", "{type: blackhole}")), 422);
    assert_eq!(stolen["field"], "sources[0].connection", "{stolen}");
    let wrong = expect(submit(&server, &token, &counting_job("connection: db", "{type: blackhole}")), 422);
    assert!(wrong["detail"].as_str().unwrap().contains("not a Kafka one"), "{wrong}");
    assert_eq!(
        expect(client().delete(server.url("/v1/connections/nope")).bearer_auth(&token).send().unwrap(), 404)["status"],
        404
    );
    let deleted = client().delete(server.url("/v1/connections/remote")).bearer_auth(&token).send().unwrap();
    assert_eq!(deleted.status().as_u16(), 204);
}

#[test]
fn targets_outside_the_egress_policy_the_servers_own_port_and_machine_reaching_properties_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = KafkaBroker::start();
    let server = Server::start(&dir.path().join("data"), &["--egress-allow", "10.0.0.0/8,kafka.internal:9092"]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let own = server.base.trim_start_matches("http://").to_string();
    let own_port = own.rsplit_once(':').unwrap().1.to_string();

    // (what, connection body, words the problem has, field)
    let refused = [
        ("a loopback broker", json!({"type": "kafka", "brokers": broker.address}), "egress policy", "brokers"),
        ("the server's own port", json!({"type": "kafka", "brokers": own}), "own port", "brokers"),
        (
            "the own port by name",
            json!({"type": "kafka", "brokers": format!("localhost:{own_port}")}),
            "own port",
            "brokers",
        ),
        (
            "a loopback database",
            json!({"type": "postgres", "url": "postgresql://postgres@127.0.0.1:5432/postgres"}),
            "egress policy",
            "url",
        ),
        (
            "a database on a socket",
            json!({"type": "postgres", "url": "postgresql://postgres@10.0.0.1/postgres?host=/var/run/postgresql"}),
            "`host` parameter",
            "url",
        ),
        (
            "a command run by librdkafka",
            json!({"type": "kafka", "brokers": "10.0.0.1:9092", "properties": {"sasl.kerberos.kinit.cmd": "touch /tmp/x"}}),
            "not one a tenant may set",
            "properties.sasl.kerberos.kinit.cmd",
        ),
        (
            "a key file of the server",
            json!({"type": "kafka", "brokers": "10.0.0.1:9092", "secrets": {"ssl.key.location": "/etc/shadow"}}),
            "not one a tenant may set",
            "secrets.ssl.key.location",
        ),
        (
            "a password in the URL",
            json!({"type": "postgres", "url": "postgresql://u:pw@10.0.0.1/d"}),
            "password",
            "url",
        ),
        (
            "an unknown field",
            json!({"type": "kafka", "brokers": "10.0.0.1:9092", "host": "x"}),
            "unknown field",
            "body",
        ),
    ];
    for (what, body, says, field) in refused {
        let problem = expect(put(&server, &token, "c", &body), 422);
        assert!(problem["detail"].as_str().unwrap().contains(says), "{what}: {problem}");
        assert_eq!(problem["field"], field, "{what}: {problem}");
    }
    expect(put(&server, &token, "Bad Name", &json!({"type": "kafka", "brokers": "10.0.0.1:9092"})), 422);
    // Past the bounds: the body (refused from its declared length, and never read past the
    // limit without one) and the number of properties. By hand, since the server answers
    // before reading the body and a client still writing it would see a broken pipe.
    let head = format!(
        "PUT /v1/connections/c HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"type\": \"kafka\"",
        300 << 10
    );
    let answer = common::raw_exchange(&server, head.as_bytes(), std::time::Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("at most 262144 bytes"), "{answer}");
    let many: serde_json::Map<String, Value> = (0..=128).map(|i| (format!("p{i}"), json!("v"))).collect();
    let problem = expect(
        put(&server, &token, "c", &json!({"type": "kafka", "brokers": "10.0.0.1:9092", "properties": many})),
        422,
    );
    assert!(problem["detail"].as_str().unwrap().contains("MAX_PROPERTIES"), "{problem}");
    let allowed = json!({"type": "kafka", "brokers": "kafka.internal:9092,10.1.2.3:9092"});
    expect(put(&server, &token, "inside", &allowed), 201);

    // A spec that names hosts itself meets the same policy, and the server's environment and
    // machine stay out of reach.
    for (what, source, says, field) in [
        ("a loopback broker", format!("brokers: \"{}\"", broker.address), "egress policy", "sources[0].brokers"),
        ("the own port", format!("brokers: \"{own}\""), "own port", "sources[0].brokers"),
        (
            "the server's environment",
            "brokers: \"10.0.0.1:9092\", properties: {sasl.username: {env: HOME}}".to_string(),
            "server's environment",
            "sources[0].properties.sasl.username",
        ),
        (
            "a plugin library",
            "brokers: \"10.0.0.1:9092\", properties: {plugin.library.paths: /tmp/evil.so}".to_string(),
            "not one a tenant may set",
            "sources[0].properties.plugin.library.paths",
        ),
        (
            "a missing connection",
            "connection: nope".to_string(),
            "not one of your connections",
            "sources[0].connection",
        ),
    ] {
        let problem = expect(submit(&server, &token, &counting_job(&source, "{type: blackhole}")), 422);
        assert!(problem["detail"].as_str().unwrap().contains(says), "{what}: {problem}");
        assert_eq!(problem["field"], field, "{what}: {problem}");
    }
    let url_env = "{type: postgres, url_env: DATABASE_URL, table: t, columns: {k: key}}";
    let problem = expect(submit(&server, &token, &counting_job("connection: inside", url_env)), 422);
    assert_eq!(problem["field"], "sink.url_env", "{problem}");
    assert!(server.log().contains("egress: tenants' connectors may reach 10.0.0.0/8,kafka.internal:9092 only"));
}
