//! Bearer tokens: who is calling. Every route but the OpenAPI document needs one.
//!
//! Three extractors, by what a route allows: [`Caller`] (any valid token), [`TenantCaller`]
//! (a tenant's) and [`AdminCaller`] (the admin's). A route names the one it needs before any
//! body extractor, so a caller without the right is refused before its body is read or
//! validated. Wrong tokens are counted per source address ([`FailureThrottle`]): a source
//! that keeps failing is answered 429 for a while, and failures are logged as a summary at
//! most once per window, so a flood of guesses neither goes unseen nor floods the log.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts};
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
            Principal::Tenant { .. } => Err(ApiError::forbidden("only the admin token may do this")),
        }
    }
}

/// A tenant's token; the admin's is refused with 403 before the body is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantCaller {
    /// The tenant.
    pub tenant: String,
    /// The token's public id.
    pub token_id: String,
}

/// The admin's token; a tenant's is refused with 403 before the body is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminCaller;

/// Length of a throttle window.
pub const FAILURE_WINDOW_MS: u64 = 10_000;
/// Failed tokens a source may send in one window; past it, it is answered 429 until the
/// window ends.
pub const MAX_FAILURES_PER_WINDOW: u32 = 20;
/// Sources tracked at once; a flood from more addresses is throttled as one (the oldest
/// window is forgotten first), so the table cannot grow without bound.
pub const MAX_SOURCES_TRACKED: usize = 4_096;

/// Wrong tokens per source address, as a state machine over a clock the caller passes in.
#[derive(Debug, Default)]
pub struct FailureThrottle {
    /// Per source: when its window started and its failures in it.
    sources: HashMap<IpAddr, (u64, u32)>,
    /// Failures since the last summary, and when that was.
    unlogged: u64,
    logged_ms: u64,
}

/// What the throttle says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Go on and check the token.
    Open,
    /// Answer 429; the source may try again after this many ms.
    Closed {
        /// Until the window ends.
        retry_after_ms: u64,
    },
}

impl FailureThrottle {
    /// Whether `source` may try a token at `now_ms`.
    pub fn gate(&self, source: IpAddr, now_ms: u64) -> Gate {
        match self.sources.get(&source) {
            Some(&(start, failures)) if failures >= MAX_FAILURES_PER_WINDOW => {
                let end = start.saturating_add(FAILURE_WINDOW_MS);
                if now_ms < end { Gate::Closed { retry_after_ms: end - now_ms } } else { Gate::Open }
            }
            _ => Gate::Open,
        }
    }

    /// `source` sent a wrong token at `now_ms`. Returns a summary to log (failures since the
    /// last one and the sources now shut out) at most once per window.
    pub fn failed(&mut self, source: IpAddr, now_ms: u64) -> Option<(u64, usize)> {
        if !self.sources.contains_key(&source) && self.sources.len() >= MAX_SOURCES_TRACKED {
            let oldest = self.sources.iter().min_by_key(|(_, (start, _))| *start).map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                self.sources.remove(&ip);
            }
        }
        let entry = self.sources.entry(source).or_insert((now_ms, 0));
        if now_ms >= entry.0.saturating_add(FAILURE_WINDOW_MS) {
            *entry = (now_ms, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        self.unlogged += 1;
        if self.logged_ms != 0 && now_ms < self.logged_ms.saturating_add(FAILURE_WINDOW_MS) {
            return None;
        }
        self.logged_ms = now_ms.max(1);
        let shut = self
            .sources
            .values()
            .filter(|(start, f)| *f >= MAX_FAILURES_PER_WINDOW && now_ms < start.saturating_add(FAILURE_WINDOW_MS))
            .count();
        Some((std::mem::take(&mut self.unlogged), shut))
    }
}

fn source_of(parts: &Parts) -> IpAddr {
    parts.extensions.get::<ConnectInfo<SocketAddr>>().map_or(IpAddr::from([0, 0, 0, 0]), |ConnectInfo(addr)| addr.ip())
}

fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let source = source_of(parts);
        let Some(header) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(wrong_token(
                state,
                source,
                ApiError::unauthorized("no token: send `Authorization: Bearer <token>`").at("Authorization"),
            ));
        };
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::unauthorized("the Authorization header must be `Bearer <token>`").at("Authorization")
            });
        let token = match token {
            Ok(token) => token,
            Err(refusal) => return Err(wrong_token(state, source, refusal)),
        };
        let stored: Option<Token> = state.store.get(Table::Tokens, &token_hash(token))?;
        let refusal = match stored {
            Some(t) if t.revoked_ms.is_none() => return Ok(Caller { principal: t.principal, token_id: t.id }),
            Some(_) => ApiError::unauthorized("this token was revoked; ask your admin for a new one"),
            None => ApiError::unauthorized("unknown token"),
        };
        Err(wrong_token(state, source, refusal))
    }
}

