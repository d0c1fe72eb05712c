//! Rust projects: a `cdylib` crate built by cargo for `wasm32-wasip2`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BuildError, BuildOptions, io, run_tool};

const INSTALL: &str = "install Rust (rustup) and run `rustup target add wasm32-wasip2`";

/// The crate's `cdylib` target name, from `cargo metadata`.
fn cdylib_name(manifest: &Path) -> Result<String, BuildError> {
    let out = Command::new("cargo")
        .args(["metadata", "--no-deps", "--format-version", "1", "--manifest-path"])
        .arg(manifest)
        .output()
        .map_err(|e| BuildError::MissingTool { tool: "cargo", why: e.to_string(), install: INSTALL })?;
    if !out.status.success() {
        return Err(BuildError::Project {
            path: manifest.to_path_buf(),
            what: format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    let bad = |what: &str| BuildError::Project { path: manifest.to_path_buf(), what: what.to_owned() };
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|_| bad("cargo metadata printed no JSON"))?;
    let wanted = manifest.canonicalize().map_err(io(manifest))?;
    let package = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| {
            p["manifest_path"].as_str().map(Path::new).and_then(|m| m.canonicalize().ok()) == Some(wanted.clone())
        })
        .ok_or_else(|| bad("cargo metadata does not list this crate"))?;
    package["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["crate_types"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib")))
        .and_then(|t| t["name"].as_str())
        .map(|name| name.replace('-', "_"))
        .ok_or_else(|| bad("has no cdylib target: add `[lib] crate-type = [\"cdylib\"]`"))
}

pub(crate) fn build(dir: &Path, options: &BuildOptions) -> Result<PathBuf, BuildError> {
    let manifest = dir.join("Cargo.toml");
    let name = cdylib_name(&manifest)?;
    let target_dir = options.target_dir.clone().unwrap_or_else(|| dir.join("target"));
    let mut cmd = Command::new("cargo");
    cmd.args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    run_tool(cmd, "cargo", INSTALL, dir)?;
    let built = target_dir.join("wasm32-wasip2/release").join(format!("{name}.wasm"));
    match &options.out {
        None => Ok(built),
        Some(out) => {
            if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            std::fs::copy(&built, out).map_err(io(out))?;
            Ok(out.clone())
        }
    }
}
