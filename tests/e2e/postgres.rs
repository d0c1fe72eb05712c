//! The PostgreSQL sink against a real server (started per test): Kafka → running count →
//! PostgreSQL exactly once through SIGKILLs equals an oracle computed from the input topic, a
//! window aggregate lands by the interface, an upsert converges, and a table that does
//! not fit is named with what is wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use eddy_engine::{Job, JobOptions};
use eddy_guest_artifacts as guests;
use eddy_tests::{KafkaBroker, PgServer, runtime};
use serde_json::Value;

use crate::kafka::{counting_yaml, oracle, purchases, spec_in};

/// A PostgreSQL sink of `mode` on `table` holding each count (`user_id` from the key, `n`
/// the running count).
fn counts_sink(pg: &PgServer, table: &str, mode: &str, key: &str) -> String {
    format!(
        "{{type: postgres, url: \"{}\", table: {table}, mode: {mode}, create: true, {key} columns: {{user_id: key, n: value}}}}",
        pg.url
    )
}

/// Every `(user, n)` row of `table`, counts per user sorted.
fn table_counts(pg: &PgServer, table: &str) -> BTreeMap<String, Vec<u64>> {
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for row in pg.rows(&format!("SELECT user_id, n FROM {table}")) {
        let user = row[0].clone().expect("user_id");
        counts.entry(user).or_default().push(row[1].as_deref().expect("n").parse().expect("a number"));
    }
    counts.values_mut().for_each(|c| c.sort_unstable());
    counts
}

fn prepared_left(pg: &PgServer) -> Vec<Vec<Option<String>>> {
    pg.rows("SELECT gid FROM pg_prepared_xacts")
}

/// Kafka → running count → PostgreSQL exactly once (appends: a duplicate would be a second
/// row) into `table`, the spec written in `dir`.
fn crash_pipeline(broker: &KafkaBroker, pg: &PgServer, dir: &Path, table: &str) -> PathBuf {
    let path = dir.join(format!("{table}.yaml"));
    let yaml = counting_yaml(broker, 2, "at_start", &counts_sink(pg, table, "exactly_once", ""))
        .replace("checkpoints: {dir: checkpoints", &format!("checkpoints: {{dir: {table}-checkpoints"));
    std::fs::write(&path, yaml).expect("write spec");
    path
}

/// The running count into PostgreSQL exactly once, in a child process that dies 30 times
/// (`EDDY_CRASH_SEED` repeats a run): killed with SIGKILL at a random moment or aborting at a
/// random point of the checkpoint protocol. Then, on a second table, deaths exactly between a
/// checkpoint's completion and the sink's commit, which leave transactions the next start
/// must commit (a rollback there would lose the checkpoint's rows). Each table holds every
/// count once, and no prepared transaction is left behind.
#[test]
fn sigkill_at_random_moments_neither_loses_nor_duplicates_a_row_in_postgres() {
    use crate::checkpoints::{crash_repeatedly, crash_settings, die_before_commits};
    let (seed, kills) = crash_settings();
    let kills = kills.max(30);
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 4);
    let pg = PgServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let produced = purchases(0, 20_000, 4);
    broker.produce("purchases", &produced);

    // Throttled to a hundredth of a core, so the deaths land while the job runs.
    let path = crash_pipeline(&broker, &pg, dir.path(), "counts");
    let (mut deaths, mut left_prepared) = (0, 0);
    let (finished_early, died_of_faults, _) = crash_repeatedly(&path, seed, kills, true, Some("0.01"), &mut || {
        deaths += 1;
        left_prepared += prepared_left(&pg).len();
    });
    let counts = table_counts(&pg, "counts");
    eprintln!(
        "postgres crash test: seed {seed}, {deaths} deaths ({died_of_faults} by injected faults){}, \
         {left_prepared} prepared transactions left by them, {} rows for {} records",
        if finished_early > 0 { " (finished early)" } else { "" },
        counts.values().map(Vec::len).sum::<usize>(),
        produced.len()
    );
    assert_eq!(counts, oracle(&produced), "seed {seed}: every count once, none twice, none lost");
    assert_eq!(prepared_left(&pg), Vec::<Vec<Option<String>>>::new(), "seed {seed}: no transaction left prepared");

    let path = crash_pipeline(&broker, &pg, dir.path(), "counts_again");
    let mut completed_uncommitted = 0;
    die_before_commits(&path, seed, 3, &mut || {
        let left = prepared_left(&pg).len();
        completed_uncommitted += left;
        left > 0
    });
    eprintln!("postgres crash test: {completed_uncommitted} transactions left between completion and commit");
    assert!(completed_uncommitted > 0, "seed {seed}: no death left a completed checkpoint's transaction");
    assert_eq!(table_counts(&pg, "counts_again"), oracle(&produced), "seed {seed}: deaths before the commit");
    assert_eq!(prepared_left(&pg), Vec::<Vec<Option<String>>>::new(), "seed {seed}: no transaction left prepared");
}

