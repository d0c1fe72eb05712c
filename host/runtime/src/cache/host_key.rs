//! The per-host secret that authenticates artifact cache entries: 32 random bytes in a file of
//! mode 0600, created on first use.
//!
//! Two processes may start on an empty host at once, and both must end up with the same key
//! (otherwise each rejects the other's entries and they recompile forever). So a new key is
//! written in full to a private temporary file and published with `hard_link`, which, unlike
//! `rename`, fails when the name exists: the loser reads the winner's complete file.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::write_new_file;

/// Length of the secret in bytes (the HMAC-SHA256 block is larger, so no key is wasted).
pub(super) const HOST_KEY_BYTES: usize = 32;

/// The secret, ready to authenticate with. Its bytes never appear in `Debug` output or logs.
pub(super) struct HostKey {
    /// Keyed once; each use clones it.
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostKey(..)")
    }
}

impl HostKey {
    /// The key at `path`, created first if there is none. The error says what is wrong with
    /// the file and what to do.
    pub(super) fn load_or_create(path: &Path) -> Result<Self, String> {
        match read(path)? {
            Some(key) => Ok(key),
            None => create(path),
        }
    }

    pub(super) fn from_bytes(bytes: [u8; HOST_KEY_BYTES]) -> Result<Self, String> {
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(&bytes).map_err(|e| format!("unusable as an HMAC key: {e}"))?;
        Ok(Self { mac })
    }

    /// A fresh HMAC-SHA256 under this key.
    pub(super) fn mac(&self) -> Hmac<Sha256> {
        self.mac.clone()
    }
}

/// `None` when no file exists at `path`.
fn read(path: &Path) -> Result<Option<HostKey>, String> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open the host key: {e}")),
    };
    let replace = "delete it and a new key is created (every cached artifact is then recompiled once)";
    // Checked on the open file, so the file checked is the file read.
    let meta = file.metadata().map_err(|e| format!("cannot stat the host key: {e}"))?;
    if !meta.is_file() {
        return Err(format!("the host key is not a regular file; {replace}"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "the host key has mode {mode:o}, so other users can read or change it and plant artifacts it \
             vouches for; refusing to use it: `chmod 600` it if nobody else could have read it, otherwise {replace}"
        ));
    }
    let mut bytes = Vec::with_capacity(HOST_KEY_BYTES + 1);
    // One byte more than a key, to tell a longer file from a key without reading all of it.
    file.take(HOST_KEY_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the host key: {e}"))?;
    let key = <[u8; HOST_KEY_BYTES]>::try_from(bytes.as_slice())
        .map_err(|_| format!("the host key must be exactly {HOST_KEY_BYTES} bytes, found {}; {replace}", meta.len()))?;
    HostKey::from_bytes(key).map(Some)
}

fn create(path: &Path) -> Result<HostKey, String> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create the directory of the host key: {e}"))?;
    let mut key = [0u8; HOST_KEY_BYTES];
    getrandom::fill(&mut key).map_err(|e| format!("no randomness for a new host key: {e}"))?;
    let tmp = write_new_file(path, &key).map_err(|e| format!("cannot write a new host key: {e}"))?;
    let published = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match published {
        Ok(()) => {
            tracing::info!(path = %path.display(), "created the host key that authenticates cached artifacts");
            HostKey::from_bytes(key)
        }
        // Another process created it meanwhile: use theirs, complete since it was linked whole.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read(path)?.ok_or_else(|| "the host key was created and removed again by another process".into())
        }
        Err(e) => Err(format!("cannot publish a new host key: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_path(dir: &tempfile::TempDir) -> std::path::PathBuf {
        dir.path().join("home").join("host.key")
    }

    /// Identifies a key without exposing it: its tag of a fixed message.
    fn fingerprint(key: &HostKey) -> Vec<u8> {
        key.mac().chain_update(b"probe").finalize().into_bytes().to_vec()
    }

    /// The fingerprint of the key stored at `path`, computed from the file's bytes.
    fn fingerprint_on_disk(path: &Path) -> Vec<u8> {
        let bytes: [u8; HOST_KEY_BYTES] = fs::read(path).expect("read").try_into().expect("32 bytes");
        assert_ne!(bytes, [0u8; HOST_KEY_BYTES], "random, not zeroed");
        fingerprint(&HostKey::from_bytes(bytes).expect("key"))
    }

    #[test]
    fn a_new_key_is_32_private_bytes_and_is_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = key_path(&dir);
        let first = HostKey::load_or_create(&path).expect("create");
        assert_eq!(fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o600);
        assert_eq!(fingerprint_on_disk(&path), fingerprint(&first));
        let again = HostKey::load_or_create(&path).expect("read back");
        assert_eq!(fingerprint(&again), fingerprint(&first));
    }

    #[test]
    fn processes_starting_at_once_agree_on_one_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = key_path(&dir);
        let barrier = std::sync::Barrier::new(8);
        let keys: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        fingerprint(&HostKey::load_or_create(&path).expect("racing create"))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let on_disk = fingerprint_on_disk(&path);
        assert!(keys.iter().all(|k| *k == on_disk), "every racer uses the published key");
        let left: Vec<_> = fs::read_dir(path.parent().expect("dir")).expect("list").collect();
        assert_eq!(left.len(), 1, "no temporary files left behind: {left:?}");
    }

    #[test]
    fn a_key_other_users_can_read_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = key_path(&dir);
        HostKey::load_or_create(&path).expect("create");
        for mode in [0o640, 0o604, 0o620] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod");
            let err = HostKey::load_or_create(&path).expect_err("a shared key must be refused");
            assert!(err.contains(&format!("mode {mode:o}")) && err.contains("chmod 600"), "{err}");
        }
    }

    #[test]
    fn a_key_of_the_wrong_length_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = key_path(&dir);
        fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        for len in [0, 31, 33, 4096] {
            fs::write(&path, vec![7u8; len]).expect("write");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
            let err = HostKey::load_or_create(&path).expect_err("a key of the wrong length must be refused");
            assert!(err.contains(&format!("exactly 32 bytes, found {len}")), "{err}");
        }
    }

    #[test]
    fn a_directory_in_place_of_the_key_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = key_path(&dir);
        fs::create_dir_all(&path).expect("mkdir");
        let err = HostKey::load_or_create(&path).expect_err("a directory is no key");
        assert!(err.contains("not a regular file"), "{err}");
    }
}
