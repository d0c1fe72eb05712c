//! `GET /v1/jobs/{id}/replay`: one subtask of a journaled step (`debug: {journal: true}`) run
//! again in this server from its journal (what `eddy replay` does with a directory), for the
//! job's owner only, in the tenant's sandbox and CPU share, bounded in records and events.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use eddy_checkpoint::inspect::key_from_text;
use eddy_engine::replay::{ReplayError, ReplayRequest, replay};
use eddy_plan::StoreLocation;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::TenantCaller;
use crate::jobs::owned;
use crate::placement::{job_checkpoints, redact};
use crate::problem::{ApiError, ApiResult, CheckedQuery, Problem};
use crate::query_bounds::{count, step_and_key};
use crate::{AppState, heavy};

/// Most events one answer holds.
pub const MAX_REPLAY_EVENTS: usize = 5_000;
const DEFAULT_REPLAY_EVENTS: usize = 500;
/// Most input records one replay runs through (the default too): a replay runs the tenant's
/// code in the server, so its length is bounded like any request's.
pub const MAX_REPLAY_RECORDS: u64 = 1_000_000;

/// `GET /v1/jobs/{id}/replay` query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReplayParams {
    /// The journaled step.
    pub step: String,
    /// Which subtask of it.
    pub subtask: u32,
    /// Only what concerns this key: its JSON as stored; text that is not JSON is a string.
    pub key: Option<String>,
    /// Start from this retained checkpoint's state (default: the oldest the journal reaches).
    pub from_checkpoint: Option<u64>,
    /// Stop after this input record (at most 1 000 000, the default).
    pub until: Option<u64>,
    /// Most events (default 500, at most 5 000).
    pub limit: Option<usize>,
}

fn checked(params: ReplayParams, checkpoints: StoreLocation) -> ApiResult<ReplayRequest> {
    step_and_key(&params.step, params.key.as_deref(), "the journaled step")?;
    let limit = count("limit", params.limit, DEFAULT_REPLAY_EVENTS, MAX_REPLAY_EVENTS)?;
    let until = count("until", params.until, MAX_REPLAY_RECORDS, MAX_REPLAY_RECORDS)?;
    Ok(ReplayRequest {
        from_checkpoint: params.from_checkpoint,
        key: params.key.as_deref().map(key_from_text),
        until: Some(until),
        max_events: Some(limit),
        ..ReplayRequest::new(checkpoints, &params.step, params.subtask)
    })
}

/// One subtask of a journaled step replayed from its journal: `events` in order (inputs,
/// state reads and writes, timers, guest logs, outputs, barriers), the `summary` (from which
/// checkpoint, records, outputs, how it ended), and `failure` when the code failed as it ran.
#[utoipa::path(get, path = "/v1/jobs/{id}/replay", tag = "jobs",
    params(("id" = String, Path, description = "The job's id"), ReplayParams),
    responses((status = 200, description = "The replay (`summary`, `events`, `failure`)", body = serde_json::Value),
        (status = 401, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(id): Path<String>,
    CheckedQuery(params): CheckedQuery<ReplayParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let job = owned(&state, &caller.tenant, &id)?;
    let mut request = checked(params, job_checkpoints(&state, &job))?;
    let quotas = crate::quotas::of(&state, &job.tenant)?;
    request.cpu_share = Some(state.supervisor.cpu_share(&job.tenant, quotas.cpu_millicores));
    request.limits = Some(state.runtime.config().limits.clone().with_memory_at_most(quotas.instance_memory_bytes));
    let st = state.clone();
    heavy(&state, move || {
        let scratch = st.data_dir.join("tmp");
        std::fs::create_dir_all(&scratch).map_err(ApiError::internal)?;
        request.scratch = Some(scratch);
        let mut events = Vec::new();
        let outcome = replay(&request, &st.runtime, &mut |e| events.push(e));
        let said = |status: StatusCode, problem: &str| ApiError::new(status, redact(&st, &job.tenant, problem));
        let (summary, failure) = match outcome {
            Ok(summary) => (Some(summary), None),
            Err(ReplayError::Operator { record, source }) => {
                (None, Some(format!("the operator failed at input record {record}: {source}")))
            }
            Err(e @ ReplayError::NoJournal(_)) => return Err(said(StatusCode::NOT_FOUND, &e.to_string())),
            Err(ReplayError::BadQuery(problem)) => return Err(ApiError::unprocessable(problem).at("step")),
            // The checkpoint a journal segment starts from is gone or damaged: a later one may do.
            Err(e @ (ReplayError::Code(_) | ReplayError::Build(_) | ReplayError::Checkpoint { .. })) => {
                return Err(said(StatusCode::CONFLICT, &e.to_string()));
            }
            Err(e) => return Err(ApiError::internal(e)),
        };
        tracing::info!(tenant = %job.tenant, job = %job.id, step = %request.step, subtask = request.subtask,
            events = events.len(), "replayed");
        Ok(Json(serde_json::json!({ "summary": summary, "events": events, "failure": failure })))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query_bounds::{MAX_KEY_BYTES, MAX_NAME_BYTES};

    fn params(step: &str, key: Option<&str>, until: Option<u64>, limit: Option<usize>) -> ReplayParams {
        ReplayParams { step: step.into(), subtask: 0, key: key.map(String::from), from_checkpoint: None, until, limit }
    }

    #[test]
    fn queries_are_bounded() {
        let dir = StoreLocation::Dir("/nowhere".into());
        assert!(checked(params("", None, None, None), dir.clone()).is_err());
        assert!(checked(params(&"s".repeat(MAX_NAME_BYTES + 1), None, None, None), dir.clone()).is_err());
        assert!(checked(params("count", Some(&"k".repeat(MAX_KEY_BYTES + 1)), None, None), dir.clone()).is_err());
        assert!(checked(params("count", None, None, Some(0)), dir.clone()).is_err());
        assert!(checked(params("count", None, None, Some(MAX_REPLAY_EVENTS + 1)), dir.clone()).is_err());
        assert!(checked(params("count", None, Some(0), None), dir.clone()).is_err());
        assert!(checked(params("count", None, Some(MAX_REPLAY_RECORDS + 1), None), dir.clone()).is_err());
        let r = checked(params("count", Some("alice"), None, None), dir).expect("fine");
        assert_eq!(r.key.as_deref(), Some(&br#""alice""#[..]));
        assert_eq!((r.until, r.max_events), (Some(MAX_REPLAY_RECORDS), Some(DEFAULT_REPLAY_EVENTS)));
    }
}
