//! `/v1/workers` (the cluster's live workers) and `/v1/cluster/enroll` (certificates for
//! workers on the coordinator's own machine when no cluster CA was given).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::Caller;
use crate::problem::{ApiError, ApiResult, Checked, Problem};

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

/// The live workers and their free slots (empty on a single-process service).
#[utoipa::path(get, path = "/v1/workers", tag = "cluster",
    responses((status = 200, body = Vec<Worker>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, _caller: Caller) -> ApiResult<Json<Vec<Worker>>> {
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

/// A worker asking for a certificate.
#[derive(Debug, Deserialize, ToSchema)]
pub struct Enrollment {
    /// The worker's name.
    pub name: String,
}

/// A node's certificate, key and the cluster CA, PEM-encoded.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Credentials {
    /// The cluster CA's certificate.
    pub ca_pem: String,
    /// The node's certificate.
    pub cert_pem: String,
    /// The node's private key.
    pub key_pem: String,
}

/// Issues a worker certificate, for workers on this machine only, and only when the
/// coordinator runs its own CA (started without `--tls`). Across machines, issue certificates
/// with `eddy cluster cert` and start every node with `--tls`.
#[utoipa::path(post, path = "/v1/cluster/enroll", tag = "cluster",
    request_body = Enrollment,
    responses((status = 200, body = Credentials), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn enroll(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Checked(Json(request)): Checked<Json<Enrollment>>,
) -> ApiResult<Json<Credentials>> {
    let Some(cluster) = state.config.cluster.as_ref() else {
        return Err(ApiError::forbidden(
            "this is `eddy serve`, which has no workers: enroll with an `eddy coordinator`",
        ));
    };
    let Some(ca) = cluster.enrollment.clone() else {
        return Err(ApiError::forbidden(
            "this coordinator enrolls no workers: it was started with --tls; start the worker with --tls too",
        ));
    };
    if !peer.ip().is_loopback() {
        return Err(ApiError::forbidden(format!(
            "enrollment is for workers on the coordinator's machine; {peer} is not: issue a certificate with \
             `eddy cluster cert` and start the worker with --tls"
        )));
    }
    // A worker enrolls once (it keeps its certificate in its data directory): a name the
    // coordinator answers to, or one a live worker holds, is someone else's.
    if ["coordinator", "localhost"].contains(&request.name.as_str())
        || cluster.control.workers().iter().any(|w| w.name == request.name)
    {
        return Err(ApiError::conflict(format!(
            "`{}` is taken (the coordinator's name, or a live worker's): choose another --name",
            request.name
        ))
        .at("name"));
    }
    let identity = ca.issue(&request.name).map_err(|e| ApiError::unprocessable(e.to_string()).at("name"))?;
    tracing::info!(worker = %request.name, "enrolled a local worker");
    Ok(Json(Credentials { ca_pem: identity.ca_pem, cert_pem: identity.cert_pem, key_pem: identity.key_pem }))
}
