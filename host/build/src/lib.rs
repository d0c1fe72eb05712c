//! # eddy-build: operator projects in every language, built into components
//!
//! What `eddy build` and `eddy new` do, as a library (the guest artifacts of Eddy's own tests
//! are built through it too, so there is one way to build a Python operator). A project is a
//! directory; its language is told by the files in it ([`Lang::detect`]): `Cargo.toml` for
//! Rust, `app.py` for Python, `app.js` for JavaScript, `app.ts` for TypeScript, `go.mod` for Go. Building runs
//! the language's toolchain offline and leaves one component:
//!
//! - Rust: `cargo build --release --target wasm32-wasip2`, the crate's `cdylib`.
//! - Python: `componentize-py` over the project and the Eddy Python SDK, which is embedded in
//!   this crate (with the WIT) and written beside the output, so a project needs nothing but
//!   its `app.py`. An `app.py` that calls `eddy.export_aggregate` targets the
//!   `window-aggregate` world, any other the `keyed-operator` world.
//! - JavaScript and TypeScript: tsc checks a TypeScript project against the SDK's types,
//!   esbuild bundles the project with the Eddy JavaScript SDK (embedded here too), and jco
//!   makes a QuickJS component of the bundle ([`JsEngine`]; componentize-js's SpiderMonkey on
//!   request). The toolchain lives in [`js_toolchain`], put there by `deploy/setup.sh languages`.
//! - Go: the project's `package main` files with the Eddy Go SDK (embedded too), compiled by
//!   Go's own `wasip1` port over bindings generated here, then made a component with WASI
//!   preview1's reactor adapter. `go` comes from `deploy/setup.sh languages` (or `$EDDY_GO`).
//!
//! ```
//! # fn main() -> Result<(), eddy_build::BuildError> {
//! let dir = tempfile::tempdir().expect("tempdir");
//! let project = dir.path().join("counter");
//! let files = eddy_build::scaffold(eddy_build::Lang::Python, &project)?;
//! assert!(files.iter().any(|f| f.ends_with("app.py")));
//! assert_eq!(eddy_build::Lang::detect(&project)?, eddy_build::Lang::Python);
//! # Ok(()) }
//! ```

mod go;
mod js;
mod python;
mod rust;
mod scaffold;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use go::unit_tests as go_unit_tests;
pub use js::toolchain as js_toolchain;
pub use scaffold::scaffold;

/// A language an operator can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Rust,
    Python,
    JavaScript,
    TypeScript,
    Go,
}

impl Lang {
    /// Every language `--lang` names, in the order the CLI lists them.
    pub const ALL: [Lang; 5] = [Lang::Rust, Lang::Python, Lang::JavaScript, Lang::TypeScript, Lang::Go];

    /// The name `--lang` takes.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::JavaScript => "js",
            Lang::TypeScript => "ts",
            Lang::Go => "go",
        }
    }

    /// The language `--lang NAME` means.
    pub fn parse(name: &str) -> Result<Lang, BuildError> {
        Lang::ALL.into_iter().find(|l| l.name() == name).ok_or_else(|| BuildError::UnknownLang(name.to_owned()))
    }

    /// The language of the project in `dir`, told by the files in it.
    pub fn detect(dir: &Path) -> Result<Lang, BuildError> {
        if !dir.is_dir() {
            return Err(BuildError::NoProject(dir.to_path_buf()));
        }
        let has = |file: &str| dir.join(file).is_file();
        let found: Vec<Lang> = [
            (has("Cargo.toml"), Lang::Rust),
            (has("app.py"), Lang::Python),
            (has("go.mod"), Lang::Go),
            (has("app.ts"), Lang::TypeScript),
            (has("app.js"), Lang::JavaScript),
        ]
        .into_iter()
        .filter_map(|(present, lang)| present.then_some(lang))
        .collect();
        match found.as_slice() {
            [one] => Ok(*one),
            [] => Err(BuildError::Undetected(dir.to_path_buf())),
            many => Err(BuildError::Ambiguous(dir.to_path_buf(), many.iter().map(|l| l.name()).collect())),
        }
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The JavaScript engine a JavaScript or TypeScript component carries.
///
/// QuickJS (jco's `qjs` backend) is the default: its components are 2 MB rather than 12 MB
/// and compile in about a second rather than 4–20 s, per record the two cost about the same,
/// and it takes the regular expressions (`\p{…}`) and schema ids SpiderMonkey does not
/// (figures in `docs/architecture.md`). SpiderMonkey (componentize-js) has the fuller
/// standard library (`TextEncoder`, `Intl`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JsEngine {
    #[default]
    QuickJs,
    SpiderMonkey,
}

