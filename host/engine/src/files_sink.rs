//! The exactly-once files sink: a two-phase commit over a directory.
//!
//! Records go to an in-progress file in `<dir>/.in-progress/`. At checkpoint `n`'s barrier the
//! file is flushed, synced and closed (pre-commit) and recorded in the checkpoint as pending
//! for `n`; a new file takes the records after the barrier. When checkpoint `n` completes, its
//! pending files are renamed into `<dir>` as `part-<n, 20 digits>-<name>` (commit) — an atomic
//! rename, so a reader sees a file whole or not at all. On restore from checkpoint `n`, the
//! files it lists are committed (the checkpoint completed, maybe the rename had not happened
//! yet), every other in-progress file is deleted (abort), and so is every committed file of a
//! checkpoint after `n` (possible only when a newer checkpoint was damaged and the job fell
//! back to `n`): the records of all of them come again from the sources' rewound positions.
//! Committing is idempotent, so a crash at any point is safe.
//!
//! The sink runs at the parallelism of its input: each subtask writes its own files (names
//! carry the run and the subtask) and records its own pending ones. Recovery is once per run,
//! before any subtask opens: it commits what every subtask's state in the checkpoint lists, so
//! a restore at another parallelism loses no file.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use eddy_core::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::sink::{Sink, write_json_lines};

const IN_PROGRESS: &str = ".in-progress";

/// What the sink records in a checkpoint: pre-committed files not known to be committed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesSinkState {
    /// (checkpoint, file name) of each pre-committed file.
    pub pending: Vec<(u64, String)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct FilesSink {
    dir: PathBuf,
    /// Distinguishes this run's and subtask's file names from every other writer's, earlier
    /// runs included (whose files may be committed).
    attempt: String,
    seq: u64,
    current: Option<(String, BufWriter<File>)>,
    state: FilesSinkState,
    /// Without checkpoints there is no protocol: everything is committed at the end.
    checkpointing: bool,
}

fn staged(dir: &Path, name: &str) -> PathBuf {
    dir.join(IN_PROGRESS).join(name)
}

fn committed_name(checkpoint: u64, name: &str) -> String {
    format!("part-{checkpoint:020}-{name}")
}

/// The checkpoint that committed a file of this name, if it is one of ours.
fn committed_by(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("part-")?.get(..20)?;
    digits.parse().ok()
}

impl FilesSink {
    /// Prepares `dir` for a run that restored checkpoint `restored` (with the state of every
    /// sink subtask it holds): commits what they list, deletes every other in-progress file
    /// and every file committed by a later checkpoint. Once per run, before any subtask opens.
    pub fn recover(dir: &Path, restored: Option<(u64, &[FilesSinkState])>) -> std::io::Result<()> {
        std::fs::create_dir_all(dir.join(IN_PROGRESS))?;
        if let Some((checkpoint, states)) = restored {
            for state in states {
                Self::commit(dir, &state.pending)?;
            }
            for entry in std::fs::read_dir(dir)?.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if committed_by(&name).is_some_and(|c| c > checkpoint) {
                    std::fs::remove_file(entry.path())?;
                }
            }
        }
        for entry in std::fs::read_dir(dir.join(IN_PROGRESS))? {
            std::fs::remove_file(entry?.path())?;
        }
        Ok(())
    }

    /// A name for this run's files, distinct from every earlier run's.
    pub fn run_name() -> String {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()).to_string()
    }

    /// Subtask `subtask`'s sink on a recovered `dir`, its files named after `run`
    /// ([`Self::run_name`]). `checkpointing`: whether checkpoints will commit its files.
    pub fn open(dir: &Path, run: &str, subtask: u32, checkpointing: bool) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir.join(IN_PROGRESS))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            attempt: format!("{run}-s{subtask}"),
            seq: 0,
            current: None,
            state: FilesSinkState::default(),
            checkpointing,
        })
    }

    /// How many committed files `dir` holds (none if it does not exist).
    pub fn committed_files(dir: &Path) -> std::io::Result<usize> {
        Ok(Self::committed_paths(dir)?.len())
    }

    /// The committed files of `dir` in commit order (none if it does not exist): what a reader
    /// of the sink's output reads, never an in-progress file.
    pub fn committed_paths(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry?;
            if committed_by(&entry.file_name().to_string_lossy()).is_some() {
                files.push(entry.path());
            }
        }
        // Names start with the committing checkpoint's id in 20 digits: name order is commit order.
        files.sort();
        Ok(files)
    }

    /// Moves the listed pre-committed files into `dir`. Idempotent: a file already moved is
    /// skipped; a file neither staged nor committed is an error (the checkpoint promised it).
    pub fn commit(dir: &Path, files: &[(u64, String)]) -> std::io::Result<()> {
        for (checkpoint, name) in files {
            let (from, to) = (staged(dir, name), dir.join(committed_name(*checkpoint, name)));
            if from.exists() {
                std::fs::rename(&from, &to)?;
            } else if !to.exists() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("pre-committed file {} is gone: the output directory was changed by hand", from.display()),
                ));
            }
        }
        if !files.is_empty() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    fn current(&mut self) -> std::io::Result<&mut BufWriter<File>> {
        if self.current.is_none() {
            self.seq += 1;
            let name = format!("{}-{:06}.jsonl", self.attempt, self.seq);
            let file = File::create(staged(&self.dir, &name))?;
            self.current = Some((name, BufWriter::new(file)));
        }
        match &mut self.current {
            Some((_, writer)) => Ok(writer),
            None => Err(std::io::Error::other("no current file")),
        }
    }

    fn close_current(&mut self, checkpoint: u64) -> std::io::Result<()> {
        if let Some((name, writer)) = self.current.take() {
            let file = writer.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            self.state.pending.push((checkpoint, name));
        }
        Ok(())
    }
}

