//! Operators in every language, through the `eddy` binary: each example's pipeline in each
//! language prints what its Rust pipeline prints, and `eddy new` / `eddy build` / `eddy test`
//! make a project that builds, is a `keyed-operator`, and passes its own test.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod common;

use std::path::{Path, PathBuf};

use common::{eddy, ok};

/// Compiled components are kept between runs of this test binary: the Python ones take
/// seconds to compile.
fn cache_dir() -> String {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("polyglot-artifacts").display().to_string()
}

fn printed(pipeline: &Path) -> Vec<String> {
    let out =
        ok(eddy(&["run", pipeline.to_str().unwrap(), "--cache-dir", &cache_dir()]), &pipeline.display().to_string());
    let mut lines: Vec<String> = out.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

#[test]
fn every_example_prints_in_every_language_what_its_rust_pipeline_prints() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for example in ["wordcount", "purchase-totals", "fraud-detector"] {
        let dir = examples.join(example);
        let rust = printed(&dir.join("pipeline.yaml"));
        assert!(!rust.is_empty(), "{example} prints something");
        let mut twins: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("pipeline-"))
            .collect();
        twins.sort();
        for lang in ["python", "js", "ts", "go"] {
            assert!(twins.iter().any(|p| p.ends_with(format!("pipeline-{lang}.yaml"))), "{example} has a {lang} twin");
        }
        for twin in twins {
            assert_eq!(printed(&twin), rust, "{} prints what the Rust pipeline prints", twin.display());
        }
    }
}

#[test]
fn a_new_project_builds_is_an_operator_and_passes_its_own_test() {
    let dir = tempfile::tempdir().unwrap();
    for lang in ["python", "js", "ts", "go", "rust"] {
        let project = dir.path().join(format!("my-{lang}-op"));
        let project_arg = project.to_str().unwrap();
        let made = ok(eddy(&["new", "--lang", lang, project_arg]), "eddy new");
        assert!(made.contains("next: `eddy build"), "{made}");
        if lang == "rust" {
            // The workspace's lock: the same dependency versions as Eddy's own guests.
            std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock"), project.join("Cargo.lock"))
                .unwrap();
        }
        let built = ok(eddy(&["build", project_arg]), "eddy build");
        let wasm = built.lines().last().unwrap();
        assert!(Path::new(wasm).is_file(), "eddy build prints the component's path last: {built}");
        let inspected = ok(eddy(&["inspect", wasm, "--cache-dir", &cache_dir()]), "eddy inspect");
        assert!(inspected.contains("keyed-operator"), "{inspected}");
        let tested = ok(eddy(&["test", project_arg]), "eddy test");
        assert!(tested.contains("test passed: 5 lines"), "{tested}");
        if lang == "go" {
            assert!(tested.contains("go test passed"), "a Go project's own tests run too: {tested}");
        }

        // The test can fail: a line the operator does not print is named.
        let expected = project.join("expected.txt");
        let text = std::fs::read_to_string(&expected).unwrap();
        std::fs::write(&expected, text.replace("\"wasm\" => 1", "\"wasm\" => 2")).unwrap();
        let failed = eddy(&["test", project_arg]);
        assert!(!failed.status.success());
        let why = String::from_utf8_lossy(&failed.stderr);
        assert!(
            why.contains(r#"missing: ["\"wasm\" => 2"]"#) && why.contains(r#"unexpected: ["\"wasm\" => 1"]"#),
            "{why}"
        );

        let again = eddy(&["new", "--lang", lang, project_arg]);
        assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"), "an existing project is not overwritten");
    }
}

/// The output of `eddy build` of a new TypeScript project with `from` replaced by `to` in its
/// app.ts, which must fail.
fn failed_typescript_build(from: &str, to: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("typed");
    let project_arg = project.to_str().unwrap();
    ok(eddy(&["new", "--lang", "ts", project_arg]), "eddy new");
    let app = project.join("app.ts");
    let text = std::fs::read_to_string(&app).unwrap();
    assert!(text.contains(from), "the scaffold has changed: no {from:?} in app.ts");
    std::fs::write(&app, text.replace(from, to)).unwrap();
    let failed = eddy(&["build", project_arg]);
    assert!(!failed.status.success());
    format!("{}{}", String::from_utf8_lossy(&failed.stdout), String::from_utf8_lossy(&failed.stderr))
}

/// TypeScript is checked before it is bundled: a type error fails the build and names the line.
#[test]
fn a_typescript_type_error_fails_the_build_with_tscs_message() {
    let said = failed_typescript_build("this.count.set(count);", "this.count.set(\"many\");");
    assert!(said.contains("app.ts") && said.contains("TS2345") && said.contains("tsc failed"), "{said}");
}

/// A TypeScript operator's export is checked against the type generated from the WIT for it:
/// an export under another name fails the build naming what is missing, before any bundle.
#[test]
fn a_typescript_export_is_checked_against_the_wits_types() {
    let said = failed_typescript_build("export const operator =", "export const operatr =");
    assert!(said.contains("operator") && said.contains("TS2") && said.contains("tsc failed"), "{said}");
}

/// Both JavaScript engines build the same project into an operator that passes its test.
#[test]
fn a_javascript_project_builds_on_either_engine() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("engines");
    let project_arg = project.to_str().unwrap();
    ok(eddy(&["new", "--lang", "js", project_arg]), "eddy new");
    let tested = ok(eddy(&["test", project_arg, "--js-engine", "spidermonkey"]), "eddy test on SpiderMonkey");
    assert!(tested.contains("test passed: 5 lines"), "{tested}");
    let wrong = eddy(&["build", project_arg, "--js-engine", "v8"]);
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("choose quickjs or spidermonkey"));
}

