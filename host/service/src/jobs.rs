//! `/v1/jobs`: submit a pipeline, watch it, cancel it, read its committed output.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::Caller;
use crate::model::{Failure, JobRecord, JobStatus, now_ms};
use crate::placement::{output_dir, place};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::secret::new_id;
use crate::store::Table;
use crate::supervisor::{LiveView, slots_of};

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
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<Submitted>)> {
    let tenant = caller.tenant()?.to_string();
    let text = spec_text(&headers, &body)?;
    let id = new_id("j_")?;
    let (spec, artifacts) = place(&state, &tenant, &id, &text)?;
    let slots = slots_of(&spec);
    let record = JobRecord {
        id: id.clone(),
        tenant: tenant.clone(),
        name: spec.name.clone(),
        spec: text,
        artifacts,
        slots,
        status: JobStatus::Created,
        failures: Vec::new(),
        restarts: 0,
        created_ms: now_ms(),
        updated_ms: now_ms(),
    };
    state.supervisor.admit(&state, record)?;
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
        id: job.id,
        name: job.name,
        status: job.status,
        artifacts: job.artifacts,
        slots: job.slots,
        restarts: job.restarts,
        failures: job.failures,
        created_ms: job.created_ms,
        updated_ms: job.updated_ms,
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
    let dir = output_dir(&state, &job.tenant, &job.id);
    let files = tokio::task::spawn_blocking(move || committed_files(&dir)).await.map_err(ApiError::internal)??;
    let stream = futures_util::stream::iter(files).then(|path| async move { tokio::fs::read(path).await });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}

/// The sink's committed files in commit order: `part-*` files of a files sink (never the
/// in-progress ones), or the one file of a file sink.
fn committed_files(dir: &std::path::Path) -> ApiResult<Vec<std::path::PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ApiError::internal(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(ApiError::internal)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("part-") || name == "output.jsonl" {
            files.push(entry.path());
        }
        if name == "table" {
            return Err(ApiError::conflict("an upsert sink's table is not readable as output through the API yet"));
        }
    }
    files.sort();
    Ok(files)
}
