//! Where checkpoints are written: any `object_store` (a local directory by default), behind a
//! small blocking facade. Checkpoint threads are plain threads, so the store owns a
//! single-threaded runtime to drive the async API.

use std::sync::Arc;

use eddy_plan::{CheckpointSpec, S3Spec, StoreLocation};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};

use crate::CheckpointError;

/// A checkpoint directory in an object store. Paths are relative to its root, `/`-separated.
pub struct CheckpointStore {
    inner: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    describe: String,
    /// The directory, for a local store (object stores have no directories to tidy).
    local_root: Option<std::path::PathBuf>,
    /// Consulted before every read and write: a seam for tests that make the store slow or failing.
    faults: Option<StoreFaults>,
}

/// A read or a write, for [`StoreFaults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// Reading a file.
    Get,
    /// Writing a file.
    Put,
}

/// Decides, before an operation on the given path, whether it fails (and may sleep first): the
/// fault-injection seam of [`CheckpointStore::with_faults`].
pub type StoreFaults = Arc<dyn Fn(StoreOp, &str) -> Result<(), String> + Send + Sync>;

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore").field("at", &self.describe).finish_non_exhaustive()
    }
}

fn io(what: String) -> impl FnOnce(object_store::Error) -> CheckpointError {
    move |e| CheckpointError::Storage { what, problem: e.to_string() }
}

impl CheckpointStore {
    /// The store a spec's `checkpoints:` section names: its `dir` or its `s3` bucket.
    pub fn open(spec: &CheckpointSpec) -> Result<Self, CheckpointError> {
        match (&spec.dir, &spec.s3) {
            (Some(dir), None) => Self::local(dir),
            (None, Some(s3)) => Self::s3(s3),
            _ => Err(CheckpointError::Incompatible("`checkpoints` needs exactly one of `dir` and `s3`".into())),
        }
    }

    /// The store at `location`.
    pub fn at(location: &StoreLocation) -> Result<Self, CheckpointError> {
        match location {
            StoreLocation::Dir(dir) => Self::local(dir),
            StoreLocation::S3(s3) => Self::s3(s3),
        }
    }

    /// A store in the local directory `dir` (created if missing). Writes are atomic: a file is
    /// written under a temporary name and renamed into place.
    pub fn local(dir: &std::path::Path) -> Result<Self, CheckpointError> {
        let storage = |problem: String| CheckpointError::Storage { what: dir.display().to_string(), problem };
        std::fs::create_dir_all(dir).map_err(|e| storage(format!("cannot create the directory: {e}")))?;
        let fs = LocalFileSystem::new_with_prefix(dir).map_err(|e| storage(e.to_string()))?;
        let mut store = Self::over(Arc::new(fs), dir.display().to_string())?;
        store.local_root = Some(dir.to_path_buf());
        Ok(store)
    }

