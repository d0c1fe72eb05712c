//! `/v1/artifacts`: uploaded operator components, stored once by sha256 and compiled once.
//!
//! An upload streams into a temporary file under the size limit ([`crate::upload`]), hashed
//! on the way. The component is then validated and compiled through the runtime's cache, and
//! only then moved to `artifacts/sha256-<hex>.wasm`; a failed or interrupted upload leaves
//! nothing behind. Each tenant sees its own artifacts: the same bytes from two tenants are one
//! file but two records.
//!
//! An upload takes the same path whatever other tenants uploaded: it is validated and
//! compiled afresh ([`eddy_runtime::Runtime::load_fresh`]) unless the uploading tenant holds
//! the artifact already, so its time says nothing about another tenant's artifacts. Storing
//! the file and recording it, like deleting the last record and its file, happen under the
//! admission lock, so an upload racing a deletion of the same bytes cannot lose its file.
//!
//! A large component (a Python or JavaScript one) compiles for seconds. With `wait=false` the
//! upload answers 202 once the bytes are in, compiles in the background, and
//! `GET /v1/artifacts/compiles/{digest}` shows where it is (compiling, ready, or failed with
//! the reason; `GET /v1/artifacts/compiles` lists them all, for the web UI); the artifact
//! exists for jobs once it is ready. A tenant has at most [`MAX_BACKGROUND_COMPILES`]
//! compiling at once, and the last [`KEPT_FINISHED`] finished compiles (with how long they
//! took, or why they failed) are kept to be read. A compile the server did not finish before
//! it stopped is gone with it: the upload is to be sent again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::TenantCaller;
use crate::model::{Artifact, JobRecord, World, now_ms};
use crate::problem::{ApiError, ApiResult, CheckedQuery, Problem, identifier};
use crate::store::Table;
use crate::upload::{Received, receive};
use crate::{AppState, blocking, heavy};

/// `POST /v1/artifacts` query: an optional name and version to refer to the artifact by.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    /// 1–64 characters of `a-z`, `0-9`, `-`, `_` and `.`; needs `version`.
    pub name: Option<String>,
    /// 1–64 characters of `A-Z`, `a-z`, `0-9`, `-`, `_`, `.` and `+`; needs `name`.
    pub version: Option<String>,
    /// `false`: answer 202 once the bytes are in and compile in the background (see
    /// `GET /v1/artifacts/compiles/{digest}`). Default `true`: answer when compiled.
    pub wait: Option<bool>,
}

/// Compiles one tenant may have running in the background at once.
pub const MAX_BACKGROUND_COMPILES: usize = 2;
/// Finished background compiles kept per tenant for their owner to read.
pub const KEPT_FINISHED: usize = 16;

/// Where a background compile is.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompileStatus {
    /// `sha256:` and the hex digest of the bytes.
    pub digest: String,
    /// `compiling`, `ready` (the artifact is there for jobs) or `failed`.
    pub status: String,
    /// Size of the `.wasm`.
    pub size: u64,
    /// Milliseconds since the compile started (while compiling), or how long it took.
    pub elapsed_ms: u64,
    /// Why it failed, with what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The artifact, once ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Artifact>,
}

/// One tenant's background compiles: running (with their start) and finished.
#[derive(Debug, Default)]
struct TenantCompiles {
    running: HashMap<String, (Instant, u64)>,
    finished: Vec<CompileStatus>,
}

/// Background compiles per tenant.
#[derive(Debug, Default)]
pub struct Compiles(Mutex<HashMap<String, TenantCompiles>>);

