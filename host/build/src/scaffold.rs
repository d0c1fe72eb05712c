//! `eddy new`: a project that builds and passes its own test. Every language gets the same
//! operator (a running count per key), a pipeline over a small input, and the output that
//! pipeline must print (`expected.txt`, compared as a multiset of lines by `eddy test`).

use std::path::{Path, PathBuf};

use crate::{BuildError, Lang, io, project_name};

/// Where the Rust SDK of the Eddy this was built from lives.
const RUST_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../guest-sdk");

const INPUT: &str = r#"{"word": "stream"}
{"word": "wasm"}
{"word": "stream"}
{"word": "state"}
{"word": "stream"}
"#;

const EXPECTED: &str = r#""stream" => 1
"wasm" => 1
"stream" => 2
"state" => 1
"stream" => 3
"#;

fn pipeline(name: &str, wasm: &str) -> String {
    format!(
        "# A running count per word: `eddy test .` builds the operator, runs this pipeline and\n\
         # compares what it prints with expected.txt (as a multiset of lines).\n\
         name: {name}\n\
         sources:\n  - type: file\n    name: words\n    path: input.jsonl\n    format: json_lines\n\
         steps:\n  - name: count\n    wasm: {wasm}\n    key_by: /word\n\
         sink:\n  type: print\n"
    )
}

const RUST_LIB: &str = r#"//! A running count per key: every record adds one to its key's count, and the new count
//! is emitted. Change `process` to make it yours; `eddy test .` checks it still passes.

use eddy_sdk::{Context, OpenContext, Operator, Record, Result, ValueState};

struct Counter {
    count: ValueState<u64>,
}

