//! Builds every guest component and writes their paths as constants, so a test that names a
//! guest cannot compile unless that guest built. Rust guests build with their own target dir
//! (a nested cargo on the outer target dir would wait on its lock forever); Python,
//! JavaScript, TypeScript and Go guests are built by `eddy_build`, as `eddy build` builds them.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use eddy_build::Lang;

/// (constant, cargo package, artifact file stem)
const RUST_GUESTS: &[(&str, &str, &str)] = &[
    ("WORDCOUNT_SPLIT", "wordcount-split", "wordcount_split"),
    ("WORDCOUNT_COUNT", "wordcount-count", "wordcount_count"),
    ("PURCHASE_TOTALS", "purchase-totals", "purchase_totals"),
    ("FRAUD_DETECTOR", "fraud-detector", "fraud_detector"),
    ("SURGE_REQUEST_COUNTER", "surge-request-counter", "surge_request_counter"),
    ("SURGE_PRICING", "surge-pricing", "surge_pricing"),
    ("NEXMARK_SELECT", "nexmark-select", "nexmark_select"),
    ("NEXMARK_Q1", "nexmark-q1", "nexmark_q1"),
    ("NEXMARK_Q2", "nexmark-q2", "nexmark_q2"),
    ("NEXMARK_Q3", "nexmark-q3", "nexmark_q3"),
    ("NEXMARK_COUNT", "nexmark-count", "nexmark_count"),
    ("NEXMARK_Q5", "nexmark-q5", "nexmark_q5"),
    ("NEXMARK_Q7", "nexmark-q7", "nexmark_q7"),
    ("NEXMARK_WINDOW_ROW", "nexmark-window-row", "nexmark_window_row"),
    ("NEXMARK_Q8", "nexmark-q8", "nexmark_q8"),
    ("NEXMARK_Q8_ROWS", "nexmark-q8-rows", "nexmark_q8_rows"),
    ("HOSTILE", "hostile", "hostile"),
    ("RUNNING_COUNT", "running-count", "running_count"),
    ("RUNNING_COUNT_V2", "running-count-v2", "running_count_v2"),
    ("COUNT_PER_KEY_V2", "count-per-key-v2", "count_per_key_v2"),
    ("TAGS", "tags", "tags"),
    ("MISSING_EXPORT", "missing-export", "missing_export"),
    ("COMMAND", "command", "command"),
];

