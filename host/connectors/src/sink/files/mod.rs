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
//!
//! The protocol runs over an [`OutputDir`]: a local directory, or an object store that every
//! worker of a cluster reaches ([`StoreDir`]), so the job master recovers files its parts
//! wrote on other machines.

mod output;

use std::sync::Arc;

use eddy_core::RecordBatch;
use serde::{Deserialize, Serialize};

pub use output::{LocalDir, OutputDir, Published, Staged, StoreDir};

use crate::sink::{Sink, write_json_lines};

/// What the sink records in a checkpoint: pre-committed files not known to be committed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesSinkState {
    /// (checkpoint, file name) of each pre-committed file.
    pub pending: Vec<(u64, String)>,
}

/// See the module docs.
pub struct FilesSink {
    out: Arc<dyn OutputDir>,
    /// Distinguishes this run's and subtask's file names from every other writer's, earlier
    /// runs included (whose files may be committed).
    attempt: String,
    seq: u64,
    current: Option<(String, Box<dyn Staged>)>,
    state: FilesSinkState,
    /// Without checkpoints there is no protocol: everything is committed at the end.
    checkpointing: bool,
}

impl std::fmt::Debug for FilesSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilesSink").field("out", &self.out).field("attempt", &self.attempt).finish_non_exhaustive()
    }
}

fn committed_name(checkpoint: u64, name: &str) -> String {
    format!("part-{checkpoint:020}-{name}")
}

