//! Precompiled artifacts on disk, keyed by the component's sha256 and the engine's
//! compatibility hash. A second load maps the artifact instead of compiling (milliseconds
//! instead of seconds for large guests).
//!
//! Deserializing an artifact runs its native code outside the sandbox, so an entry is loaded
//! only if this host wrote it for this exact component and engine. The file is
//! `MAGIC | sha256(body) | tag | body`, where `tag` is an HMAC-SHA256, under the per-host
//! secret ([`host_key`]), of the `.wasm`'s digest, the engine tag and `sha256(body)`. The
//! checksum alone tells a damaged entry (rebuilt) from one that is whole but not vouched
//! for: written under another host's key, copied from another component, renamed, or edited
//! with its checksum recomputed (all recompiled, never loaded). The key lives outside the
//! cache directory, so whoever can write entries cannot also supply the key.
//!
//! Files are created with `create_new` under a random temporary name, then renamed into place,
//! so a crash mid-write never leaves a half entry under the final name and a file planted at
//! a temporary name (a symlink, say) is never written through.

mod host_key;

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use self::host_key::HostKey;
use crate::LoadError;

const MAGIC: &[u8; 8] = b"EDDYART2";
const CHECKSUM_LEN: usize = 32;
const TAG_LEN: usize = 32;
const HEADER_LEN: usize = MAGIC.len() + CHECKSUM_LEN + TAG_LEN;

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
    /// The entry failed authentication (written under another host key, for another
    /// component or engine, or edited): it was never loaded, and was recompiled and replaced.
    Untrusted {
        /// Which check failed.
        reason: String,
    },
}

/// Artifact cache in one directory, with the key that authenticates its entries.
#[derive(Debug)]
pub(crate) struct ArtifactCache {
    dir: PathBuf,
    key_path: Option<PathBuf>,
    /// Read (or created) on first use, so a runtime that never loads needs no key.
    key: OnceLock<HostKey>,
}

fn engine_tag(engine: &Engine) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

fn cache_err(path: &Path, reason: impl ToString) -> LoadError {
    LoadError::Cache { path: path.display().to_string(), reason: reason.to_string() }
}

/// Why an entry is not loaded.
#[derive(Debug)]
enum Rejection {
    Damaged(String),
    Untrusted(String),
}

impl From<Rejection> for CacheOutcome {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::Damaged(reason) => CacheOutcome::Rebuilt { reason },
            Rejection::Untrusted(reason) => CacheOutcome::Untrusted { reason },
        }
    }
}

impl ArtifactCache {
    pub(crate) fn new(dir: PathBuf, key_path: Option<PathBuf>) -> Self {
        Self { dir, key_path, key: OnceLock::new() }
    }

    fn path_for(&self, engine_tag: &str, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{engine_tag}.cwasm"))
    }

