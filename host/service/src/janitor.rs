//! What the service collects and measures in the background, so nothing a tenant stores
//! grows without a bound:
//! - every [`ServiceConfig::housekeeping_interval`](crate::ServiceConfig) it lists each job's
//!   checkpoints and savepoints in the store and records their bytes (the `checkpoint_bytes`
//!   quota counts these listed bytes, not a job's own report of them); a tenant past its
//!   quota has its largest running job failed, naming the quota;
//! - ended jobs past the retention ([`ServiceConfig::ended_job_retention`](crate::ServiceConfig))
//!   are deleted with their output, checkpoints and savepoints;
//! - a job's checkpoint generations before its current one are deleted once the current one
//!   completed a checkpoint (a rescale or upgrade left them behind).
//!
//! Deleting removes the files first and the record last: a crash in between leaves a record
//! whose deletion can be asked again, never files that no record names.

use std::collections::HashMap;
use std::time::Duration;

use eddy_checkpoint::CheckpointStore;

use crate::AppState;
use crate::model::{JobRecord, now_ms};
use crate::placement::{StoreLocation, job_checkpoints, job_dir, job_store};
use crate::problem::{ApiError, ApiResult, identifier};
use crate::store::Table;

/// Deletes every object under `location` (a job's store, or a part of it).
fn delete_all(location: &StoreLocation) -> Result<(), String> {
    let store = CheckpointStore::at(location).map_err(|e| e.to_string())?;
    for (path, _) in store.list("").map_err(|e| e.to_string())? {
        store.delete(&path).map_err(|e| e.to_string())?;
    }
    store.prune_empty_dirs();
    if let StoreLocation::Dir(dir) = location {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

/// Deletes an ended job: its files (local directory, and its checkpoints, savepoints and
/// output in the store), then its record and spec. Blocking.
pub fn delete_job(state: &AppState, job: &JobRecord) -> ApiResult<()> {
    let unavailable =
        |e: String| ApiError::unavailable(format!("cannot delete job {}'s files now ({e}); try again", job.id));
    delete_all(&job_store(state, &job.tenant, &job.id)).map_err(unavailable)?;
    let dir = job_dir(state, &job.tenant, &job.id);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(unavailable(e.to_string())),
    }
    let key = job.key();
    state.store.write(|txn| -> Result<(), crate::store::StoreError> {
        txn.delete(Table::Jobs, &key)?;
        txn.delete(Table::JobSpecs, &key)?;
        Ok(())
    })?;
    Ok(())
}

/// Deletes savepoint `name` of `job` (the last part of its path). Refused while the job's
/// current generation would start from it. Blocking.
pub fn delete_savepoint(state: &AppState, job: &JobRecord, name: &str) -> ApiResult<()> {
    identifier("name", name, false, b"-_.")?;
    let path = format!("savepoints/{name}");
    if !job.savepoints.iter().any(|s| s.path == path) {
        return Err(ApiError::not_found("savepoint", name));
    }
    if job.restore_from.as_deref() == Some(path.as_str())
        && !job.status.is_terminal()
        && !has_own_checkpoint(state, job)
    {
        return Err(ApiError::conflict(format!(
            "job {} starts from savepoint {name} until it completes a checkpoint of its own; try again then",
            job.id
        )));
    }
    let location = job_store(state, &job.tenant, &job.id).join(&path);
    delete_all(&location)
        .map_err(|e| ApiError::unavailable(format!("cannot delete savepoint {name} now ({e}); try again")))?;
    state.store.write(|txn| -> ApiResult<()> {
        let Some(mut record) = txn.get::<JobRecord>(Table::Jobs, &job.key())? else { return Ok(()) };
        record.savepoints.retain(|s| s.path != path);
        if record.restore_from.as_deref() == Some(path.as_str()) {
            record.restore_from = None;
        }
        Ok(txn.put(Table::Jobs, &job.key(), &record)?)
    })?;
    tracing::info!(tenant = %job.tenant, job = %job.id, savepoint = name, "savepoint deleted");
    Ok(())
}

/// Whether the job's current generation has a completed checkpoint.
fn has_own_checkpoint(state: &AppState, job: &JobRecord) -> bool {
    let location = job_checkpoints(state, job);
    CheckpointStore::at(&location)
        .and_then(|store| eddy_checkpoint::metadata::completed_ids(&store))
        .is_ok_and(|ids| !ids.is_empty())
}

/// Deletes the checkpoint generations of `job` before its current one, in the background:
/// the current generation has completed a checkpoint, so none of them is restored again.
pub fn collect_old_generations(state: &AppState, job: &JobRecord) {
    let base = job_store(state, &job.tenant, &job.id);
    let (tenant, id, generation) = (job.tenant.clone(), job.id.clone(), job.generation);
    let spawned = std::thread::Builder::new().name(format!("gc-{id}")).spawn(move || {
        for old in 0..generation {
            match delete_all(&base.join(&format!("checkpoints/{old}"))) {
                Ok(()) => tracing::info!(tenant = %tenant, job = %id, generation = old, "deleted a superseded checkpoint generation"),
                Err(e) => tracing::warn!(tenant = %tenant, job = %id, generation = old, error = %e, "cannot delete a superseded checkpoint generation"),
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the collection of old checkpoint generations");
    }
}

/// Bytes of a job's checkpoints and savepoints in the store.
fn stored_bytes(state: &AppState, job: &JobRecord) -> Result<u64, String> {
    let store = CheckpointStore::at(&job_store(state, &job.tenant, &job.id)).map_err(|e| e.to_string())?;
    let mut bytes = 0u64;
    for prefix in ["checkpoints", "savepoints"] {
        bytes = store.list(prefix).map_err(|e| e.to_string())?.iter().fold(bytes, |sum, (_, n)| sum.saturating_add(*n));
    }
    Ok(bytes)
}

/// What one tenant's jobs hold in the store: bytes in all, and each active job with its own.
type TenantStore<'a> = (u64, Vec<(&'a JobRecord, u64)>);

/// One round: measure, enforce, expire.
pub fn sweep(state: &AppState) {
    let jobs: Vec<JobRecord> = match state.store.list(Table::Jobs, "") {
        Ok(jobs) => jobs,
        Err(e) => return tracing::warn!(error = %e, "housekeeping cannot read the jobs"),
    };
    let mut stored = HashMap::new();
    let mut by_tenant: HashMap<&str, TenantStore<'_>> = HashMap::new();
    for job in &jobs {
        let bytes = match stored_bytes(state, job) {
            Ok(bytes) => bytes,
            // Keep the last figure: a store that did not answer has not shrunk.
            Err(_) => state.supervisor.stored_bytes(&job.key()),
        };
        stored.insert(job.key(), bytes);
        let tenant = by_tenant.entry(job.tenant.as_str()).or_default();
        tenant.0 = tenant.0.saturating_add(bytes);
        if job.status.is_active() {
            tenant.1.push((job, bytes));
        }
    }
    state.supervisor.set_stored_bytes(stored);
    for (tenant, (total, running)) in by_tenant {
        let Ok(quotas) = crate::quotas::of(state, tenant) else { continue };
        if total <= quotas.checkpoint_bytes {
            continue;
        }
        let Some((largest, bytes)) = running.into_iter().max_by_key(|(_, bytes)| *bytes) else { continue };
        let Some(live) = state.supervisor.live(&largest.key()) else { continue };
        let reason = format!(
            "quota `checkpoint_bytes` exceeded: your jobs' checkpoints and savepoints take {total} bytes in the store, \
             more than {}; this job, the largest ({bytes} bytes), was stopped. Delete savepoints or ended jobs, or ask \
             the admin to raise the quota",
            quotas.checkpoint_bytes
        );
        tracing::warn!(tenant, job = %largest.id, total, limit = quotas.checkpoint_bytes, "a tenant passed its checkpoint quota");
        live.refuse(reason);
    }
    let retention = i64::try_from(state.config.ended_job_retention.as_millis()).unwrap_or(i64::MAX);
    let now = now_ms();
    for job in jobs.iter().filter(|j| j.status.is_terminal()) {
        let ended = job.ended_ms.unwrap_or(job.updated_ms);
        if now.saturating_sub(ended) < retention {
            continue;
        }
        match delete_job(state, job) {
            Ok(()) => tracing::info!(tenant = %job.tenant, job = %job.id, "deleted an ended job past its retention"),
            Err(e) => {
                tracing::warn!(tenant = %job.tenant, job = %job.id, error = %e.detail, "cannot delete an expired job")
            }
        }
    }
}

/// Runs [`sweep`] every `interval` until the server stops.
pub fn run(state: std::sync::Arc<AppState>, interval: Duration) {
    let spawned = std::thread::Builder::new().name("housekeeping".into()).spawn(move || {
        loop {
            sweep(&state);
            let until = std::time::Instant::now() + interval;
            while std::time::Instant::now() < until {
                if state.supervisor.is_stopping() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100).min(interval));
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start housekeeping");
    }
}
