//! The same contract from another language: the Python word counter gives exactly the Rust
//! counter's output for the same input, and a pure-Python reader of rows
//! (`guest-sdk/python/eddy/rows.py`, only `struct`) reads rows as Eddy renders them.

use eddy_guest_artifacts as guests;
use eddy_runtime::Subtask;
use eddy_tests::{json_batch, load, open_operator};

#[test]
fn python_counter_equals_its_rust_twin() {
    let words = ["the", "fox", "the", "Été", "dog", "the", "fox", "\"quoted\"", "a\\b"];
    let input: Vec<(Option<&str>, u64)> = words.iter().enumerate().map(|(i, w)| (Some(*w), 1 + i as u64 % 3)).collect();
    let mut outputs = Vec::new();
    for (name, path) in [("count-rust", guests::WORDCOUNT_COUNT), ("count-python", guests::PYTHON_WORDCOUNT_COUNT)] {
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

/// A record with every kind a row holds, nested.
#[derive(serde::Serialize)]
struct Everything {
    small: i32,
    big: u64,
    ratio: f64,
    flag: bool,
    text: String,
    missing: Option<u64>,
    raw: serde_bytes_like::Bytes,
    inner: Inner,
    list: Vec<u16>,
}

/// The texts the rows of every kind carry: plain, escapes and non-ASCII, empty.
const TEXTS: [&str; 3] = ["plain", "Été \"quoted\" \\ tab\t", ""];

/// Row `i` of every kind, carrying `text`.
fn everything(i: usize, text: &str) -> Everything {
    Everything {
        small: -7 * i as i32,
        big: u64::MAX - i as u64,
        ratio: 0.25 + i as f64,
        flag: i.is_multiple_of(2),
        text: text.into(),
        missing: (i == 1).then_some(5),
        raw: serde_bytes_like::Bytes(vec![0, 255, i as u8]),
        inner: Inner { id: i as u64, label: (i != 2).then(|| format!("n{i}")) },
        list: vec![1, 2, i as u16],
    }
}

#[derive(serde::Serialize)]
struct Inner {
    id: u64,
    label: Option<String>,
}

mod serde_bytes_like {
    /// Bytes serialized as bytes (not as a list of numbers).
    pub struct Bytes(pub Vec<u8>);

    impl serde::Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }
}

#[test]
fn a_pure_python_reader_reads_rows_as_eddy_renders_them() {
    let registry = eddy_runtime::schemas();
    let mut rows: Vec<Vec<u8>> = Vec::new();
    let config = eddy_nexmark::NexmarkConfig { seed: 3, ..eddy_nexmark::NexmarkConfig::default() };
    let mut scratch = eddy_nexmark::Scratch::default();
    for schema in eddy_nexmark::row_schemas() {
        registry.declare(&schema).expect("nexmark schemas");
    }
    for i in 0..120 {
        let mut row = Vec::new();
        eddy_nexmark::write_row(&eddy_nexmark::event_ref(&config, i, &mut scratch), &mut row);
        rows.push(row);
    }
    let mut encoder = eddy_wire::ser::RowEncoder::new();
    let mut declare = |s: &eddy_wire::schema::Schema| registry.declare(s).expect("declared");
    for (i, text) in TEXTS.into_iter().enumerate() {
        let value = everything(i, text);
        let mut row = Vec::new();
        encoder.encode(&value, &mut row, &mut declare).expect("a struct");
        rows.push(row);
    }
    // What Eddy's sinks print for each row: the oracle the Python reader must meet.
    let expected: Vec<String> = rows
        .iter()
        .map(|r| String::from_utf8(eddy_connectors::values::json_text(r).into_owned()).expect("utf-8"))
        .collect();

    let dir = tempfile::tempdir().expect("tempdir");
    let mut ids = serde_json::Map::new();
    for row in &rows {
        collect_schemas(row, registry, &mut ids);
    }
    let schemas_path = dir.path().join("schemas.json");
    std::fs::write(&schemas_path, serde_json::to_vec(&ids).expect("json")).expect("write schemas");
    let mut input = Vec::new();
    for row in &rows {
        input.extend_from_slice(&(row.len() as u32).to_le_bytes());
        input.extend_from_slice(row);
    }
    let reader = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk/python/eddy/rows.py");
    let mut child = std::process::Command::new("python3")
        .arg(reader)
        .arg(&schemas_path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (deploy/setup.sh installs it)");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &input).expect("feed rows");
    let out = child.wait_with_output().expect("python ran");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<String> = String::from_utf8(out.stdout).expect("utf-8").lines().map(String::from).collect();
    // Compare as JSON values: Python and serde_json may space or escape differently.
    assert_eq!(got.len(), expected.len());
    for (i, (got, expected)) in got.iter().zip(&expected).enumerate() {
        let got: serde_json::Value = serde_json::from_str(got).expect("python printed JSON");
        let expected: serde_json::Value = serde_json::from_str(expected).expect("eddy rendered JSON");
        assert_eq!(got, expected, "row {i}");
    }
    // The doctests of the reader (it writes rows too).
    let doctest = std::process::Command::new("python3").args(["-m", "doctest", reader]).output().expect("doctest");
    assert!(doctest.status.success(), "{}", String::from_utf8_lossy(&doctest.stdout));
}

/// Every schema `row` and its nested rows name, as `{id: [name, [fields]]}`.
fn collect_schemas(
    row: &[u8],
    registry: &eddy_runtime::SchemaRegistry,
    ids: &mut serde_json::Map<String, serde_json::Value>,
) {
    use eddy_wire::schema::Schemas;
    let read = eddy_wire::row::RowRef::new(row).expect("a row");
    if let Some(schema) = registry.get(read.schema()) {
        ids.insert(read.schema().to_string(), serde_json::json!([schema.name, schema.fields]));
    }
    for i in 0..read.len() {
        if let Ok(Some(nested)) = read.row(i) {
            collect_schemas(nested.as_bytes(), registry, ids);
        }
    }
}

/// The shared codec table every SDK's tests check themselves against
/// (`guest-sdk/testdata/codec-table.json`): rows as `eddy-wire` writes them, with what they
/// mean (as Eddy's sinks render them), and keys and state values as serde_json writes them.
/// This test is its source: it fails when the file and `eddy-wire` disagree; run it with
/// `EDDY_BLESS=1` to rewrite the file after a deliberate change.
#[test]
fn the_shared_codec_table_is_what_eddy_wire_writes() {
    #[derive(serde::Serialize)]
    struct Purchase {
        user_id: String,
        amount_cents: u64,
    }
    #[derive(serde::Serialize)]
    struct Alert {
        account_id: u64,
        amount_cents: i64,
    }
    #[derive(serde::Serialize)]
    struct Totals {
        purchases: u64,
        total_cents: u64,
    }
    let mut schemas = serde_json::Map::new();
    // Declared to the host's registry too: the sinks' rendering (the meaning) reads names there.
    let mut declare = |s: &eddy_wire::schema::Schema| {
        schemas.insert(s.id().to_string(), serde_json::json!([s.name, s.fields]));
        eddy_runtime::schemas().declare(s).expect("declared")
    };
    let mut encoder = eddy_wire::ser::RowEncoder::new();
    let mut rows = Vec::new();
    let mut row = |name: &str, bytes: Vec<u8>| {
        let meaning: serde_json::Value =
            serde_json::from_slice(&eddy_connectors::values::json_text(&bytes)).expect("rendered JSON");
        let natural = signed_only_when_negative(&bytes);
        rows.push(serde_json::json!({"name": name, "hex": hex(&bytes), "meaning": meaning, "natural": natural}));
    };
    row("purchase", encode(&mut encoder, &mut declare, &Purchase { user_id: "alice".into(), amount_cents: 1299 }));
    row("negative integer", encode(&mut encoder, &mut declare, &Alert { account_id: 7, amount_cents: -60_000 }));
    row("accumulator", encode(&mut encoder, &mut declare, &Totals { purchases: 4, total_cents: 5248 }));
    for (i, text) in TEXTS.into_iter().enumerate() {
        row(&format!("every kind {i}"), encode(&mut encoder, &mut declare, &everything(i, text)));
    }
    // Keys and state: serde_json's bytes, which every SDK must write byte for byte.
    let mut json: Vec<String> = [
        serde_json::json!("fox"),
        serde_json::json!("Été \"quoted\" \\ \n\t\u{1}\u{1f}/\u{7f}"),
        serde_json::json!(0),
        serde_json::json!(-5),
        serde_json::json!(u64::MAX),
        serde_json::json!(i64::MIN),
        serde_json::json!(true),
        serde_json::json!(null),
        serde_json::json!(1.5),
        serde_json::json!(0.1),
        serde_json::json!(-2.25),
        serde_json::json!(1e20),
        serde_json::json!([1, "a", null, [false]]),
    ]
    .iter()
    .map(|v| serde_json::to_string(v).expect("json"))
    .collect();
    // A struct's fields in declaration order, as a Rust state value would be written.
    #[derive(serde::Serialize)]
    struct Seen {
        user: String,
        last: i64,
        tags: Vec<String>,
    }
    let seen = Seen { user: "bob".into(), last: -3, tags: vec!["a".into()] };
    json.push(serde_json::to_string(&seen).expect("json"));

    let table = serde_json::json!({
        "about": "Written by tests/e2e/polyglot.rs (the_shared_codec_table_is_what_eddy_wire_writes) from eddy-wire and serde_json; every SDK's tests check their codec against it. Do not edit by hand: rerun that test with EDDY_BLESS=1.",
        "schemas": schemas,
        "rows": rows,
        "json": json,
    });
    let text = serde_json::to_string_pretty(&table).expect("json") + "\n";
    let path = CODEC_TABLE;
    if std::env::var_os("EDDY_BLESS").is_some() {
        std::fs::create_dir_all(std::path::Path::new(path).parent().expect("dir")).expect("mkdir");
        std::fs::write(path, &text).expect("write the table");
    }
    let on_disk = std::fs::read_to_string(path).expect("the table exists (EDDY_BLESS=1 writes it)");
    assert!(
        on_disk == text,
        "{path} is not what eddy-wire writes: rerun this test with EDDY_BLESS=1 and review the diff"
    );
}

const CODEC_TABLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk/testdata/codec-table.json");

/// The host writes the rows the Python and JavaScript SDKs hand it as JSON field values
/// (`json-batch.emit`): for every natural row of the shared table whose fields JSON can carry
/// (no bytes, no nested row), the bytes equal the table's.
#[test]
fn rows_written_from_json_fields_are_the_shared_tables_rows() {
    let table: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(CODEC_TABLE).expect("table")).expect("JSON");
    let schemas = table["schemas"].as_object().expect("schemas");
    let mut checked = 0;
    for case in table["rows"].as_array().expect("rows") {
        let bytes: Vec<u8> = (0..case["hex"].as_str().expect("hex").len() / 2)
            .map(|i| u8::from_str_radix(&case["hex"].as_str().expect("hex")[2 * i..2 * i + 2], 16).expect("hex digit"))
            .collect();
        let schema = u32::from_le_bytes(bytes[4..8].try_into().expect("header"));
        let Some(fields) = schemas.get(&schema.to_string()).map(|s| s[1].as_array().expect("fields").clone()) else {
            continue;
        };
        let values: Vec<&serde_json::Value> =
            fields.iter().map(|f| &case["meaning"][f.as_str().expect("name")]).collect();
        let carried = case["natural"] == true
            && values.iter().all(|v| !v.is_object())
            && eddy_wire::row::RowRef::new(&bytes)
                .map(|r| (0..r.len()).all(|i| r.kind(i) != Ok(eddy_wire::row::Kind::Bytes)))
                .expect("row");
        if !carried {
            continue;
        }
        let mut written = Vec::new();
        eddy_wire::from_json::row_from_json_fields(
            &serde_json::to_string(&values).expect("text"),
            schema,
            &mut written,
        )
        .expect("fields");
        assert_eq!(hex(&written), case["hex"].as_str().expect("hex"), "{}", case["name"]);
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} rows of the table could be checked");
}

/// Whether every integer field of `row` (nested rows too) is signed exactly when negative: the
/// kinds a writer without static types (Python, JavaScript) picks, so such an SDK must write
/// these rows byte for byte.
fn signed_only_when_negative(row: &[u8]) -> bool {
    use eddy_wire::row::{Kind, RowRef};
    let read = RowRef::new(row).expect("a row");
    (0..read.len()).all(|i| match read.kind(i).expect("kind") {
        _ if read.is_null(i).expect("null bit") => true,
        Kind::I64 => read.i64(i).expect("i64") < 0,
        Kind::Row => read.row(i).expect("row").is_none_or(|r| signed_only_when_negative(r.as_bytes())),
        _ => true,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn encode<T: serde::Serialize>(
    encoder: &mut eddy_wire::ser::RowEncoder,
    declare: &mut dyn eddy_wire::ser::Declare,
    value: &T,
) -> Vec<u8> {
    let mut bytes = Vec::new();
    encoder.encode(value, &mut bytes, declare).expect("a struct");
    bytes
}

/// The Python SDK's own tests (plain CPython, no component): its codec against the shared
/// table, and its operator and aggregate runners on the in-memory host.
#[test]
fn the_python_sdk_passes_its_tests() {
    let sdk = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk/python");
    let out = std::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(sdk)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(report.contains("OK") && !report.contains("Ran 0 tests"), "{report}");
}

/// The JavaScript SDK's own tests (plain Node, no component): its codec against the shared
/// table, and its operator and aggregate runners on the in-memory host.
#[test]
fn the_javascript_sdk_passes_its_tests() {
    let sdk = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk/js");
    let out = std::process::Command::new("node")
        .args(["--test", "tests/"])
        .current_dir(sdk)
        .output()
        .expect("node (deploy/setup.sh installs it)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains("# fail 0") && !report.contains("# pass 0"), "{report}");
}

/// The Go SDK's own tests (`go test`, native, no component): its codec against the shared
/// table, and its operator and aggregate runners on the in-memory harness.
#[test]
fn the_go_sdk_passes_its_tests() {
    let sdk = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk/go");
    let out = std::process::Command::new("go")
        .args(["test", "-count=1", "-v", "./..."])
        .current_dir(sdk)
        .envs([("GOPROXY", "off"), ("GOTOOLCHAIN", "local"), ("GOFLAGS", "-mod=mod"), ("GOWORK", "off")])
        .output()
        .expect("go (deploy/setup.sh languages installs it)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains("--- PASS") && !report.contains("--- FAIL"), "{report}");
}
