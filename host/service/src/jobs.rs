//! `/v1/jobs`: submit a pipeline, watch it, cancel it, read its committed output.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::artifacts::resolve;
use crate::auth::Caller;
use crate::model::{Failure, JobRecord, JobStatus, Overrides, Savepoint, now_ms};
use crate::placement::{self, output_dir, place};
use crate::problem::{ApiError, ApiResult, Checked, Problem};
use crate::quotas;
use crate::secret::new_id;
use crate::store::Table;
use crate::supervisor::{Control, LiveView, slots_of};

/// Largest pipeline spec accepted.
pub const MAX_SPEC_BYTES: usize = 1 << 20;

/// `POST /v1/jobs` answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    /// The job's id.
    pub id: String,
    /// Slots it holds.
    pub slots: u32,
}

/// A job as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    /// Its id.
    pub id: String,
    /// The pipeline's name.
    pub name: String,
    /// Where it is.
    pub status: JobStatus,
    /// The digests of its steps' artifacts, in step order.
    pub artifacts: Vec<String>,
    /// Slots it holds while it runs.
    pub slots: u32,
    /// Restarts after failures.
    pub restarts: u32,
    /// The newest failures, oldest first.
    pub failures: Vec<Failure>,
    /// Submitted at (ms since the epoch).
    pub created_ms: i64,
    /// Last change of status.
    pub updated_ms: i64,
    /// The physical plan as `eddy plan` prints it: tasks (chains), subtasks, key groups and
    /// exchanges.
    pub plan: String,
    /// Every step's parallelism since a rescale.
    pub parallelism: Option<u32>,
    /// Restarts from a savepoint so far (rescales, upgrades, server shutdowns).
    pub generation: u32,
    /// Savepoints taken, oldest first.
    pub savepoints: Vec<Savepoint>,
    /// Metrics and checkpoints of the running attempt (absent when it does not run).
    pub live: Option<LiveView>,
}

/// One line of `GET /v1/jobs`.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobSummary {
    /// Its id.
    pub id: String,
    /// The pipeline's name.
    pub name: String,
    /// Where it is.
    pub status: JobStatus,
    /// Submitted at.
    pub created_ms: i64,
}

fn spec_text(headers: &HeaderMap, body: &[u8]) -> Result<String, ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let known = ["application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "application/json"];
    if !known.contains(&media.as_str()) {
        return Err(ApiError::unsupported_media(format!(
            "send the pipeline as YAML (`Content-Type: application/yaml`) or JSON (`application/json`), not `{content_type}`"
        ))
        .at("Content-Type"));
    }
    if body.len() > MAX_SPEC_BYTES {
        return Err(ApiError::too_large(format!("a pipeline spec may have at most {MAX_SPEC_BYTES} bytes")));
    }
    String::from_utf8(body.to_vec()).map_err(|_| ApiError::bad_request("the pipeline spec is not UTF-8").at("body"))
}

fn owned(state: &AppState, tenant: &str, id: &str) -> ApiResult<JobRecord> {
    match state.store.get::<JobRecord>(Table::Jobs, id)? {
        Some(job) if job.tenant == tenant => Ok(job),
        // Another tenant's job looks exactly like a missing one.
        _ => Err(ApiError::not_found("job", id)),
    }
}

/// Submits a pipeline whose steps name uploaded artifacts (`sha256:<hex>` or `name@version`).
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    request_body(content = String, content_type = "application/yaml", description = "The pipeline spec, YAML or JSON"),
    responses((status = 201, body = Submitted), (status = 401, body = Problem), (status = 409, body = Problem),
        (status = 413, body = Problem), (status = 415, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn submit(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    Checked(body): Checked<axum::body::Bytes>,
) -> ApiResult<(StatusCode, Json<Submitted>)> {
    let tenant = caller.tenant()?.to_string();
    let text = spec_text(&headers, &body)?;
    let id = new_id("j_")?;
    let record = JobRecord {
        id: id.clone(),
        tenant: tenant.clone(),
        name: String::new(),
        spec: text,
        artifacts: Vec::new(),
        slots: 0,
        state_bytes: 0,
        memory_bytes: 0,
        status: JobStatus::Created,
        failures: Vec::new(),
        restarts: 0,
        created_ms: now_ms(),
        updated_ms: now_ms(),
        overrides: Overrides::default(),
        plan: String::new(),
        generation: 0,
        restore_from: None,
        savepoints: Vec::new(),
    };
    // Parsing and placing read the store and may take a while on a large spec: off the
    // async workers, so one request cannot hold up the others.
    let (spec, artifacts, record) = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || place(&state, &record).map(|(spec, artifacts)| (spec, artifacts, record)))
            .await
            .map_err(ApiError::internal)??
    };
    let mut record = record;
    let slots = slots_of(&spec);
    record.name = spec.name.clone();
    record.plan = eddy_plan::PhysicalPlan::new(&spec).to_string();
    record.artifacts = artifacts;
    record.slots = slots;
    record.state_bytes = quotas::state_bytes_of(&spec);
    record.memory_bytes = quotas::memory_of(&state, &tenant, &spec)?;
    {
        let _admission = state.supervisor.admission();
        quotas::admit_job(&state, &tenant, slots, record.state_bytes, record.memory_bytes)?;
        state.supervisor.admit(&state, record)?;
    }
    tracing::info!(tenant = %tenant, job = %id, name = %spec.name, slots, "job submitted");
    Ok((StatusCode::CREATED, Json(Submitted { id, slots })))
}

