//! `/v1/connections`: a tenant's named connections to Kafka clusters and PostgreSQL databases.
//! A spec names one (`connection: orders`) instead of hosts and credentials; placing the job
//! fills in the brokers or URL and the secrets, so the spec the tenant sees, the job views,
//! metrics and logs never hold them. Secrets are write-only: no answer returns them, only
//! their names.
//!
//! Both what a tenant stores here and what a spec gives directly are checked the same way
//! before anything connects: every target against the egress policy ([`crate::egress`]), and
//! Kafka properties against the ones a tenant may set ([`TENANT_PROPERTIES`]): the rest of
//! librdkafka's name files, libraries and commands of the machine that runs the client
//! (`ssl.key.location`, `plugin.library.paths`, `sasl.kerberos.kinit.cmd`) or size its
//! buffers past the job's memory quota.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use eddy_plan::{MAX_PROPERTIES, PipelineSpec, PropertyValue, SECRET_PROPERTIES, SinkSpec, SourceSpec};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::TenantCaller;
use crate::model::JobRecord;
use crate::problem::{ApiError, ApiResult, Problem};
use crate::store::Table;
use crate::{AppState, blocking};

/// Most connections one tenant keeps.
pub const MAX_CONNECTIONS: usize = 64;
/// Largest `PUT` body (room for a few PEM certificates).
pub const MAX_CONNECTION_BYTES: usize = 256 << 10;

/// The librdkafka properties a tenant may set (on a connection or in a spec), besides the
/// secrets in [`SECRET_PROPERTIES`] (which only a connection's `secrets` holds).
pub const TENANT_PROPERTIES: &[&str] = &[
    "client.id",
    "compression.type",
    "linger.ms",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "security.protocol",
    "ssl.ca.pem",
    "ssl.certificate.pem",
    "ssl.endpoint.identification.algorithm",
];

/// A connection as stored (with its secrets) and as `PUT` (the body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Connection {
    /// A Kafka cluster.
    Kafka {
        /// Bootstrap brokers, `host:port[,host:port...]`.
        brokers: String,
        /// librdkafka properties that are not secret (see [`TENANT_PROPERTIES`]).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        properties: BTreeMap<String, String>,
        /// Secret librdkafka properties (`sasl.password`, `ssl.key.pem`, ...): stored, never
        /// returned.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        secrets: BTreeMap<String, String>,
    },
    /// A PostgreSQL database.
    Postgres {
        /// `postgresql://user@host[:port]/database[?options]`, without a password.
        url: String,
        /// The user's password: stored, never returned.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        password: Option<String>,
    },
}

/// A connection as answered: what it reaches and the names of its secrets.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConnectionView {
    /// Its name.
    pub name: String,
    /// `kafka` or `postgres`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Kafka: the bootstrap brokers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub brokers: Option<String>,
    /// PostgreSQL: the URL (without a password).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Kafka: the properties that are not secret.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// The names of the secrets it holds (`sasl.password`, `password`), never their values.
    pub secrets: Vec<String>,
}

/// A stored connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    name: String,
    connection: Connection,
}

impl Stored {
    fn view(&self) -> ConnectionView {
        match &self.connection {
            Connection::Kafka { brokers, properties, secrets } => ConnectionView {
                name: self.name.clone(),
                kind: "kafka".into(),
                brokers: Some(brokers.clone()),
                url: None,
                properties: properties.clone(),
                secrets: secrets.keys().cloned().collect(),
            },
            Connection::Postgres { url, password } => ConnectionView {
                name: self.name.clone(),
                kind: "postgres".into(),
                brokers: None,
                url: Some(url.clone()),
                properties: BTreeMap::new(),
                secrets: password.iter().map(|_| "password".to_string()).collect(),
            },
        }
    }
}

fn check_name(name: &str) -> ApiResult<()> {
    eddy_plan::check_connection_name(name).map_err(|e| ApiError::unprocessable(e).at("name"))
}

