//! `/v1/tenants`: the admin creates tenants and issues and revokes their tokens.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::{AdminCaller, Caller};
use crate::model::{Principal, Tenant, Token, now_ms};
use crate::problem::{ApiError, ApiResult, Checked, Problem, identifier};
use crate::secret::{new_id, new_token, token_hash};
use crate::store::{Table, Txn};
use crate::{AppState, blocking};

/// `POST /v1/tenants`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    /// 1–64 characters of `a-z`, `0-9`, `-` and `_`, unique.
    pub name: String,
}

/// A token, shown once when issued.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct IssuedToken {
    /// The tenant it speaks for.
    pub tenant: String,
    /// Its public id, to revoke it by.
    pub token_id: String,
    /// The bearer token itself: store it now, it is never shown again.
    pub token: String,
}

/// A new tenant with its first token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedTenant {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its first token's public id.
    pub token_id: String,
    /// Its first token: store it now, it is never shown again.
    pub token: String,
}

/// Stores a new token for `principal`; returns (token id, token).
pub(crate) fn issue(txn: &mut Txn<'_>, principal: Principal) -> Result<(String, String), ApiError> {
    let token = new_token()?;
    let id = new_id("k_")?;
    txn.put(
        Table::Tokens,
        &token_hash(&token),
        &Token { id: id.clone(), principal, created_ms: now_ms(), revoked_ms: None },
    )?;
    Ok((id, token))
}

/// Creates a tenant and its first token (admin only).
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", request_body = NewTenant,
    responses((status = 201, body = CreatedTenant), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn create_tenant(
    State(state): State<Arc<AppState>>,
    _admin: AdminCaller,
    Checked(Json(new)): Checked<Json<NewTenant>>,
) -> ApiResult<(StatusCode, Json<CreatedTenant>)> {
    identifier("name", &new.name, true, b"-_")?;
    let created = blocking(move || {
        state.store.write(|txn| -> ApiResult<CreatedTenant> {
            // Few tenants, so uniqueness is a scan inside the same transaction.
            let taken = txn.list_keyed::<Tenant>(Table::Tenants, "")?.iter().any(|(_, t)| t.name == new.name);
            if taken {
                return Err(ApiError::conflict(format!("a tenant named `{}` exists", new.name)).at("name"));
            }
            let tenant = Tenant { id: new_id("t_")?, name: new.name.clone(), created_ms: now_ms(), quotas: None };
            txn.put(Table::Tenants, &tenant.id, &tenant)?;
            let (token_id, token) = issue(txn, Principal::Tenant { tenant: tenant.id.clone() })?;
            Ok(CreatedTenant { id: tenant.id, name: tenant.name, token_id, token })
        })
    })
    .await?;
    tracing::info!(tenant = %created.id, name = %created.name, "tenant created");
    Ok((StatusCode::CREATED, Json(created)))
}

/// Lists the tenants (admin only).
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants",
    responses((status = 200, body = Vec<Tenant>), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
pub async fn list_tenants(State(state): State<Arc<AppState>>, _admin: AdminCaller) -> ApiResult<Json<Vec<Tenant>>> {
    Ok(Json(state.store.list(Table::Tenants, "")?))
}

/// Issues another token for a tenant (admin only).
#[utoipa::path(post, path = "/v1/tenants/{id}/tokens", tag = "tenants",
    params(("id" = String, Path, description = "The tenant's id")),
    responses((status = 201, body = IssuedToken), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn issue_token(
    State(state): State<Arc<AppState>>,
    _admin: AdminCaller,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<IssuedToken>)> {
    let tenant = id.clone();
    let issued = blocking(move || {
        state.store.write(|txn| -> ApiResult<IssuedToken> {
            txn.get::<Tenant>(Table::Tenants, &tenant)?.ok_or_else(|| ApiError::not_found("tenant", &tenant))?;
            let (token_id, token) = issue(txn, Principal::Tenant { tenant: tenant.clone() })?;
            Ok(IssuedToken { tenant: tenant.clone(), token_id, token })
        })
    })
    .await?;
    tracing::info!(tenant = %id, token = %issued.token_id, "token issued");
    Ok((StatusCode::CREATED, Json(issued)))
}

/// Revokes one of a tenant's tokens (admin only): requests with it answer 401 from now on.
#[utoipa::path(delete, path = "/v1/tenants/{id}/tokens/{token_id}", tag = "tenants",
    params(("id" = String, Path, description = "The tenant's id"), ("token_id" = String, Path, description = "The token's public id")),
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn revoke_token(
    State(state): State<Arc<AppState>>,
    _admin: AdminCaller,
    Path((id, token_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let (tenant, token) = (id.clone(), token_id.clone());
    blocking(move || {
        state.store.write(|txn| -> ApiResult<()> {
            let tokens = txn.list_keyed::<Token>(Table::Tokens, "")?;
            let owned = Principal::Tenant { tenant: tenant.clone() };
            let (hash, mut stored) = tokens
                .into_iter()
                .find(|(_, t)| t.id == token && t.principal == owned)
                .ok_or_else(|| ApiError::not_found("token", &token))?;
            stored.revoked_ms.get_or_insert_with(now_ms);
            Ok(txn.put(Table::Tokens, &hash, &stored)?)
        })
    })
    .await?;
    tracing::info!(tenant = %id, token = %token_id, "token revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// Who the token speaks for.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// `admin` or `tenant`.
    pub kind: String,
    /// The tenant's id (tenants only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The tenant's name (tenants only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The token's public id.
    pub token_id: String,
}

/// Who the caller is (what `eddy login` checks).
#[utoipa::path(get, path = "/v1/whoami", tag = "tenants",
    responses((status = 200, body = WhoAmI), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn whoami(State(state): State<Arc<AppState>>, caller: Caller) -> ApiResult<Json<WhoAmI>> {
    Ok(Json(match &caller.principal {
        Principal::Admin => WhoAmI { kind: "admin".into(), tenant: None, name: None, token_id: caller.token_id },
        Principal::Tenant { tenant } => {
            let name = state.store.get::<Tenant>(Table::Tenants, tenant)?.map(|t| t.name);
            WhoAmI { kind: "tenant".into(), tenant: Some(tenant.clone()), name, token_id: caller.token_id.clone() }
        }
    }))
}
