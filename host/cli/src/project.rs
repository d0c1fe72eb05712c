//! `eddy new`, `eddy build` and `eddy test`: operator projects in any language.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use eddy_build::{BuildOptions, JsEngine, Lang};

/// What `--lang` and `--js-engine` asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flags<'a> {
    pub lang: Option<&'a str>,
    pub js_engine: Option<&'a str>,
}

impl Flags<'_> {
    fn options(self, out: Option<PathBuf>) -> Result<BuildOptions> {
        Ok(BuildOptions {
            lang: self.lang.map(Lang::parse).transpose()?,
            out,
            target_dir: None,
            js_engine: self.js_engine.map(JsEngine::parse).transpose()?.unwrap_or_default(),
        })
    }
}

/// Scaffolds `dir` and says what to do next.
pub fn new(lang_name: &str, dir: &Path) -> Result<()> {
    let lang = Lang::parse(lang_name)?;
    let files = eddy_build::scaffold(lang, dir)?;
    println!("created a {lang} operator in {}:", dir.display());
    for f in &files {
        println!("  {}", f.strip_prefix(dir).unwrap_or(f).display());
    }
    println!("next: `eddy build {0}`, then `eddy test {0}`", dir.display());
    Ok(())
}

/// Builds the project in `dir`; the component's path is the last line printed.
pub fn build(dir: &Path, flags: Flags<'_>, out: Option<PathBuf>) -> Result<PathBuf> {
    let options = flags.options(out)?;
    let shown = options.lang.map_or_else(|| Lang::detect(dir).map(|l| l.to_string()), |l| Ok(l.to_string()))?;
    eprintln!("building the {shown} operator in {} ...", dir.display());
    let started = std::time::Instant::now();
    let wasm = eddy_build::build(dir, &options)?;
    let size = std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0);
    eprintln!("built in {:.1?}: {:.2} MB", started.elapsed(), size as f64 / 1e6);
    println!("{}", wasm.display());
    Ok(wasm)
}

/// Sorted lines, to compare outputs as multisets (parallel subtasks interleave).
fn sorted_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines.sort_unstable();
    lines
}

/// Builds `dir`, runs its `pipeline.yaml` and compares what it prints with `expected.txt`.
pub fn test(dir: &Path, flags: Flags<'_>) -> Result<()> {
    build(dir, flags, None)?;
    let pipeline = dir.join("pipeline.yaml");
    let expected_path = dir.join("expected.txt");
    let expected = std::fs::read_to_string(&expected_path)
        .with_context(|| format!("{}: `eddy test` compares the pipeline's output with it", expected_path.display()))?;
    let exe = std::env::current_exe().context("finding the eddy binary")?;
    eprintln!("running {} ...", pipeline.display());
    let run = std::process::Command::new(exe)
        .arg("run")
        .arg(&pipeline)
        .arg("--cache-dir")
        .arg(dir.join(".eddy/artifacts"))
        .output()
        .context("running the pipeline")?;
    let got = String::from_utf8_lossy(&run.stdout);
    if !run.status.success() {
        bail!("{} failed:\n{}", pipeline.display(), String::from_utf8_lossy(&run.stderr));
    }
    let (got, want) = (sorted_lines(&got), sorted_lines(&expected));
    if got != want {
        let missing: Vec<&&str> = want.iter().filter(|l| !got.contains(l)).collect();
        let extra: Vec<&&str> = got.iter().filter(|l| !want.contains(l)).collect();
        bail!(
            "the output differs from {} ({} lines, {} expected)\n  missing: {missing:?}\n  unexpected: {extra:?}",
            expected_path.display(),
            got.len(),
            want.len()
        );
    }
    println!("test passed: {} lines as expected.txt says", got.len());
    let lang = flags.options(None)?.lang.map_or_else(|| Lang::detect(dir), Ok)?;
    if lang == Lang::Go {
        eprintln!("running go test ...");
        if eddy_build::go_unit_tests(dir)? {
            println!("go test passed");
        }
    }
    Ok(())
}