/// The polyglot pipeline submitted to `eddy serve`: four languages on its embedded worker,
/// checkpointed into an exactly-once sink, commit exactly the alerts computed plainly.
#[test]
fn the_polyglot_pipeline_runs_on_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("data"), &[]);
    let (_, token) = common::tenant(&server, "acme");
    let (spec, oracle) = common::polyglot_job(&server, &token, 6_000, None);
    let id = common::expect(common::submit(&server, &token, &spec), 201)["id"].as_str().unwrap().to_owned();
    let done = common::wait_job(&server, &token, &id, "ended", |j| {
        !["created", "running", "restarting"].contains(&j["status"].as_str().unwrap())
    });
    assert_eq!(done["status"], "finished", "{done}");
    common::assert_alerts_once(&server, &token, &id, &oracle);
}

/// Big components compile in the background when asked: the upload answers 202 at once, the
/// compile's status shows compiling and then ready (with the artifact, usable by name), a
/// component that does not compile ends failed with the reason, and a tenant cannot start more
/// than two at once.
#[test]
fn uploads_compile_in_the_background_with_a_visible_status() {
    use common::{client, expect};
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("data"), &[]);
    let (_, token) = common::tenant(&server, "acme");
    let upload = |wasm: &[u8], query: &str| {
        client()
            .post(server.url(&format!("/v1/artifacts?wait=false{query}")))
            .bearer_auth(&token)
            .body(wasm.to_vec())
            .send()
            .unwrap()
    };
    let status = |digest: &str| {
        expect(
            client().get(server.url(&format!("/v1/artifacts/compiles/{digest}"))).bearer_auth(&token).send().unwrap(),
            200,
        )
    };
    let count = std::fs::read(eddy_guest_artifacts::PYTHON_WORDCOUNT_COUNT).unwrap();
    let totals = std::fs::read(eddy_guest_artifacts::PYTHON_PURCHASE_TOTALS).unwrap();
    let first = expect(upload(&count, "&name=count&version=1"), 202);
    assert_eq!(first["status"], "compiling", "{first}");
    let second = expect(upload(&totals, ""), 202);
    let third = upload(&std::fs::read(eddy_guest_artifacts::PYTHON_FRAUD_DETECTOR).unwrap(), "");
    assert_eq!(third.status(), 429, "a third compile at once is refused");
    assert!(third.text().unwrap().contains("compiling already"));
    let digest = first["digest"].as_str().unwrap().to_owned();
    assert_eq!(status(&digest)["status"], "compiling");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let ready = loop {
        let s = status(&digest);
        if s["status"] != "compiling" {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "still compiling: {s}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["artifact"]["world"], "keyed-operator", "{ready}");
    assert!(ready["elapsed_ms"].as_u64().unwrap() > 0, "how long it took: {ready}");
    assert!(ready["artifact"]["names"].as_array().unwrap().iter().any(|n| n == "count@1"), "{ready}");
    let shown = expect(client().get(server.url("/v1/artifacts/count@1")).bearer_auth(&token).send().unwrap(), 200);
    assert_eq!(shown["digest"], digest.as_str());

    // Bytes that are a component header and nothing else: accepted, then failed with the reason.
    let broken = expect(upload(b"\0asm\x0d\0\x01\0garbage", ""), 202);
    let broken_digest = broken["digest"].as_str().unwrap().to_owned();
    let failed = loop {
        let s = status(&broken_digest);
        if s["status"] != "compiling" {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(!failed["error"].as_str().unwrap().is_empty(), "{failed}");
    let unknown = client().get(server.url("/v1/artifacts/compiles/sha256:00")).bearer_auth(&token).send().unwrap();
    assert_eq!(unknown.status(), 404);
    // Another tenant learns nothing of this tenant's compiles, ready or failed.
    let (_, other) = common::tenant(&server, "globex");
    for asked in [&digest, &broken_digest] {
        let seen =
            client().get(server.url(&format!("/v1/artifacts/compiles/{asked}"))).bearer_auth(&other).send().unwrap();
        assert_eq!(seen.status(), 404, "{asked}");
    }
    // The list (what the web UI shows): this tenant's recent compiles, newest first; none of
    // them for the other tenant.
    let list = |t: &str| expect(client().get(server.url("/v1/artifacts/compiles")).bearer_auth(t).send().unwrap(), 200);
    let mine = list(&token);
    let statuses: Vec<(String, String)> = mine
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["digest"].as_str().unwrap().to_owned(), c["status"].as_str().unwrap().to_owned()))
        .collect();
    // Running compiles first (the other upload may still be one on a busy machine), then the
    // finished ones, newest first: the broken one finished after `count@1` was ready.
    let at = |wanted: (&str, &str)| {
        statuses
            .iter()
            .position(|(d, s)| (d.as_str(), s.as_str()) == wanted)
            .unwrap_or_else(|| panic!("{wanted:?}: {mine}"))
    };
    assert!(at((&broken_digest, "failed")) < at((&digest, "ready")), "{mine}");
    let running = statuses.iter().filter(|(_, s)| s == "compiling").count();
    assert!(statuses[..running].iter().all(|(_, s)| s == "compiling"), "running ones first: {mine}");
    assert_eq!(list(&other), serde_json::json!([]));
    let _ = second;
}

/// Go's collector runs in export bodies only: `eddy run` of a Go word count over 300 000 words
/// into a blackhole (the fastest sink: the biggest batches) collects many times and finishes.
/// Before, a collection started inside the host's allocation in the guest read the wall clock
/// (an import) and trapped with "cannot leave component instance" on this very input (checked:
/// the component built before the fix fails this test). The counts themselves are checked by
/// the examples' tests.
#[test]
fn a_go_word_count_collects_garbage_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let word = |i: usize| format!("w{}", (i * 7919) % 5000);
    let lines: Vec<String> =
        (0..30_000).map(|l| (0..10).map(|w| word(l * 10 + w)).collect::<Vec<_>>().join(" ")).collect();
    std::fs::write(dir.path().join("input.txt"), lines.join("\n") + "\n").unwrap();
    let yaml = format!(
        "name: go-load\nsources: [{{type: file, name: lines, path: input.txt, format: lines}}]\nsteps:\n  \
         - {{name: split, wasm: {}}}\n  - {{name: count, wasm: {}, key_by: key, parallelism: 2}}\nsink: {{type: blackhole}}\n",
        eddy_guest_artifacts::GO_WORDCOUNT_SPLIT,
        eddy_guest_artifacts::GO_WORDCOUNT_COUNT
    );
    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(&pipeline, yaml).unwrap();
    let out = eddy(&["run", pipeline.to_str().unwrap(), "--cache-dir", &cache_dir()]);
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{summary}");
    assert!(summary.contains("count -> sink:blackhole: in 300000  out 300000"), "{summary}");
}
