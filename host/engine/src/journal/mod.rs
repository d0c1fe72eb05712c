//! Input journals: what one subtask's operator saw, so `eddy replay` can run it again.
//!
//! A step with `debug: {journal: true}` (or a job with it) wraps each of its subtask's
//! operators in [`Journaled`], which appends every call it passes on (input batches,
//! watermarks, processing-time ticks, the end of input) to a segment file before the operator
//! sees it. A guest without granted clocks, randomness or network is a pure function of its
//! state, its input order and its timers, so state from a checkpoint and the segments after it
//! reproduce everything the operator did.
//!
//! Layout: `journal/<step>/<subtask>/after-<C>.jnl` in the job's checkpoint store holds what
//! the subtask saw after checkpoint `C`'s barrier (`after-0`: since the job started with
//! nothing restored), up to the next barrier, whose id names the next segment. A run that
//! restores checkpoint `C` rewrites `after-C` and deletes the later segments an earlier attempt
//! left: the journal follows the attempt whose output counts. The checkpoint thread deletes
//! segments from before the oldest retained checkpoint ([`prune`]), so a journal costs what the
//! retained checkpoints' input costs in the store.
//!
//! In a checkpoint directory the open segment is written in place, so a replay sees it grow.
//! In a bucket it is written to the subtask's local state directory and put into the bucket
//! when its barrier passes or the subtask ends ([`JournalWriter`]): a worker killed mid-segment
//! loses that segment's tail there, and a replay of a running job reaches the last barrier.

mod format;
mod reader;
mod writer;

use eddy_checkpoint::{CheckpointError, CheckpointStore};
use serde::{Deserialize, Serialize};

pub use format::{Decoded, Frame, MAX_FRAME_BYTES, decode, encode};
pub use reader::{Segment, parse_segment};
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

/// The journal's prefix in a checkpoint store.
const ROOT: &str = "journal";

/// One subtask's segments' prefix in the store.
pub fn subtask_prefix(step: &str, index: u32) -> String {
    format!("{ROOT}/{step}/{index}")
}

/// The name of the segment that starts after checkpoint `after`.
pub fn segment_name(after: u64) -> String {
    format!("after-{after}.jnl")
}

/// The path in the store of one subtask's segment that starts after checkpoint `after`.
pub fn segment_path(step: &str, index: u32, after: u64) -> String {
    format!("{}/{}", subtask_prefix(step, index), segment_name(after))
}

/// The checkpoint a segment's name (or path) says it starts after.
fn segment_id(path: &str) -> Option<u64> {
    path.rsplit('/').next()?.strip_prefix("after-")?.strip_suffix(".jnl")?.parse().ok()
}

/// A segment as listed in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSegment {
    /// The checkpoint it starts after.
    pub after: u64,
    /// Its path in the store.
    pub path: String,
    /// Its size.
    pub bytes: u64,
}

/// One subtask's segments in `store`, by the checkpoint each starts after, ascending.
pub fn segments(store: &CheckpointStore, step: &str, index: u32) -> Result<Vec<StoredSegment>, CheckpointError> {
    let mut found: Vec<StoredSegment> = store
        .list(&subtask_prefix(step, index))?
        .into_iter()
        .filter_map(|(path, bytes)| Some(StoredSegment { after: segment_id(&path)?, path, bytes }))
        .collect();
    found.sort_by_key(|s| s.after);
    Ok(found)
}

/// Deletes every segment in `store` that starts before checkpoint `oldest_retained`: no
/// retained checkpoint's state comes before it, so nothing can replay it. Returns how many.
pub fn prune(store: &CheckpointStore, oldest_retained: u64) -> Result<usize, CheckpointError> {
    let mut deleted = 0;
    for (path, _) in store.list(ROOT)? {
        if segment_id(&path).is_some_and(|id| id < oldest_retained) {
            store.delete(&path)?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_the_segments_of_retained_checkpoints_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::local(dir.path()).unwrap();
        assert_eq!(prune(&store, 9).unwrap(), 0, "no journal is nothing to prune");
        for (step, index) in [("count", 0), ("count", 1), ("window", 0)] {
            let prefix = subtask_prefix(step, index);
            for after in [0, 3, 4, 7] {
                store.put(&format!("{prefix}/{}", segment_name(after)), vec![0; after as usize]).unwrap();
            }
            store.put(&format!("{prefix}/notes.txt"), Vec::new()).unwrap();
        }
        store.put("chk-3/_metadata", Vec::new()).unwrap();
        assert_eq!(prune(&store, 4).unwrap(), 6);
        for (step, index) in [("count", 0), ("count", 1), ("window", 0)] {
            let left: Vec<(u64, u64)> =
                segments(&store, step, index).unwrap().iter().map(|s| (s.after, s.bytes)).collect();
            assert_eq!(left, [(4, 4), (7, 7)]);
            assert!(store.exists(&format!("{}/notes.txt", subtask_prefix(step, index))).unwrap(), "only segments go");
        }
        assert!(store.exists("chk-3/_metadata").unwrap(), "checkpoints are not the journal's to prune");
        assert!(segments(&store, "count", 5).unwrap().is_empty(), "a subtask that journaled nothing has no segment");
    }
}
