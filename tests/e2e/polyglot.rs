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
    for (i, text) in ["plain", "Été \"quoted\" \\ tab\t", ""].into_iter().enumerate() {
        let value = Everything {
            small: -7 * i as i32,
            big: u64::MAX - i as u64,
            ratio: 0.25 + i as f64,
            flag: i % 2 == 0,
            text: text.into(),
            missing: (i == 1).then_some(5),
            raw: serde_bytes_like::Bytes(vec![0, 255, i as u8]),
            inner: Inner { id: i as u64, label: (i != 2).then(|| format!("n{i}")) },
            list: vec![1, 2, i as u16],
        };
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