/// Lists the caller's jobs, newest first.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs",
    responses((status = 200, body = Vec<JobSummary>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, caller: Caller) -> ApiResult<Json<Vec<JobSummary>>> {
    let tenant = caller.tenant()?;
    let mut jobs: Vec<JobSummary> = state
        .store
        .list::<JobRecord>(Table::Jobs, "")?
        .into_iter()
        .filter(|j| j.tenant == tenant)
        .map(|j| JobSummary { id: j.id, name: j.name, status: j.status, created_ms: j.created_ms })
        .collect();
    jobs.sort_by_key(|j| std::cmp::Reverse(j.created_ms));
    Ok(Json(jobs))
}

/// Shows a job: status, failures, and live metrics and checkpoints while it runs.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, body = JobView), (status = 401, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    let job = owned(&state, caller.tenant()?, &id)?;
    let live = state.supervisor.live(&id).and_then(|l| l.view());
    Ok(Json(JobView {
        plan: job.plan,
        id: job.id,
        name: job.name,
        status: job.status,
        artifacts: job.artifacts,
        slots: job.slots,
        restarts: job.restarts,
        failures: job.failures,
        created_ms: job.created_ms,
        updated_ms: job.updated_ms,
        parallelism: job.overrides.parallelism,
        generation: job.generation,
        savepoints: job.savepoints,
        live,
    }))
}

/// Cancels a job (no savepoint). Answers at once; the status turns `canceled` when it stopped.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 202), (status = 401, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let job = owned(&state, caller.tenant()?, &id)?;
    if job.status.is_terminal() || !state.supervisor.cancel(&id) {
        return Err(ApiError::conflict(format!("job {id} is {:?}, not running", job.status).to_lowercase()));
    }
    tracing::info!(tenant = %job.tenant, job = %id, "job cancel requested");
    Ok(StatusCode::ACCEPTED)
}

/// The committed output of the job's sink as JSON lines (all committed files, in order).
#[utoipa::path(get, path = "/v1/jobs/{id}/output", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, content_type = "application/x-ndjson", body = String), (status = 401, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn output(State(state): State<Arc<AppState>>, caller: Caller, Path(id): Path<String>) -> ApiResult<Response> {
    let job = owned(&state, caller.tenant()?, &id)?;
    let table = output_dir(&state, &job.tenant, &job.id).join("table");
    if table.is_dir() {
        let lines = tokio::task::spawn_blocking(move || upsert_lines(&table)).await.map_err(ApiError::internal)??;
        return Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], lines).into_response());
    }
    // A files sink's output may be in a bucket, whose client blocks: one blocking thread
    // opens it, reads the committed files in commit order and hands each to the response.
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(2);
    let listed = tokio::sync::oneshot::channel::<Result<(), String>>();
    let (state, tenant, job_id) = (state.clone(), job.tenant.clone(), job.id.clone());
    tokio::task::spawn_blocking(move || {
        let out = match placement::job_files_output(&state, &tenant, &job_id) {
            Ok(out) => out,
            Err(e) => return drop(listed.0.send(Err(e))),
        };
        let names = match eddy_engine::FilesSink::committed(out.as_ref()) {
            Ok(names) => names,
            Err(e) => return drop(listed.0.send(Err(e.to_string()))),
        };
        let _ = listed.0.send(Ok(()));
        for name in names {
            if tx.blocking_send(out.read(&name)).is_err() {
                break;
            }
        }
    });
    listed
        .1
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::conflict(format!("the output cannot be listed now ({e}); try again")))?;
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}