fn key(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

/// Refuses a property a tenant may not set, or a secret outside `secrets`; `at` names the field.
fn check_property(at: &str, name: &str, secret: bool) -> ApiResult<()> {
    let allowed = if secret { SECRET_PROPERTIES } else { TENANT_PROPERTIES };
    if allowed.contains(&name) {
        return Ok(());
    }
    let shown: String = name.chars().take(64).flat_map(char::escape_default).collect();
    let hint = if !secret && SECRET_PROPERTIES.contains(&name) {
        "is a secret: store it in a connection's `secrets`".to_string()
    } else {
        format!("is not one a tenant may set here; the ones allowed are {}", allowed.join(", "))
    };
    Err(ApiError::unprocessable(format!("property `{shown}` {hint}")).at(format!("{at}.{shown}")))
}

/// Checks that every `(host, port)` of `targets` is within the server's egress policy.
fn check_targets(state: &AppState, at: &str, targets: Result<Vec<(String, u16)>, String>) -> ApiResult<()> {
    let targets = targets.map_err(|e| ApiError::unprocessable(e).at(at))?;
    for (host, port) in targets {
        state.config.egress.check(&host, port).map_err(|e| ApiError::unprocessable(e).at(at))?;
    }
    Ok(())
}

/// Checks a connection before it is stored. Blocking (names are resolved).
fn check(state: &AppState, connection: &Connection) -> ApiResult<()> {
    let bounded = |at: &str, text: &str| {
        if text.len() > eddy_plan::MAX_PROPERTY_VALUE_BYTES {
            return Err(ApiError::unprocessable(format!(
                "{} bytes, above {} (MAX_PROPERTY_VALUE_BYTES)",
                text.len(),
                eddy_plan::MAX_PROPERTY_VALUE_BYTES
            ))
            .at(at.to_string()));
        }
        Ok(())
    };
    match connection {
        Connection::Kafka { brokers, properties, secrets } => {
            if brokers.trim().is_empty() || brokers.len() > eddy_plan::MAX_ADDRESS_BYTES {
                return Err(ApiError::unprocessable(format!(
                    "give 1 to {} bytes of `host:port[,host:port...]`",
                    eddy_plan::MAX_ADDRESS_BYTES
                ))
                .at("brokers"));
            }
            if properties.len() + secrets.len() > MAX_PROPERTIES {
                return Err(ApiError::unprocessable(format!(
                    "{} properties and secrets, above {MAX_PROPERTIES} (MAX_PROPERTIES)",
                    properties.len() + secrets.len()
                ))
                .at("properties"));
            }
            for (name, value) in properties {
                check_property("properties", name, false)?;
                bounded(&format!("properties.{name}"), value)?;
            }
            for (name, value) in secrets {
                check_property("secrets", name, true)?;
                bounded(&format!("secrets.{name}"), value)?;
            }
            check_targets(state, "brokers", crate::egress::broker_targets(brokers))
        }
        Connection::Postgres { url, password } => {
            eddy_plan::check_postgres_url(url)
                .map_err(|e| ApiError::unprocessable(format!("the URL {e}")).at("url"))?;
            if let Some(p) = password {
                bounded("password", p)?;
            }
            check_targets(state, "url", crate::egress::postgres_targets(url))
        }
    }
}

/// Stores a connection, replacing one of the same name (jobs already running keep what they
/// were placed with until they restart).
#[utoipa::path(put, path = "/v1/connections/{name}", tag = "connections",
    params(("name" = String, Path, description = "The connection's name (a-z, 0-9, - and _)")),
    request_body = Connection,
    responses((status = 201, body = ConnectionView), (status = 200, body = ConnectionView),
        (status = 400, body = Problem), (status = 401, body = Problem), (status = 413, body = Problem),
        (status = 422, body = Problem), (status = 429, body = Problem)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, Json<ConnectionView>)> {
    check_name(&name)?;
    let too_large = || ApiError::too_large(format!("a connection may have at most {MAX_CONNECTION_BYTES} bytes"));
    let body = crate::upload::read_small(&headers, body, MAX_CONNECTION_BYTES, too_large).await?;
    let connection: Connection = serde_json::from_slice(&body)
        .map_err(|e| ApiError::unprocessable(format!("not a connection: {e}")).at("body"))?;
    let tenant = caller.tenant;
    let stored = Stored { name: name.clone(), connection };
    let (st, t, s) = (state.clone(), tenant.clone(), stored.clone());
    let created = blocking(move || {
        check(&st, &s.connection)?;
        st.store.write(|txn| -> ApiResult<bool> {
            let k = key(&t, &s.name);
            let existed = txn.get::<Stored>(Table::Connections, &k)?.is_some();
            if !existed && txn.list_keyed::<Stored>(Table::Connections, &format!("{t}/"))?.len() >= MAX_CONNECTIONS {
                return Err(ApiError::too_many(
                    format!("you have {MAX_CONNECTIONS} connections, the most a tenant keeps: delete one first"),
                    0,
                ));
            }
            txn.put(Table::Connections, &k, &s)?;
            Ok(!existed)
        })
    })
    .await?;
    tracing::info!(tenant = %tenant, connection = %name, created, "connection stored");
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(stored.view())))
}

