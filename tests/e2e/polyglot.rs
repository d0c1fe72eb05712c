//! The same contract from another language: the Python word counter gives exactly the Rust
//! counter's output for the same input.

use eddy_guest_artifacts as guests;
use eddy_runtime::Subtask;
use eddy_tests::{json_batch, load, open_operator};

#[test]
fn python_counter_equals_its_rust_twin() {
    let words = ["the", "fox", "the", "Été", "dog", "the", "fox", "\"quoted\"", "a\\b"];
    let input: Vec<(Option<&str>, u64)> = words.iter().enumerate().map(|(i, w)| (Some(*w), 1 + i as u64 % 3)).collect();
    let mut outputs = Vec::new();
    for (name, path) in [("count-rust", guests::WORDCOUNT_COUNT), ("count-python", guests::PYTHON_WORDCOUNT)] {
        let component = load(name, path);
        let mut op = open_operator(&component, Subtask::single(128), "null");
        let mut out = Vec::new();
        // Two batches, so state must carry across calls in both languages.
        for chunk in input.chunks(5) {
            let batch = op.process(&json_batch(chunk)).expect(name);
            out.extend(batch.main.iter().map(|r| r.to_owned()));
        }
        op.close().expect("close");
        outputs.push(out);
    }
    assert_eq!(outputs[0].len(), words.len());
    assert_eq!(outputs[0], outputs[1], "Rust and Python outputs differ byte for byte");
}