/// The interface: Kafka purchases → hourly-style totals per user (a tumbling window of
/// 1 s here) → PostgreSQL keyed by user and window, the table created by the sink. The oracle
/// groups the produced purchases itself.
#[test]
fn window_totals_land_in_postgres_by_user_and_window() {
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 3);
    let pg = PgServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let produced = purchases(0, 3000, 3);
    broker.produce("purchases", &produced);
    let yaml = format!(
        "name: totals\nsources:\n  - {{type: kafka, name: purchases, brokers: \"{}\", topics: [purchases], format: \
         json, start: earliest, end: at_start, timestamp: /ts}}\n\
         watermarks: {{out_of_orderness_ms: 500}}\n\
         steps: [{{name: totals, wasm: {}, key_by: /user_id, window: {{type: tumbling, size_ms: 1000}}}}]\n\
         checkpoints: {{dir: checkpoints, interval_ms: 100}}\n\
         sink: {{type: postgres, url: \"{}\", table: totals, mode: exactly_once, create: true, key: [user_id, \
         window_start], columns: {{user_id: key, window_start: /start, purchases: /result/purchases, total_cents: \
         /result/total_cents}}}}\n",
        broker.address,
        guests::PURCHASE_TOTALS,
        pg.url
    );
    let summary = Job::start(&spec_in(dir.path(), &yaml), runtime(), JobOptions::default())
        .expect("job starts")
        .wait()
        .expect("job ends");
    assert!(summary.finished);
    let mut expected: BTreeMap<(String, i64), (u64, i64)> = BTreeMap::new();
    for (_, _, value) in &produced {
        let v: Value = serde_json::from_slice(value).expect("json");
        let ts = v["ts"].as_i64().expect("ts");
        let total = expected.entry((v["user_id"].as_str().expect("user").to_owned(), ts - ts % 1000)).or_default();
        total.0 += 1;
        total.1 += v["amount_cents"].as_i64().expect("amount");
    }
    let got: BTreeMap<(String, i64), (u64, i64)> = pg
        .rows("SELECT user_id, window_start, purchases, total_cents FROM totals")
        .into_iter()
        .map(|r| {
            let n = |i: usize| r[i].as_deref().expect("not null").to_owned();
            ((n(0), n(1).parse().expect("start")), (n(2).parse().expect("purchases"), n(3).parse().expect("total")))
        })
        .collect();
    assert_eq!(got, expected);
    let types =
        pg.rows("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'totals' ORDER BY 1");
    let types: Vec<(String, String)> =
        types.into_iter().map(|r| (r[0].clone().expect("name"), r[1].clone().expect("type"))).collect();
    assert_eq!(
        types,
        [("purchases", "bigint"), ("total_cents", "bigint"), ("user_id", "text"), ("window_start", "bigint")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
}

/// An upsert keyed by user ends with each user's last count, even written twice over.
#[test]
fn an_upsert_converges_to_the_last_count_of_each_key_across_a_rerun() {
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 2);
    let pg = PgServer::start();
    let produced = purchases(0, 500, 2);
    broker.produce("purchases", &produced);
    let sink = counts_sink(&pg, "latest", "upsert", "key: [user_id],");
    for _ in 0..2 {
        // A fresh checkpoint directory each time: the second run replays everything.
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = spec_in(dir.path(), &counting_yaml(&broker, 2, "at_start", &sink));
        assert!(Job::start(&spec, runtime(), JobOptions::default()).expect("starts").wait().expect("ends").finished);
    }
    let expected: BTreeMap<String, Vec<u64>> =
        oracle(&produced).into_iter().map(|(user, counts)| (user, vec![*counts.last().expect("a count")])).collect();
    assert_eq!(table_counts(&pg, "latest"), expected);
}

