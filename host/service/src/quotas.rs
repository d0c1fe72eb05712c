//! Per-tenant quotas, checked at admission: a request that would take a tenant past one is
//! refused with 403 naming the quota (`quotas.<name>`), its limit and the usage, so the
//! tenant knows what to free or whom to ask.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use eddy_plan::PipelineSpec;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::Caller;
use crate::model::{Artifact, JobRecord, Tenant};
use crate::problem::{ApiError, ApiResult, Checked, Problem};
use crate::store::Table;

/// What one tenant may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Jobs not yet ended (created, running, restarting).
    pub jobs: u32,
    /// Slots those jobs hold.
    pub slots: u32,
    /// Bytes of all its artifacts.
    pub artifact_bytes: u64,
    /// The state its running jobs may hold: per step, `state_max_bytes` (or the backend's
    /// default) times its parallelism, summed.
    pub state_bytes: u64,
    /// Bytes of its running jobs' newest checkpoints: no new job starts while they exceed this.
    pub checkpoint_bytes: u64,
    /// Its share of the CPU, in thousandths of a core, over all its operators: calls wait
    /// when they used more (see `eddy_runtime::CpuShare`). Applies to jobs started after a
    /// change.
    pub cpu_millicores: u32,
    /// Linear memory one operator instance may grow to (it traps beyond).
    pub instance_memory_bytes: u64,
    /// Linear memory all its running instances may grow to together: each instance counts at
    /// `instance_memory_bytes`, one per step and subtask.
    pub memory_bytes: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        // All cores: a tenant is throttled only once the admin sets a share.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            jobs: 8,
            slots: 8,
            artifact_bytes: 1 << 30,
            state_bytes: 64 << 30,
            checkpoint_bytes: 64 << 30,
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
    /// See [`Quotas::slots`].
    pub slots: u32,
    /// See [`Quotas::artifact_bytes`].
    pub artifact_bytes: u64,
    /// See [`Quotas::state_bytes`].
    pub state_bytes: u64,
    /// See [`Quotas::checkpoint_bytes`].
    pub checkpoint_bytes: u64,
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

/// The state a job may hold at most, by its steps' limits and parallelism.
pub fn state_bytes_of(spec: &PipelineSpec) -> u64 {
    spec.steps
        .iter()
        .enumerate()
        .map(|(i, step)| spec.state.max_bytes_for(step).saturating_mul(u64::from(spec.step_parallelism(i))))
        .fold(0u64, u64::saturating_add)
}

/// Operator instances a job runs: one per step and subtask.
pub fn instances_of(spec: &PipelineSpec) -> u64 {
    (0..spec.steps.len()).map(|i| u64::from(spec.step_parallelism(i))).sum()
}

/// The tenant's quotas (the server's defaults unless the admin set them).
pub fn of(state: &AppState, tenant: &str) -> ApiResult<Quotas> {
    let t: Option<Tenant> = state.store.get(Table::Tenants, tenant)?;
    Ok(t.and_then(|t| t.quotas).unwrap_or(state.config.default_quotas))
}

/// What the tenant holds now.
pub fn usage(state: &AppState, tenant: &str) -> ApiResult<Usage> {
    let mut usage = Usage::default();
    let jobs: Vec<JobRecord> = state.store.list(Table::Jobs, "")?;
    for job in jobs.iter().filter(|j| j.tenant == tenant && !j.status.is_terminal()) {
        usage.jobs += 1;
        usage.slots += job.slots;
        usage.state_bytes = usage.state_bytes.saturating_add(job.state_bytes);
        usage.memory_bytes = usage.memory_bytes.saturating_add(job.memory_bytes);
        let live = state.supervisor.live(&job.id).and_then(|l| l.view());
        let newest = live.and_then(|v| v.checkpoints.last().map(|c| c.full_bytes)).unwrap_or(0);
        usage.checkpoint_bytes = usage.checkpoint_bytes.saturating_add(newest);
    }
    let artifacts: Vec<Artifact> = state.store.list(Table::Artifacts, &format!("{tenant}/"))?;
    usage.artifact_bytes = artifacts.iter().map(|a| a.size).sum();
    Ok(usage)
}

fn exceeded(name: &str, limit: u64, used: u64, adding: u64) -> ApiError {
    ApiError::forbidden(format!(
        "quota `{name}` exceeded: {used} in use + {adding} asked > {limit}; free some (cancel or stop jobs, delete \
         artifacts) or ask the admin to raise it"
    ))
    .at(format!("quotas.{name}"))
}