impl Operator for Counter {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        Ok(Counter { count: ctx.value_state("count") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let key: String = record.key()?;
        let count = self.count.get()?.unwrap_or(0) + 1;
        self.count.set(&count)?;
        ctx.emit(&key, &count)
    }
}

eddy_sdk::export_operator!(Counter);
"#;

const PYTHON_APP: &str = r#""""A running count per key: every record adds one to its key's count, and the new count is
emitted. Change `process` to make it yours; `eddy test .` checks it still passes."""

import eddy


class Counter(eddy.Operator):
    def open(self, ctx, config):
        self.count = ctx.value_state("count")

    def process(self, record, ctx):
        count = self.count.get(0) + 1
        self.count.set(count)
        ctx.emit(record.key, count)


Operator = eddy.export_operator(Counter)
"#;

const JS_APP: &str = r#"// A running count per key: every record adds one to its key's count, and the new count is
// emitted. Change `process` to make it yours; `eddy test .` checks it still passes.

import { Operator, exportOperator } from "eddy";

class Counter extends Operator {
  open(ctx) {
    this.count = ctx.valueState("count");
  }

  process(record, ctx) {
    const count = this.count.get(0) + 1;
    this.count.set(count);
    ctx.emit(record.key, count);
  }
}

export const operator = exportOperator(Counter);
"#;

const TS_APP: &str = r#"// A running count per key: every record adds one to its key's count, and the new count is
// emitted. Change `process` to make it yours; `eddy test .` checks it still passes.

import { Context, OpenContext, Operator, Record, ValueState, exportOperator } from "eddy";

class Counter extends Operator {
  private count!: ValueState<number>;

  open(ctx: OpenContext): void {
    this.count = ctx.valueState<number>("count");
  }

  process(record: Record, ctx: Context): void {
    const count = this.count.get(0) + 1;
    this.count.set(count);
    ctx.emit(record.key, count);
  }
}

export const operator = exportOperator(Counter);
"#;

const GO_APP: &str = r#"// A running count per key: every record adds one to its key's count, and the new count is
// emitted. Change Process to make it yours; `eddy test .` checks it still passes, and
// `go test` runs app_test.go (after one `eddy build`, which puts the SDK in build/eddy-go).
package main

import "eddy"

type Counter struct {
	count *eddy.ValueState[uint64]
}

func (c *Counter) Open(ctx *eddy.OpenContext) error {
	c.count = eddy.NewValueState[uint64](ctx, "count")
	return nil
}

func (c *Counter) Process(r *eddy.Record, ctx *eddy.Context) error {
	var key string
	if err := r.Key(&key); err != nil {
		return err
	}
	count, _ := c.count.Get()
	c.count.Set(count + 1)
	ctx.Emit(key, count+1)
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return &Counter{} }) }
"#;

const GO_TEST: &str = r#"package main

import (
	"slices"
	"testing"

	"eddy"
)

func TestCountsPerKey(t *testing.T) {
	h, err := eddy.NewHarness("")
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.Process(eddy.Keyed("a", nil), eddy.Keyed("b", nil), eddy.Keyed("a", nil))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range out {
		got = append(got, o.String())
	}
	if want := []string{`"a" => 1`, `"b" => 1`, `"a" => 2`}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
"#;

fn go_mod(name: &str) -> String {
    format!(
        "module {name}\n\ngo 1.24\n\nrequire eddy v0.0.0\n\n\
         // `eddy build` writes the Eddy Go SDK here.\nreplace eddy => ./{}\n",
        crate::go::SDK_DIR
    )
}

/// The file a project of `lang` is written in, and its text.
fn source(lang: Lang) -> (&'static str, &'static str) {
    match lang {
        Lang::Rust => ("src/lib.rs", RUST_LIB),
        Lang::JavaScript => ("app.js", JS_APP),
        Lang::TypeScript => ("app.ts", TS_APP),
        Lang::Go => ("app.go", GO_APP),
        Lang::Python => ("app.py", PYTHON_APP),
    }
}

fn readme(name: &str, lang: Lang, wasm: &str) -> String {
    let edit = source(lang).0;
    format!(
        "# {name}\n\nAn Eddy operator in {lang}, made by `eddy new --lang {lang}`. Edit `{edit}`, then:\n\n\
         ```sh\neddy build .        # the component: {wasm}\neddy test .         # build, run pipeline.yaml, compare with expected.txt\n\
         eddy run pipeline.yaml\n```\n"
    )
}

fn rust_manifest(name: &str) -> Result<String, BuildError> {
    let sdk = Path::new(RUST_SDK).canonicalize().map_err(|e| BuildError::Project {
        path: PathBuf::from(RUST_SDK),
        what: format!("the Rust SDK of this Eddy is not here ({e}): Rust projects need an Eddy source checkout"),
    })?;
    Ok(format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
         [lib]\ncrate-type = [\"cdylib\"]\n\n\
         [dependencies]\neddy-sdk = {{ path = {sdk:?} }}\n\n\
         # One codegen unit with LTO inlines the SDK into the operator: faster per record.\n\
         [profile.release]\nlto = true\ncodegen-units = 1\nstrip = \"debuginfo\"\n\n\
         # A project of its own, not a member of an enclosing workspace.\n[workspace]\n",
        sdk = sdk.display().to_string()
    ))
}

/// Writes a new project for `lang` into `dir` (new or empty) and returns the files written.
pub fn scaffold(lang: Lang, dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(BuildError::NotEmpty { path: dir.to_path_buf() });
    }
    let mut name = project_name(dir).to_lowercase();
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        name.insert_str(0, "op_");
    }
    let (wasm, mut files): (String, Vec<(&str, String)>) = match lang {
        Lang::Rust => {
            let wasm = format!("target/wasm32-wasip2/release/{}.wasm", name.replace('-', "_"));
            (wasm, vec![("Cargo.toml", rust_manifest(&name)?), ("src/lib.rs", RUST_LIB.into())])
        }
        Lang::Go => (
            format!("build/{name}.wasm"),
            vec![("go.mod", go_mod(&name)), ("app.go", GO_APP.into()), ("app_test.go", GO_TEST.into())],
        ),
        _ => {
            let (file, text) = source(lang);
            (format!("build/{name}.wasm"), vec![(file, text.into())])
        }
    };
    files.push(("pipeline.yaml", pipeline(&name, &wasm)));
    files.push(("input.jsonl", INPUT.into()));
    files.push(("expected.txt", EXPECTED.into()));
    files.push(("README.md", readme(&name, lang, &wasm)));
    files.push((".gitignore", "/target/\n/build/\n".into()));
    let mut written = Vec::new();
    for (file, text) in files {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scaffold_refuses_a_directory_with_files_in_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("mine.txt"), "keep me").expect("write");
        let err = scaffold(Lang::Python, dir.path()).expect_err("not empty").to_string();
        assert!(err.contains("not empty"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join("mine.txt")).expect("kept"), "keep me");
    }

    #[test]
    fn every_scaffold_names_the_component_its_build_leaves() {
        for lang in Lang::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let project = dir.path().join("my-op");
            scaffold(lang, &project).expect("scaffold");
            let pipeline = std::fs::read_to_string(project.join("pipeline.yaml")).expect("pipeline");
            let wanted = match lang {
                Lang::Rust => "target/wasm32-wasip2/release/my_op.wasm",
                _ => "build/my_op.wasm",
            };
            assert!(pipeline.contains(wanted), "{lang}: {pipeline}");
            assert_eq!(Lang::detect(&project).expect("detect"), lang);
        }
    }
}
