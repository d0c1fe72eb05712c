//! `eddy replay` through the binary: a word count runs with its count step journaled, then
//! each subtask is replayed in another process. Its outputs equal the lines the run wrote for
//! that subtask's words, in order, and every word's last count is how often it occurs in the
//! input (counted here); `--key` shows one word's records, reads and writes; `--wasm` with code
//! that counts alike finds no difference, and with code that counts by two finds them all. A
//! running count journaled into a bucket replays through `s3://` from its oldest kept
//! checkpoint.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{eddy, ok};
use serde_json::Value;

const TEXT: &str = "the quick brown fox\njumps over the lazy dog\nthe end\nquick quick fox\n";

fn cache_dir() -> String {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay-artifacts").display().to_string()
}

fn replay(pipeline: &Path, extra: &[&str]) -> String {
    let (pipeline, cache) = (pipeline.to_str().unwrap(), cache_dir());
    let mut args = vec!["replay", pipeline, "--step", "count", "--cache-dir", &cache];
    args.extend_from_slice(extra);
    ok(eddy(&args), &format!("eddy {}", args.join(" ")))
}

fn lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_replayed_subtask_prints_what_the_run_wrote_and_compares_other_code() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("input.txt"), TEXT.repeat(20)).unwrap();
    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(
        &pipeline,
        format!(
            "name: wc-replay\nbatch_size: 8\nsources: [{{type: file, name: lines, path: input.txt}}]\nsteps:\n  - \
             {{name: split, wasm: {split}}}\n  - {{name: count, wasm: {count}, key_by: key, parallelism: 2, debug: \
             {{journal: true}}}}\ncheckpoints: {{dir: checkpoints, interval_ms: 60000}}\nsink: {{type: file, path: \
             out.jsonl}}\n",
            split = eddy_guest_artifacts::WORDCOUNT_SPLIT,
            count = eddy_guest_artifacts::WORDCOUNT_COUNT,
        ),
    )
    .unwrap();
    ok(eddy(&["run", pipeline.to_str().unwrap(), "--cache-dir", &cache_dir()]), "eddy run");
    let written: Vec<(String, Value)> = lines(&std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap())
        .into_iter()
        .map(|l| (l["key"].to_string(), l["value"].clone()))
        .collect();
    let mut oracle: BTreeMap<String, u64> = BTreeMap::new();
    for word in TEXT.repeat(20).split_whitespace() {
        *oracle.entry(format!("\"{word}\"")).or_default() += 1;
    }

    let mut owner_of_the = None;
    let mut replayed = 0;
    for subtask in ["0", "1"] {
        let events = lines(&replay(&pipeline, &["--subtask", subtask, "--format", "jsonl"]));
        let summary = events.last().unwrap();
        assert_eq!((summary["event"].as_str(), summary["end"]["end"].as_str()), (Some("summary"), Some("finished")));
        let of = |kind: &'static str| events.iter().filter(move |e| e["event"] == kind);
        let keys: BTreeSet<String> = of("input").map(|e| e["key"].to_string()).collect();
        let outputs: Vec<(String, Value)> = of("output").map(|e| (e["key"].to_string(), e["value"].clone())).collect();
        let mine: Vec<_> = written.iter().filter(|(k, _)| keys.contains(k)).cloned().collect();
        assert_eq!(outputs, mine, "subtask {subtask} replays what the run wrote for its words, in order");
        let last: BTreeMap<String, u64> = outputs.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect();
        let expected: BTreeMap<String, u64> =
            oracle.iter().filter(|(k, _)| keys.contains(*k)).map(|(k, n)| (k.clone(), *n)).collect();
        assert_eq!(last, expected, "subtask {subtask}: each word's last count");
        if keys.contains("\"the\"") {
            owner_of_the = Some(subtask);
        }
        replayed += outputs.len();
    }
    assert_eq!(replayed, written.len());

    let owner = owner_of_the.unwrap();
    let text = replay(&pipeline, &["--subtask", owner, "--key", "the"]);
    let inputs = text.lines().filter(|l| l.starts_with('#') && l.contains(" in key \"the\"")).count() as u64;
    assert_eq!(inputs, oracle["\"the\""], "{text}");
    assert!(text.lines().any(|l| l.trim_start().starts_with("write  count[\"the\"] = ")), "{text}");
    assert!(!text.contains("\"fox\""), "only the word asked for:\n{text}");
    assert!(text.contains("replayed step `count` subtask"), "{text}");

    let same = replay(&pipeline, &["--subtask", owner, "--wasm", eddy_guest_artifacts::RUNNING_COUNT]);
    assert!(same.trim_end().ends_with("0 outputs differ"), "{same}");
    let doubled = replay(&pipeline, &["--subtask", owner, "--wasm", eddy_guest_artifacts::RUNNING_COUNT_V2]);
    let emitted = replay(&pipeline, &["--subtask", owner, "--format", "jsonl"]).matches("\"event\":\"output\"").count();
    assert!(doubled.trim_end().ends_with(&format!("{emitted} outputs differ")), "{doubled}");
    assert!(doubled.contains("output #1\n  recorded: "), "{doubled}");

    let missing = eddy(&["replay", pipeline.to_str().unwrap(), "--step", "split", "--subtask", "0"]);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && err.contains("debug: {journal: true}"), "{err}");
}

