//! Per-tenant quotas, checked at admission: a request that would take a tenant past one is
//! refused with 403 naming the quota (`quotas.<name>`), its limit and the usage, so the
//! tenant knows what to free or whom to ask.
//!
//! Each quota counts what it protects. A job's *demand* ([`Demand::of`]) is what it can make
//! the server hold at most: its slots; the disk its RocksDB state may fill; and the memory its
//! operator instances, its heap state (which is memory: the heap backend counts what its
//! entries occupy, and a snapshot in flight and emptied leaves can make that up to about 3x,
//! [`eddy_state::heap_memory_bound_bytes`]), its RocksDB caches and the host's entry caches
//! (a window step's write-back buffer, the lengths beside RocksDB) may take. The same memory
//! is also charged to the server's budget ([`crate::supervisor::Supervisor`]), so tenants
//! together cannot take more than the machine has.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use eddy_plan::{PipelineSpec, StateBackendKind};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::{AdminCaller, TenantCaller};
use crate::model::{Artifact, JobRecord, Tenant};
use crate::problem::{ApiError, ApiResult, Checked, Problem};
use crate::store::Table;

/// What one tenant may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Jobs not yet ended (created, running, restarting, held).
    pub jobs: u32,
    /// Job records kept, ended ones included (delete ended jobs to free them).
    pub job_records: u32,
    /// Slots its running jobs hold.
    pub slots: u32,
    /// Bytes of all its artifacts.
    pub artifact_bytes: u64,
    /// Files in its files area.
    pub files: u32,
    /// Bytes of its files.
    pub file_bytes: u64,
    /// The disk its running jobs' RocksDB state may fill: per RocksDB step, its state limit
    /// times its parallelism, summed.
    pub state_bytes: u64,
    /// Bytes its jobs' checkpoints and savepoints occupy in the store, as listed there
    /// (measured every 30 s): past it no job starts, and its largest running job fails.
    pub checkpoint_bytes: u64,
    /// Savepoints kept over all its jobs (delete old ones to take new ones).
    pub savepoints: u32,
    /// Its share of the CPU, in thousandths of a core, over all its operators: calls wait
    /// when they used more (see `eddy_runtime::CpuShare`), and so does a restart.
    pub cpu_millicores: u32,
    /// Linear memory one operator instance may grow to (it traps beyond).
    pub instance_memory_bytes: u64,
    /// The memory its running jobs may make the server hold: `instance_memory_bytes` per
    /// instance (one per step and subtask), its heap state, and RocksDB caches.
    pub memory_bytes: u64,
}

impl Default for Quotas {
    /// Defaults under which every example of the repository runs (tested), on one machine of
    /// a few cores and GiB.
    fn default() -> Self {
        // All cores: a tenant is throttled only once the admin sets a share.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            jobs: 8,
            job_records: 256,
            slots: 8,
            artifact_bytes: 1 << 30,
            files: 1_000,
            file_bytes: 16 << 30,
            state_bytes: 64 << 30,
            checkpoint_bytes: 64 << 30,
            savepoints: 64,
            cpu_millicores: u32::try_from(cores * 1000).unwrap_or(u32::MAX),
            instance_memory_bytes: 256 << 20,
            memory_bytes: 8 << 30,
        }
    }
}

/// What a tenant holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    /// See [`Quotas::jobs`].
    pub jobs: u32,
    /// See [`Quotas::job_records`].
    pub job_records: u32,
    /// See [`Quotas::slots`].
    pub slots: u32,
    /// See [`Quotas::artifact_bytes`].
    pub artifact_bytes: u64,
    /// See [`Quotas::files`].
    pub files: u32,
    /// See [`Quotas::file_bytes`].
    pub file_bytes: u64,
    /// See [`Quotas::state_bytes`].
    pub state_bytes: u64,
    /// See [`Quotas::checkpoint_bytes`].
    pub checkpoint_bytes: u64,
    /// See [`Quotas::savepoints`].
    pub savepoints: u32,
    /// See [`Quotas::memory_bytes`].
    pub memory_bytes: u64,
}