/// An upsert sink's table as JSON lines `{"key", "value"}`, in key order.
fn upsert_lines(table: &std::path::Path) -> ApiResult<Vec<u8>> {
    let rows = eddy_engine::UpsertSink::read_table(table)
        .map_err(|e| ApiError::conflict(format!("the upsert table cannot be read now ({e}); try again")))?;
    let mut out = Vec::new();
    for (key, value) in rows {
        out.extend_from_slice(b"{\"key\":");
        out.extend_from_slice(&eddy_engine::values::json_text(&key));
        out.extend_from_slice(b",\"value\":");
        out.extend_from_slice(&eddy_engine::values::json_text(&value));
        out.extend_from_slice(b"}\n");
    }
    Ok(out)
}

/// Sends `control` to the running job `id` of the caller's and waits for its savepoint.
async fn control(state: &AppState, tenant: &str, id: &str, control: Control) -> ApiResult<Savepoint> {
    let job = owned(state, tenant, id)?;
    let live = state
        .supervisor
        .live(id)
        .filter(|_| !job.status.is_terminal())
        .ok_or_else(|| ApiError::conflict(format!("job {id} is {}, not running", status_name(job.status))))?;
    let what = format!("{control:?}");
    let answer = live.request(control);
    drop(live);
    let savepoint =
        answer.await.map_err(|_| ApiError::conflict(format!("job {id} ended before the {what} was done")))??;
    tracing::info!(tenant = %tenant, job = %id, savepoint = savepoint.id, "{what} done");
    Ok(savepoint)
}

fn status_name(status: JobStatus) -> String {
    serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// Takes a savepoint; the job keeps running.
#[utoipa::path(post, path = "/v1/jobs/{id}/savepoints", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 201, body = Savepoint), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn savepoint(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Savepoint>)> {
    let savepoint = control(&state, caller.tenant()?, &id, Control::Savepoint).await?;
    Ok((StatusCode::CREATED, Json(savepoint)))
}

/// Stops the job with a savepoint (status `stopped`).
#[utoipa::path(post, path = "/v1/jobs/{id}/stop", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, body = Savepoint), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn stop(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Savepoint>> {
    Ok(Json(control(&state, caller.tenant()?, &id, Control::Stop).await?))
}

/// `POST /v1/jobs/{id}/rescale`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rescale {
    /// The new parallelism of every step (1 to the pipeline's `max_parallelism`).
    pub parallelism: u32,
}

/// Restarts the job from a savepoint with every step at a new parallelism (state follows its
/// key groups).
#[utoipa::path(post, path = "/v1/jobs/{id}/rescale", tag = "jobs", request_body = Rescale,
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, body = Savepoint), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn rescale(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Checked(Json(body)): Checked<Json<Rescale>>,
) -> ApiResult<Json<Savepoint>> {
    let tenant = caller.tenant()?;
    let mut job = owned(&state, tenant, &id)?;
    job.overrides.parallelism = Some(body.parallelism);
    let (spec, _) = place(&state, &job)?;
    if body.parallelism == 0 || body.parallelism > spec.max_parallelism {
        return Err(ApiError::unprocessable(format!(
            "parallelism {} is outside 1..={} (the pipeline's max_parallelism)",
            body.parallelism, spec.max_parallelism
        ))
        .at("parallelism"));
    }
    {
        let _admission = state.supervisor.admission();
        quotas::admit_rescale(&state, &job, &spec)?;
        state.supervisor.reserve(&id, slots_of(&spec))?;
    }
    Ok(Json(control(&state, tenant, &id, Control::Rescale(body.parallelism)).await?))
}

/// `POST /v1/jobs/{id}/upgrade`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Upgrade {
    /// The step to give a new artifact.
    pub step: String,
    /// The artifact: `sha256:<hex>` or `name@version`.
    pub wasm: String,
}

/// Restarts the job from a savepoint with one step running another artifact; the step keeps
/// its state (state belongs to step names).
#[utoipa::path(post, path = "/v1/jobs/{id}/upgrade", tag = "jobs", request_body = Upgrade,
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, body = Savepoint), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn upgrade(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Checked(Json(body)): Checked<Json<Upgrade>>,
) -> ApiResult<Json<Savepoint>> {
    let tenant = caller.tenant()?;
    let job = owned(&state, tenant, &id)?;
    let (spec, _) = place(&state, &job)?;
    if !spec.steps.iter().any(|s| s.name == body.step) {
        let steps: Vec<&str> = spec.steps.iter().map(|s| s.name.as_str()).collect();
        return Err(
            ApiError::unprocessable(format!("no step `{}`; the steps are {}", body.step, steps.join(", "))).at("step")
        );
    }
    let artifact = resolve(&state, tenant, &body.wasm)?
        .ok_or_else(|| ApiError::unprocessable(format!("`{}` is not one of your artifacts", body.wasm)).at("wasm"))?;
    let change = Control::Upgrade { step: body.step, digest: artifact.digest };
    Ok(Json(control(&state, tenant, &id, change).await?))
}