impl JsEngine {
    /// The name `--js-engine` takes.
    pub fn name(self) -> &'static str {
        match self {
            JsEngine::QuickJs => "quickjs",
            JsEngine::SpiderMonkey => "spidermonkey",
        }
    }

    /// The engine `--js-engine NAME` means.
    pub fn parse(name: &str) -> Result<JsEngine, BuildError> {
        [JsEngine::QuickJs, JsEngine::SpiderMonkey]
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| BuildError::UnknownEngine(name.to_owned()))
    }
}

/// How to build one project.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The language; detected from the project's files when `None`.
    pub lang: Option<Lang>,
    /// Where the component goes; by default `DIR/build/<name>.wasm` (Python) or cargo's
    /// `target/wasm32-wasip2/release/<crate>.wasm` (Rust).
    pub out: Option<PathBuf>,
    /// Rust only: cargo's target directory (default: the project's `target/`).
    pub target_dir: Option<PathBuf>,
    /// JavaScript and TypeScript only: the engine the component carries.
    pub js_engine: JsEngine,
}

/// What went wrong, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{} is not a directory: give the operator project's directory (`eddy new --lang python DIR` makes one)", .0.display())]
    NoProject(PathBuf),
    #[error(
        "cannot tell the language of {}: expected Cargo.toml (Rust), app.py (Python), app.js, app.ts or go.mod; pass --lang",
        .0.display()
    )]
    Undetected(PathBuf),
    #[error("{} holds files of several languages ({}): pass --lang", .0.display(), .1.join(", "))]
    Ambiguous(PathBuf, Vec<&'static str>),
    #[error("no language `{0}`: choose rust, python, js, ts or go")]
    UnknownLang(String),
    #[error("no JavaScript engine `{0}`: choose quickjs or spidermonkey")]
    UnknownEngine(String),
    #[error("{tool} is not installed ({why}): {install}")]
    MissingTool { tool: &'static str, why: String, install: &'static str },
    #[error("{tool} failed to build {} (its output is above)", dir.display())]
    ToolFailed { tool: &'static str, dir: PathBuf },
    #[error("{}: {what}", path.display())]
    Project { path: PathBuf, what: String },
    #[error("{} already exists and is not empty: `eddy new` writes only into a new or empty directory", path.display())]
    NotEmpty { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io { path: path.to_path_buf(), source }
}

/// Runs `cmd` with its output going to ours; a tool that is missing or fails says which.
pub(crate) fn run_tool(
    mut cmd: Command,
    tool: &'static str,
    install: &'static str,
    dir: &Path,
) -> Result<(), BuildError> {
    let status = cmd.status().map_err(|e| BuildError::MissingTool { tool, why: e.to_string(), install })?;
    if !status.success() {
        return Err(BuildError::ToolFailed { tool, dir: dir.to_path_buf() });
    }
    Ok(())
}

/// The world `app` targets, told by which export call it makes (`operator_call` or
/// `aggregate_call`, e.g. `export_operator(`); `hint` says how to end it when it makes neither.
pub(crate) fn world_of(
    app: &Path,
    operator_call: &str,
    aggregate_call: &str,
    hint: &str,
) -> Result<&'static str, BuildError> {
    let text = std::fs::read_to_string(app).map_err(io(app))?;
    world_in(app, &text, operator_call, aggregate_call, hint)
}

/// [`world_of`] over a project's source text; `app` names it in errors.
pub(crate) fn world_in(
    app: &Path,
    text: &str,
    operator_call: &str,
    aggregate_call: &str,
    hint: &str,
) -> Result<&'static str, BuildError> {
    match (text.contains(operator_call), text.contains(aggregate_call)) {
        (true, false) => Ok("keyed-operator"),
        (false, true) => Ok("window-aggregate"),
        (true, true) => Err(BuildError::Project {
            path: app.to_path_buf(),
            what: "exports both an operator and an aggregate: a component is one of them".into(),
        }),
        (false, false) => {
            Err(BuildError::Project { path: app.to_path_buf(), what: format!("exports nothing: {hint}") })
        }
    }
}

/// The WIT contract every component is built against.
pub(crate) const WIT: &str = include_str!("../../../wit/dataflow.wit");

