//! `/v1/files`: a tenant's data files, which its jobs' file sources read by name.
//!
//! A name is checked before a byte of the body is read (a bad one is a 422, never a failure
//! inside the server after the whole upload), and so are the tenant's `files` and
//! `file_bytes` quotas, by the declared length and again by the received one.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::TenantCaller;
use crate::placement::{files_dir, files_store};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::upload::receive;
use crate::{AppState, blocking};

/// The longest file name.
pub const MAX_FILE_NAME_BYTES: usize = 128;

/// A stored file.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StoredFile {
    /// Its name: what a file source's `path` names.
    pub name: String,
    /// Its size.
    pub size: u64,
    /// `sha256:<hex>` of its bytes (only when just uploaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// Refuses a file name that is not 1–128 ASCII letters, digits, `-`, `_` and `.`, starting
/// with a letter or digit: one name in one directory, nothing a path or a shell could read
/// otherwise.
pub fn check_name(name: &str) -> ApiResult<()> {
    let ok = (1..=MAX_FILE_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        return Ok(());
    }
    let shown: String = name.chars().take(64).flat_map(char::escape_default).collect();
    let more = if name.chars().count() > 64 { "..." } else { "" };
    Err(ApiError::unprocessable(format!(
        "file name `{shown}{more}`: use 1-{MAX_FILE_NAME_BYTES} characters of A-Z, a-z, 0-9, `-`, `_` and `.`, \
         starting with a letter or digit"
    ))
    .at("name"))
}

/// The tenant's files: how many and their bytes. Blocking.
pub fn usage(state: &AppState, tenant: &str) -> ApiResult<(u32, u64)> {
    let files = listed(state, tenant)?;
    Ok((u32::try_from(files.len()).unwrap_or(u32::MAX), files.iter().map(|f| f.size).sum()))
}

/// The tenant's files, by name. Blocking.
fn listed(state: &AppState, tenant: &str) -> ApiResult<Vec<StoredFile>> {
    let dir = files_dir(state, tenant);
    let mut files = Vec::new();
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                // Not followed: a link placed in the area (a shared volume) is no file of its.
                let Ok(meta) = entry.path().symlink_metadata() else { continue };
                // Temporary files of uploads in progress start with `.`.
                if meta.is_file() && !name.starts_with('.') {
                    files.push(StoredFile { name, size: meta.len(), digest: None });
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ApiError::internal(e)),
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// The size of the tenant's file `name`, if it has one.
fn existing(state: &AppState, tenant: &str, name: &str) -> Option<u64> {
    let meta = files_dir(state, tenant).join(name).symlink_metadata().ok()?;
    meta.is_file().then_some(meta.len())
}

/// Stores a file in the caller's files area, replacing one of the same name.
#[utoipa::path(put, path = "/v1/files/{name}", tag = "files",
    params(("name" = String, Path, description = "The file's name (letters, digits, - _ .)")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = StoredFile), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 413, body = Problem), (status = 422, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<StoredFile>)> {
    let tenant = caller.tenant;
    check_name(&name)?;
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    {
        let (state, tenant, name) = (state.clone(), tenant.clone(), name.clone());
        blocking(move || {
            crate::quotas::admit_file(&state, &tenant, declared.unwrap_or(0), existing(&state, &tenant, &name))
        })
        .await?;
    }
    let dir = files_dir(&state, &tenant);
    tokio::fs::create_dir_all(&dir).await.map_err(ApiError::internal)?;
    let limit = state.config.max_file_bytes;
    let received = receive(&dir, &headers, body, limit, "split the input into several files").await?;
    let (size, digest) = (received.size, received.digest.clone());
    let (st, t, n) = (state.clone(), tenant.clone(), name.clone());
    blocking(move || {
        st.supervisor.admitting(|| {
            crate::quotas::admit_file(&st, &t, received.size, existing(&st, &t, &n))?;
            if let Some(store) = files_store(&st, &t) {
                // First the copy every worker reads, then the local one: a failed upload
                // leaves the old file in both places.
                let local = std::fs::File::open(&received.file).map_err(ApiError::internal)?;
                eddy_checkpoint::CheckpointStore::at(&store)
                    .and_then(|s| s.put_file(&n, local))
                    .map_err(|e| ApiError::unavailable(format!("cannot store `{n}` for the workers: {e}; retry")))?;
            }
            received.file.persist(files_dir(&st, &t).join(&n)).map_err(ApiError::internal)?;
            Ok(())
        })
    })
    .await?;
    tracing::info!(tenant = %tenant, file = %name, size, "file stored");
    Ok((StatusCode::CREATED, Json(StoredFile { name, size, digest: Some(digest) })))
}

/// Deletes one of the caller's files (jobs that read it already keep reading their copy).
#[utoipa::path(delete, path = "/v1/files/{name}", tag = "files",
    params(("name" = String, Path, description = "The file's name")),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem),
        (status = 503, body = Problem)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    check_name(&name)?;
    let tenant = caller.tenant;
    blocking(move || {
        if existing(&state, &tenant, &name).is_none() {
            return Err(ApiError::not_found("file", &name));
        }
        if let Some(store) = files_store(&state, &tenant) {
            eddy_checkpoint::CheckpointStore::at(&store)
                .and_then(|s| s.delete(&name))
                .map_err(|e| ApiError::unavailable(format!("cannot delete `{name}` from the store: {e}; retry")))?;
        }
        std::fs::remove_file(files_dir(&state, &tenant).join(&name)).map_err(ApiError::internal)?;
        tracing::info!(tenant = %tenant, file = %name, "file deleted");
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists the caller's files.
#[utoipa::path(get, path = "/v1/files", tag = "files",
    responses((status = 200, body = Vec<StoredFile>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, caller: TenantCaller) -> ApiResult<Json<Vec<StoredFile>>> {
    Ok(Json(blocking(move || listed(&state, &caller.tenant)).await?))
}
