//! A pipeline spec run end to end on the embedded runtime, compared with an oracle; and a bad
//! input line reported with its line number.

use std::collections::BTreeMap;

use eddy_engine::{ChainRunner, JsonLinesSink, PipelineSpec, RunError};
use eddy_guest_artifacts as guests;
use eddy_tests::runtime;

fn spec(dir: &std::path::Path, input: &str, format: &str) -> PipelineSpec {
    std::fs::write(dir.join("input.txt"), input).expect("write input");
    let yaml = format!(
        "name: wc\nbatch_size: 3\nsource: {{type: file, path: input.txt, format: {format}}}\nsteps:\n  \
         - {{name: split, wasm: {}}}\n  - {{name: count, wasm: {}}}\nsink: {{type: blackhole}}\n",
        guests::WORDCOUNT_SPLIT,
        guests::WORDCOUNT_COUNT
    );
    std::fs::write(dir.join("pipeline.yaml"), yaml).expect("write spec");
    PipelineSpec::from_file(&dir.join("pipeline.yaml")).expect("valid spec")
}

#[test]
fn wordcount_pipeline_produces_the_oracle_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "the cat\nThe dog, the END\n\nend-to-end\n";
    let runner = ChainRunner::new(spec(dir.path(), text, "lines"), runtime());
    let mut out = Vec::new();
    let summary = runner.run(&mut JsonLinesSink(&mut out), |_| {}).expect("run");
    let mut last = BTreeMap::new();
    for line in String::from_utf8(out).expect("utf8").lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        last.insert(v["key"].as_str().expect("key").to_owned(), v["value"].as_u64().expect("count"));
    }
    let mut oracle = BTreeMap::new();
    for w in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        *oracle.entry(w.to_lowercase()).or_insert(0) += 1;
    }
    assert_eq!(last, oracle);
    assert_eq!(summary.records_in, 4);
    assert_eq!(summary.steps[1].records_in, oracle.values().sum::<u64>());
}

#[test]
fn a_bad_input_line_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runner = ChainRunner::new(spec(dir.path(), "\"ok\"\n{not json\n", "json_lines"), runtime());
    let err = runner.run(&mut eddy_engine::Blackhole, |_| {}).expect_err("bad line");
    assert!(matches!(err, RunError::BadInput { line: 2, .. }), "{err}");
}