/// (constant, language, project directory): the twins of the Rust examples in the SDK
/// languages, and their sandbox probes. The artifact's file stem is the constant, lower-cased.
const SDK_GUESTS: &[(&str, Lang, &str)] = &[
    ("PYTHON_WORDCOUNT_SPLIT", Lang::Python, "examples/wordcount/python/split"),
    ("PYTHON_WORDCOUNT_COUNT", Lang::Python, "examples/wordcount/python/count"),
    ("PYTHON_PURCHASE_TOTALS", Lang::Python, "examples/purchase-totals/python"),
    ("PYTHON_FRAUD_DETECTOR", Lang::Python, "examples/fraud-detector/python"),
    ("PYTHON_NEXMARK_Q1", Lang::Python, "examples/nexmark/python/q1"),
    ("PYTHON_HOSTILE", Lang::Python, "tests/guests/python-hostile"),
    ("JS_WORDCOUNT_SPLIT", Lang::JavaScript, "examples/wordcount/js/split"),
    ("JS_WORDCOUNT_COUNT", Lang::JavaScript, "examples/wordcount/js/count"),
    ("JS_PURCHASE_TOTALS", Lang::JavaScript, "examples/purchase-totals/js"),
    ("JS_FRAUD_DETECTOR", Lang::JavaScript, "examples/fraud-detector/js"),
    ("JS_NEXMARK_Q1", Lang::JavaScript, "examples/nexmark/js/q1"),
    ("JS_HOSTILE", Lang::JavaScript, "tests/guests/js-hostile"),
    ("TS_WORDCOUNT_SPLIT", Lang::TypeScript, "examples/wordcount/ts/split"),
    ("TS_WORDCOUNT_COUNT", Lang::TypeScript, "examples/wordcount/ts/count"),
    ("TS_PURCHASE_TOTALS", Lang::TypeScript, "examples/purchase-totals/ts"),
    ("TS_FRAUD_DETECTOR", Lang::TypeScript, "examples/fraud-detector/ts"),
    ("PYTHON_TAGS", Lang::Python, "tests/guests/python-tags"),
    ("JS_TAGS", Lang::JavaScript, "tests/guests/js-tags"),
    ("TS_TAGS", Lang::TypeScript, "tests/guests/ts-tags"),
    ("POLYGLOT_PARSE", Lang::TypeScript, "examples/polyglot/parse"),
    ("POLYGLOT_ENRICH", Lang::Python, "examples/polyglot/enrich"),
    ("POLYGLOT_ALERT", Lang::Go, "examples/polyglot/alert"),
    ("GO_WORDCOUNT_SPLIT", Lang::Go, "examples/wordcount/go/split"),
    ("GO_WORDCOUNT_COUNT", Lang::Go, "examples/wordcount/go/count"),
    ("GO_PURCHASE_TOTALS", Lang::Go, "examples/purchase-totals/go"),
    ("GO_FRAUD_DETECTOR", Lang::Go, "examples/fraud-detector/go"),
    ("GO_NEXMARK_Q1", Lang::Go, "examples/nexmark/go/q1"),
    ("GO_HOSTILE", Lang::Go, "tests/guests/go-hostile"),
    ("GO_TAGS", Lang::Go, "tests/guests/go-tags"),
];

fn main() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.join("../..").canonicalize()?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
    let target_dir = out_dir.ancestors().nth(4).context("unexpected OUT_DIR layout")?.join("wasm-guests");

    for watched in ["wit", "guest-sdk", "examples", "tests/guests", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let mut consts = String::new();
    for (name, path) in build_rust_guests(&root, &target_dir)? {
        writeln!(consts, "/// Path of the `{name}` guest component.\npub const {name}: &str = {:?};", path.display())?;
    }
    for (name, lang, dir) in SDK_GUESTS {
        let out = target_dir.join(format!("{}.wasm", name.to_lowercase()));
        let path = build_sdk_guest(*lang, &root.join(dir), &out)?;
        writeln!(
            consts,
            "/// Path of the {lang} `{name}` guest component.\npub const {name}: &str = {:?};",
            path.display()
        )?;
    }
    std::fs::write(out_dir.join("artifacts.rs"), consts)?;
    Ok(())
}

fn build_rust_guests(root: &Path, target_dir: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
        .arg(target_dir)
        // Guests ship without debug info: smaller components, faster compiles.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        // One codegen unit with LTO inlines serde and the SDK into the operator: the word
        // counter's sandboxed cost per record drops by ~15% (`cargo bench --bench sandbox`).
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        // Under `cargo clippy` the outer build runs clippy-driver; guests are linted on their own.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS");
    for (_, package, _) in RUST_GUESTS {
        cmd.args(["-p", package]);
    }
    let status = cmd.status().context("running cargo for the guest components")?;
    if !status.success() {
        bail!(
            "building the guest components failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)"
        );
    }
    let dir = target_dir.join("wasm32-wasip2/release");
    Ok(RUST_GUESTS.iter().map(|(name, _, stem)| (*name, dir.join(format!("{stem}.wasm")))).collect())
}

/// Guests of the SDK languages are built as `eddy build` builds them.
fn build_sdk_guest(lang: Lang, dir: &Path, out: &Path) -> Result<PathBuf> {
    let options = eddy_build::BuildOptions {
        lang: Some(lang),
        out: Some(out.to_path_buf()),
        ..eddy_build::BuildOptions::default()
    };
    eddy_build::build(dir, &options).with_context(|| format!("building the {lang} guest in {}", dir.display()))
}
