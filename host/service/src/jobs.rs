//! `/v1/jobs`: submit a pipeline, watch it, cancel, resume or delete it, read its committed
//! output, and change it through savepoints.
//!
//! Every handler reads as the same pipeline: the caller's role is checked by its extractor
//! (before any body is read), the body is bounded before it is read, and the work that reads
//! or writes the store, parses or places a spec runs on a blocking thread
//! ([`crate::blocking`]), so no request holds up the async threads that answer the others.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use eddy_core::limits::MAX_SPEC_BYTES;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::artifacts::resolve;
use crate::auth::TenantCaller;
use crate::model::{Failure, JobRecord, JobStatus, LiveSwap, Overrides, Savepoint, job_key, now_ms};
use crate::placement::{self, check_world, output_dir, place};
use crate::problem::{ApiError, ApiResult, Checked, Problem};
use crate::quotas::{self, Demand};
use crate::secret::new_id;
use crate::store::Table;
use crate::supervisor::{Control, Live, LiveView};
use crate::{AppState, blocking, heavy};

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
    /// Restarts after failures, charged to its restart strategy.
    pub restarts: u32,
    /// Attempts started, whatever ended them (a lost worker's too).
    pub attempts: u32,
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

/// A pipeline spec body: YAML or JSON, at most [`MAX_SPEC_BYTES`], refused by its declared
/// type and length before a byte of it is read.
#[derive(Debug)]
pub struct SpecBody(pub String);

impl<S: Send + Sync> FromRequest<S> for SpecBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        let headers = request.headers();
        let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let media = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        let known = ["application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "application/json"];
        if !known.contains(&media.as_str()) {
            return Err(ApiError::unsupported_media(format!(
                "send the pipeline as YAML (`Content-Type: application/yaml`) or JSON (`application/json`), not \
                 `{content_type}`"
            ))
            .at("Content-Type"));
        }
        let too_large = || ApiError::too_large(format!("a pipeline spec may have at most {MAX_SPEC_BYTES} bytes"));
        let headers = headers.clone();
        let bytes = crate::upload::read_small(&headers, request.into_body(), MAX_SPEC_BYTES, too_large).await?;
        String::from_utf8(bytes.to_vec())
            .map(SpecBody)
            .map_err(|_| ApiError::bad_request("the pipeline spec is not UTF-8").at("body"))
    }
}

/// The caller's job `id`; another tenant's looks exactly like a missing one.
pub fn owned(state: &AppState, tenant: &str, id: &str) -> ApiResult<JobRecord> {
    state.store.get::<JobRecord>(Table::Jobs, &job_key(tenant, id))?.ok_or_else(|| ApiError::not_found("job", id))
}

/// The spec text `record` was submitted with.
pub fn spec_of(state: &AppState, record: &JobRecord) -> ApiResult<String> {
    state
        .store
        .get::<String>(Table::JobSpecs, &record.key())?
        .ok_or_else(|| ApiError::internal(format!("job {} has no stored spec", record.key())))
}

/// A new record for `tenant`'s job `id`, before its spec is placed.
fn new_record(tenant: &str, id: String) -> JobRecord {
    JobRecord {
        id,
        tenant: tenant.to_owned(),
        name: String::new(),
        artifacts: Vec::new(),
        slots: 0,
        state_bytes: 0,
        memory_bytes: 0,
        status: JobStatus::Created,
        failures: Vec::new(),
        restarts: 0,
        attempts: 0,
        created_ms: now_ms(),
        updated_ms: now_ms(),
        overrides: Overrides::default(),
        live_upgrade: None,
        plan: String::new(),
        generation: 0,
        restore_from: None,
        savepoints: Vec::new(),
        crash_resumes: 0,
        fast_failures: 0,
        ended_ms: None,
    }
}

/// Fills in what `record` holds once its spec is placed.
pub fn describe(state: &AppState, record: &mut JobRecord, text: &str) -> ApiResult<(eddy_plan::PipelineSpec, Demand)> {
    let (spec, digests) = place(state, record, text)?;
    crate::spread::check_deployment_size(state, record, &spec, &digests)?;
    let demand = Demand::of(&spec, quotas::of(state, &record.tenant)?.instance_memory_bytes);
    record.name = spec.name.clone();
    record.plan = eddy_plan::PhysicalPlan::new(&spec).to_string();
    record.artifacts = digests;
    record.slots = demand.slots;
    record.state_bytes = demand.state_bytes;
    record.memory_bytes = demand.memory_bytes;
    Ok((spec, demand))
}