impl Compiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TenantCompiles>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a place for `digest`, or says why not (already compiling, or too many at once).
    fn begin(&self, tenant: &str, digest: &str, size: u64) -> ApiResult<()> {
        let mut all = self.lock();
        let mine = all.entry(tenant.to_owned()).or_default();
        if mine.running.contains_key(digest) {
            return Ok(());
        }
        if mine.running.len() >= MAX_BACKGROUND_COMPILES {
            return Err(ApiError::too_many(
                format!(
                    "{MAX_BACKGROUND_COMPILES} uploads are compiling already: wait for one (GET /v1/artifacts/compiles/{{digest}})"
                ),
                5,
            ));
        }
        mine.finished.retain(|f| f.digest != digest);
        mine.running.insert(digest.to_owned(), (Instant::now(), size));
        Ok(())
    }

    fn end(&self, tenant: &str, digest: &str, failure: Option<String>) {
        let mut all = self.lock();
        let mine = all.entry(tenant.to_owned()).or_default();
        let Some((started, size)) = mine.running.remove(digest) else { return };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let status = if failure.is_some() { "failed" } else { "ready" }.to_owned();
        let done =
            CompileStatus { digest: digest.to_owned(), status, size, elapsed_ms, error: failure, artifact: None };
        mine.finished.push(done);
        if mine.finished.len() > KEPT_FINISHED {
            mine.finished.remove(0);
        }
    }

    fn status(&self, tenant: &str, digest: &str) -> Option<CompileStatus> {
        let all = self.lock();
        let mine = all.get(tenant)?;
        if let Some((started, size)) = mine.running.get(digest) {
            return Some(compiling(digest, *started, *size));
        }
        mine.finished.iter().find(|f| f.digest == digest).cloned()
    }

    /// Every compile of `tenant` kept here: the running ones, longest running first, then the
    /// finished ones, newest first.
    fn list(&self, tenant: &str) -> Vec<CompileStatus> {
        let all = self.lock();
        let Some(mine) = all.get(tenant) else { return Vec::new() };
        let mut out: Vec<CompileStatus> =
            mine.running.iter().map(|(digest, (started, size))| compiling(digest, *started, *size)).collect();
        out.sort_by(|a, b| b.elapsed_ms.cmp(&a.elapsed_ms).then_with(|| a.digest.cmp(&b.digest)));
        out.extend(mine.finished.iter().rev().cloned());
        out
    }
}

fn compiling(digest: &str, started: Instant, size: u64) -> CompileStatus {
    CompileStatus {
        digest: digest.to_owned(),
        status: "compiling".into(),
        size,
        elapsed_ms: started.elapsed().as_millis() as u64,
        error: None,
        artifact: None,
    }
}

/// An artifact with the jobs that use it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ArtifactDetail {
    /// The artifact.
    #[serde(flatten)]
    pub artifact: Artifact,
    /// The export its world requires.
    pub exports: Vec<String>,
    /// Ids of this tenant's jobs whose steps run it.
    pub used_by: Vec<String>,
}

/// The `name@version` label of an upload, if it names one.
fn label(query: &UploadQuery) -> Result<Option<String>, ApiError> {
    match (&query.name, &query.version) {
        (None, None) => Ok(None),
        (Some(name), Some(version)) => {
            identifier("name", name, true, b"-_.")?;
            identifier("version", version, false, b"-_.+")?;
            Ok(Some(format!("{name}@{version}")))
        }
        (Some(_), None) => Err(ApiError::unprocessable("`name` needs a `version` too").at("version")),
        (None, Some(_)) => Err(ApiError::unprocessable("`version` needs a `name` too").at("name")),
    }
}

fn key(tenant: &str, digest: &str) -> String {
    format!("{tenant}/{digest}")
}

/// Where the bytes of `digest` (`sha256:<hex>`) live.
pub fn wasm_path(state: &AppState, digest: &str) -> PathBuf {
    wasm_file(&state.data_dir, digest)
}

/// Where the service under `data_dir` keeps the bytes of artifact `digest`.
pub fn wasm_file(data_dir: &std::path::Path, digest: &str) -> PathBuf {
    data_dir.join("artifacts").join(format!("{}.wasm", digest.replace(':', "-")))
}

/// The digest a step's `wasm:` names for `tenant`: `sha256:<hex>` or `name@version`.
pub fn resolve(state: &AppState, tenant: &str, reference: &str) -> Result<Option<Artifact>, ApiError> {
    let digest = if reference.starts_with("sha256:") {
        reference.to_string()
    } else {
        match state.store.get::<String>(Table::ArtifactNames, &key(tenant, reference))? {
            Some(digest) => digest,
            None => return Ok(None),
        }
    };
    Ok(state.store.get(Table::Artifacts, &key(tenant, &digest))?)
}