/// What to answer a request from `source` with a wrong (API or join) token: `refusal`, or 429
/// once the source keeps failing. Counted, and the summary logged when one is due. A valid
/// token is answered as usual whatever its source sent before, so a shared address (a NAT)
/// shuts out only its guessing.
pub fn wrong_token(state: &AppState, source: IpAddr, refusal: ApiError) -> ApiError {
    let now = now_ms();
    let mut throttle = state.throttle();
    if let Gate::Closed { retry_after_ms } = throttle.gate(source, now) {
        let seconds = retry_after_ms.div_ceil(1000);
        return ApiError::too_many(format!("too many wrong tokens from {source}; try again in {seconds} s"), seconds);
    }
    if let Some((failures, shut_out)) = throttle.failed(source, now) {
        tracing::warn!(failures, shut_out, last_source = %source, "requests with wrong tokens");
    }
    refusal
}

impl FromRequestParts<Arc<AppState>> for TenantCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let tenant = caller.tenant()?.to_owned();
        Ok(TenantCaller { tenant, token_id: caller.token_id })
    }
}

impl FromRequestParts<Arc<AppState>> for AdminCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        Caller::from_request_parts(parts, state).await?.admin()?;
        Ok(AdminCaller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn a_source_that_keeps_failing_is_shut_out_until_its_window_ends_and_others_are_not() {
        let mut t = FailureThrottle::default();
        for i in 0..MAX_FAILURES_PER_WINDOW {
            assert_eq!(t.gate(A, 1_000 + u64::from(i)), Gate::Open, "failure {i}");
            t.failed(A, 1_000 + u64::from(i));
        }
        assert_eq!(t.gate(A, 2_000), Gate::Closed { retry_after_ms: 9_000 });
        assert_eq!(t.gate(B, 2_000), Gate::Open);
        assert_eq!(t.gate(A, 11_000), Gate::Open, "a new window");
        t.failed(A, 11_000);
        assert_eq!(t.gate(A, 11_001), Gate::Open, "its count started over");
    }

    #[test]
    fn failures_are_summarized_once_per_window() {
        let mut t = FailureThrottle::default();
        const C: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3));
        // The first failure is logged at once.
        assert_eq!(t.failed(C, 0), Some((1, 0)));
        // A flood from A and B within the window: nothing more is logged...
        for i in 0..30 {
            assert_eq!(t.failed(A, 9_000 + i), None);
            assert_eq!(t.failed(B, 9_000 + i), None);
        }
        // ...until the window passed: then one line counts every failure since, and the
        // sources shut out now.
        assert_eq!(t.failed(C, 10_001), Some((61, 2)));
        assert_eq!(t.failed(C, 10_002), None);
    }

    #[test]
    fn the_table_of_sources_stays_bounded() {
        let mut t = FailureThrottle::default();
        for i in 0..(MAX_SOURCES_TRACKED as u32 + 100) {
            t.failed(IpAddr::V4(std::net::Ipv4Addr::from(i)), u64::from(i));
        }
        assert_eq!(t.sources.len(), MAX_SOURCES_TRACKED);
    }
}