/// What a table that does not fit says, at start or at the first write.
#[test]
fn a_table_that_does_not_fit_is_named_with_the_column() {
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 1);
    broker.produce("purchases", &purchases(0, 10, 1));
    let pg = PgServer::start();
    pg.execute(
        "CREATE TABLE flags (user_id text PRIMARY KEY, n boolean); CREATE TABLE narrow (user_id text PRIMARY KEY); \
         CREATE TABLE unkeyed (user_id text, n bigint)",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let failure = |sink: String| {
        let spec = spec_in(dir.path(), &counting_yaml(&broker, 1, "at_start", &sink));
        match Job::start(&spec, runtime(), JobOptions::default()) {
            Err(e) => e.to_string(),
            Ok(job) => job.wait().expect_err("the job fails").to_string(),
        }
    };
    let url = &pg.url;
    for (sink, expected) in [
        (
            format!(
                "{{type: postgres, url: \"{url}\", table: flags, key: [user_id], columns: {{user_id: key, n: value}}}}"
            ),
            "column `n` (boolean): 1 is not a boolean",
        ),
        (
            format!(
                "{{type: postgres, url: \"{url}\", table: narrow, key: [user_id], columns: {{user_id: key, n: value}}}}"
            ),
            "table `narrow` has no column `n`",
        ),
        (
            format!(
                "{{type: postgres, url: \"{url}\", table: flags, key: [user_id], columns: {{user_id: key, n: {{from: \
                 value, type: bigint}}}}}}"
            ),
            "column `n` of table `flags` is boolean, but the spec declares bigint",
        ),
        (
            format!("{{type: postgres, url: \"{url}\", table: absent, columns: {{user_id: key, n: value}}}}"),
            "table `absent` does not exist",
        ),
        (
            format!(
                "{{type: postgres, url: \"{url}\", table: unkeyed, mode: upsert, key: [user_id], columns: {{user_id: key, n: value}}}}"
            ),
            "table `unkeyed` does not take the sink's rows",
        ),
        (
            "{type: postgres, url_env: EDDY_TEST_UNSET_URL, table: t, columns: {user_id: key}}".to_string(),
            "$EDDY_TEST_UNSET_URL, which is not set",
        ),
    ] {
        let got = failure(sink);
        assert!(got.contains(expected), "expected {expected:?} in: {got}");
    }
    assert_eq!(pg.rows("SELECT count(*) FROM flags"), [[Some("0".to_string())]], "nothing half-written");
}

/// A broker that hangs for 8 s in the middle of a run (SIGSTOP: connections open, nothing
/// answered) and comes back: the job waits it out, reads on from where it was, and the table
/// ends with every count once, for what was produced before and after.
#[test]
fn a_broker_away_and_back_mid_run_loses_and_repeats_no_row() {
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 2);
    let pg = PgServer::start();
    let mut produced = purchases(0, 4_000, 2);
    broker.produce("purchases", &produced);
    let dir = tempfile::tempdir().expect("tempdir");
    let spec =
        spec_in(dir.path(), &counting_yaml(&broker, 2, "unbounded", &counts_sink(&pg, "counts", "exactly_once", "")));
    let job = Job::start(&spec, runtime(), JobOptions::default()).expect("starts");
    let rows = || -> usize {
        let found = pg.rows("SELECT count(*) FROM information_schema.tables WHERE table_name = 'counts'");
        if found[0][0].as_deref() == Some("0") {
            return 0;
        }
        pg.rows("SELECT count(*) FROM counts")[0][0].as_deref().expect("count").parse().expect("a number")
    };
    // The job ending early is the failure to explain, so its outcome is what gets reported.
    let wait_rows = |job: Job, n: usize| -> Job {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while rows() < n {
            assert!(std::time::Instant::now() < deadline, "{} rows of {n}", rows());
            if job.is_done() {
                panic!("the job ended with {} rows of {n}: {:?}", rows(), job.wait().map(|s| s.checkpoints.len()));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        job
    };
    let job = wait_rows(job, 1);
    broker.pause();
    std::thread::sleep(std::time::Duration::from_secs(8));
    broker.resume();
    let more = purchases(4_000, 8_000, 2);
    broker.produce("purchases", &more);
    produced.extend(more);
    let job = wait_rows(job, produced.len());
    job.cancel();
    let summary = job.wait().expect("a cancelled job ends cleanly");
    eprintln!(
        "broker away 8 s: {} rows for {} records, {} checkpoints completed",
        rows(),
        produced.len(),
        summary.checkpoints.len()
    );
    assert_eq!(table_counts(&pg, "counts"), oracle(&produced));
}