/// Writes the WIT and an SDK package (`files`: name and text) under `dir`, as `wit/` and
/// `sdk/eddy/`, replacing what was there; returns the `wit` and `sdk` directories.
pub(crate) fn stage_sdk(dir: &Path, files: &[(&str, &str)]) -> Result<(PathBuf, PathBuf), BuildError> {
    let wit = dir.join("wit");
    let sdk = dir.join("sdk");
    let package = sdk.join("eddy");
    for d in [&wit, &package] {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let wit_file = wit.join("dataflow.wit");
    std::fs::write(&wit_file, WIT).map_err(io(&wit_file))?;
    for (name, text) in files {
        let path = package.join(name);
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    Ok((wit, sdk))
}

/// Builds the project in `dir` and returns the component's path.
pub fn build(dir: &Path, options: &BuildOptions) -> Result<PathBuf, BuildError> {
    let lang = match options.lang {
        Some(lang) => lang,
        None => Lang::detect(dir)?,
    };
    match lang {
        Lang::Rust => rust::build(dir, options),
        Lang::Python => python::build(dir, options),
        Lang::JavaScript | Lang::TypeScript => js::build(dir, lang, options),
        Lang::Go => go::build(dir, options),
    }
}

/// The project's name: its directory's, as a file stem.
pub(crate) fn project_name(dir: &Path) -> String {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let name: String = canonical
        .file_name()
        .map(|n| n.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect())
        .unwrap_or_default();
    if name.is_empty() { "operator".into() } else { name }
}

/// The names of the files under `dir` (relative, `/`-separated) that `keep` accepts: what an
/// embedded SDK list must hold, for the tests that check none was forgotten.
#[cfg(test)]
pub(crate) fn sdk_files(dir: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, keep: &dyn Fn(&str) -> bool, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).expect("SDK dir").map(|e| e.expect("entry").path()).collect();
        entries.sort();
        for path in entries {
            let name = path.strip_prefix(root).expect("under root").to_string_lossy().replace('\\', "/");
            if path.is_dir() {
                walk(root, &path, keep, out);
            } else if keep(&name) {
                out.push(name);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir);
    let mut out = Vec::new();
    walk(&root, &root, &keep, &mut out);
    out.sort();
    out
}

/// The names an embedded SDK list holds, sorted.
#[cfg(test)]
pub(crate) fn embedded(sdk: &[(&str, &str)]) -> Vec<String> {
    let mut names: Vec<String> = sdk.iter().map(|(name, _)| (*name).to_string()).collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module added to an SDK and not to its list would be missing from every build.
    #[test]
    fn every_sdk_file_is_embedded() {
        assert_eq!(embedded(python::SDK), sdk_files("guest-sdk/python/eddy", |f| f.ends_with(".py")));
        assert_eq!(embedded(js::SDK), sdk_files("guest-sdk/js/eddy", |f| f.ends_with(".js") || f.ends_with(".d.ts")));
        let go = |f: &str| f == "go.mod" || (f.ends_with(".go") && !f.ends_with("_test.go") && !f.starts_with("glue/"));
        assert_eq!(embedded(go::SDK), sdk_files("guest-sdk/go", go));
    }

    #[test]
    fn the_language_is_told_by_the_project_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        assert!(matches!(Lang::detect(p), Err(BuildError::Undetected(_))));
        std::fs::write(p.join("app.py"), "").expect("write");
        assert_eq!(Lang::detect(p).expect("python"), Lang::Python);
        std::fs::write(p.join("Cargo.toml"), "").expect("write");
        let err = Lang::detect(p).expect_err("two languages").to_string();
        assert!(err.contains("rust, python") && err.contains("--lang"), "{err}");
        assert!(matches!(Lang::detect(&p.join("nope")), Err(BuildError::NoProject(_))));
        assert_eq!(Lang::parse("ts").expect("ts"), Lang::TypeScript);
        assert!(Lang::parse("cobol").expect_err("unknown").to_string().contains("rust, python, js, ts or go"));
    }

    #[test]
    fn a_go_project_needs_its_module_and_an_export() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        let options = BuildOptions { lang: Some(Lang::Go), ..BuildOptions::default() };
        assert!(JsEngine::parse("v8").expect_err("unknown").to_string().contains("quickjs or spidermonkey"));
        let err = build(p, &options).expect_err("no go.mod").to_string();
        assert!(err.contains("needs go.mod"), "{err}");
        std::fs::write(p.join("go.mod"), "module x\n").expect("write");
        std::fs::write(p.join("app.go"), "package main\nfunc main() {}\n").expect("write");
        let err = build(p, &options).expect_err("no export").to_string();
        assert!(err.contains("exports nothing") && err.contains("eddy.ExportOperator"), "{err}");
    }
}
