//! Enrolling workers with a coordinator that runs its own CA (started without `--tls`):
//! `POST /v1/cluster/join-tokens` (admin) issues a join token, `POST /v1/cluster/enroll` with
//! it (as `Authorization: Bearer <join token>`) issues a worker certificate.
//!
//! What it takes to get a certificate, in the order it is checked:
//! - the request comes from this machine (the private key travels in the answer, over plain
//!   HTTP): across machines, issue certificates with `eddy cluster cert` and use `--tls`;
//! - a join token the admin issued, unexpired, with uses left (each enrollment takes one);
//!   wrong tokens count against the source like wrong API tokens ([`crate::auth`]);
//! - a name that is a lowercase DNS label, not one the coordinator answers to
//!   (`coordinator`, `localhost`, its certificate's names), not a live worker's, and not one
//!   issued before — unless the token was issued for that very name (the admin's renewal).
//!
//! Certificates from enrollment expire after [`ENROLLED_VALIDITY`]; a worker renews by
//! enrolling again with a token issued for its name (`eddy cluster join-token --name N`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, header};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::{AdminCaller, wrong_token};
use crate::model::{IssuedName, JoinToken, now_ms};
use crate::problem::{ApiError, ApiResult, Checked, Problem};
use crate::secret::{hex, new_id, token_hash};
use crate::store::Table;
use crate::{AppState, blocking};

/// How long a certificate from enrollment is valid.
pub const ENROLLED_VALIDITY: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);
/// What every join token starts with.
pub const JOIN_TOKEN_PREFIX: &str = "eddy_join_";
/// The longest a join token may live.
pub const MAX_JOIN_TOKEN_TTL_S: u64 = 7 * 24 * 3600;
/// The most enrollments one join token may allow.
pub const MAX_JOIN_TOKEN_USES: u32 = 100;

/// `POST /v1/cluster/join-tokens`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NewJoinToken {
    /// The one worker name it enrolls (also one issued before: a renewal); none: any new name.
    pub name: Option<String>,
    /// Enrollments it allows (1 unless given, at most 100).
    pub uses: Option<u32>,
    /// Seconds it lives (3 600 unless given, at most a week).
    pub ttl_s: Option<u64>,
}

/// A join token, shown once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct IssuedJoinToken {
    /// Its public id.
    pub id: String,
    /// The token: give it to `eddy worker --join-token` (or `EDDY_JOIN_TOKEN`).
    pub token: String,
    /// When it stops working (ms since the epoch).
    pub expires_ms: i64,
    /// Enrollments it allows.
    pub uses: u32,
    /// The name it is for, if one.
    pub name: Option<String>,
}

/// Issues a join token (admin only).
#[utoipa::path(post, path = "/v1/cluster/join-tokens", tag = "cluster", request_body = NewJoinToken,
    responses((status = 201, body = IssuedJoinToken), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn issue_join_token(
    State(state): State<Arc<AppState>>,
    _admin: AdminCaller,
    Checked(Json(new)): Checked<Json<NewJoinToken>>,
) -> ApiResult<(axum::http::StatusCode, Json<IssuedJoinToken>)> {
    if state.config.cluster.as_ref().and_then(|c| c.enrollment.as_ref()).is_none() {
        return Err(ApiError::forbidden(
            "this server issues no certificates (it is `eddy serve`, or a coordinator started with --tls): issue \
             them with `eddy cluster cert`",
        ));
    }
    if let Some(name) = &new.name {
        check_worker_name(name)?;
    }
    let uses = new.uses.unwrap_or(1);
    if !(1..=MAX_JOIN_TOKEN_USES).contains(&uses) {
        return Err(ApiError::unprocessable(format!("uses {uses} is outside 1..={MAX_JOIN_TOKEN_USES}")).at("uses"));
    }
    let ttl_s = new.ttl_s.unwrap_or(3_600);
    if !(1..=MAX_JOIN_TOKEN_TTL_S).contains(&ttl_s) {
        return Err(ApiError::unprocessable(format!("ttl_s {ttl_s} is outside 1..={MAX_JOIN_TOKEN_TTL_S}")).at("ttl_s"));
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(ApiError::internal)?;
    let token = format!("{JOIN_TOKEN_PREFIX}{}", hex(&bytes));
    let id = new_id("jt_")?;
    let expires_ms = now_ms().saturating_add(i64::try_from(ttl_s * 1000).unwrap_or(i64::MAX));
    let record =
        JoinToken { id: id.clone(), name: new.name.clone(), uses_left: uses, expires_ms, created_ms: now_ms() };
    let hash = token_hash(&token);
    blocking(move || Ok(state.store.write(|txn| txn.put(Table::JoinTokens, &hash, &record))?)).await?;
    tracing::info!(token = %id, name = ?new.name, uses, ttl_s, "join token issued");
    Ok((axum::http::StatusCode::CREATED, Json(IssuedJoinToken { id, token, expires_ms, uses, name: new.name })))
}

/// A worker asking for a certificate.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Enrollment {
    /// The worker's name: a lowercase DNS label.
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

fn check_worker_name(name: &str) -> ApiResult<()> {
    eddy_transport::quic::check_label(name).map_err(|e| ApiError::unprocessable(e.to_string()).at("name"))
}

/// Issues a worker certificate to a worker on this machine holding a join token (see the
/// module docs).
#[utoipa::path(post, path = "/v1/cluster/enroll", tag = "cluster",
    request_body = Enrollment,
    responses((status = 200, body = Credentials), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem), (status = 429, body = Problem)),
    security(("bearer" = [])))]
