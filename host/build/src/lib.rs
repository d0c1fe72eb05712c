//! # eddy-build: operator projects in every language, built into components
//!
//! What `eddy build` and `eddy new` do, as a library (the guest artifacts of Eddy's own tests
//! are built through it too, so there is one way to build a Python operator). A project is a
//! directory; its language is told by the files in it ([`Lang::detect`]): `Cargo.toml` for
//! Rust, `app.py` for Python, `app.js` for JavaScript, `app.ts` for TypeScript. Building runs
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

mod js;
mod python;
mod rust;
mod scaffold;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

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

    fn supported(self) -> Result<(), BuildError> {
        match self {
            Lang::Go => Err(BuildError::NotYet(self.name())),
            _ => Ok(()),
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
    #[error("{0} operators cannot be built yet: this Eddy builds rust, python, js and ts")]
    NotYet(&'static str),
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
    lang.supported()?;
    match lang {
        Lang::Rust => rust::build(dir, options),
        Lang::Python => python::build(dir, options),
        Lang::JavaScript | Lang::TypeScript => js::build(dir, lang, options),
        Lang::Go => Err(BuildError::NotYet(lang.name())),
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn languages_without_a_toolchain_here_say_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = BuildOptions { lang: Some(Lang::Go), ..BuildOptions::default() };
        assert!(JsEngine::parse("v8").expect_err("unknown").to_string().contains("quickjs or spidermonkey"));
        let err = build(dir.path(), &options).expect_err("go").to_string();
        assert!(err.contains("go operators cannot be built yet"), "{err}");
    }
}
