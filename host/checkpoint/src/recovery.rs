//! Choosing what a starting job restores from and what it keeps: the newest checkpoint that
//! passes its checks, the older valid ones to retain beside it, and the next checkpoint id.
//!
//! Two kinds of failure are told apart, because mistaking one for the other loses data:
//! - a checkpoint that is *damaged* ([`CheckpointError::Corrupt`]: missing file, wrong size or
//!   checksum, unparsable metadata) is passed over for the one before it;
//! - a checkpoint that *could not be read* ([`CheckpointError::Storage`]: permission denied, a
//!   store that is down) may be perfectly fine: reading is retried, then the start fails with
//!   the cause, and nothing is deleted.
//!
//! A checkpoint of another pipeline, or taken with another `max_parallelism` (the number of key
//! groups state is split into), is refused outright: restoring it would silently orphan state.

use std::time::Duration;

use crate::metadata::{CheckpointMetadata, checkpoint_dirs};
use crate::restore::{RestorePoint, Skipped};
use crate::store::CheckpointStore;
use crate::{CheckpointError, CheckpointId};

/// What a checkpoint must match to be restored into the job being started.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The pipeline's name; `None` for a savepoint, which may seed another pipeline.
    pub job: Option<&'a str>,
    /// The pipeline's `max_parallelism`.
    pub max_parallelism: u32,
}

impl Expected<'_> {
    fn check(&self, meta: &CheckpointMetadata, store: &CheckpointStore) -> Result<(), CheckpointError> {
        if let Some(job) = self.job
            && meta.job != job
        {
            return Err(CheckpointError::Incompatible(format!(
                "checkpoint {} in {} belongs to pipeline `{}`, not `{job}`; give each pipeline its own checkpoint \
                 location",
                meta.id,
                store.describe(),
                meta.job
            )));
        }
        if let Some(recorded) = meta.max_parallelism
            && recorded != self.max_parallelism
        {
            return Err(CheckpointError::Incompatible(format!(
                "checkpoint {} in {} was taken with max_parallelism {recorded} and the pipeline now says {}; keyed \
                 state is split into max_parallelism key groups, which cannot change across a restore. Set \
                 max_parallelism back to {recorded}, or start fresh with an empty checkpoint location and sink \
                 output",
                meta.id,
                store.describe(),
                self.max_parallelism
            )));
        }
        Ok(())
    }
}

/// How often and how patiently a read that failed for want of access is tried again.
#[derive(Debug, Clone)]
pub struct ReadRetry {
    /// Waits between attempts; one attempt more than there are waits.
    pub backoff: Vec<Duration>,
}

impl Default for ReadRetry {
    fn default() -> Self {
        Self { backoff: vec![Duration::from_millis(100), Duration::from_millis(300), Duration::from_millis(900)] }
    }
}

impl ReadRetry {
    /// `read`, tried again after each wait while it fails with [`CheckpointError::Storage`].
    fn run<T>(&self, mut read: impl FnMut() -> Result<T, CheckpointError>) -> Result<T, CheckpointError> {
        let mut waits = self.backoff.iter();
        loop {
            match read() {
                Err(e @ CheckpointError::Storage { .. }) => match waits.next() {
                    Some(wait) => {
                        tracing::warn!(error = %e, "reading checkpoints failed; trying again");
                        std::thread::sleep(*wait);
                    }
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }
}

/// What a start found in a checkpoint store.
#[derive(Debug)]
pub struct Recovered {
    /// The newest checkpoint that passed every check, fetched.
    pub point: Option<RestorePoint>,
    /// Older checkpoints that passed their checks, newest first, kept beside `point` so that
    /// `retained` means the same after a restart as before it.
    pub older: Vec<CheckpointMetadata>,
    /// Newer checkpoints passed over as damaged, with the reason.
    pub skipped: Skipped,
    /// Past every checkpoint directory in the store: ids are never reused, so a new checkpoint
    /// never writes into a damaged one's directory.
    pub next_id: CheckpointId,
}

impl Recovered {
    /// The older checkpoints and the restored one, oldest first (the order in which the
    /// checkpoint thread retires them).
    pub fn retained(&self) -> Vec<CheckpointMetadata> {
        self.older.iter().rev().cloned().chain(self.point.iter().map(|p| p.metadata().clone())).collect()
    }
}

/// The id after every checkpoint directory in `store` (1 in an empty one).
pub fn next_id(store: &CheckpointStore, retry: &ReadRetry) -> Result<CheckpointId, CheckpointError> {
    let listing = retry.run(|| store.list(""))?;
    Ok(checkpoint_dirs(&listing).max().map_or(1, |id| id.saturating_add(1)))
}

/// Finds the newest checkpoint in `store` that passes its checks and matches `expected`
/// (fetched into a directory under `local`), and up to `retained - 1` older valid ones. Damaged checkpoints are skipped; any other failure
/// (after `retry`) or a mismatch is the error.
pub fn recover(
    store: &CheckpointStore,
    expected: Expected<'_>,
    retained: usize,
    retry: &ReadRetry,
    local: &std::path::Path,
) -> Result<Recovered, CheckpointError> {
    let listing = retry.run(|| store.list(""))?;
    let next_id = checkpoint_dirs(&listing).max().map_or(1, |id| id.saturating_add(1));
    let mut ids: Vec<CheckpointId> = listing
        .iter()
        .filter_map(|(path, _)| path.strip_prefix("chk-")?.strip_suffix("/_metadata")?.parse().ok())
        .collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    let verified = |id: CheckpointId| {
        retry.run(|| {
            let meta = CheckpointMetadata::read_verified(store, id)?;
            expected.check(&meta, store)?;
            Ok(meta)
        })
    };
    let mut skipped = Vec::new();
    let mut candidates = ids.into_iter();
    let mut point = None;
    for id in candidates.by_ref() {
        match verified(id).and_then(|meta| retry.run(|| RestorePoint::fetch(store, meta.clone(), local))) {
            Ok(found) => {
                point = Some(found);
                break;
            }
            Err(e @ CheckpointError::Corrupt { .. }) => skipped.push((id, e)),
            Err(e) => return Err(e),
        }
    }
    let mut older = Vec::new();
    if point.is_some() {
        for id in candidates {
            if older.len() + 1 >= retained {
                break;
            }
            match verified(id) {
                Ok(meta) => older.push(meta),
                Err(CheckpointError::Corrupt { file, problem }) => {
                    tracing::warn!(checkpoint = id, %file, %problem, "older checkpoint damaged; not retained");
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(Recovered { point, older, skipped, next_id })
}
