//! Bearer tokens: who is calling. Every route but the OpenAPI document needs one.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::AppState;
use crate::model::{Principal, Token};
use crate::problem::ApiError;
use crate::secret::token_hash;
use crate::store::Table;

/// The caller, from a valid, unrevoked bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Who the token speaks for.
    pub principal: Principal,
    /// The token's public id.
    pub token_id: String,
}

impl Caller {
    /// The caller's tenant, or 403 for the admin (who owns no artifacts or jobs).
    pub fn tenant(&self) -> Result<&str, ApiError> {
        match &self.principal {
            Principal::Tenant { tenant } => Ok(tenant),
            Principal::Admin => Err(ApiError::forbidden(
                "the admin token manages tenants only; use a tenant's token (POST /v1/tenants creates one)",
            )),
        }
    }

    /// Nothing, or 403 for a tenant.
    pub fn admin(&self) -> Result<(), ApiError> {
        match self.principal {
            Principal::Admin => Ok(()),
            Principal::Tenant { .. } => Err(ApiError::forbidden("only the admin token may manage tenants")),
        }
    }
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get(header::AUTHORIZATION).ok_or_else(|| {
            ApiError::unauthorized("no token: send `Authorization: Bearer <token>`").at("Authorization")
        })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::unauthorized("the Authorization header must be `Bearer <token>`").at("Authorization")
            })?;
        let stored: Option<Token> = state.store.get(Table::Tokens, &token_hash(token))?;
        match stored {
            Some(t) if t.revoked_ms.is_none() => Ok(Caller { principal: t.principal, token_id: t.id }),
            Some(_) => Err(ApiError::unauthorized("this token was revoked; ask your admin for a new one")),
            None => Err(ApiError::unauthorized("unknown token")),
        }
    }
}
