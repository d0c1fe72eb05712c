//! Precompiled artifacts on disk, keyed by the component's sha256 and the engine's
//! compatibility hash. A second load maps the artifact instead of compiling (milliseconds
//! instead of seconds for large guests).
//!
//! Deserializing an artifact runs native code from it, so an entry is trusted only if its
//! own checksum matches: file = `MAGIC | sha256(body) | body`. A damaged or truncated entry
//! is reported, deleted and rebuilt. Writes go to a temporary file and are renamed into place,
//! so a crash mid-write never leaves a half entry under the final name.

use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::LoadError;

const MAGIC: &[u8; 8] = b"EDDYART1";
const HEADER_LEN: usize = MAGIC.len() + 32;

/// How a load obtained its compiled component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    /// No cache configured: compiled in memory.
    Uncached,
    /// Compiled now and stored.
    Compiled,
    /// Loaded from a valid cache entry.
    Hit,
    /// The entry was damaged; it was deleted, recompiled and stored again.
    Rebuilt {
        /// What was wrong with it.
        reason: String,
    },
}

/// Artifact cache in one directory.
#[derive(Debug, Clone)]
pub(crate) struct ArtifactCache {
    dir: PathBuf,
}

fn engine_tag(engine: &Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

fn cache_err(path: &Path, reason: impl ToString) -> LoadError {
    LoadError::Cache { path: path.display().to_string(), reason: reason.to_string() }
}

impl ArtifactCache {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub(crate) fn path_for(&self, engine: &Engine, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", engine_tag(engine)))
    }

    /// The compiled component for `wasm`, from the cache when a valid entry exists.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        wasm: &[u8],
    ) -> Result<(Component, CacheOutcome), LoadError> {
        let path = self.path_for(engine, digest);
        let outcome = match fs::read(&path) {
            Ok(file) => match verified_body(&file) {
                Ok(body) => {
                    // SAFETY: the body is byte for byte what `precompile_component` produced for
                    // this engine configuration (checked by sha256 above), and wasmtime checks
                    // the engine compatibility header itself.
                    match unsafe { Component::deserialize(engine, body) } {
                        Ok(component) => return Ok((component, CacheOutcome::Hit)),
                        Err(e) => CacheOutcome::Rebuilt { reason: format!("artifact rejected by the engine: {e}") },
                    }
                }
                Err(reason) => CacheOutcome::Rebuilt { reason },
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheOutcome::Compiled,
            Err(e) => CacheOutcome::Rebuilt { reason: format!("unreadable: {e}") },
        };
        if let CacheOutcome::Rebuilt { reason } = &outcome {
            tracing::warn!(path = %path.display(), %reason, "damaged artifact cache entry; rebuilding it");
            let _ = fs::remove_file(&path);
        }
        let body = engine.precompile_component(wasm).map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        self.store(&path, &body)?;
        // SAFETY: produced just now by this engine.
        let component =
            unsafe { Component::deserialize(engine, &body) }.map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        Ok((component, outcome))
    }

    fn store(&self, path: &Path, body: &[u8]) -> Result<(), LoadError> {
        fs::create_dir_all(&self.dir).map_err(|e| cache_err(&self.dir, e))?;
        let mut file = Vec::with_capacity(HEADER_LEN + body.len());
        file.extend_from_slice(MAGIC);
        file.extend_from_slice(&Sha256::digest(body));
        file.extend_from_slice(body);
        // Unique per writer: threads of one process may store the same entry at once, and a
        // shared temporary name would let one rename away the file the other is about to rename.
        static NEXT_TMP: AtomicU64 = AtomicU64::new(0);
        let n = NEXT_TMP.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
        fs::write(&tmp, &file).map_err(|e| cache_err(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| cache_err(path, e))
    }
}

fn verified_body(file: &[u8]) -> Result<&[u8], String> {
    if file.len() < HEADER_LEN || &file[..MAGIC.len()] != MAGIC {
        return Err("not an Eddy artifact (bad header or truncated)".into());
    }
    let (sum, body) = file[MAGIC.len()..].split_at(32);
    if Sha256::digest(body).as_slice() != sum {
        return Err("checksum mismatch (corrupt or truncated)".into());
    }
    Ok(body)
}

/// Hex sha256 of a component: its identity in the cache and in pipelines.
pub fn digest_of(wasm: &[u8]) -> String {
    Sha256::digest(wasm).iter().map(|b| format!("{b:02x}")).collect()
}