/// Validates and compiles the upload (on a blocking thread: compiling takes a while), afresh
/// unless `own` (the tenant holds these bytes already).
async fn inspect(state: &Arc<AppState>, path: &std::path::Path, digest: &str, own: bool) -> ApiResult<World> {
    let (state, path, digest) = (state.clone(), path.to_owned(), digest.to_owned());
    let world = heavy(&state.clone(), move || {
        let bytes = std::fs::read(&path).map_err(ApiError::internal)?;
        let loaded = if own { state.runtime.load(&digest, &bytes) } else { state.runtime.load_fresh(&digest, &bytes) };
        let component = loaded.map_err(|e| match e {
            eddy_runtime::LoadError::TooLarge { .. } => ApiError::too_large(e.to_string()),
            e => ApiError::unprocessable(e.to_string()).at("body"),
        })?;
        Ok(component.world())
    })
    .await?;
    Ok(match world {
        eddy_runtime::World::KeyedOperator => World::KeyedOperator,
        eddy_runtime::World::WindowAggregate => World::WindowAggregate,
    })
}

/// Uploads a component (the raw `.wasm` bytes as the body).
#[utoipa::path(post, path = "/v1/artifacts", tag = "artifacts", params(UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/wasm"),
    responses((status = 201, description = "New for this tenant", body = Artifact),
        (status = 200, description = "Already uploaded: the same artifact", body = Artifact),
        (status = 202, description = "`wait=false`: compiling in the background", body = CompileStatus),
        (status = 401, body = Problem), (status = 409, body = Problem), (status = 413, body = Problem),
        (status = 422, body = Problem), (status = 429, body = Problem)),
    security(("bearer" = [])))]
pub async fn upload(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    CheckedQuery(query): CheckedQuery<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let tenant = caller.tenant;
    let label = label(&query)?;
    // The quota is checked once the digest is known: the same bytes again take no more of it.
    let incoming = state.data_dir.join("artifacts").join(".incoming");
    let advice = "build it in release mode and strip it";
    let Received { file: temp, size, digest } =
        receive(&incoming, &headers, body, state.config.max_artifact_bytes, advice).await?;
    if size == 0 {
        return Err(ApiError::unprocessable("the body is empty: send the .wasm bytes").at("body"));
    }
    let own = state.store.get::<Artifact>(Table::Artifacts, &key(&tenant, &digest))?.is_some();
    if query.wait == Some(false) && !own {
        state.compiles.begin(&tenant, &digest, size)?;
        let (st, t, d) = (state.clone(), tenant.clone(), digest.clone());
        tokio::spawn(async move {
            let failure = compile_and_record(&st, &t, &d, temp, size, own, label).await.err().map(|e| e.detail);
            if let Some(why) = &failure {
                tracing::warn!(tenant = %t, digest = %d, error = %why, "background compile failed");
            }
            st.compiles.end(&t, &d, failure);
        });
        let status = state.compiles.status(&tenant, &digest);
        return Ok((StatusCode::ACCEPTED, Json(status)).into_response());
    }
    let (artifact, created) = compile_and_record(&state, &tenant, &digest, temp, size, own, label).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(artifact)).into_response())
}

/// Validates and compiles an upload, then stores and records it.
async fn compile_and_record(
    state: &Arc<AppState>,
    tenant: &str,
    digest: &str,
    temp: tempfile::TempPath,
    size: u64,
    own: bool,
    label: Option<String>,
) -> ApiResult<(Artifact, bool)> {
    let world = inspect(state, &temp, digest, own).await?;
    let (st, t, d) = (state.clone(), tenant.to_owned(), digest.to_owned());
    let (artifact, created) =
        blocking(move || st.supervisor.admitting(|| record(&st, &t, &d, temp, size, world, label))).await?;
    tracing::info!(tenant = %tenant, digest = %digest, size, created, "artifact uploaded");
    Ok((artifact, created))
}

