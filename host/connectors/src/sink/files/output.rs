//! Where a files sink's output lives: a local directory, or an object store every worker
//! reaches (the bucket of a cluster's checkpoints). The two-phase commit in
//! [`super::FilesSink`] runs unchanged over either; each place says how a file is staged,
//! published and listed.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use eddy_checkpoint::{CheckpointError, CheckpointStore};

/// The in-progress directory, beside the committed files.
pub(super) const IN_PROGRESS: &str = ".in-progress";

/// An in-progress file: written record by record, then sealed (durable, still invisible).
pub trait Staged: Write + Send {
    /// Makes the written bytes durable where [`OutputDir::publish`] will find them.
    fn seal(self: Box<Self>) -> std::io::Result<()>;
}

/// What [`OutputDir::publish`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The staged file is now the committed one.
    Moved,
    /// Only the committed file exists: an earlier publish did it.
    Already,
    /// Neither exists.
    Missing,
}

/// How much of a committed file [`OutputDir::read_chunks`] reads at a time from a directory.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// A files sink's output place (see the module docs). Names are file names without a
/// directory: committed files at the top, staged files in [`IN_PROGRESS`].
pub trait OutputDir: Send + Sync + std::fmt::Debug {
    /// Where it is, for messages.
    fn describe(&self) -> String;
    /// A new staged file `name`.
    fn stage(&self, name: &str) -> std::io::Result<Box<dyn Staged>>;
    /// Makes staged `staged` visible as `committed`, atomically for a reader.
    fn publish(&self, staged: &str, committed: &str) -> std::io::Result<Published>;
    /// Makes the publishes so far durable.
    fn sync(&self) -> std::io::Result<()>;
    /// The committed files' names (unsorted; none if the place does not exist).
    fn committed(&self) -> std::io::Result<Vec<String>>;
    /// The staged files' names.
    fn staged(&self) -> std::io::Result<Vec<String>>;
    /// Deletes a committed file.
    fn remove_committed(&self, name: &str) -> std::io::Result<()>;
    /// Deletes a staged file.
    fn remove_staged(&self, name: &str) -> std::io::Result<()>;
    /// Hands a committed file's bytes to `each`, a chunk at a time (a file may be as large as
    /// its writer made it), until `each` answers `false`.
    fn read_chunks(&self, name: &str, each: &mut dyn FnMut(&[u8]) -> bool) -> std::io::Result<()>;
}

/// Output in a local (or mounted) directory: staged files are synced, published by rename.
#[derive(Debug, Clone)]
pub struct LocalDir(PathBuf);

impl LocalDir {
    /// The directory `dir` (created when first written).
    pub fn new(dir: &Path) -> Self {
        Self(dir.to_path_buf())
    }
}

struct LocalStaged(BufWriter<File>);

impl Write for LocalStaged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Staged for LocalStaged {
    fn seal(self: Box<Self>) -> std::io::Result<()> {
        self.0.into_inner().map_err(|e| e.into_error())?.sync_all()
    }
}

/// The names of the files in `dir` (none if it does not exist).
fn file_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(names)
}

impl OutputDir for LocalDir {
    fn describe(&self) -> String {
        self.0.display().to_string()
    }

    fn stage(&self, name: &str) -> std::io::Result<Box<dyn Staged>> {
        let dir = self.0.join(IN_PROGRESS);
        std::fs::create_dir_all(&dir)?;
        Ok(Box::new(LocalStaged(BufWriter::new(File::create(dir.join(name))?))))
    }

    fn publish(&self, staged: &str, committed: &str) -> std::io::Result<Published> {
        let (from, to) = (self.0.join(IN_PROGRESS).join(staged), self.0.join(committed));
        if from.exists() {
            std::fs::rename(&from, &to)?;
            Ok(Published::Moved)
        } else if to.exists() {
            Ok(Published::Already)
        } else {
            Ok(Published::Missing)
        }
    }

    fn sync(&self) -> std::io::Result<()> {
        File::open(&self.0)?.sync_all()
    }

    fn committed(&self) -> std::io::Result<Vec<String>> {
        file_names(&self.0)
    }

    fn staged(&self) -> std::io::Result<Vec<String>> {
        file_names(&self.0.join(IN_PROGRESS))
    }