/// A tenant's quotas beside its usage.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaReport {
    /// The limits.
    pub quotas: Quotas,
    /// The usage.
    pub usage: Usage,
}

/// What a job can make the server hold at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// Slots (its widest task).
    pub slots: u32,
    /// Disk its RocksDB state may fill.
    pub state_bytes: u64,
    /// Memory: instances, heap state, RocksDB caches.
    pub memory_bytes: u64,
}

impl Demand {
    /// The demand of `spec` (placed) under a per-instance memory cap of `instance_memory`.
    pub fn of(spec: &PipelineSpec, instance_memory: u64) -> Self {
        let (mut state_bytes, mut memory_bytes) = (0u64, 0u64);
        for (i, step) in spec.steps.iter().enumerate() {
            let parallelism = u64::from(spec.step_parallelism(i));
            let limit = spec.state.max_bytes_for(step);
            let on_disk = spec.state.backend == StateBackendKind::Rocksdb;
            let per_subtask = match spec.state.backend {
                // The memory the heap backend's count can stand for, a checkpoint's snapshot and
                // emptied leaves included (see `eddy_state::heap_memory_bound_bytes`).
                StateBackendKind::Heap => eddy_state::heap_memory_bound_bytes(limit),
                StateBackendKind::Rocksdb => {
                    state_bytes = state_bytes.saturating_add(limit.saturating_mul(parallelism));
                    let caches = spec.state.block_cache_mb.saturating_add(spec.state.write_buffer_mb.saturating_mul(2));
                    u64::try_from(caches).unwrap_or(u64::MAX).saturating_mul(1 << 20)
                }
            };
            let host_caches = eddy_state::entry_caches_bytes(on_disk, step.window.is_some()) as u64;
            let instance = per_subtask.saturating_add(host_caches).saturating_add(instance_memory);
            memory_bytes = memory_bytes.saturating_add(instance.saturating_mul(parallelism));
        }
        // A two-phase window's first phase: one more instance in each subtask of a chain in
        // front of it.
        let first_phases: u64 = eddy_plan::PhysicalPlan::new(spec)
            .tasks
            .iter()
            .filter(|t| t.first_phase.is_some())
            .map(|t| u64::from(t.parallelism))
            .sum();
        memory_bytes = memory_bytes.saturating_add(instance_memory.saturating_mul(first_phases));
        Self { slots: crate::supervisor::slots_of(spec), state_bytes, memory_bytes }
    }
}

/// The tenant's quotas (the server's defaults unless the admin set them).
pub fn of(state: &AppState, tenant: &str) -> ApiResult<Quotas> {
    let t: Option<Tenant> = state.store.get(Table::Tenants, tenant)?;
    Ok(t.and_then(|t| t.quotas).unwrap_or(state.config.default_quotas))
}

/// What the tenant holds now (reads its own records only). Blocking.
pub fn usage(state: &AppState, tenant: &str) -> ApiResult<Usage> {
    let mut usage = Usage::default();
    let jobs: Vec<JobRecord> = state.store.list(Table::Jobs, &format!("{tenant}/"))?;
    usage.job_records = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
    for job in &jobs {
        usage.savepoints = usage.savepoints.saturating_add(u32::try_from(job.savepoints.len()).unwrap_or(u32::MAX));
        usage.checkpoint_bytes = usage.checkpoint_bytes.saturating_add(state.supervisor.stored_bytes(&job.key()));
        if job.status.is_terminal() {
            continue;
        }
        usage.jobs += 1;
        if job.status.is_active() {
            usage.slots = usage.slots.saturating_add(job.slots);
            usage.state_bytes = usage.state_bytes.saturating_add(job.state_bytes);
            usage.memory_bytes = usage.memory_bytes.saturating_add(job.memory_bytes);
        }
    }
    let artifacts: Vec<Artifact> = state.store.list(Table::Artifacts, &format!("{tenant}/"))?;
    usage.artifact_bytes = artifacts.iter().map(|a| a.size).sum();
    let (files, file_bytes) = crate::files::usage(state, tenant)?;
    usage.files = files;
    usage.file_bytes = file_bytes;
    Ok(usage)
}

