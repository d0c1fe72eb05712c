//! Errors as RFC 9457 problem details (`application/problem+json`): the status, a title, and
//! a detail naming the field or limit at fault and what to do instead.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::secret::NoRandomness;
use crate::store::StoreError;

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// Always `about:blank`: the status says the kind.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What was wrong and what to do.
    pub detail: String,
    /// The request field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// See [`Problem::detail`].
    pub detail: String,
    /// See [`Problem::field`].
    pub field: Option<String>,
    /// Seconds after which a retry may succeed (the `Retry-After` header), when known.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// An error with `status` and `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self { status, detail: detail.into(), field: None, retry_after_s: None }
    }

    /// 429: this source sent too much; retry after `retry_after_s`.
    pub fn too_many(detail: impl Into<String>, retry_after_s: u64) -> Self {
        Self { retry_after_s: Some(retry_after_s), ..Self::new(StatusCode::TOO_MANY_REQUESTS, detail) }
    }

    /// 503: the server cannot do it now (a store is down, a budget is full); retry later.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, detail)
    }

    /// Names the request field at fault.
    pub fn at(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// 400: the request is malformed.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    /// 401: no valid token.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, detail)
    }

    /// 403: a valid token that may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, detail)
    }

    /// 404: no such resource for this caller (another tenant's looks the same).
    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("no {what} `{id}`"))
    }

    /// 409: the resource's state forbids it.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, detail)
    }

    /// 413: over a size limit.
    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, detail)
    }

    /// 415: a body in a format the route does not take.
    pub fn unsupported_media(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, detail)
    }

    /// 422: well-formed, but not something the service can run.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }

    /// 500: the server failed; the detail is logged, not shown.
    pub fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "request failed inside the server");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "the server failed; its log has the cause")
    }

    /// The body.
    pub fn problem(&self) -> Problem {
        Problem {
            kind: "about:blank",
            title: self.status.canonical_reason().unwrap_or("Error").to_string(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            field: self.field.clone(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Self::internal(e)
    }
}

impl From<NoRandomness> for ApiError {
    fn from(e: NoRandomness) -> Self {
        Self::internal(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response = (self.status, body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(seconds) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// Refuses `value` of request field `field` unless it is 1-64 ASCII letters (lowercase only
/// when `lowercase`), digits and the `punctuation` bytes.
pub fn identifier(field: &str, value: &str, lowercase: bool, punctuation: &[u8]) -> Result<(), ApiError> {
    let letter = |b: u8| if lowercase { b.is_ascii_lowercase() } else { b.is_ascii_alphabetic() };
    let ok = (1..=64).contains(&value.len())
        && value.bytes().all(|b| letter(b) || b.is_ascii_digit() || punctuation.contains(&b));
    if ok {
        return Ok(());
    }
    let letters = if lowercase { "a-z" } else { "a-z, A-Z" };
    let marks: Vec<String> = punctuation.iter().map(|&b| char::from(b).to_string()).collect();
    Err(ApiError::unprocessable(format!(
        "{field} `{value}`: use 1-64 characters of {letters}, 0-9 and {}",
        marks.join(" ")
    ))
    .at(field))
}

/// What a handler answers.
pub type ApiResult<T> = Result<T, ApiError>;

/// What axum's own extractors refuse with, as the status and text of a problem.
trait Refusal {
    fn status(&self) -> axum::http::StatusCode;
    fn body_text(&self) -> String;
}

macro_rules! refusal {
    ($($t:ty),*) => {$(
        impl Refusal for $t {
            fn status(&self) -> axum::http::StatusCode {
                <$t>::status(self)
            }
            fn body_text(&self) -> String {
                <$t>::body_text(self)
            }
        }
    )*};
}

refusal!(
    axum::extract::rejection::JsonRejection,
    axum::extract::rejection::QueryRejection,
    axum::extract::rejection::BytesRejection
);

/// An extractor (`Json`, `Query`, `Bytes`) whose refusals are problem details naming the
/// part of the request at fault, like every other error of the API.
#[derive(Debug, Clone)]
pub struct Checked<E>(pub E);

fn refused(what: &str, rejection: &impl Refusal) -> ApiError {
    ApiError::new(rejection.status(), rejection.body_text()).at(what)
}

impl<S, E> axum::extract::FromRequest<S> for Checked<E>
where
    S: Send + Sync,
    E: axum::extract::FromRequest<S>,
    E::Rejection: Refusal,
{
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        E::from_request(request, state).await.map(Checked).map_err(|r| refused("body", &r))
    }
}

/// The query string, checked the same way.
#[derive(Debug, Clone)]
pub struct CheckedQuery<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for CheckedQuery<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| CheckedQuery(q.0))
            .map_err(|r| refused("query", &r))
    }
}