    /// The compiled component for `wasm`, from the cache when an authentic entry exists.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        wasm: &[u8],
        reuse: bool,
    ) -> Result<(Component, CacheOutcome), LoadError> {
        let key = self.key()?;
        let entry = Entry { key, digest, engine_tag: engine_tag(engine) };
        let path = self.path_for(&entry.engine_tag, digest);
        let read = if reuse { fs::read(&path) } else { Err(std::io::ErrorKind::NotFound.into()) };
        let outcome = match read {
            Ok(file) => match entry.authentic_body(&file) {
                Ok(body) => {
                    // SAFETY: this host's key vouches that the body is byte for byte what
                    // `precompile_component` produced here for this digest and engine
                    // configuration; wasmtime checks its own compatibility header too.
                    match unsafe { Component::deserialize(engine, body) } {
                        Ok(component) => return Ok((component, CacheOutcome::Hit)),
                        Err(e) => CacheOutcome::Rebuilt { reason: format!("artifact rejected by the engine: {e}") },
                    }
                }
                Err(rejection) => rejection.into(),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheOutcome::Compiled,
            Err(e) => CacheOutcome::Rebuilt { reason: format!("unreadable: {e}") },
        };
        match &outcome {
            CacheOutcome::Rebuilt { reason } => {
                tracing::warn!(path = %path.display(), %reason, "damaged artifact cache entry; rebuilding it");
            }
            CacheOutcome::Untrusted { reason } => tracing::warn!(
                path = %path.display(),
                %reason,
                "artifact cache entry failed authentication (another host's key, another component's \
                 entry, or edited); it was not loaded and is being recompiled and replaced"
            ),
            _ => {}
        }
        let body = engine.precompile_component(wasm).map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        self.store(&path, &entry.file(&body))?;
        // SAFETY: produced just now by this engine.
        let component =
            unsafe { Component::deserialize(engine, &body) }.map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        Ok((component, outcome))
    }

    /// The host key, read or created on first use; the cache directory exists (0700) after.
    fn key(&self) -> Result<&HostKey, LoadError> {
        if let Some(key) = self.key.get() {
            return Ok(key);
        }
        let path = self.key_path.as_deref().ok_or_else(|| {
            cache_err(
                &self.dir,
                "no place for the host key that authenticates cached artifacts: set EDDY_HOME or HOME, \
                 or RuntimeConfig::host_key_path",
            )
        })?;
        self.create_dir()?;
        self.warn_if_shared();
        self.refuse_key_inside(path)?;
        let key = HostKey::load_or_create(path).map_err(|reason| cache_err(path, reason))?;
        // Racing threads read the same file, so whichever sets it sets the same key.
        Ok(self.key.get_or_init(|| key))
    }

    fn create_dir(&self) -> Result<(), LoadError> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir).map_err(|e| cache_err(&self.dir, e))
    }

    /// Whoever can write entries must not be able to supply the key that vouches for them.
    fn refuse_key_inside(&self, key_path: &Path) -> Result<(), LoadError> {
        let dir = fs::canonicalize(&self.dir).map_err(|e| cache_err(&self.dir, e))?;
        if resolved(key_path).starts_with(&dir) {
            return Err(cache_err(
                key_path,
                format!(
                    "the host key may not live inside the artifact cache {} (anyone who can plant an \
                     artifact there could plant its key too); keep it elsewhere, e.g. the default \
                     $EDDY_HOME/host.key or $HOME/.eddy/host.key",
                    dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// Entries others plant are rejected anyway, but they cost a recompile each time.
    fn warn_if_shared(&self) {
        if let Ok(meta) = fs::metadata(&self.dir)
            && meta.permissions().mode() & 0o022 != 0
        {
            tracing::warn!(
                dir = %self.dir.display(),
                mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "the artifact cache is writable by other users; entries they plant are rejected, \
                 but `chmod 700` it to keep them out"
            );
        }
    }

    fn store(&self, path: &Path, file: &[u8]) -> Result<(), LoadError> {
        self.create_dir()?;
        let tmp = write_new_file(path, file).map_err(|e| cache_err(path, format!("writing a temporary file: {e}")))?;
        fs::rename(&tmp, path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            cache_err(path, e)
        })
    }
}

/// What an entry is bound to: the host key, the component's digest and the engine.
struct Entry<'a> {
    key: &'a HostKey,
    digest: &'a str,
    engine_tag: String,
}

impl Entry<'_> {
    fn tag(&self, checksum: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.key.mac();
        // Each field is fixed-length hex or a fixed-size hash, separated anyway so no two
        // inputs concatenate to the same bytes.
        for field in [MAGIC.as_slice(), self.digest.as_bytes(), self.engine_tag.as_bytes(), checksum] {
            mac.update(&(field.len() as u64).to_le_bytes());
            mac.update(field);
        }
        mac
    }

    /// The file to store for `body`.
    fn file(&self, body: &[u8]) -> Vec<u8> {
        let checksum = Sha256::digest(body);
        let mut file = Vec::with_capacity(HEADER_LEN + body.len());
        file.extend_from_slice(MAGIC);
        file.extend_from_slice(&checksum);
        file.extend_from_slice(&self.tag(&checksum).finalize().into_bytes());
        file.extend_from_slice(body);
        file
    }

    /// The body of `file` if this host wrote it for this digest and engine.
    fn authentic_body<'f>(&self, file: &'f [u8]) -> Result<&'f [u8], Rejection> {
        if file.len() < HEADER_LEN || &file[..MAGIC.len()] != MAGIC {
            return Err(Rejection::Damaged("not an Eddy artifact of this version (bad header or truncated)".into()));
        }
        let (checksum, rest) = file[MAGIC.len()..].split_at(CHECKSUM_LEN);
        let (tag, body) = rest.split_at(TAG_LEN);
        if Sha256::digest(body).as_slice() != checksum {
            return Err(Rejection::Damaged("checksum mismatch (corrupt or truncated)".into()));
        }
        // Constant-time comparison.
        self.tag(checksum).verify_slice(tag).map_err(|_| {
            Rejection::Untrusted(format!(
                "authentication failed: not written under this host's key for component sha256 {} and \
                 engine {}",
                self.digest, self.engine_tag
            ))
        })?;
        Ok(body)
    }
}

/// Writes `bytes` to a new file (mode 0600, `create_new`, synced) with a random name next to
/// `path`, and returns its name. Unique per writer: threads and processes may store the same
/// entry at once, and a shared temporary name would let one rename away the other's file.
fn write_new_file(path: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{}.tmp", u64::from_le_bytes(nonce)));
    let tmp = path.with_file_name(name);
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// `path` with symlinks resolved as far as it exists, the rest appended as written (a key
/// file, or its directory, may not exist yet).
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    for existing in absolute.ancestors() {
        if let Ok(real) = fs::canonicalize(existing) {
            let rest = absolute.strip_prefix(existing).unwrap_or(Path::new(""));
            return real.join(rest);
        }
    }
    absolute
}