/// A journal in a bucket (checkpoints in an S3-compatible store, moto): `eddy run` puts each
/// subtask's segments there as their barriers pass, and drops those before the oldest of the
/// two retained checkpoints. `eddy replay s3://...` in another process then starts from that
/// checkpoint, and each user's replayed counts run up by one to their total, counted here
/// from the generator, as the tail of what the run wrote for them.
#[test]
fn a_journal_in_a_bucket_replays_from_the_oldest_checkpoint_kept() {
    let s3 = eddy_tests::S3Service::start();
    s3.create_bucket("journals");
    let env = [("AWS_ENDPOINT_URL", s3.endpoint.as_str()), ("AWS_ALLOW_HTTP", "true")];
    let eddy_env = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_eddy"))
            .args(args)
            .envs(common::S3_CREDENTIALS)
            .envs(env)
            .output()
            .unwrap();
        ok(out, &format!("eddy {}", args.join(" ")))
    };
    let dir = tempfile::tempdir().unwrap();
    let events = 1500;
    let store = format!("{{bucket: journals, prefix: counts, endpoint: \"{}\", allow_http: true}}", s3.endpoint);
    let yaml = common::counts_job(events)
        .replace("wasm: count@1", &format!("wasm: {}", eddy_guest_artifacts::RUNNING_COUNT))
        .replace("key_by: /user}", "key_by: /user, parallelism: 2, debug: {journal: true}}")
        .replace(
            "checkpoints: {interval_ms: 200}",
            &format!("checkpoints: {{interval_ms: 100, retained: 2, s3: {store}}}"),
        )
        .replace("sink: {type: files, dir: out}", "sink: {type: file, path: out.jsonl}");
    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(&pipeline, &yaml).unwrap();
    eddy_env(&["run", pipeline.to_str().unwrap(), "--cache-dir", &cache_dir()]);
    assert!(!dir.path().join("journal").exists() && !dir.path().join("checkpoints").exists(), "nothing kept locally");
    let written: Vec<(String, u64)> = lines(&std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap())
        .into_iter()
        .map(|l| (l["key"].as_str().unwrap().to_owned(), l["value"].as_u64().unwrap()))
        .collect();
    let totals: BTreeMap<String, u64> = common::generated_counts(&common::counts_job(events)).into_iter().collect();

    let keys = s3.list("journals", "counts/");
    let ids = |pattern: &str| -> BTreeSet<u64> {
        keys.split(pattern).skip(1).filter_map(|rest| rest.split(['/', '.']).next()?.parse().ok()).collect()
    };
    let oldest_kept = *ids("counts/chk-").first().unwrap();
    assert!(oldest_kept > 1, "retention dropped the first checkpoints: {keys}");
    for subtask in ["0", "1"] {
        let segments = ids(&format!("counts/journal/count/{subtask}/after-"));
        assert_eq!(segments.first(), Some(&oldest_kept), "subtask {subtask}: segments before the oldest kept go");
        let cache = cache_dir();
        let args = ["replay", "s3://journals/counts", "--step", "count", "--subtask", subtask, "--format", "jsonl"];
        let events = lines(&eddy_env(&[&args[..], &["--cache-dir", &cache]].concat()));
        let summary = events.last().unwrap();
        assert_eq!(summary["end"]["end"], "finished", "{summary}");
        assert_eq!(summary["from_checkpoint"], oldest_kept, "{summary}");
        let mut per_user: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for e in events.iter().filter(|e| e["event"] == "output") {
            per_user.entry(e["key"].as_str().unwrap().to_owned()).or_default().push(e["value"].as_u64().unwrap());
        }
        assert!(!per_user.is_empty(), "subtask {subtask} counted after checkpoint {oldest_kept}");
        for (user, counts) in per_user {
            let first = counts[0];
            assert_eq!(counts, (first..=totals[&user]).collect::<Vec<_>>(), "{user}: up by one to the total");
            let run: Vec<u64> = written.iter().filter(|(k, _)| *k == user).map(|(_, v)| *v).collect();
            assert!(run.ends_with(&counts), "{user}: the tail of what the run wrote");
        }
    }
}
