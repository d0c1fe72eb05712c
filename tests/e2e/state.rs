//! Reading state back (`eddy_checkpoint::inspect`, what `eddy state` and the REST state lookup
//! use), checked against oracles computed from the input: a word's `count` state is how often
//! it occurs, on the heap and on RocksDB, before and after a rescale; an open window's
//! accumulator holds its key's purchases of that window.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use eddy_checkpoint::CheckpointStore;
use eddy_checkpoint::inspect::{StateDump, StateQuery, read_state};
use eddy_plan::StoreLocation;
use eddy_state::StateKind;

use crate::checkpoints::{start_wordcount, wait_for};

fn read(savepoint: &Path, step: &str, key: Option<&str>) -> StateDump {
    let store = CheckpointStore::local(savepoint).expect("store");
    let query = StateQuery {
        step: step.into(),
        state: None,
        key: key.map(|k| serde_json::json!(k).to_string().into_bytes()),
        limit: 10_000,
    };
    read_state(&store, None, &query, &std::env::temp_dir()).expect("reads")
}

/// Every word's count, counted here from the text (not by the operator under test).
fn oracle(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_lowercase()).or_default() += 1;
    }
    counts
}

fn counts(dump: &StateDump) -> BTreeMap<String, u64> {
    dump.entries
        .iter()
        .map(|e| {
            assert_eq!((e.state.as_str(), e.kind), ("count", Some(StateKind::Value)), "{e:?}");
            (e.key.as_str().expect("a word").to_owned(), e.value.as_u64().expect("a count"))
        })
        .collect()
}

/// Word counts stop with a savepoint at parallelism 2, then resume at 3 with more input and
/// stop again: both savepoints read back as the oracle's counts, on both backends, and a key
/// lookup finds exactly that key's count (in whichever old subtask held its key group).
#[test]
fn word_counts_read_back_equal_the_input_on_both_backends_and_after_a_rescale() {
    let parts =
        ["the quick brown fox\njumps over the lazy dog\nthe end\n".repeat(30), "a quick end\nzebra\n".repeat(17)];
    for backend in ["heap", "rocksdb"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut input = String::new();
        let mut restore = None;
        for (round, (part, parallelism)) in parts.iter().zip([2, 3]).enumerate() {
            input.push_str(part);
            std::fs::write(dir.path().join("input.txt"), &input).expect("input");
            let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
            let yaml = format!(
                "name: wc-state\nbatch_size: 16\nsources: [{{type: file, name: lines, path: input.txt, follow: true}}]\n\
                 steps:\n  - {{name: split, wasm: {split}}}\n  - {{name: count, wasm: {count}, key_by: key, \
                 parallelism: {parallelism}}}\nstate: {{backend: {backend}, dir: state}}\n\
                 checkpoints: {{dir: checkpoints, interval_ms: 50}}\nsink: {{type: print}}\n",
                split = eddy_guest_artifacts::WORDCOUNT_SPLIT,
                count = eddy_guest_artifacts::WORDCOUNT_COUNT,
            );
            let (job, received) = start_wordcount(dir.path(), &yaml, restore.take());
            wait_for(&received, part.split_whitespace().count());
            let savepoint = dir.path().join(format!("savepoint-{round}"));
            job.stop_with_savepoint(&StoreLocation::Dir(savepoint.clone()), Duration::from_secs(30))
                .expect("savepoint");
            let expected = oracle(&input);
            let dump = read(&savepoint, "count", None);
            assert!(!dump.truncated);
            assert_eq!(counts(&dump), expected, "{backend}, round {round}");
            for word in ["the", "zebra", "absent"] {
                let one = read(&savepoint, "count", Some(word));
                let want: BTreeMap<String, u64> =
                    expected.get(word).map(|n| (word.to_owned(), *n)).into_iter().collect();
                assert_eq!(counts(&one), want, "{backend}, round {round}, key {word}");
            }
            restore = Some(savepoint);
        }
    }
}

/// An hourly window still open at a savepoint: each key's accumulator, read back by its row
/// schema's field names, holds the count and sum of that key's purchases, computed here.
#[test]
fn an_open_windows_accumulators_read_back_by_field_name() {
    const HOUR: i64 = 3_600_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let users = ["ann", "bob", "cy"];
    let purchases: Vec<(&str, i64, i64)> = (0..30).map(|i| (users[i % 3], 100 + i as i64, 1_000 * i as i64)).collect();
    let lines: String = purchases
        .iter()
        .map(|(u, cents, ts)| format!("{{\"user_id\":\"{u}\",\"amount_cents\":{cents},\"ts\":{ts}}}\n"))
        .collect();
    std::fs::write(dir.path().join("input.jsonl"), lines).expect("input");
    let yaml = format!(
        "name: totals-state\nbatch_size: 4\nsources: [{{type: file, name: purchases, path: input.jsonl, format: json_lines, \
         timestamp: /ts, follow: true}}]\nsteps:\n  - {{name: hourly, wasm: {wasm}, key_by: /user_id, \
         window: {{type: tumbling, size_ms: {HOUR}}}}}\ncheckpoints: {{dir: checkpoints, interval_ms: 50}}\nsink: {{type: print}}\n",
        wasm = eddy_guest_artifacts::PURCHASE_TOTALS,
    );
    let (job, _received) = start_wordcount(dir.path(), &yaml, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.metrics().tasks.iter().all(|t| t.records_in < 30) {
        assert!(Instant::now() < deadline, "the aggregate never saw the purchases");
        std::thread::sleep(Duration::from_millis(10));
    }
    let savepoint = dir.path().join("savepoint");
    job.stop_with_savepoint(&StoreLocation::Dir(savepoint.clone()), Duration::from_secs(30)).expect("savepoint");

    let mut oracle: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for (user, cents, _) in &purchases {
        let e = oracle.entry((*user).to_owned()).or_default();
        e.0 += 1;
        e.1 += cents;
    }
    let dump = read(&savepoint, "hourly", None);
    let got: BTreeMap<String, (u64, i64)> = dump
        .entries
        .iter()
        .map(|e| {
            assert_eq!(e.kind, Some(StateKind::WindowAccumulator), "{e:?}");
            let window = e.window.expect("a window");
            assert_eq!((window.start, window.end, e.fired), (0, HOUR, Some(false)), "{e:?}");
            let user = e.key.as_str().expect("user").to_owned();
            (user, (e.value["purchases"].as_u64().expect("by name"), e.value["total_cents"].as_i64().expect("by name")))
        })
        .collect();
    assert_eq!(got, oracle);
}
