//! Savepoints: user-owned copies of a completed checkpoint, self-contained (shared files
//! included) in the same layout, so a savepoint directory is itself a checkpoint store that a
//! job can restore from — with a new version of an operator's `.wasm` or another parallelism:
//! state follows step names and key groups.

use crate::metadata::{CheckpointMetadata, completed_ids};
use crate::restore::{Skipped, fetch_verified};
use crate::store::CheckpointStore;
use crate::{CheckpointError, CheckpointId};

/// Copies checkpoint `meta` from `from` to `to`: every file it references, each checked against
/// its recorded size and checksum as it goes, then its metadata (last, so a torn copy is never
/// taken for a savepoint). A damaged file stops the copy and removes the files it added (not
/// those `to` held already: another savepoint there may share them).
pub fn copy_checkpoint(
    from: &CheckpointStore,
    meta: &CheckpointMetadata,
    to: &CheckpointStore,
) -> Result<CheckpointId, CheckpointError> {
    let present: std::collections::HashSet<String> = to.list("")?.into_iter().map(|(path, _)| path).collect();
    let mut added = Vec::new();
    let copied = meta.files().try_for_each(|file| {
        let bytes = fetch_verified(from, file)?;
        to.put(&file.path, bytes)?;
        if !present.contains(&file.path) {
            added.push(file.path.as_str());
        }
        Ok(())
    });
    if let Err(e) = copied.and_then(|()| meta.write(to)) {
        for path in added {
            let _ = to.delete(path);
        }
        return Err(e);
    }
    Ok(meta.id)
}

/// Copies the newest intact checkpoint of `from` into `to`, reading each file once and keeping
/// nothing locally. A damaged checkpoint is passed over for the next older one, as a restore
/// does, and returned with the reason. The store is listed a second time if no checkpoint
/// could be copied: a running job keeps checkpointing meanwhile, and its garbage collection
/// may delete the one being copied once a newer one completes.
pub fn savepoint_from_latest(
    from: &CheckpointStore,
    to: &CheckpointStore,
) -> Result<(CheckpointId, Skipped), CheckpointError> {
    let mut skipped = Skipped::new();
    for _ in 0..2 {
        for id in completed_ids(from)? {
            match CheckpointMetadata::read_verified(from, id).and_then(|meta| copy_checkpoint(from, &meta, to)) {
                Ok(id) => return Ok((id, skipped)),
                Err(e @ CheckpointError::Corrupt { .. }) => skipped.push((id, e)),
                Err(e) => return Err(e),
            }
        }
    }
    let reasons: Vec<String> = skipped.iter().map(|(id, e)| format!("checkpoint {id}: {e}")).collect();
    Err(CheckpointError::Incompatible(if reasons.is_empty() {
        format!("no completed checkpoint in {}", from.describe())
    } else {
        format!("no intact checkpoint in {} ({})", from.describe(), reasons.join("; "))
    }))
}