/// Whether `name` has the shape of [`FilesSink`]'s staged files (`<run>-s<subtask>-<seq>.jsonl`,
/// letters, digits and `-`): one plain file name, nothing a path could climb out with.
fn is_staged_name(name: &str) -> bool {
    name.len() <= 128
        && name.strip_suffix(".jsonl").is_some_and(|stem| {
            !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// At most 64 characters of an untrusted name, for an error message.
fn truncated(name: &str) -> String {
    name.chars().take(64).collect()
}

/// The checkpoint that committed a file of this name, if it is one of ours.
fn committed_by(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("part-")?.get(..20)?;
    digits.parse().ok()
}

impl FilesSink {
    /// Prepares `out` for a run that restored checkpoint `restored` (with the state of every
    /// sink subtask it holds): commits what they list, deletes every other in-progress file
    /// and every file committed by a later checkpoint. Once per run, before any subtask opens.
    pub fn recover(out: &dyn OutputDir, restored: Option<(u64, &[FilesSinkState])>) -> std::io::Result<()> {
        if let Some((checkpoint, states)) = restored {
            for state in states {
                Self::commit(out, &state.pending)?;
            }
            for name in out.committed()? {
                if let Some(by) = committed_by(&name).filter(|c| *c > checkpoint) {
                    // Exactly once needs it: the restore replays what produced this file, so
                    // keeping it would emit its records twice. Said, since it is output lost
                    // to a reader who saw it.
                    tracing::warn!(
                        file = %name,
                        committed_by = by,
                        restored = checkpoint,
                        output = %out.describe(),
                        "removed committed output of a checkpoint newer than the one restored (it was damaged or \
                         cut short); its records are emitted again from the restored checkpoint"
                    );
                    out.remove_committed(&name)?;
                }
            }
        }
        for name in out.staged()? {
            out.remove_staged(&name)?;
        }
        Ok(())
    }

    /// A name for this run's files, distinct from every earlier run's.
    pub fn run_name() -> String {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()).to_string()
    }

    /// Subtask `subtask`'s sink on a recovered `out`, its files named after `run`
    /// ([`Self::run_name`]). `checkpointing`: whether checkpoints will commit its files.
    pub fn open(out: Arc<dyn OutputDir>, run: &str, subtask: u32, checkpointing: bool) -> Self {
        Self {
            out,
            attempt: format!("{run}-s{subtask}"),
            seq: 0,
            current: None,
            state: FilesSinkState::default(),
            checkpointing,
        }
    }

    /// The committed files of `out` in commit order: what a reader of the sink's output
    /// reads, never an in-progress file.
    pub fn committed(out: &dyn OutputDir) -> std::io::Result<Vec<String>> {
        let mut names: Vec<String> = out.committed()?.into_iter().filter(|n| committed_by(n).is_some()).collect();
        // Names start with the committing checkpoint's id in 20 digits: name order is commit order.
        names.sort();
        Ok(names)
    }

    /// Publishes the listed pre-committed files. Idempotent: a file already published is
    /// skipped; a file neither staged nor committed is an error (the checkpoint promised it).
    /// The list comes from checkpoint metadata that workers wrote parts of, so a name that is
    /// not one this sink gives its files is refused before anything is published.
    pub fn commit(out: &dyn OutputDir, files: &[(u64, String)]) -> std::io::Result<()> {
        if let Some((_, name)) = files.iter().find(|(_, name)| !is_staged_name(name)) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("pre-committed file name {:?} is not one the files sink writes", truncated(name)),
            ));
        }
        for (checkpoint, name) in files {
            if out.publish(name, &committed_name(*checkpoint, name))? == Published::Missing {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "pre-committed file {name} is gone from {}: the output was changed by hand",
                        out.describe()
                    ),
                ));
            }
        }
        if !files.is_empty() {
            out.sync()?;
        }
        Ok(())
    }

    fn current(&mut self) -> std::io::Result<&mut Box<dyn Staged>> {
        if self.current.is_none() {
            self.seq += 1;
            let name = format!("{}-{:06}.jsonl", self.attempt, self.seq);
            let file = self.out.stage(&name)?;
            self.current = Some((name, file));
        }
        match &mut self.current {
            Some((_, writer)) => Ok(writer),
            None => Err(std::io::Error::other("no current file")),
        }
    }

    fn close_current(&mut self, checkpoint: u64) -> std::io::Result<()> {
        if let Some((name, writer)) = self.current.take() {
            writer.seal()?;
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
        Self::commit(self.out.as_ref(), &all)
    }

    fn pre_commit(&mut self, checkpoint: u64) -> std::io::Result<Option<serde_json::Value>> {
        self.close_current(checkpoint)?;
        serde_json::to_value(&self.state).map(Some).map_err(std::io::Error::other)
    }

    fn notify_complete(&mut self, checkpoint: u64) -> std::io::Result<()> {
        let (done, later): (Vec<_>, Vec<_>) = self.state.pending.drain(..).partition(|(c, _)| *c <= checkpoint);
        self.state.pending = later;
        Self::commit(self.out.as_ref(), &done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_checkpoint::CheckpointStore;

    fn batch(values: &[&str]) -> RecordBatch {
        let mut b = RecordBatch::default();
        for v in values {
            b.push(None, format!("\"{v}\"").as_bytes(), None);
        }
        b
    }

    /// Every kind of output place, each over a fresh temporary directory: the protocol must
    /// hold on all of them.
    fn places() -> Vec<(tempfile::TempDir, Arc<dyn OutputDir>)> {
        let local = tempfile::tempdir().expect("tempdir");
        let out: Arc<dyn OutputDir> = Arc::new(LocalDir::new(local.path()));
        let stored = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn OutputDir> = Arc::new(StoreDir::new(CheckpointStore::local(stored.path()).expect("store")));
        vec![(local, out), (stored, store)]
    }

    /// Committed values, sorted, read as a reader of the output does.
    fn committed(out: &dyn OutputDir) -> Vec<String> {
        let mut values = Vec::new();
        for name in FilesSink::committed(out).expect("list") {
            let mut bytes = Vec::new();
            out.read_chunks(&name, &mut |chunk| {
                bytes.extend_from_slice(chunk);
                true
            })
            .expect("read");
            for line in String::from_utf8(bytes).expect("utf-8").lines() {
                let v: serde_json::Value = serde_json::from_str(line).expect("json");
                values.push(v["value"].as_str().expect("string").to_owned());
            }
        }
        values.sort();
        values
    }

    #[test]
    fn files_become_visible_only_when_their_checkpoint_completes() {
        for (_dir, out) in places() {
            let out = &out;
            FilesSink::recover(out.as_ref(), None).expect("recover");
            let mut sink = FilesSink::open(out.clone(), "r1", 0, true);
            sink.write(None, &batch(&["a", "b"])).expect("write");
            let state1 = sink.pre_commit(1).expect("pre-commit");
            sink.write(None, &batch(&["c"])).expect("write");
            assert!(committed(out.as_ref()).is_empty(), "nothing visible before completion");
            sink.notify_complete(1).expect("commit");
            assert_eq!(committed(out.as_ref()), ["a", "b"]);
            let state2 = sink.pre_commit(2).expect("pre-commit");
            assert_ne!(state1, state2);
            sink.write(None, &batch(&["d"])).expect("write");
            sink.pre_commit(3).expect("staged, never completed");
            // Crash: checkpoint 2 completed (its metadata is written) but the sink never heard.
            drop(sink);
            let restored: FilesSinkState = serde_json::from_value(state2.expect("state")).expect("state");
            FilesSink::recover(out.as_ref(), Some((2, std::slice::from_ref(&restored)))).expect("recover");
            let mut again = FilesSink::open(out.clone(), "r2", 0, true);
            assert_eq!(committed(out.as_ref()), ["a", "b", "c"], "2's file committed on restore, `d` aborted");
            assert!(out.staged().expect("staged").is_empty(), "leftovers removed from {out:?}");
            again.write(None, &batch(&["d"])).expect("write");
            again.pre_commit(3).expect("pre-commit");
            again.notify_complete(3).expect("commit");
            assert_eq!(committed(out.as_ref()), ["a", "b", "c", "d"]);
            // Restoring checkpoint 2 again commits nothing twice and rolls back 3's file (as
            // when checkpoint 3 turned out damaged): `d` will come again from the sources.
            FilesSink::recover(out.as_ref(), Some((2, std::slice::from_ref(&restored)))).expect("idempotent");
            assert_eq!(committed(out.as_ref()), ["a", "b", "c"]);
            let state1: FilesSinkState = serde_json::from_value(state1.expect("state")).expect("state");
            FilesSink::recover(out.as_ref(), Some((1, &[state1]))).expect("back to 1");
            assert_eq!(committed(out.as_ref()), ["a", "b"]);
        }
    }

    /// Two subtasks write side by side; a restore (at any parallelism) commits what both
    /// pre-committed, and neither's files overwrite the other's.
    #[test]
    fn every_subtasks_pending_files_are_committed_on_recovery() {
        for (_dir, out) in places() {
            FilesSink::recover(out.as_ref(), None).expect("recover");
            let run = FilesSink::run_name();
            let mut sinks: Vec<FilesSink> = (0..2).map(|i| FilesSink::open(out.clone(), &run, i, true)).collect();
            sinks[0].write(None, &batch(&["a"])).expect("write");
            sinks[1].write(None, &batch(&["b"])).expect("write");
            let states: Vec<FilesSinkState> = sinks
                .iter_mut()
                .map(|s| serde_json::from_value(s.pre_commit(1).expect("pre-commit").expect("state")).expect("state"))
                .collect();
            sinks[1].write(None, &batch(&["c"])).expect("write");
            drop(sinks);
            FilesSink::recover(out.as_ref(), Some((1, &states))).expect("recover");
            assert_eq!(committed(out.as_ref()), ["a", "b"], "both subtasks' files, not `c`");
        }
    }

    #[test]
    fn without_checkpoints_everything_is_committed_at_the_end() {
        for (_dir, out) in places() {
            FilesSink::recover(out.as_ref(), None).expect("recover");
            let mut sink = FilesSink::open(out.clone(), "r", 0, false);
            sink.write(None, &batch(&["x"])).expect("write");
            sink.write(Some("late"), &batch(&["y"])).expect("write");
            sink.finish().expect("finish");
            assert_eq!(committed(out.as_ref()), ["x", "y"]);
        }
    }

    /// Sink states are partly written by workers: a listed name that is not a staged file's
    /// (a path, a dotfile) is refused and nothing is published, not even the good names.
    #[test]
    fn a_pending_name_that_is_no_staged_file_name_is_refused() {
        for (_dir, out) in places() {
            let mut staged = out.stage("r1-s0-000001.jsonl").expect("stage");
            staged.write_all(b"{}\n").expect("write");
            staged.seal().expect("seal");
            for bad in ["../../escape.jsonl", "a/b.jsonl", ".jsonl", "x.json", "..", "", &"a".repeat(200)] {
                let files = [(1, "r1-s0-000001.jsonl".to_owned()), (1, bad.to_owned())];
                let err = FilesSink::commit(out.as_ref(), &files).expect_err(bad);
                assert!(err.to_string().contains("not one the files sink writes"), "{bad}: {err}");
                assert!(committed(out.as_ref()).is_empty(), "{bad}: nothing published");
            }
            FilesSink::commit(out.as_ref(), &[(1, "r1-s0-000001.jsonl".to_owned())]).expect("a staged name");
            assert_eq!(FilesSink::committed(out.as_ref()).expect("list").len(), 1);
        }
    }

    /// A file whose checkpoint promised it but is gone is an error naming it; a publish that
    /// a crash interrupted after the copy (both names present) completes without a second copy.
    #[test]
    fn a_lost_pre_committed_file_is_named_and_a_half_done_publish_completes() {
        for (_dir, out) in places() {
            let err = FilesSink::commit(out.as_ref(), &[(4, "gone.jsonl".into())]).expect_err("missing");
            assert!(err.to_string().contains("gone.jsonl") && err.to_string().contains("changed by hand"), "{err}");
            let mut staged = out.stage("twice.jsonl").expect("stage");
            staged.write_all(b"{\"value\":\"t\"}\n").expect("write");
            staged.seal().expect("seal");
            let committed_copy = committed_name(5, "twice.jsonl");
            out.publish("twice.jsonl", &committed_copy).expect("publish");
            let mut again = out.stage("twice.jsonl").expect("stage");
            again.write_all(b"{\"value\":\"t\"}\n").expect("write");
            again.seal().expect("seal");
            FilesSink::commit(out.as_ref(), &[(5, "twice.jsonl".into())]).expect("idempotent");
            assert_eq!(committed(out.as_ref()), ["t"]);
            assert!(out.staged().expect("staged").is_empty(), "{out:?}");
        }
    }
}