/// Lists the caller's connections (without secrets).
#[utoipa::path(get, path = "/v1/connections", tag = "connections",
    responses((status = 200, body = Vec<ConnectionView>), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<Arc<AppState>>, caller: TenantCaller) -> ApiResult<Json<Vec<ConnectionView>>> {
    let stored: Vec<Stored> = state.store.list(Table::Connections, &format!("{}/", caller.tenant))?;
    Ok(Json(stored.iter().map(Stored::view).collect()))
}

/// Shows one connection (without secrets).
#[utoipa::path(get, path = "/v1/connections/{name}", tag = "connections",
    params(("name" = String, Path, description = "The connection's name")),
    responses((status = 200, body = ConnectionView), (status = 401, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(name): Path<String>,
) -> ApiResult<Json<ConnectionView>> {
    check_name(&name)?;
    let stored = state.store.get::<Stored>(Table::Connections, &key(&caller.tenant, &name))?;
    Ok(Json(stored.ok_or_else(|| ApiError::not_found("connection", &name))?.view()))
}

/// Deletes one of the caller's connections, unless a job that may still run uses it.
#[utoipa::path(delete, path = "/v1/connections/{name}", tag = "connections",
    params(("name" = String, Path, description = "The connection's name")),
    responses((status = 204), (status = 401, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<Arc<AppState>>,
    caller: TenantCaller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    check_name(&name)?;
    let tenant = caller.tenant;
    let (st, t, n) = (state.clone(), tenant.clone(), name.clone());
    blocking(move || {
        st.store.write(|txn| -> ApiResult<()> {
            let k = key(&t, &n);
            if txn.get::<Stored>(Table::Connections, &k)?.is_none() {
                return Err(ApiError::not_found("connection", &n));
            }
            let mut users = Vec::new();
            for (job_key, job) in txn.list_keyed::<JobRecord>(Table::Jobs, &format!("{t}/"))? {
                let Some(text) = txn.get::<String>(Table::JobSpecs, &job_key)? else { continue };
                let uses = PipelineSpec::parse(&text).is_ok_and(|s| s.connections().iter().any(|(_, c)| *c == n));
                if uses && !job.status.is_terminal() {
                    users.push(job.id);
                }
            }
            if !users.is_empty() {
                return Err(ApiError::conflict(format!(
                    "connection `{n}` is used by job(s) {}: cancel or stop them first",
                    users.join(", ")
                )));
            }
            txn.delete(Table::Connections, &k)?;
            Ok(())
        })
    })
    .await?;
    tracing::info!(tenant = %tenant, connection = %name, "connection deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Makes `spec`'s connectors safe to run for `tenant` and fills in its connections: a named
/// connection becomes its brokers or URL with its properties and secrets; properties a spec
/// gives itself must be ones a tenant may set, inline (no `{env: ...}`: the server's
/// environment is not the tenant's); every target must be within the egress policy. Run
/// after the spec was validated, since the secrets it fills in would not pass. Blocking.
pub fn resolve_connectors(state: &AppState, tenant: &str, spec: &mut PipelineSpec) -> ApiResult<()> {
    let lookup = |at: &str, name: &str| -> ApiResult<Connection> {
        let stored = state.store.get::<Stored>(Table::Connections, &key(tenant, name))?;
        let stored = stored.ok_or_else(|| {
            ApiError::unprocessable(format!(
                "`{name}` is not one of your connections: create it with PUT /v1/connections/{name}"
            ))
            .at(at)
        })?;
        // Checked again: the policy may have changed since it was stored.
        check(state, &stored.connection).map_err(|e| e.at(at))?;
        Ok(stored.connection)
    };
    for (i, source) in spec.sources.iter_mut().enumerate() {
        let SourceSpec::Kafka(k) = source else { continue };
        let at = format!("sources[{i}]");
        kafka_client(state, &at, &lookup, &mut k.brokers, &mut k.connection, &mut k.properties)?;
    }
    match &mut spec.sink {
        SinkSpec::Kafka(k) => {
            kafka_client(state, "sink", &lookup, &mut k.brokers, &mut k.connection, &mut k.properties)
        }
        SinkSpec::Postgres(p) => {
            if p.url_env.is_some() {
                return Err(ApiError::unprocessable(
                    "`url_env` reads the server's environment: store the database as a connection (PUT \
                     /v1/connections/{name}) and name it with `connection`",
                )
                .at("sink.url_env"));
            }
            if let Some(name) = p.connection.take() {
                let Connection::Postgres { url, password } = lookup("sink.connection", &name)? else {
                    return Err(ApiError::unprocessable(format!("connection `{name}` is not a PostgreSQL one"))
                        .at("sink.connection"));
                };
                p.url = Some(match password {
                    Some(pw) => with_password(&url, &pw),
                    None => url,
                });
            } else if let Some(url) = &p.url {
                check_targets(state, "sink.url", crate::egress::postgres_targets(url))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// One Kafka client's fields: the connection filled in, or the spec's own brokers and
/// properties checked.
fn kafka_client(
    state: &AppState,
    at: &str,
    lookup: &dyn Fn(&str, &str) -> ApiResult<Connection>,
    brokers: &mut String,
    connection: &mut Option<String>,
    properties: &mut BTreeMap<String, PropertyValue>,
) -> ApiResult<()> {
    for (name, value) in properties.iter() {
        check_property(&format!("{at}.properties"), name, false)?;
        if matches!(value, PropertyValue::Env { .. }) {
            return Err(ApiError::unprocessable(
                "`{env: ...}` reads the server's environment: store secrets in a connection's `secrets`",
            )
            .at(format!("{at}.properties.{name}")));
        }
    }
    let Some(name) = connection.take() else {
        return check_targets(state, &format!("{at}.brokers"), crate::egress::broker_targets(brokers));
    };
    let field = format!("{at}.connection");
    let Connection::Kafka { brokers: b, properties: p, secrets } = lookup(&field, &name)? else {
        return Err(ApiError::unprocessable(format!("connection `{name}` is not a Kafka one")).at(field));
    };
    *brokers = b;
    // The spec's own properties win over the connection's; secrets are the connection's only.
    for (k, v) in p.into_iter().chain(secrets) {
        properties.entry(k).or_insert(PropertyValue::Text(v));
    }
    Ok(())
}

/// `url` with `password` for its user (percent-encoded).
fn with_password(url: &str, password: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let Some((user, host)) = rest.split_once('@') else { return url.to_owned() };
    let encoded: String = password
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("{scheme}://{user}:{encoded}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_put_in_the_url_percent_encoded() {
        assert_eq!(
            with_password("postgresql://app@db:5432/x", "p@ss w/rd"),
            "postgresql://app:p%40ss%20w%2Frd@db:5432/x"
        );
        assert_eq!(with_password("postgresql://db/x", "pw"), "postgresql://db/x", "no user, no password");
    }

    #[test]
    fn views_name_secrets_and_never_hold_them() {
        let stored = Stored {
            name: "orders".into(),
            connection: Connection::Kafka {
                brokers: "k:9092".into(),
                properties: BTreeMap::from([("security.protocol".into(), "sasl_ssl".into())]),
                secrets: BTreeMap::from([("sasl.password".into(), "hunter2".into())]),
            },
        };
        let text = serde_json::to_string(&stored.view()).unwrap();
        assert!(text.contains("sasl.password") && !text.contains("hunter2"), "{text}");
        let pg = Stored {
            name: "db".into(),
            connection: Connection::Postgres { url: "postgresql://u@h/d".into(), password: Some("hunter2".into()) },
        };
        let text = serde_json::to_string(&pg.view()).unwrap();
        assert!(text.contains("\"password\"") && !text.contains("hunter2"), "{text}");
    }

    #[test]
    fn properties_outside_the_tenants_list_are_refused_by_name() {
        for (name, secret, says) in [
            ("ssl.key.location", false, "not one a tenant may set"),
            ("sasl.kerberos.kinit.cmd", false, "not one a tenant may set"),
            ("plugin.library.paths", false, "not one a tenant may set"),
            ("queue.buffering.max.kbytes", false, "not one a tenant may set"),
            ("sasl.password", false, "is a secret"),
            ("security.protocol", true, "not one a tenant may set"),
        ] {
            let e = check_property("properties", name, secret).unwrap_err().problem();
            assert!(e.detail.contains(says), "{name}: {}", e.detail);
        }
        assert!(check_property("properties", "security.protocol", false).is_ok());
        assert!(check_property("secrets", "sasl.password", true).is_ok());
    }
}