/// Submits a pipeline whose steps name uploaded artifacts (`sha256:<hex>` or `name@version`).
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    request_body(content = String, content_type = "application/yaml", description = "The pipeline spec, YAML or JSON"),
    responses((status = 201, body = Submitted), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 409, body = Problem), (status = 413, body = Problem), (status = 415, body = Problem),
        (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn submit(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    SpecBody(text): SpecBody,
) -> ApiResult<(StatusCode, Json<Submitted>)> {
    let id = new_id("j_")?;
    let st = state.clone();
    let submitted = heavy(&st, move || {
        let mut record = new_record(&caller.tenant, id.clone());
        let (spec, demand) = describe(&state, &mut record, &text)?;
        state.supervisor.admit(&state, record, &text, demand)?;
        tracing::info!(tenant = %caller.tenant, job = %id, name = %spec.name, slots = demand.slots, "job submitted");
        Ok(Submitted { id, slots: demand.slots })
    })
    .await?;
    Ok((StatusCode::CREATED, Json(submitted)))
}

/// Lists the caller's jobs, newest first.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs",
    responses((status = 200, body = Vec<JobSummary>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, caller: TenantCaller) -> ApiResult<Json<Vec<JobSummary>>> {
    let records: Vec<JobRecord> = state.store.list(Table::Jobs, &format!("{}/", caller.tenant))?;
    let mut jobs: Vec<JobSummary> = records
        .into_iter()
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
    caller: TenantCaller,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    let job = owned(&state, &caller.tenant, &id)?;
    let live = state.supervisor.live(&job.key()).and_then(|l| l.view());
    Ok(Json(JobView {
        plan: job.plan,
        id: job.id,
        name: job.name,
        status: job.status,
        artifacts: job.artifacts,
        slots: job.slots,
        restarts: job.restarts,
        attempts: job.attempts,
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
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 202), (status = 401, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let job = owned(&state, &caller.tenant, &id)?;
    if job.status == JobStatus::Held {
        let key = job.key();
        blocking(move || {
            crate::supervisor::end(&state, &key, JobStatus::Canceled);
            Ok(())
        })
        .await?;
    } else if job.status.is_terminal() || !state.supervisor.cancel(&job.key()) {
        return Err(ApiError::conflict(format!("job {id} is {}, not running", job.status.name())));
    }
    tracing::info!(tenant = %job.tenant, job = %id, "job cancel requested");
    Ok(StatusCode::ACCEPTED)
}

/// Deletes an ended job: its record, output, checkpoints and savepoints.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let job = owned(&state, &caller.tenant, &id)?;
    if !job.status.is_terminal() {
        return Err(ApiError::conflict(format!(
            "job {id} is {}: cancel or stop it first (POST /v1/jobs/{id}/cancel)",
            job.status.name()
        )));
    }
    blocking(move || crate::janitor::delete_job(&state, &job)).await?;
    tracing::info!(tenant = %caller.tenant, job = %id, "job deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Starts a held job again (one the server held after dying twice in a row while it ran).
#[utoipa::path(post, path = "/v1/jobs/{id}/resume", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 202), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn resume(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let job = owned(&state, &caller.tenant, &id)?;
    if job.status != JobStatus::Held {
        return Err(ApiError::conflict(format!("job {id} is {}, not held", job.status.name())));
    }
    blocking(move || state.supervisor.resume_held(&state, job)).await?;
    tracing::info!(tenant = %caller.tenant, job = %id, "held job resumed by its owner");
    Ok(StatusCode::ACCEPTED)
}

/// The committed output of the job's sink as JSON lines (all committed files, in order),
/// streamed as it is read.
#[utoipa::path(get, path = "/v1/jobs/{id}/output", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, content_type = "application/x-ndjson", body = String), (status = 401, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn output(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let job = owned(&state, &caller.tenant, &id)?;
    // Both readers block (RocksDB, a bucket's client): one blocking thread reads and hands
    // each chunk to the response, at most two chunks ahead of the client.
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(2);
    let listed = tokio::sync::oneshot::channel::<Result<(), String>>();
    let table = output_dir(&state, &job.tenant, &job.id).join("table");
    let (state, tenant, job_id) = (state.clone(), job.tenant.clone(), job.id.clone());
    tokio::task::spawn_blocking(move || {
        if table.is_dir() {
            return stream_upsert_table(&table, listed.0, &tx);
        }
        let out = match placement::job_files_output(&state, &tenant, &job_id) {
            Ok(out) => out,
            Err(e) => return drop(listed.0.send(Err(e))),
        };
        let names = match eddy_connectors::FilesSink::committed(out.as_ref()) {
            Ok(names) => names,
            Err(e) => return drop(listed.0.send(Err(e.to_string()))),
        };
        let _ = listed.0.send(Ok(()));
        for name in names {
            let mut gone = false;
            let read = out.read_chunks(&name, &mut |chunk| {
                gone = tx.blocking_send(Ok(chunk.to_vec())).is_err();
                !gone
            });
            if gone {
                return;
            }
            if let Err(e) = read {
                // The client sees the stream break off rather than a silently short output.
                let _ = tx.blocking_send(Err(e));
                return;
            }
        }
    });
    listed
        .1
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::conflict(format!("the output cannot be read now ({e}); try again")))?;
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}

/// An upsert sink's table as JSON lines `{"key", "value"}` in key order, a row at a time.
fn stream_upsert_table(
    table: &std::path::Path,
    listed: tokio::sync::oneshot::Sender<Result<(), String>>,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>,
) {
    let mut started = Some(listed);
    let mut gone = false;
    let scanned = eddy_connectors::UpsertSink::scan_table(table, &mut |key, value| {
        if let Some(listed) = started.take() {
            let _ = listed.send(Ok(()));
        }
        if gone {
            return;
        }
        let mut line = b"{\"key\":".to_vec();
        line.extend_from_slice(&eddy_connectors::values::json_text(key));
        line.extend_from_slice(b",\"value\":");
        line.extend_from_slice(&eddy_connectors::values::json_text(value));
        line.extend_from_slice(b"}\n");
        gone = tx.blocking_send(Ok(line)).is_err();
    });
    match (scanned, started.take()) {
        (Ok(()), Some(listed)) => drop(listed.send(Ok(()))),
        (Err(e), Some(listed)) => drop(listed.send(Err(e.to_string()))),
        (Err(e), None) => drop(tx.blocking_send(Err(e))),
        (Ok(()), None) => {}
    }
}

/// The caller's job `id` as the supervisor runs it; a conflict when it is not running.
fn running(state: &AppState, tenant: &str, id: &str) -> ApiResult<Arc<Live>> {
    let job = owned(state, tenant, id)?;
    state
        .supervisor
        .live(&job.key())
        .filter(|_| !job.status.is_terminal())
        .ok_or_else(|| ApiError::conflict(format!("job {id} is {}, not running", job.status.name())))
}

/// Sends `control` to the caller's running job `id` and waits for its savepoint.
async fn control(state: &AppState, tenant: &str, id: &str, control: Control) -> ApiResult<Savepoint> {
    let live = running(state, tenant, id)?;
    let what = format!("{control:?}");
    let answer = live.request(control);
    drop(live);
    let savepoint =
        answer.await.map_err(|_| ApiError::conflict(format!("job {id} ended before the {what} was done")))??;
    tracing::info!(tenant = %tenant, job = %id, savepoint = savepoint.id, "{what} done");
    Ok(savepoint)
}

/// Refuses one more savepoint of `tenant`'s beyond its quota. Blocking.
async fn admit_savepoint(state: &Arc<AppState>, tenant: &str) -> ApiResult<()> {
    let (state, tenant) = (state.clone(), tenant.to_owned());
    blocking(move || quotas::admit_savepoint(&state, &tenant)).await
}

/// Takes a savepoint; the job keeps running.
#[utoipa::path(post, path = "/v1/jobs/{id}/savepoints", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 201, body = Savepoint), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn savepoint(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Savepoint>)> {
    owned(&state, &caller.tenant, &id)?;
    admit_savepoint(&state, &caller.tenant).await?;
    let savepoint = control(&state, &caller.tenant, &id, Control::Savepoint).await?;
    Ok((StatusCode::CREATED, Json(savepoint)))
}

/// Deletes one of a job's savepoints (not the one its current generation starts from while
/// that generation has no checkpoint of its own).
#[utoipa::path(delete, path = "/v1/jobs/{id}/savepoints/{name}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id"),
        ("name" = String, Path, description = "The savepoint's name: the last part of its `path`")),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn delete_savepoint(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path((id, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let job = owned(&state, &caller.tenant, &id)?;
    blocking(move || crate::janitor::delete_savepoint(&state, &job, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Stops the job with a savepoint (status `stopped`).
#[utoipa::path(post, path = "/v1/jobs/{id}/stop", tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, body = Savepoint), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn stop(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
) -> ApiResult<Json<Savepoint>> {
    owned(&state, &caller.tenant, &id)?;
    admit_savepoint(&state, &caller.tenant).await?;
    Ok(Json(control(&state, &caller.tenant, &id, Control::Stop).await?))
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
    responses((status = 200, body = Savepoint), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn rescale(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
    Checked(Json(body)): Checked<Json<Rescale>>,
) -> ApiResult<Json<Savepoint>> {
    let (st, tenant, job_id) = (state.clone(), caller.tenant.clone(), id.clone());
    heavy(&state, move || {
        let mut job = owned(&st, &tenant, &job_id)?;
        let text = spec_of(&st, &job)?;
        let before = job.clone();
        job.overrides.parallelism = Some(body.parallelism);
        let max = eddy_plan::PipelineSpec::parse(&text).map(|s| s.max_parallelism).unwrap_or(0);
        if body.parallelism == 0 || body.parallelism > max {
            return Err(ApiError::unprocessable(format!(
                "parallelism {} is outside 1..={max} (the pipeline's max_parallelism)",
                body.parallelism
            ))
            .at("parallelism"));
        }
        let (_, demand) = describe(&st, &mut job, &text)?;
        quotas::admit_savepoint(&st, &tenant)?;
        st.supervisor.reserve(&st, &before, demand)
    })
    .await?;
    Ok(Json(control(&state, &caller.tenant, &id, Control::Rescale(body.parallelism)).await?))
}

/// `POST /v1/jobs/{id}/upgrade`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Upgrade {
    /// The step to give a new artifact.
    pub step: String,
    /// The artifact: `sha256:<hex>` or `name@version`.
    pub wasm: String,
    /// `restart` (default): savepoint, stop, start again with the new code. `live`: the next
    /// checkpoint's barrier carries the swap; nothing restarts.
    #[serde(default)]
    pub mode: UpgradeMode,
}

/// How an upgrade reaches the running job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UpgradeMode {
    /// Savepoint, stop, restart with the new artifact.
    #[default]
    Restart,
    /// Swap the code at a checkpoint barrier while the job runs.
    Live,
}

/// What an upgrade did: the savepoint a restart-mode upgrade started from, or the checkpoint
/// a live one swapped at.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Upgraded {
    /// `mode: restart`.
    Restart(Savepoint),
    /// `mode: live`.
    Live(LiveSwap),
}

/// Gives one step another artifact; the step keeps its state (state belongs to step names).
/// `restart` mode restarts the job from a savepoint; `live` mode swaps the code at the next
/// checkpoint's barrier, after the new code was opened beside the old and its declared states
/// checked against the old one's (a 422 names the problem; nothing changed).
#[utoipa::path(post, path = "/v1/jobs/{id}/upgrade", tag = "jobs", request_body = Upgrade,
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, body = Upgraded), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn upgrade(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
    Checked(Json(body)): Checked<Json<Upgrade>>,
) -> ApiResult<Json<Upgraded>> {
    let mode = body.mode;
    let (st, tenant, job_id) = (state.clone(), caller.tenant.clone(), id.clone());
    let change = heavy(&state, move || {
        let job = owned(&st, &tenant, &job_id)?;
        let text = spec_of(&st, &job)?;
        let (spec, _) = place(&st, &job, &text)?;
        let Some(index) = spec.steps.iter().position(|s| s.name == body.step) else {
            let steps: Vec<&str> = spec.steps.iter().map(|s| s.name.as_str()).collect();
            return Err(ApiError::unprocessable(format!(
                "no step `{}`; the steps are {}",
                body.step,
                steps.join(", ")
            ))
            .at("step"));
        };
        let artifact = resolve(&st, &tenant, &body.wasm)?.ok_or_else(|| {
            ApiError::unprocessable(format!("`{}` is not one of your artifacts", body.wasm)).at("wasm")
        })?;
        check_world(&spec.steps[index], index, &body.wasm, artifact.world).map_err(|e| e.at("wasm"))?;
        if mode == UpgradeMode::Restart {
            quotas::admit_savepoint(&st, &tenant)?;
        }
        Ok(Control::Upgrade { step: body.step, digest: artifact.digest })
    })
    .await?;
    match (mode, change) {
        (UpgradeMode::Live, Control::Upgrade { step, digest }) => {
            Ok(Json(Upgraded::Live(swap_live(&state, &caller.tenant, &id, step, digest).await?)))
        }
        (_, change) => Ok(Json(Upgraded::Restart(control(&state, &caller.tenant, &id, change).await?))),
    }
}

/// Hands a live swap to the job's thread and waits for the checkpoint that carries it.
async fn swap_live(state: &AppState, tenant: &str, id: &str, step: String, digest: String) -> ApiResult<LiveSwap> {
    let live = running(state, tenant, id)?;
    let answer = live.swap(step, digest)?;
    drop(live);
    let swapped = answer.await.map_err(|_| ApiError::conflict(format!("job {id} ended before the live upgrade")))??;
    tracing::info!(tenant, job = %id, step = %swapped.step, checkpoint = swapped.checkpoint, "live upgrade done");
    Ok(swapped)
}
