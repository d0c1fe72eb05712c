//! Validation: each kind of unusable upload is rejected with an error that names the problem.

use eddy_guest_artifacts as guests;
use eddy_runtime::{LoadError, Runtime, RuntimeConfig, Subtask, World};
use eddy_tests::{load, runtime};

fn load_err(wasm: &[u8]) -> LoadError {
    runtime().load("upload", wasm).expect_err("must be rejected")
}

#[test]
fn garbage_bytes_are_not_wasm() {
    let err = load_err(b"#!/bin/sh\necho definitely not wasm\n");
    assert!(matches!(err, LoadError::NotWasm), "{err}");
    assert!(err.to_string().contains("not a WebAssembly binary"), "{err}");
}

#[test]
fn a_core_module_is_not_a_component() {
    let core = wat::parse_str("(module (func (export \"process\")))").expect("valid wat");
    let err = load_err(&core);
    assert!(matches!(err, LoadError::CoreModule), "{err}");
    assert!(err.to_string().contains("wasm32-wasip2"), "tells what to do: {err}");
}

#[test]
fn a_component_of_another_world_is_named_as_such() {
    let wasm = std::fs::read(guests::COMMAND).expect("command guest");
    let err = load_err(&wasm);
    let LoadError::WrongWorld { exports } = &err else { panic!("expected WrongWorld, got {err}") };
    assert!(exports.contains("wasi:cli/run"), "names what it exports instead: {err}");
    assert!(err.to_string().contains("eddy:dataflow/operator@0.4.0"), "{err}");
}

#[test]
fn missing_exports_are_listed() {
    let wasm = std::fs::read(guests::MISSING_EXPORT).expect("missing-export guest");
    let err = load_err(&wasm);
    let LoadError::MissingExports { interface, missing } = &err else { panic!("expected MissingExports, got {err}") };
    assert_eq!(interface, "eddy:dataflow/operator@0.4.0");
    assert_eq!(missing, "on-timer, close");
}

#[test]
fn a_truncated_component_fails_to_compile_with_a_reason() {
    let wasm = std::fs::read(guests::WORDCOUNT_COUNT).expect("guest");
    let err = load_err(&wasm[..wasm.len() / 2]);
    assert!(matches!(err, LoadError::Invalid(_)), "{err}");
}

#[test]
fn oversized_uploads_are_refused_before_compiling() {
    let small = Runtime::new(RuntimeConfig { max_component_bytes: 1024, ..RuntimeConfig::default() }).expect("runtime");
    let err = small.load_file("big", guests::WORDCOUNT_COUNT.as_ref()).expect_err("too large");
    assert!(matches!(err, LoadError::TooLarge { limit: 1024, .. }), "{err}");
}

#[test]
fn a_missing_file_names_the_path() {
    let err = runtime().load_file("nope", "/no/such/operator.wasm".as_ref()).expect_err("missing");
    assert!(err.to_string().contains("/no/such/operator.wasm"), "{err}");
}

#[test]
fn worlds_are_detected_and_misuse_is_refused() {
    let counter = load("count", guests::WORDCOUNT_COUNT);
    let totals = load("totals", guests::PURCHASE_TOTALS);
    assert_eq!(counter.world(), World::KeyedOperator);
    assert_eq!(totals.world(), World::WindowAggregate);
    assert_eq!(counter.digest().len(), 64);
    let err = totals
        .instantiate_operator(
            Subtask::single(128),
            Box::new(eddy_state::HeapStateBackend::default()),
            Box::new(eddy_core::HeapTimerService::default()),
        )
        .expect_err("an aggregate is not an operator");
    assert!(err.to_string().contains("window aggregate"), "{err}");
    assert!(counter.instantiate_aggregate().is_err());
}

#[test]
fn operators_that_read_their_batches_as_json_are_told_from_the_rest() {
    for (name, wasm, reads) in [
        ("rust", guests::NEXMARK_Q1, false),
        ("go", guests::GO_NEXMARK_Q1, false),
        ("python", guests::PYTHON_NEXMARK_Q1, true),
        ("javascript", guests::JS_NEXMARK_Q1, true),
    ] {
        assert_eq!(load(name, wasm).reads_json_batch(), reads, "{name}");
    }
}
