//! `/v1/workers`: the cluster's live workers, for the admin (a tenant has no business knowing
//! the machines, their addresses or what else runs there).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::AdminCaller;
use crate::problem::{ApiResult, Problem};

/// A live worker.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Worker {
    /// Its name.
    pub name: String,
    /// Slots it offers.
    pub slots: u32,
    /// Slots no subtask holds.
    pub free_slots: u32,
    /// Where other workers reach its data plane.
    pub data_addr: String,
    /// Its registration's number (a restart gets a new one).
    pub incarnation: u64,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms_ago: u64,
}

/// The live workers and their free slots (empty on a single-process service); admin only.
#[utoipa::path(get, path = "/v1/workers", tag = "cluster",
    responses((status = 200, body = Vec<Worker>), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, _admin: AdminCaller) -> ApiResult<Json<Vec<Worker>>> {
    let Some(control) = state.config.cluster.as_ref().map(|c| &c.control) else { return Ok(Json(Vec::new())) };
    let (workers, now) = (control.workers(), control.clock_ms());
    Ok(Json(
        workers
            .into_iter()
            .map(|m| Worker {
                free_slots: m.free_slots(),
                last_heartbeat_ms_ago: now.saturating_sub(m.last_heartbeat_ms),
                name: m.name,
                slots: m.slots,
                data_addr: m.data_addr,
                incarnation: m.incarnation,
            })
            .collect(),
    ))
}
