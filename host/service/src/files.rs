//! `/v1/files`: a tenant's data files, which its jobs' file sources read by relative path.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::Caller;
use crate::placement::{confined, files_dir, files_store};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::upload::receive;

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

/// Stores a file in the caller's files area, replacing one of the same name.
#[utoipa::path(put, path = "/v1/files/{name}", tag = "files",
    params(("name" = String, Path, description = "The file's name (letters, digits, - _ .)")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = StoredFile), (status = 401, body = Problem), (status = 413, body = Problem),
        (status = 422, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<StoredFile>)> {
    let tenant = caller.tenant()?.to_string();
    confined("name", std::path::Path::new(&name))?;
    if name.contains('/') || name.starts_with('.') {
        return Err(
            ApiError::unprocessable(format!("file name `{name}`: one name, no `/`, not starting with `.`")).at("name")
        );
    }
    let dir = files_dir(&state, &tenant);
    tokio::fs::create_dir_all(&dir).await.map_err(ApiError::internal)?;
    let limit = state.config.max_file_bytes;
    let received = receive(&dir, &headers, body, limit, "split the input into several files").await?;
    if let Some(store) = files_store(&state, &tenant) {
        // First the copy every worker reads, then the local one: a failed upload leaves the
        // old file in both places.
        let (local, key) = (std::fs::File::open(&received.file).map_err(ApiError::internal)?, name.clone());
        let uploaded = tokio::task::spawn_blocking(move || {
            eddy_engine::checkpoint::CheckpointStore::at(&store).and_then(|s| s.put_file(&key, local))
        })
        .await
        .map_err(ApiError::internal)?;
        uploaded.map_err(|e| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("cannot store `{name}` for the workers: {e}; retry"))
        })?;
    }
    received.file.persist(dir.join(&name)).map_err(ApiError::internal)?;
    tracing::info!(tenant = %tenant, file = %name, size = received.size, "file stored");
    Ok((StatusCode::CREATED, Json(StoredFile { name, size: received.size, digest: Some(received.digest) })))
}

/// Lists the caller's files.
#[utoipa::path(get, path = "/v1/files", tag = "files",
    responses((status = 200, body = Vec<StoredFile>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, caller: Caller) -> ApiResult<Json<Vec<StoredFile>>> {
    let dir = files_dir(&state, caller.tenant()?);
    let mut files = Vec::new();
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Ok(meta) = entry.metadata() else { continue };
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
    Ok(Json(files))
}
