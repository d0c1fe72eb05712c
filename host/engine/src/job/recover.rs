//! What a starting job restores: the shell around [`eddy_checkpoint::recovery`] that opens
//! the spec's checkpoint store, applies a finished job's last commit, refuses to start over when
//! that would emit committed output again, and collects the garbage of earlier runs.

use std::path::Path;
use std::sync::Arc;

use super::{RunError, sink_committer};
use eddy_checkpoint::metadata::{Sweep, collect_garbage};
use eddy_checkpoint::recovery::{self, Expected, ReadRetry};
use eddy_checkpoint::restore::Skipped;
use eddy_checkpoint::store::StoreFaults;
use eddy_checkpoint::{CheckpointError, CheckpointId, CheckpointMetadata, CheckpointStore, RestorePoint};
use eddy_connectors::{FilesSink, OutputDir};
use eddy_plan::{PipelineSpec, StoreLocation};

/// The checkpoint store, the checkpoint to restore from, and the retained checkpoints.
pub(super) struct Recovery {
    pub(super) store: CheckpointStore,
    pub(super) point: Option<RestorePoint>,
    /// Checkpoints kept from before this run (the restored one and older valid ones).
    pub(super) retained: Vec<CheckpointMetadata>,
    /// The first checkpoint id of this run.
    pub(super) next_id: CheckpointId,
}

/// Opens the spec's checkpoint store and picks what to restore: the newest valid checkpoint in
/// it (or in `restore_from`, a savepoint). A finished job's final checkpoint re-commits its sink
/// and stops the start; a store with checkpoints none of which is valid, or a sink with committed
/// output and no checkpoint, stops it too. Then garbage from earlier runs is collected.
///
/// Only the `lead` (the job itself, or the master part of a spread job) commits and collects:
/// another part starting while the master runs must not delete what the master just uploaded.
pub(super) fn recover(
    spec: &PipelineSpec,
    restore_from: Option<&StoreLocation>,
    store_faults: Option<StoreFaults>,
    lead: bool,
    local: &Path,
    files_out: Option<&Arc<dyn OutputDir>>,
) -> Result<Option<Recovery>, RunError> {
    let Some(checkpoints) = &spec.checkpoints else { return Ok(None) };
    let mut store = CheckpointStore::open(checkpoints)?;
    if let Some(faults) = store_faults {
        store = store.with_faults(faults);
    }
    let retry = ReadRetry::default();
    if let Some(location) = restore_from {
        let expected = Expected { job: None, max_parallelism: spec.max_parallelism };
        let savepoint = recovery::recover(&CheckpointStore::at(location)?, expected, 1, &retry, local)?;
        let Some(point) = savepoint.point else {
            let why = savepoint.skipped.first().map(|(id, e)| format!(" (checkpoint {id}: {e})")).unwrap_or_default();
            return Err(RunError::Checkpoint(CheckpointError::Incompatible(format!(
                "no valid savepoint in {location}{why}"
            ))));
        };
        let next_id = recovery::next_id(&store, &retry)?.max(point.id() + 1);
        return Ok(Some(Recovery { store, point: Some(point), retained: Vec::new(), next_id }));
    }
    let expected = Expected { job: Some(&spec.name), max_parallelism: spec.max_parallelism };
    let found = recovery::recover(&store, expected, checkpoints.retained.max(1), &retry, local)?;
    for (id, error) in &found.skipped {
        tracing::warn!(job = %spec.name, checkpoint = id, %error, "checkpoint skipped: it is damaged");
    }
    if let Some(point) = &found.point
        && point.metadata().finished
    {
        for state in point.sink_states().into_iter().filter(|_| lead) {
            sink_committer(&spec.sink, &spec.name, files_out)(state)
                .map_err(|error| RunError::Sink { path: "sink".into(), error })?;
        }
        return Err(RunError::AlreadyFinished { job: spec.name.clone(), id: point.id(), dir: checkpoints.location() });
    }
    if found.point.is_none() {
        refuse_to_start_over(spec, &checkpoints.location(), &found.skipped, files_out)?;
    }
    let retained = found.retained();
    // Files of checkpoints that never completed, or that were superseded.
    if lead {
        collect_garbage(&store, &retained, &std::collections::HashSet::new(), Sweep::Startup)?;
    }
    Ok(Some(Recovery { store, point: found.point, retained, next_id: found.next_id }))
}

/// With nothing to restore, a start from the beginning is right only if nothing was emitted
/// before: no damaged checkpoint (the job ran before) and no committed output.
fn refuse_to_start_over(
    spec: &PipelineSpec,
    checkpoints: &str,
    skipped: &Skipped,
    files_out: Option<&Arc<dyn OutputDir>>,
) -> Result<(), RunError> {
    let mut found = Vec::new();
    if let Some((id, error)) = skipped.first() {
        found.push(format!("{} checkpoint(s) in {checkpoints} are damaged (newest, {id}: {error})", skipped.len()));
    }
    if let Some(out) = files_out {
        let committed =
            FilesSink::committed(out.as_ref()).map_err(|error| RunError::Sink { path: out.describe(), error })?.len();
        if committed > 0 {
            found.push(format!("{committed} committed file(s) in {}", out.describe()));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(RunError::WillNotStartOver { job: spec.name.clone(), found: found.join("; "), checkpoints: checkpoints.into() })
}