pub async fn enroll(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
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
    let source = peer.ip();
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| t.starts_with(JOIN_TOKEN_PREFIX))
        .map(str::to_owned);
    let Some(token) = token else {
        return Err(wrong_token(
            &state,
            source,
            ApiError::unauthorized(
                "enrolling needs a join token: `Authorization: Bearer <join token>` (the admin issues one with \
                 `eddy cluster join-token`; the worker takes it as --join-token or EDDY_JOIN_TOKEN)",
            )
            .at("Authorization"),
        ));
    };
    let name = request.name;
    check_worker_name(&name)?;
    let reserved = ["coordinator", "localhost"];
    let own = cluster.node.name();
    if reserved.contains(&name.as_str()) || name == own {
        return Err(ApiError::conflict(format!("`{name}` is the coordinator's name: choose another --name")).at("name"));
    }
    if cluster.control.workers().iter().any(|w| w.name == name) {
        return Err(ApiError::conflict(format!("`{name}` is a live worker's name: choose another --name")).at("name"));
    }
    let st = state.clone();
    blocking(move || {
        // Issued first, recorded with the token's use in one transaction: a failure in between
        // hands out nothing and takes no use.
        let identity = ca
            .issue_with_aliases(&name, &[], ENROLLED_VALIDITY)
            .map_err(|e| ApiError::unprocessable(e.to_string()).at("name"))?;
        let expires_ms = now_ms().saturating_add(i64::try_from(ENROLLED_VALIDITY.as_millis()).unwrap_or(i64::MAX));
        let hash = token_hash(&token);
        let taken = st.store.write(|txn| -> ApiResult<String> {
            let Some(mut join) = txn.get::<JoinToken>(Table::JoinTokens, &hash)? else {
                return Err(ApiError::unauthorized("unknown join token"));
            };
            if join.expires_ms <= now_ms() || join.uses_left == 0 {
                return Err(ApiError::unauthorized(
                    "this join token expired or was used up: ask the admin for a new one",
                ));
            }
            if join.name.as_ref().is_some_and(|n| *n != name) {
                return Err(
                    ApiError::forbidden(format!("this join token is for another worker, not `{name}`")).at("name")
                );
            }
            let issued_before = txn.get::<IssuedName>(Table::IssuedNames, &name)?;
            if issued_before.is_some() && join.name.is_none() {
                return Err(ApiError::conflict(format!(
                    "`{name}` was enrolled before: choose another --name, or renew it with a join token issued for \
                     it (eddy cluster join-token --name {name})"
                ))
                .at("name"));
            }
            join.uses_left -= 1;
            txn.put(Table::JoinTokens, &hash, &join)?;
            txn.put(
                Table::IssuedNames,
                &name,
                &IssuedName { issued_ms: now_ms(), expires_ms, token_id: join.id.clone() },
            )?;
            Ok(join.id)
        });
        let token_id = match taken {
            Ok(id) => id,
            Err(e) if e.status == axum::http::StatusCode::UNAUTHORIZED => return Err(wrong_token(&st, source, e)),
            Err(e) => return Err(e),
        };
        tracing::info!(worker = %name, token = %token_id, "enrolled a local worker");
        Ok(Json(Credentials { ca_pem: identity.ca_pem, cert_pem: identity.cert_pem, key_pem: identity.key_pem }))
    })
    .await
}