    fn remove_committed(&self, name: &str) -> std::io::Result<()> {
        std::fs::remove_file(self.0.join(name))
    }

    fn remove_staged(&self, name: &str) -> std::io::Result<()> {
        std::fs::remove_file(self.0.join(IN_PROGRESS).join(name))
    }

    fn read_chunks(&self, name: &str, each: &mut dyn FnMut(&[u8]) -> bool) -> std::io::Result<()> {
        use std::io::Read;
        let mut file = File::open(self.0.join(name))?;
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        loop {
            let n = file.read(&mut chunk)?;
            if n == 0 || !each(&chunk[..n]) {
                return Ok(());
            }
        }
    }
}

/// Output in an object store: a staged file is spooled to a local temporary file and uploaded
/// when sealed (streamed, a large one in parts); publishing renames the object (a copy and a delete on S3, so a crash between
/// them leaves both, which the next publish or recovery resolves: the committed copy wins).
#[derive(Debug, Clone)]
pub struct StoreDir(Arc<CheckpointStore>);

impl StoreDir {
    /// The output at the root of `store`.
    pub fn new(store: CheckpointStore) -> Self {
        Self(Arc::new(store))
    }
}

fn io_error(e: CheckpointError) -> std::io::Error {
    match e {
        CheckpointError::Corrupt { .. } => std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
        other => std::io::Error::other(other.to_string()),
    }
}

struct StoreStaged {
    store: Arc<CheckpointStore>,
    path: String,
    /// Unnamed, so a worker killed mid-epoch leaves nothing behind in its temporary directory.
    spool: BufWriter<std::fs::File>,
}

impl Write for StoreStaged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.spool.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.spool.flush()
    }
}

impl Staged for StoreStaged {
    fn seal(self: Box<Self>) -> std::io::Result<()> {
        let spool = self.spool.into_inner().map_err(|e| e.into_error())?;
        self.store.put_file(&self.path, spool).map_err(io_error)
    }
}

/// The names directly under `prefix` among `listed` paths.
fn names_under(listed: Vec<(String, u64)>, prefix: &str) -> Vec<String> {
    listed
        .into_iter()
        .filter_map(|(path, _)| path.strip_prefix(prefix).filter(|n| !n.contains('/')).map(str::to_owned))
        .collect()
}

impl OutputDir for StoreDir {
    fn describe(&self) -> String {
        self.0.describe().to_owned()
    }

    fn stage(&self, name: &str) -> std::io::Result<Box<dyn Staged>> {
        Ok(Box::new(StoreStaged {
            store: self.0.clone(),
            path: format!("{IN_PROGRESS}/{name}"),
            spool: BufWriter::new(tempfile::tempfile()?),
        }))
    }

    fn publish(&self, staged: &str, committed: &str) -> std::io::Result<Published> {
        let from = format!("{IN_PROGRESS}/{staged}");
        if self.0.exists(committed).map_err(io_error)? {
            self.0.delete(&from).map_err(io_error)?;
            return Ok(Published::Already);
        }
        if !self.0.exists(&from).map_err(io_error)? {
            return Ok(Published::Missing);
        }
        self.0.rename(&from, committed).map_err(io_error)?;
        Ok(Published::Moved)
    }

    fn sync(&self) -> std::io::Result<()> {
        // A completed put is durable in an object store.
        Ok(())
    }

    fn committed(&self) -> std::io::Result<Vec<String>> {
        Ok(names_under(self.0.list("").map_err(io_error)?, ""))
    }

    fn staged(&self) -> std::io::Result<Vec<String>> {
        let prefix = format!("{IN_PROGRESS}/");
        Ok(names_under(self.0.list(IN_PROGRESS).map_err(io_error)?, &prefix))
    }

    fn remove_committed(&self, name: &str) -> std::io::Result<()> {
        self.0.delete(name).map_err(io_error)
    }

    fn remove_staged(&self, name: &str) -> std::io::Result<()> {
        self.0.delete(&format!("{IN_PROGRESS}/{name}")).map_err(io_error)
    }

    fn read_chunks(&self, name: &str, each: &mut dyn FnMut(&[u8]) -> bool) -> std::io::Result<()> {
        self.0.stream(name, 0, each).map(drop).map_err(io_error)
    }
}