fn exceeded(name: &str, limit: u64, used: u64, adding: u64) -> ApiError {
    ApiError::forbidden(format!(
        "quota `{name}` exceeded: {used} in use + {adding} asked > {limit}; free some (cancel, stop or delete \
         jobs, delete savepoints, files or artifacts) or ask the admin to raise it"
    ))
    .at(format!("quotas.{name}"))
}

fn check(name: &str, limit: u64, used: u64, adding: u64) -> ApiResult<()> {
    if used.saturating_add(adding) > limit { Err(exceeded(name, limit, used, adding)) } else { Ok(()) }
}

/// Refuses a new job of `demand`, or lets it in. `growth`: the job already runs and `demand`
/// is what it takes beyond what it holds (a rescale, an upgrade).
pub fn admit(state: &AppState, tenant: &str, demand: Demand, growth: bool) -> ApiResult<()> {
    let (q, u) = (of(state, tenant)?, usage(state, tenant)?);
    if !growth {
        check("jobs", q.jobs.into(), u.jobs.into(), 1)?;
        check("job_records", q.job_records.into(), u.job_records.into(), 1)?;
    }
    check("slots", q.slots.into(), u.slots.into(), demand.slots.into())?;
    check("state_bytes", q.state_bytes, u.state_bytes, demand.state_bytes)?;
    check("memory_bytes", q.memory_bytes, u.memory_bytes, demand.memory_bytes)?;
    check("checkpoint_bytes", q.checkpoint_bytes, u.checkpoint_bytes, 0)?;
    Ok(())
}

/// What `to` takes beyond `from` (a running job's change), never negative.
pub fn growth(from: &JobRecord, to: Demand) -> Demand {
    Demand {
        slots: to.slots.saturating_sub(from.slots),
        state_bytes: to.state_bytes.saturating_sub(from.state_bytes),
        memory_bytes: to.memory_bytes.saturating_sub(from.memory_bytes),
    }
}

/// Refuses an artifact of `size` bytes, or lets it in.
pub fn admit_artifact(state: &AppState, tenant: &str, size: u64) -> ApiResult<()> {
    let (q, u) = (of(state, tenant)?, usage(state, tenant)?);
    check("artifact_bytes", q.artifact_bytes, u.artifact_bytes, size)
}

/// Refuses a file of `size` bytes replacing one of `replacing` bytes (0: a new file).
pub fn admit_file(state: &AppState, tenant: &str, size: u64, replacing: Option<u64>) -> ApiResult<()> {
    let (q, u) = (of(state, tenant)?, usage(state, tenant)?);
    if replacing.is_none() {
        check("files", q.files.into(), u.files.into(), 1)?;
    }
    check("file_bytes", q.file_bytes, u.file_bytes.saturating_sub(replacing.unwrap_or(0)), size)
}

/// Refuses one more savepoint, or lets it be taken.
pub fn admit_savepoint(state: &AppState, tenant: &str) -> ApiResult<()> {
    let (q, u) = (of(state, tenant)?, usage(state, tenant)?);
    check("savepoints", q.savepoints.into(), u.savepoints.into(), 1)?;
    check("checkpoint_bytes", q.checkpoint_bytes, u.checkpoint_bytes, 0)
}

