//! `GET /v1/jobs/{id}/state`: a step's keyed state as the job's newest completed checkpoint
//! holds it, decoded (what `eddy state` reads from a directory), for the job's owner only.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use eddy_checkpoint::CheckpointStore;
use eddy_checkpoint::inspect::{InspectError, StateQuery, key_from_text, read_state};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::TenantCaller;
use crate::jobs::owned;
use crate::placement::{job_checkpoints, redact};
use crate::problem::{ApiError, ApiResult, CheckedQuery, Problem};
use crate::query_bounds::{MAX_NAME_BYTES, count, step_and_key, too_long};
use crate::{AppState, heavy};

/// Most entries one answer holds, and the default.
pub const MAX_STATE_ENTRIES: usize = 1_000;
const DEFAULT_STATE_ENTRIES: usize = 100;

/// `GET /v1/jobs/{id}/state` query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct StateParams {
    /// The step whose state to read.
    pub step: String,
    /// Only this key: its JSON as stored (`"alice"` with the quotes, `42`); text that is not
    /// JSON is taken as a string.
    pub key: Option<String>,
    /// Only this state (a declared name).
    pub state: Option<String>,
    /// Most entries (default 100, at most 1 000).
    pub limit: Option<usize>,
}

fn checked(params: StateParams) -> ApiResult<StateQuery> {
    step_and_key(&params.step, params.key.as_deref(), "the step whose state to read")?;
    if params.state.as_ref().is_some_and(|s| s.len() > MAX_NAME_BYTES) {
        return Err(too_long("state", MAX_NAME_BYTES));
    }
    let limit = count("limit", params.limit, DEFAULT_STATE_ENTRIES, MAX_STATE_ENTRIES)?;
    Ok(StateQuery { step: params.step, state: params.state, key: params.key.as_deref().map(key_from_text), limit })
}

/// A step's keyed state from the job's newest completed checkpoint: entries (key, state,
/// window, value decoded as JSON), pending timers, and whether more matched than `limit`.
#[utoipa::path(get, path = "/v1/jobs/{id}/state", tag = "jobs",
    params(("id" = String, Path, description = "The job's id"), StateParams),
    responses((status = 200, description = "The state found (`checkpoint`, `step`, `states`, `entries`, `timers`, \
        `truncated`)", body = serde_json::Value),
        (status = 401, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
    CheckedQuery(params): CheckedQuery<StateParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let job = owned(&state, &caller.tenant, &id)?;
    let query = checked(params)?;
    let st = state.clone();
    heavy(&state, move || {
        let location = job_checkpoints(&st, &job);
        let store = CheckpointStore::at(&location).map_err(ApiError::internal)?;
        let scratch = st.data_dir.join("tmp");
        std::fs::create_dir_all(&scratch).map_err(ApiError::internal)?;
        let dump = read_state(&store, None, &query, &scratch).map_err(|e| match e {
            InspectError::NotFound(problem) => ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                redact(
                    &st,
                    &job.tenant,
                    &format!("{problem} (a job's state is read from its newest completed checkpoint)"),
                ),
            ),
            InspectError::BadQuery(problem) => ApiError::unprocessable(problem),
            InspectError::Checkpoint(e) => ApiError::internal(e),
        })?;
        tracing::info!(tenant = %job.tenant, job = %job.id, step = %query.step, entries = dump.entries.len(),
            "state read");
        serde_json::to_value(&dump).map(Json).map_err(ApiError::internal)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query_bounds::{MAX_KEY_BYTES, MAX_NAME_BYTES};

    fn params(step: &str, key: Option<&str>, limit: Option<usize>) -> StateParams {
        StateParams { step: step.into(), key: key.map(String::from), state: None, limit }
    }

    #[test]
    fn queries_are_bounded() {
        assert!(checked(params("", None, None)).is_err());
        assert!(checked(params(&"s".repeat(MAX_NAME_BYTES + 1), None, None)).is_err());
        assert!(checked(params("count", Some(&"k".repeat(MAX_KEY_BYTES + 1)), None)).is_err());
        assert!(checked(params("count", None, Some(0))).is_err());
        assert!(checked(params("count", None, Some(MAX_STATE_ENTRIES + 1))).is_err());
        let q = checked(params("count", Some("alice"), None)).expect("fine");
        assert_eq!((q.key.as_deref(), q.limit), (Some(&br#""alice""#[..]), DEFAULT_STATE_ENTRIES));
    }
}