    /// A store in an S3-compatible bucket (credentials from the environment).
    pub fn s3(spec: &S3Spec) -> Result<Self, CheckpointError> {
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&spec.bucket)
            .with_region(&spec.region)
            .with_allow_http(spec.allow_http);
        if let Some(endpoint) = &spec.endpoint {
            builder = builder.with_endpoint(endpoint).with_virtual_hosted_style_request(false);
        }
        let describe = format!("s3://{}/{}", spec.bucket, spec.prefix);
        let s3 =
            builder.build().map_err(|e| CheckpointError::Storage { what: describe.clone(), problem: e.to_string() })?;
        let prefix = StorePath::from(spec.prefix.as_str());
        let store: Arc<dyn ObjectStore> = if spec.prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
        };
        Self::over(store, describe)
    }

    /// A store over any object store (S3-compatible, in-memory for tests).
    pub fn over(inner: Arc<dyn ObjectStore>, describe: String) -> Result<Self, CheckpointError> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
            CheckpointError::Storage { what: describe.clone(), problem: format!("no async runtime: {e}") }
        })?;
        Ok(Self { inner, runtime, describe, local_root: None, faults: None })
    }

    /// The same store, with every read and write first passed to `faults` (tests: slow, failing
    /// and unreadable stores).
    pub fn with_faults(mut self, faults: StoreFaults) -> Self {
        self.faults = Some(faults);
        self
    }

    fn fault(&self, op: StoreOp, path: &str, what: &str) -> Result<(), CheckpointError> {
        match &self.faults {
            Some(faults) => faults(op, path).map_err(|problem| CheckpointError::Storage {
                what: format!("{what} {path} in {}", self.describe),
                problem,
            }),
            None => Ok(()),
        }
    }

    /// The directory the store is, for a local store.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    /// Where the store is, for messages.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Writes `bytes` to `path`, replacing what was there.
    pub fn put(&self, path: &str, bytes: Vec<u8>) -> Result<(), CheckpointError> {
        self.fault(StoreOp::Put, path, "writing")?;
        let location = StorePath::from(path);
        self.runtime
            .block_on(self.inner.put(&location, PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(io(format!("writing {path} in {}", self.describe)))
    }

    /// Reads `path` whole. A missing file is damage ([`CheckpointError::Corrupt`]); any other
    /// failure is [`CheckpointError::Storage`]: the file may be fine, it could not be read now.
    pub fn get(&self, path: &str) -> Result<Vec<u8>, CheckpointError> {
        self.fault(StoreOp::Get, path, "reading")?;
        let location = StorePath::from(path);
        let got = self.runtime.block_on(async {
            let got = self.inner.get(&location).await?;
            got.bytes().await
        });
        match got {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(object_store::Error::NotFound { .. }) => {
                Err(CheckpointError::Corrupt { file: path.to_owned(), problem: "missing".into() })
            }
            Err(e) => Err(io(format!("reading {path} in {}", self.describe))(e)),
        }
    }

    /// Streams `path` from byte `from` to its end into `to`, each byte at its own offset (so
    /// `to` has a hole before `from`), a chunk at a time, never whole in memory; stops early
    /// once `enough` says so of a chunk just written. Returns the object's size; nothing is
    /// written when `from` is at or past its end.
    pub fn download(
        &self,
        path: &str,
        from: u64,
        to: &mut std::fs::File,
        mut enough: impl FnMut(&[u8]) -> bool,
    ) -> Result<u64, CheckpointError> {
        use std::io::{Seek, SeekFrom, Write};
        let mut positioned = false;
        let mut failed = None;
        let size = self.stream(path, from, |chunk| {
            let written = (|| {
                if !positioned {
                    to.seek(SeekFrom::Start(from))?;
                    positioned = true;
                }
                to.write_all(chunk)
            })();
            match written {
                Ok(()) => !enough(chunk),
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })?;
        match failed {
            Some(e) => Err(CheckpointError::Storage {
                what: format!("reading {path} in {}", self.describe),
                problem: e.to_string(),
            }),
            None => Ok(size),
        }
    }

    /// Hands `path` from byte `from` to its end to `each`, a chunk at a time, never whole in
    /// memory, until `each` answers `false`. Returns the object's size; `each` is not called
    /// when `from` is at or past its end. `each` runs outside the store's runtime, so it may
    /// block (hand the chunk to a bounded channel, write a file).
    pub fn stream(&self, path: &str, from: u64, mut each: impl FnMut(&[u8]) -> bool) -> Result<u64, CheckpointError> {
        self.fault(StoreOp::Get, path, "reading")?;
        let what = || format!("reading {path} in {}", self.describe);
        let storage = |problem: String| CheckpointError::Storage { what: what(), problem };
        let missing = || CheckpointError::Corrupt { file: path.to_owned(), problem: "missing".into() };
        let location = StorePath::from(path);
        let opened = self.runtime.block_on(async {
            if from > 0 {
                // A range starting at or past the end is an error to a store, not an empty answer.
                let size = match self.inner.head(&location).await {
                    Ok(meta) => meta.size,
                    Err(object_store::Error::NotFound { .. }) => return Err(missing()),
                    Err(e) => return Err(storage(e.to_string())),
                };
                if from >= size {
                    return Ok((size, None));
                }
            }
            let options = object_store::GetOptions {
                range: (from > 0).then_some(object_store::GetRange::Offset(from)),
                ..Default::default()
            };
            match self.inner.get_opts(&location, options).await {
                Ok(got) => Ok((got.meta.size, Some(got.into_stream()))),
                Err(object_store::Error::NotFound { .. }) => Err(missing()),
                Err(e) => Err(storage(e.to_string())),
            }
        })?;
        let (size, Some(mut chunks)) = opened else { return Ok(opened.0) };
        while let Some(chunk) = self.runtime.block_on(futures_util::StreamExt::next(&mut chunks)) {
            let chunk = chunk.map_err(|e| storage(e.to_string()))?;
            if !each(&chunk) {
                break;
            }
        }
        Ok(size)
    }

    /// Whether `path` exists.
    pub fn exists(&self, path: &str) -> Result<bool, CheckpointError> {
        match self.runtime.block_on(self.inner.head(&StorePath::from(path))) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(io(format!("looking for {path} in {}", self.describe))(e)),
        }
    }

    /// Writes the whole of the open local file `local` to `path`, replacing what was there,
    /// without holding it in memory: up to 10 MiB go in one request, a larger file as a
    /// multipart upload. A handle rather than a path, so that the local file can be unnamed
    /// (`tempfile::tempfile`) and vanish with the process that wrote it, even under SIGKILL.
    pub fn put_file(&self, path: &str, mut local: std::fs::File) -> Result<(), CheckpointError> {
        use std::io::Seek;
        use tokio::io::AsyncWriteExt;
        self.fault(StoreOp::Put, path, "writing")?;
        let what = || format!("writing {path} in {} from a local file", self.describe);
        let storage = |e: std::io::Error| CheckpointError::Storage { what: what(), problem: e.to_string() };
        local.rewind().map_err(storage)?;
        self.runtime.block_on(async {
            let mut from = tokio::fs::File::from_std(local);
            let mut to = object_store::buffered::BufWriter::new(self.inner.clone(), StorePath::from(path));
            tokio::io::copy(&mut from, &mut to).await.map_err(storage)?;
            to.shutdown().await.map_err(storage)
        })
    }

    /// Moves `from` to `to`, replacing `to` (atomic in a directory; a copy and a delete on S3).
    pub fn rename(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        self.fault(StoreOp::Put, to, "writing")?;
        self.runtime
            .block_on(self.inner.rename(&StorePath::from(from), &StorePath::from(to)))
            .map_err(io(format!("renaming {from} to {to} in {}", self.describe)))
    }

    /// Deletes `path` (absent is fine).
    pub fn delete(&self, path: &str) -> Result<(), CheckpointError> {
        match self.runtime.block_on(self.inner.delete(&StorePath::from(path))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io(format!("deleting {path} in {}", self.describe))(e)),
        }
    }

    /// Removes directories left empty by deletions (local stores only; best effort).
    pub fn prune_empty_dirs(&self) {
        fn prune(dir: &std::path::Path, is_root: bool) -> bool {
            let Ok(entries) = std::fs::read_dir(dir) else { return false };
            let mut empty = true;
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                empty &= path.is_dir() && prune(&path, false);
            }
            empty && !is_root && std::fs::remove_dir(dir).is_ok()
        }
        if let Some(root) = &self.local_root {
            prune(root, true);
        }
    }

    /// Every file under `prefix` (empty: the whole store), with its size.
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, CheckpointError> {
        let mut files = Vec::new();
        let mut dirs = vec![if prefix.is_empty() { None } else { Some(StorePath::from(prefix)) }];
        while let Some(dir) = dirs.pop() {
            let listed = self
                .runtime
                .block_on(self.inner.list_with_delimiter(dir.as_ref()))
                .map_err(io(format!("listing {} in {}", prefix, self.describe)))?;
            files.extend(listed.objects.into_iter().map(|o| (o.location.to_string(), o.size)));
            dirs.extend(listed.common_prefixes.into_iter().map(Some));
        }
        files.sort();
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small file goes up in one request, a large one in parts; both arrive whole.
    #[test]
    fn a_local_file_is_uploaded_whole_whatever_its_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::local(&dir.path().join("store")).expect("store");
        for (name, len) in [("small", 1_000usize), ("large", 23 << 20)] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let local = dir.path().join(name);
            std::fs::write(&local, &bytes).expect("write");
            let file = std::fs::File::open(&local).expect("open");
            store.put_file(&format!("up/{name}"), file).expect("upload");
            assert!(store.get(&format!("up/{name}")).expect("read") == bytes, "{name} arrived whole");
        }
    }

    #[test]
    fn put_get_list_delete_in_a_local_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::local(&dir.path().join("checkpoints")).expect("store");
        store.put("chk-1/t0-s0/a.state", b"one".to_vec()).expect("put");
        store.put("chk-1/_metadata", b"meta".to_vec()).expect("put");
        store.put("shared/x.sst", b"sst!".to_vec()).expect("put");
        assert_eq!(store.get("chk-1/t0-s0/a.state").expect("get"), b"one");
        assert_eq!(
            store.list("").expect("list"),
            vec![
                ("chk-1/_metadata".to_string(), 4),
                ("chk-1/t0-s0/a.state".to_string(), 3),
                ("shared/x.sst".to_string(), 4)
            ]
        );
        assert_eq!(store.list("chk-1").expect("list").len(), 2);
        assert!(store.exists("shared/x.sst").expect("head"));
        store.delete("shared/x.sst").expect("delete");
        store.delete("shared/x.sst").expect("deleting twice is fine");
        assert!(!store.exists("shared/x.sst").expect("head"));
        assert!(store.get("nope").is_err());
    }
}