/// Where a background compile (`POST /v1/artifacts?wait=false`) is: compiling, ready (with
/// the artifact) or failed (with why).
#[utoipa::path(get, path = "/v1/artifacts/compiles/{digest}", tag = "artifacts",
    params(("digest" = String, Path, description = "`sha256:<hex>`, as the 202 answer named it")),
    responses((status = 200, body = CompileStatus), (status = 401, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn compile_status(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(digest): Path<String>,
) -> ApiResult<Json<CompileStatus>> {
    let tenant = caller.tenant.as_str();
    // A deleted artifact is not ready however its compile ended.
    let artifact: Option<Artifact> = state.store.get(Table::Artifacts, &key(tenant, &digest))?;
    match state.compiles.status(tenant, &digest) {
        Some(status) if status.status == "ready" && artifact.is_none() => Err(ApiError::not_found("compile", &digest)),
        Some(status) => Ok(Json(CompileStatus { artifact: artifact.filter(|_| status.status == "ready"), ..status })),
        // Compiled before it was kept here (or waited for): ready, its compile time not known.
        None => {
            let artifact = artifact.ok_or_else(|| ApiError::not_found("compile", &digest))?;
            let size = artifact.size;
            let status = "ready".into();
            Ok(Json(CompileStatus { digest, status, size, elapsed_ms: 0, error: None, artifact: Some(artifact) }))
        }
    }
}

/// This tenant's recent background compiles (what the web UI's artifacts page shows): running
/// ones first, then finished ones, newest first; a ready one whose artifact was deleted since
/// is left out.
#[utoipa::path(get, path = "/v1/artifacts/compiles", tag = "artifacts",
    responses((status = 200, body = Vec<CompileStatus>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list_compiles(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
) -> ApiResult<Json<Vec<CompileStatus>>> {
    let tenant = caller.tenant.as_str();
    let mut out = Vec::new();
    for compile in state.compiles.list(tenant) {
        if compile.status != "ready" {
            out.push(compile);
        } else if let Some(artifact) = state.store.get::<Artifact>(Table::Artifacts, &key(tenant, &compile.digest))? {
            out.push(CompileStatus { artifact: Some(artifact), ..compile });
        }
    }
    Ok(Json(out))
}

/// Stores the file of a validated upload (unless the bytes are there) and records it for the
/// tenant: under the admission lock, so a deletion of the same bytes cannot come between.
fn record(
    state: &AppState,
    tenant: &str,
    digest: &str,
    temp: tempfile::TempPath,
    size: u64,
    world: World,
    label: Option<String>,
) -> ApiResult<(Artifact, bool)> {
    let dest = wasm_path(state, digest);
    if dest.exists() {
        drop(temp);
    } else {
        temp.persist(&dest).map_err(ApiError::internal)?;
    }
    state.store.write(|txn| -> ApiResult<(Artifact, bool)> {
        let existing: Option<Artifact> = txn.get(Table::Artifacts, &key(tenant, digest))?;
        let created = existing.is_none();
        if created {
            crate::quotas::admit_artifact(state, tenant, size)?;
        }
        let mut artifact = existing.unwrap_or_else(|| Artifact {
            digest: digest.to_owned(),
            tenant: tenant.to_owned(),
            size,
            world,
            names: Vec::new(),
            created_ms: now_ms(),
        });
        if let Some(label) = &label {
            match txn.get::<String>(Table::ArtifactNames, &key(tenant, label))? {
                Some(other) if other != digest => {
                    return Err(ApiError::conflict(format!(
                        "`{label}` already names {other}; upload these bytes under a new version"
                    ))
                    .at("version"));
                }
                Some(_) => {}
                None => {
                    txn.put(Table::ArtifactNames, &key(tenant, label), &digest)?;
                    artifact.names.push(label.clone());
                }
            }
        }
        txn.put(Table::Artifacts, &key(tenant, digest), &artifact)?;
        Ok((artifact, created))
    })
}

/// Lists the caller's artifacts.
#[utoipa::path(get, path = "/v1/artifacts", tag = "artifacts",
    responses((status = 200, body = Vec<Artifact>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, caller: TenantCaller) -> ApiResult<Json<Vec<Artifact>>> {
    Ok(Json(state.store.list(Table::Artifacts, &format!("{}/", caller.tenant))?))
}

fn jobs_using(state: &AppState, tenant: &str, digest: &str) -> Result<Vec<JobRecord>, ApiError> {
    let jobs: Vec<JobRecord> = state.store.list(Table::Jobs, &format!("{tenant}/"))?;
    Ok(jobs.into_iter().filter(|j| j.artifacts.iter().any(|a| a == digest)).collect())
}

/// Shows one artifact, by digest or `name@version`.
#[utoipa::path(get, path = "/v1/artifacts/{reference}", tag = "artifacts",
    params(("reference" = String, Path, description = "`sha256:<hex>` or `name@version`")),
    responses((status = 200, body = ArtifactDetail), (status = 401, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(reference): Path<String>,
) -> ApiResult<Json<ArtifactDetail>> {
    let tenant = caller.tenant.as_str();
    let artifact = resolve(&state, tenant, &reference)?.ok_or_else(|| ApiError::not_found("artifact", &reference))?;
    let used_by = jobs_using(&state, tenant, &artifact.digest)?.into_iter().map(|j| j.id).collect();
    let exports = vec![
        match artifact.world {
            World::KeyedOperator => eddy_runtime::OPERATOR_EXPORT,
            World::WindowAggregate => eddy_runtime::AGGREGATE_EXPORT,
        }
        .to_string(),
    ];
    Ok(Json(ArtifactDetail { artifact, exports, used_by }))
}

/// Deletes one of the caller's artifacts, unless a job that may still run uses it.
#[utoipa::path(delete, path = "/v1/artifacts/{reference}", tag = "artifacts",
    params(("reference" = String, Path, description = "`sha256:<hex>` or `name@version`")),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(reference): Path<String>,
) -> ApiResult<StatusCode> {
    let tenant = caller.tenant;
    let artifact = resolve(&state, &tenant, &reference)?.ok_or_else(|| ApiError::not_found("artifact", &reference))?;
    let digest = artifact.digest.clone();
    let (st, t, d) = (state.clone(), tenant.clone(), digest.clone());
    blocking(move || st.supervisor.admitting(|| forget(&st, &t, &d, &artifact))).await?;
    tracing::info!(tenant = %tenant, digest = %digest, "artifact deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Removes the tenant's record of `artifact`, and its file when no tenant records it any
/// more: under the admission lock (see [`record`]).
fn forget(state: &AppState, tenant: &str, digest: &str, artifact: &Artifact) -> ApiResult<()> {
    let last_user = state.store.write(|txn| -> ApiResult<bool> {
        let live: Vec<String> = txn
            .list_keyed::<JobRecord>(Table::Jobs, &format!("{tenant}/"))?
            .into_iter()
            .filter(|(_, j)| !j.status.is_terminal() && j.artifacts.iter().any(|a| a == digest))
            .map(|(_, j)| j.id)
            .collect();
        if !live.is_empty() {
            return Err(ApiError::conflict(format!(
                "{digest} is used by job(s) {}: cancel or stop them first",
                live.join(", ")
            )));
        }
        txn.delete(Table::Artifacts, &key(tenant, digest))?;
        for label in &artifact.names {
            txn.delete(Table::ArtifactNames, &key(tenant, label))?;
        }
        let others = txn.list_keyed::<Artifact>(Table::Artifacts, "")?;
        Ok(!others.iter().any(|(_, a)| a.digest == digest))
    })?;
    if last_user {
        // The store no longer names the file, so a crash here only leaves an orphan file.
        if let Err(e) = std::fs::remove_file(wasm_path(state, digest)) {
            tracing::warn!(digest = %digest, error = %e, "could not remove an unused artifact file");
        }
    }
    Ok(())
}