/// Hex sha256 of a component: its identity in the cache and in pipelines.
pub fn digest_of(wasm: &[u8]) -> String {
    Sha256::digest(wasm).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const DIGEST_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const BODY: &[u8] = b"stands in for native code";

    fn key(byte: u8) -> HostKey {
        HostKey::from_bytes([byte; host_key::HOST_KEY_BYTES]).expect("key")
    }

    fn entry<'a>(key: &'a HostKey, digest: &'a str, engine_tag: &str) -> Entry<'a> {
        Entry { key, digest, engine_tag: engine_tag.to_owned() }
    }

    fn untrusted(result: Result<&[u8], Rejection>) -> bool {
        matches!(result, Err(Rejection::Untrusted(_)))
    }

    fn damaged(result: Result<&[u8], Rejection>) -> bool {
        matches!(result, Err(Rejection::Damaged(_)))
    }

    #[test]
    fn an_entry_authenticates_only_under_its_key_digest_and_engine() {
        let (mine, theirs) = (key(1), key(2));
        let file = entry(&mine, DIGEST_A, "e1").file(BODY);
        assert_eq!(entry(&mine, DIGEST_A, "e1").authentic_body(&file).expect("authentic"), BODY);
        assert!(untrusted(entry(&theirs, DIGEST_A, "e1").authentic_body(&file)), "another host's key");
        assert!(untrusted(entry(&mine, DIGEST_B, "e1").authentic_body(&file)), "another component");
        assert!(untrusted(entry(&mine, DIGEST_A, "e2").authentic_body(&file)), "another engine");
    }

    #[test]
    fn damage_is_told_apart_from_an_edit_that_fixed_the_checksum() {
        let mine = key(1);
        let check = entry(&mine, DIGEST_A, "e1");
        let file = check.file(BODY);
        let mut flipped = file.clone();
        *flipped.last_mut().expect("body") ^= 1;
        assert!(damaged(check.authentic_body(&flipped)), "a flipped bit");
        assert!(damaged(check.authentic_body(&file[..HEADER_LEN - 1])), "truncated");
        let mut old_format = file.clone();
        old_format[..MAGIC.len()].copy_from_slice(b"EDDYART1");
        assert!(damaged(check.authentic_body(&old_format)), "an entry of the unauthenticated format");

        // What someone without the key can do: change the body and recompute its checksum.
        let checksum_at = MAGIC.len();
        let checksum = Sha256::digest(&flipped[HEADER_LEN..]);
        flipped[checksum_at..checksum_at + CHECKSUM_LEN].copy_from_slice(&checksum);
        assert!(untrusted(check.authentic_body(&flipped)), "an edit with its checksum recomputed");
        let mut retagged = file.clone();
        retagged[HEADER_LEN - 1] ^= 1;
        assert!(untrusted(check.authentic_body(&retagged)), "a changed tag");
    }

    #[test]
    fn a_key_inside_the_cache_is_refused_before_it_is_created() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("artifacts");
        fs::create_dir(&dir).expect("mkdir");
        std::os::unix::fs::symlink(&dir, root.path().join("alias")).expect("symlink");
        for key_path in [dir.join("host.key"), dir.join("keys/host.key"), root.path().join("alias/host.key")] {
            let cache = ArtifactCache::new(dir.clone(), Some(key_path.clone()));
            let err = cache.key().expect_err("a key inside the cache must be refused").to_string();
            assert!(err.contains("inside the artifact cache"), "{err}");
            assert!(!key_path.exists(), "no key was created at {}", key_path.display());
        }
    }

    #[test]
    fn without_a_place_for_the_key_the_cache_is_not_used() {
        let root = tempfile::tempdir().expect("tempdir");
        let err = ArtifactCache::new(root.path().join("artifacts"), None).key().expect_err("no key").to_string();
        assert!(err.contains("EDDY_HOME"), "{err}");
    }

    #[test]
    fn temporary_files_are_new_private_and_unique() {
        let root = tempfile::tempdir().expect("tempdir");
        let path = root.path().join("entry.cwasm");
        let (a, b) = (write_new_file(&path, b"one").expect("write"), write_new_file(&path, b"two").expect("write"));
        assert_ne!(a, b, "two writers of one entry never share a temporary file");
        for (tmp, bytes) in [(&a, b"one"), (&b, b"two")] {
            assert_eq!(fs::read(tmp).expect("read"), bytes);
            assert_eq!(fs::metadata(tmp).expect("stat").permissions().mode() & 0o777, 0o600);
        }
    }
}
