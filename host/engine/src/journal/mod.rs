//! Input journals: what one subtask's operator saw, so `eddy replay` can run it again.
//!
//! A step with `debug: {journal: true}` (or a job with it) wraps each of its subtask's
//! operators in [`Journaled`], which appends every call it passes on (input batches,
//! watermarks, processing-time ticks, the end of input) to a segment file before the operator
//! sees it. A guest without granted clocks, randomness or network is a pure function of its
//! state, its input order and its timers, so state from a checkpoint and the segments after it
//! reproduce everything the operator did.
//!
//! Layout: `<checkpoints dir>/journal/<step>/<subtask>/after-<C>.jnl` holds what the subtask
//! saw after checkpoint `C`'s barrier (`after-0`: since the job started with nothing
//! restored), up to the next barrier, whose id names the next segment. A run that restores
//! checkpoint `C` rewrites `after-C` and deletes the later segments an earlier attempt left:
//! the journal follows the attempt whose output counts. The checkpoint thread deletes segments
//! from before the oldest retained checkpoint ([`prune`]), so a journal costs what the retained
//! checkpoints' input costs on disk.

mod format;
mod reader;
mod writer;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use format::{Decoded, Frame, MAX_FRAME_BYTES, decode, encode};
pub use reader::{Segment, read_segment};
pub(crate) use writer::{JournalWriter, Journaled};

/// The journal format this build writes and reads.
pub const JOURNAL_VERSION: u32 = 1;

/// Where one operator of one subtask sits in the plan: enough to build it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalSlot {
    /// The task (in plan order).
    pub task: usize,
    /// The subtask of its task.
    pub index: u32,
    /// The operator's position in the task's chain.
    pub position: usize,
    /// The task's parallelism.
    pub task_parallelism: u32,
    /// Whether the task reads a hash exchange (its state is split by key groups).
    pub keyed: bool,
}

/// First frame of every segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalHeader {
    /// [`JOURNAL_VERSION`] when written.
    pub version: u32,
    /// The step.
    pub step: String,
    /// Where its operator sat.
    pub slot: JournalSlot,
    /// The checkpoint whose state this segment follows (0: the job's start, nothing restored).
    pub after_checkpoint: u64,
    /// The digest of the code the operator ran.
    pub artifact: String,
    /// Processing time when the segment began (the operator's timer clock starts there).
    pub processing_time_ms: i64,
    /// The job's pipeline as it ran (paths resolved), so a replay builds the same operator;
    /// without its sources and sink (a replay needs neither, and they may name secrets).
    pub spec: eddy_plan::PipelineSpec,
}

/// The journal directory beside the checkpoints in `checkpoints_dir`.
pub fn root(checkpoints_dir: &Path) -> PathBuf {
    checkpoints_dir.join("journal")
}

/// The directory of one subtask's segments.
pub fn subtask_dir(root: &Path, step: &str, index: u32) -> PathBuf {
    root.join(step).join(index.to_string())
}

/// The segment that starts after checkpoint `after`.
pub fn segment_path(dir: &Path, after: u64) -> PathBuf {
    dir.join(format!("after-{after}.jnl"))
}

/// The segments in one subtask's directory, by the checkpoint each starts after, ascending.
pub fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let id = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("after-")?.strip_suffix(".jnl")?.parse::<u64>().ok());
        if let Some(id) = id {
            found.push((id, path));
        }
    }
    found.sort();
    Ok(found)
}

/// Deletes every segment under `root` that starts before checkpoint `oldest_retained`: no
/// retained checkpoint's state comes before it, so nothing can replay it. Returns how many.
pub fn prune(root: &Path, oldest_retained: u64) -> usize {
    let Ok(steps) = std::fs::read_dir(root) else { return 0 };
    let mut deleted = 0;
    for subtask in steps.flatten().filter_map(|s| std::fs::read_dir(s.path()).ok()).flatten().flatten() {
        let Ok(found) = segments(&subtask.path()) else { continue };
        for (_, path) in found.into_iter().filter(|(id, _)| *id < oldest_retained) {
            match std::fs::remove_file(&path) {
                Ok(()) => deleted += 1,
                Err(e) => tracing::warn!(path = %path.display(), "could not delete an old journal segment: {e}"),
            }
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_the_segments_of_retained_checkpoints_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = root(dir.path());
        for (step, index) in [("count", 0), ("count", 1), ("window", 0)] {
            let d = subtask_dir(&root, step, index);
            std::fs::create_dir_all(&d).unwrap();
            for after in [0, 3, 4, 7] {
                std::fs::write(segment_path(&d, after), b"").unwrap();
            }
            std::fs::write(d.join("notes.txt"), b"").unwrap();
        }
        assert_eq!(prune(&root, 4), 6);
        for (step, index) in [("count", 0), ("count", 1), ("window", 0)] {
            let d = subtask_dir(&root, step, index);
            let left: Vec<u64> = segments(&d).unwrap().into_iter().map(|(id, _)| id).collect();
            assert_eq!(left, [4, 7]);
            assert!(d.join("notes.txt").exists(), "only segments are pruned");
        }
        assert_eq!(prune(&dir.path().join("none"), 9), 0, "no journal is nothing to prune");
    }
}
