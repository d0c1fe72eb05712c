//! Receiving a request body into a file: streamed under a size limit, hashed on the way, into
//! a temporary file that disappears unless the caller keeps it. A declared `Content-Length`
//! over the limit is refused before a byte is read; a body that passes the limit is cut off
//! there, so a client cannot make the server read (or store) more than the limit.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::problem::{ApiError, ApiResult};
use crate::secret::hex;

/// What the temporary file of an upload in progress is called first: a start removes those
/// a crash left behind, and listings skip them.
pub const PREFIX: &str = ".upload-";

/// A body received whole.
#[derive(Debug)]
pub struct Received {
    /// The temporary file (deleted when dropped, unless persisted).
    pub file: tempfile::TempPath,
    /// Its size.
    pub size: u64,
    /// `sha256:<hex>` of its bytes.
    pub digest: String,
}

/// Streams `body` into a temporary file in `dir`, refusing more than `limit` bytes with 413
/// and the `what_to_do` advice.
pub async fn receive(
    dir: &std::path::Path,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    what_to_do: &str,
) -> ApiResult<Received> {
    let too_large = || ApiError::too_large(format!("at most {limit} bytes are accepted here; {what_to_do}"));
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let path = tempfile::Builder::new().prefix(PREFIX).tempfile_in(dir).map_err(ApiError::internal)?.into_temp_path();
    let mut file = tokio::fs::File::create(&path).await.map_err(ApiError::internal)?;
    let (mut size, mut hasher) = (0u64, Sha256::new());
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("the upload broke off: {e}")))?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(too_large());
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(ApiError::internal)?;
    }
    file.sync_all().await.map_err(ApiError::internal)?;
    Ok(Received { file: path, size, digest: format!("sha256:{}", hex(&hasher.finalize())) })
}

/// Reads a body into memory, refusing with 413 (`too_large`) one whose declared length is over
/// `limit` before a byte is read, and one without a declared length once `limit` bytes came:
/// what a small body may cost in memory is `limit`, whatever the client sends.
pub async fn read_small(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    too_large: impl Fn() -> ApiError,
) -> ApiResult<bytes::Bytes> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit)).await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(ApiError::bad_request(format!("the body broke off: {e}")).at("body")),
    }
}