/// Refuses a job of `slots` slots, `state_bytes` of state and `memory_bytes` of instance
/// memory, or lets it in.
pub fn admit_job(state: &AppState, tenant: &str, slots: u32, state_bytes: u64, memory_bytes: u64) -> ApiResult<()> {
    let (q, u) = (of(state, tenant)?, usage(state, tenant)?);
    if u.jobs + 1 > q.jobs {
        return Err(exceeded("jobs", q.jobs.into(), u.jobs.into(), 1));
    }
    if u.slots + slots > q.slots {
        return Err(exceeded("slots", q.slots.into(), u.slots.into(), slots.into()));
    }
    if u.state_bytes.saturating_add(state_bytes) > q.state_bytes {
        return Err(exceeded("state_bytes", q.state_bytes, u.state_bytes, state_bytes));
    }
    if u.memory_bytes.saturating_add(memory_bytes) > q.memory_bytes {
        return Err(exceeded("memory_bytes", q.memory_bytes, u.memory_bytes, memory_bytes));
    }
    if u.checkpoint_bytes > q.checkpoint_bytes {
        return Err(exceeded("checkpoint_bytes", q.checkpoint_bytes, u.checkpoint_bytes, 0));
    }
    Ok(())
}

/// Refuses a running job's growth from `job`'s slots and memory to those of `spec`, or lets it.
pub fn admit_rescale(state: &AppState, job: &JobRecord, spec: &PipelineSpec) -> ApiResult<()> {
    let (q, u) = (of(state, &job.tenant)?, usage(state, &job.tenant)?);
    let growth = crate::supervisor::slots_of(spec).saturating_sub(job.slots);
    if u.slots + growth > q.slots {
        return Err(exceeded("slots", q.slots.into(), u.slots.into(), growth.into()));
    }
    let memory = memory_of(state, &job.tenant, spec)?.saturating_sub(job.memory_bytes);
    if u.memory_bytes.saturating_add(memory) > q.memory_bytes {
        return Err(exceeded("memory_bytes", q.memory_bytes, u.memory_bytes, memory));
    }
    Ok(())
}

/// The linear memory a job's instances may grow to under the tenant's per-instance quota.
pub fn memory_of(state: &AppState, tenant: &str, spec: &PipelineSpec) -> ApiResult<u64> {
    Ok(instances_of(spec).saturating_mul(of(state, tenant)?.instance_memory_bytes))
}

/// Refuses an artifact of `size` bytes, or lets it in.
pub fn admit_artifact(state: &AppState, tenant: &str, size: u64) -> ApiResult<()> {
    let (q, u) = (of(state, tenant)?, usage(state, tenant)?);
    if u.artifact_bytes.saturating_add(size) > q.artifact_bytes {
        return Err(exceeded("artifact_bytes", q.artifact_bytes, u.artifact_bytes, size));
    }
    Ok(())
}

/// The caller's quotas and usage.
#[utoipa::path(get, path = "/v1/quotas", tag = "tenants",
    responses((status = 200, body = QuotaReport), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn show(State(state): State<Arc<AppState>>, caller: Caller) -> ApiResult<Json<QuotaReport>> {
    let tenant = caller.tenant()?;
    Ok(Json(QuotaReport { quotas: of(&state, tenant)?, usage: usage(&state, tenant)? }))
}

/// Sets a tenant's quotas (admin only); fields left out take the server's defaults.
#[utoipa::path(put, path = "/v1/tenants/{id}/quotas", tag = "tenants", request_body = Quotas,
    params(("id" = String, Path, description = "The tenant's id")),
    responses((status = 200, body = QuotaReport), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn set(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Checked(Json(quotas)): Checked<Json<Quotas>>,
) -> ApiResult<Json<QuotaReport>> {
    caller.admin()?;
    state.store.write(|txn| -> ApiResult<()> {
        let mut tenant: Tenant = txn.get(Table::Tenants, &id)?.ok_or_else(|| ApiError::not_found("tenant", &id))?;
        tenant.quotas = Some(quotas);
        Ok(txn.put(Table::Tenants, &id, &tenant)?)
    })?;
    tracing::info!(tenant = %id, ?quotas, "quotas set");
    Ok(Json(QuotaReport { quotas, usage: usage(&state, &id)? }))
}