/// The caller's quotas and usage.
#[utoipa::path(get, path = "/v1/quotas", tag = "tenants",
    responses((status = 200, body = QuotaReport), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn show(State(state): State<Arc<AppState>>, caller: TenantCaller) -> ApiResult<Json<QuotaReport>> {
    let report = crate::blocking(move || {
        Ok(QuotaReport { quotas: of(&state, &caller.tenant)?, usage: usage(&state, &caller.tenant)? })
    })
    .await?;
    Ok(Json(report))
}

/// Sets a tenant's quotas (admin only); fields left out take the server's defaults.
#[utoipa::path(put, path = "/v1/tenants/{id}/quotas", tag = "tenants", request_body = Quotas,
    params(("id" = String, Path, description = "The tenant's id")),
    responses((status = 200, body = QuotaReport), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn set(
    State(state): State<Arc<AppState>>,
    _admin: AdminCaller,
    Path(id): Path<String>,
    Checked(Json(quotas)): Checked<Json<Quotas>>,
) -> ApiResult<Json<QuotaReport>> {
    let report = crate::blocking(move || {
        state.store.write(|txn| -> ApiResult<()> {
            let mut tenant: Tenant = txn.get(Table::Tenants, &id)?.ok_or_else(|| ApiError::not_found("tenant", &id))?;
            tenant.quotas = Some(quotas);
            Ok(txn.put(Table::Tenants, &id, &tenant)?)
        })?;
        tracing::info!(tenant = %id, ?quotas, "quotas set");
        Ok(QuotaReport { quotas, usage: usage(&state, &id)? })
    })
    .await?;
    Ok(Json(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> PipelineSpec {
        PipelineSpec::parse(yaml).expect("a spec")
    }

    #[test]
    fn a_jobs_demand_counts_instances_heap_state_twice_and_rocksdb_and_host_caches_as_memory() {
        let heap = spec(
            "name: a\nparallelism: 2\nsources: [{type: generator, name: g}]\nsteps:\n  - {name: s, wasm: x}\n  - {name: \
             c, wasm: y, key_by: key, state_max_bytes: 1000}\n  - {name: w, wasm: z, key_by: key, window: {type: \
             tumbling, size_ms: 10}}\nstate: {max_bytes_per_subtask: 100}\nsink: {type: print}\n",
        );
        let d = Demand::of(&heap, 10);
        // Step s: 100 B of state, step c: 1000 B, step w: 100 B and its write-back buffer of 8
        // MiB, each at parallelism 2, each as the memory the heap backend's count stands for;
        // six instances of 10 B.
        let bound = eddy_state::heap_memory_bound_bytes;
        let windows = 2 * ((8 << 20) + bound(100) + 10);
        assert_eq!(
            d,
            Demand { slots: 2, state_bytes: 0, memory_bytes: 2 * (bound(100) + 10) + 2 * (bound(1000) + 10) + windows }
        );
        assert!(bound(1000) >= 3000, "a snapshot doubles heap state, emptied leaves add half: {}", bound(1000));
        let rocks = spec(
            "name: a\nsources: [{type: generator, name: g}]\nsteps:\n  - {name: s, wasm: x, parallelism: 3}\nstate: \
             {backend: rocksdb, max_bytes_per_subtask: 5, block_cache_mb: 8, write_buffer_mb: 4}\nsink: {type: print}\n",
        );
        let d = Demand::of(&rocks, 0);
        // RocksDB's caches, and beside it the host's lengths (4 MiB) and write-back buffer of
        // keyed state (4 MiB); no window.
        assert_eq!(d, Demand { slots: 3, state_bytes: 15, memory_bytes: 3 * ((16 << 20) + (4 << 20) + (4 << 20)) });
        // A two-phase window's first phase is one more instance per upstream subtask: the
        // three source readers, or step s's two subtasks when s comes first.
        let with = |first: &str, two_phase: bool| {
            let yaml = format!(
                "name: a\nparallelism: 2\nsources: [{{type: generator, name: g, parallelism: 3}}]\nsteps:\n{first}  - \
                 {{name: w, wasm: z, key_by: key, window: {{type: tumbling, size_ms: 10, two_phase: {two_phase}, \
                 drop_late: true}}}}\nsink: {{type: print}}\n"
            );
            Demand::of(&spec(&yaml), 10).memory_bytes
        };
        assert_eq!(with("", true) - with("", false), 3 * 10);
        let s = "  - {name: s, wasm: x}\n";
        assert_eq!(with(s, true) - with(s, false), 2 * 10);
    }
}
