//! Savepoints: user-owned copies of a completed checkpoint, self-contained (shared files
//! included) in the same layout, so a savepoint directory is itself a checkpoint store that a
//! job can restore from — with a new version of an operator's `.wasm` or another parallelism:
//! state follows step names and key groups.

use super::metadata::CheckpointMetadata;
use super::store::CheckpointStore;
use super::{CheckpointError, CheckpointId};
use crate::checkpoint::restore::RestorePoint;

/// Copies checkpoint `meta` from `from` to `to`: every file it references, then its metadata
/// (last, so a torn copy is never taken for a savepoint).
pub fn copy_checkpoint(
    from: &CheckpointStore,
    meta: &CheckpointMetadata,
    to: &CheckpointStore,
) -> Result<CheckpointId, CheckpointError> {
    for file in meta.files() {
        let bytes = from.get(&file.path)?;
        if bytes.len() as u64 != file.bytes || crc32fast::hash(&bytes) != file.crc32 {
            return Err(CheckpointError::Corrupt {
                file: file.path.clone(),
                problem: "size or checksum differs from the checkpoint's record".into(),
            });
        }
        to.put(&file.path, bytes)?;
    }
    meta.write(to)?;
    Ok(meta.id)
}

/// Copies the newest valid checkpoint of `from` into `to` (a running job keeps checkpointing
/// meanwhile; a copy that loses a race with garbage collection is retried once).
pub fn savepoint_from_latest(from: &CheckpointStore, to: &CheckpointStore) -> Result<CheckpointId, CheckpointError> {
    let mut last_error = None;
    for _ in 0..2 {
        let (point, _) = RestorePoint::latest(from)?;
        let Some(point) = point else {
            return Err(CheckpointError::Incompatible(format!("no completed checkpoint in {}", from.describe())));
        };
        match copy_checkpoint(from, point.metadata(), to) {
            Ok(id) => return Ok(id),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| CheckpointError::Incompatible("savepoint copy failed".into())))
}