impl Sink for FilesSink {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        write_json_lines(self.current()?, output, batch)
    }

    fn finish(&mut self) -> std::io::Result<()> {
        if self.checkpointing {
            // The job's final checkpoint commits (see `pre_commit`).
            return Ok(());
        }
        self.close_current(u64::MAX)?;
        let all = std::mem::take(&mut self.state.pending);
        Self::commit(&self.dir, &all)
    }

    fn pre_commit(&mut self, checkpoint: u64) -> std::io::Result<Option<serde_json::Value>> {
        self.close_current(checkpoint)?;
        serde_json::to_value(&self.state).map(Some).map_err(std::io::Error::other)
    }

    fn notify_complete(&mut self, checkpoint: u64) -> std::io::Result<()> {
        let (done, later): (Vec<_>, Vec<_>) = self.state.pending.drain(..).partition(|(c, _)| *c <= checkpoint);
        self.state.pending = later;
        Self::commit(&self.dir, &done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(values: &[&str]) -> RecordBatch {
        let mut b = RecordBatch::default();
        for v in values {
            b.push(None, format!("\"{v}\"").as_bytes(), None);
        }
        b
    }

    /// Committed values, sorted.
    fn committed(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).expect("dir").filter_map(Result::ok) {
            if entry.file_type().expect("type").is_file() {
                for line in std::fs::read_to_string(entry.path()).expect("read").lines() {
                    let v: serde_json::Value = serde_json::from_str(line).expect("json");
                    out.push(v["value"].as_str().expect("string").to_owned());
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn files_become_visible_only_when_their_checkpoint_completes() {
        let dir = tempfile::tempdir().expect("tempdir");
        FilesSink::recover(dir.path(), None).expect("recover");
        let mut sink = FilesSink::open(dir.path(), "r1", 0, true).expect("open");
        sink.write(None, &batch(&["a", "b"])).expect("write");
        let state1 = sink.pre_commit(1).expect("pre-commit");
        sink.write(None, &batch(&["c"])).expect("write");
        assert!(committed(dir.path()).is_empty(), "nothing visible before completion");
        sink.notify_complete(1).expect("commit");
        assert_eq!(committed(dir.path()), ["a", "b"]);
        let state2 = sink.pre_commit(2).expect("pre-commit");
        assert_ne!(state1, state2);
        sink.write(None, &batch(&["d"])).expect("write");
        // Crash: checkpoint 2 completed (its metadata is written) but the sink never heard.
        drop(sink);
        let restored: FilesSinkState = serde_json::from_value(state2.expect("state")).expect("state");
        FilesSink::recover(dir.path(), Some((2, std::slice::from_ref(&restored)))).expect("recover");
        let mut again = FilesSink::open(dir.path(), "r2", 0, true).expect("reopen");
        assert_eq!(committed(dir.path()), ["a", "b", "c"], "2's file committed on restore, `d` aborted");
        assert_eq!(std::fs::read_dir(dir.path().join(IN_PROGRESS)).expect("dir").count(), 0, "leftovers removed");
        again.write(None, &batch(&["d"])).expect("write");
        again.pre_commit(3).expect("pre-commit");
        again.notify_complete(3).expect("commit");
        assert_eq!(committed(dir.path()), ["a", "b", "c", "d"]);
        // Restoring checkpoint 2 again commits nothing twice and rolls back 3's file (as when
        // checkpoint 3 turned out damaged): `d` will come again from the sources.
        FilesSink::recover(dir.path(), Some((2, std::slice::from_ref(&restored)))).expect("idempotent");
        assert_eq!(committed(dir.path()), ["a", "b", "c"]);
        let state1: FilesSinkState = serde_json::from_value(state1.expect("state")).expect("state");
        FilesSink::recover(dir.path(), Some((1, &[state1]))).expect("back to 1");
        assert_eq!(committed(dir.path()), ["a", "b"]);
    }

    /// Two subtasks write side by side; a restore (at any parallelism) commits what both
    /// pre-committed, and neither's files overwrite the other's.
    #[test]
    fn every_subtasks_pending_files_are_committed_on_recovery() {
        let dir = tempfile::tempdir().expect("tempdir");
        FilesSink::recover(dir.path(), None).expect("recover");
        let run = FilesSink::run_name();
        let mut sinks: Vec<FilesSink> =
            (0..2).map(|i| FilesSink::open(dir.path(), &run, i, true).expect("open")).collect();
        sinks[0].write(None, &batch(&["a"])).expect("write");
        sinks[1].write(None, &batch(&["b"])).expect("write");
        let states: Vec<FilesSinkState> = sinks
            .iter_mut()
            .map(|s| serde_json::from_value(s.pre_commit(1).expect("pre-commit").expect("state")).expect("state"))
            .collect();
        sinks[1].write(None, &batch(&["c"])).expect("write");
        drop(sinks);
        FilesSink::recover(dir.path(), Some((1, &states))).expect("recover");
        assert_eq!(committed(dir.path()), ["a", "b"], "both subtasks' files, not `c`");
    }

    #[test]
    fn without_checkpoints_everything_is_committed_at_the_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        FilesSink::recover(dir.path(), None).expect("recover");
        let mut sink = FilesSink::open(dir.path(), "r", 0, false).expect("open");
        sink.write(None, &batch(&["x"])).expect("write");
        sink.write(Some("late"), &batch(&["y"])).expect("write");
        sink.finish().expect("finish");
        assert_eq!(committed(dir.path()), ["x", "y"]);
    }
}
