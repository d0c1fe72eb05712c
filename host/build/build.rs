//! Embeds the Go package the generated Go bindings import (`go.bytecodealliance.org/pkg`),
//! from the `wit-bindgen-go` crate's sources, where it ships beside the generator that needs
//! it: there is no Go module proxy to fetch it from, so `eddy build` writes it out and points
//! a `replace` at it. The crate's directory is found in cargo's registry at the locked version
//! (a build of part of the workspace has not downloaded every package, which `cargo metadata`
//! would need offline), else through `cargo metadata`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, String>;

fn env(name: &str) -> Result<String> {
    std::env::var(name).map_err(|e| format!("{name}: {e} (cargo sets it for build scripts)"))
}

fn main() -> Result<()> {
    println!("cargo:rerun-if-changed=build.rs");
    let pkg = go_pkg_dir()?.join("src").join("pkg");
    let mut files = Vec::new();
    collect(&pkg, &pkg, &mut files)?;
    files.sort();
    if !files.iter().any(|f| f == "go.mod") {
        return Err(format!(
            "no go.mod under {}: the wit-bindgen-go crate no longer ships its Go package",
            pkg.display()
        ));
    }
    let mut out = String::from(
        "/// The Go package `go.bytecodealliance.org/pkg`, file by file.\npub(crate) const GO_PKG: &[(&str, &[u8])] = &[\n",
    );
    for f in &files {
        let _ = writeln!(out, "    ({f:?}, include_bytes!({:?})),", pkg.join(f).display().to_string());
    }
    out.push_str("];\n");
    let dest = PathBuf::from(env("OUT_DIR")?).join("go_pkg.rs");
    std::fs::write(&dest, out).map_err(|e| format!("{}: {e}", dest.display()))
}

/// The `wit-bindgen-go` crate's directory: in cargo's registry, at the version the lock file
/// resolved, else wherever `cargo metadata` says (a vendored or patched source).
fn go_pkg_dir() -> Result<PathBuf> {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR")?);
    if let Some(dir) = locked_version(&manifest_dir).and_then(|v| in_registry(&format!("wit-bindgen-go-{v}"))) {
        return Ok(dir);
    }
    from_metadata(&manifest_dir.join("Cargo.toml"))
}

/// The version of `wit-bindgen-go` in the workspace's `Cargo.lock`.
fn locked_version(manifest_dir: &Path) -> Option<String> {
    let lock = manifest_dir.ancestors().map(|d| d.join("Cargo.lock")).find(|p| p.is_file())?;
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(lock).ok()?;
    let after = text.split("name = \"wit-bindgen-go\"\n").nth(1)?;
    let version = after.lines().next()?.strip_prefix("version = \"")?.strip_suffix('"')?;
    Some(version.to_owned())
}

/// `crate_dir` (`name-version`) under cargo's registry sources, if it was downloaded there.
fn in_registry(crate_dir: &str) -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    std::fs::read_dir(home.join("registry").join("src"))
        .ok()?
        .filter_map(std::result::Result::ok)
        .map(|index| index.path().join(crate_dir))
        .find(|dir| dir.join("src").join("pkg").join("go.mod").is_file())
}

/// The `wit-bindgen-go` crate's directory as `cargo metadata` resolves it. Offline: only
/// what this platform's build downloaded can be resolved, which a partial build may not have.
fn from_metadata(manifest: &Path) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--manifest-path"])
        .arg(manifest)
        .arg("--filter-platform")
        .arg(env("TARGET")?)
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "wit-bindgen-go is not in cargo's registry and cargo metadata failed (run `cargo fetch`): {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("cargo metadata's answer is not JSON: {e}"))?;
    let manifest_path = metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "wit-bindgen-go"))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata lists no wit-bindgen-go")?;
    Path::new(manifest_path).parent().map(Path::to_path_buf).ok_or_else(|| format!("{manifest_path} has no directory"))
}

/// The Go sources and module files under `dir`, relative to `root` (docs and CI files left out).
fn collect(root: &Path, dir: &Path, files: &mut Vec<String>) -> Result<()> {
    let unreadable = |e: std::io::Error| format!("{}: {e}", dir.display());
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        if path.is_dir() {
            collect(root, &path, files)?;
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("go" | "s" | "mod"))
            || path.ends_with("LICENSE")
        {
            let relative = path.strip_prefix(root).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}
