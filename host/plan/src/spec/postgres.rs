//! The PostgreSQL sink's spec: where the database is (never with a password in the text), the
//! table, how record fields map to its columns, and the guarantee.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::kafka::MAX_ADDRESS_BYTES;
use super::{SpecError, check_connection_name, invalid};

/// PostgreSQL's limit of columns per table.
pub const MAX_COLUMNS: usize = 1600;
/// PostgreSQL's limit of an identifier's bytes.
pub const MAX_IDENTIFIER_BYTES: usize = 63;
/// The longest JSON pointer a column reads.
pub const MAX_POINTER_BYTES: usize = 1024;

/// A PostgreSQL table written by every subtask of the sink's input, each on its own connection.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkSpec {
    /// `postgresql://user@host:port/database[?options]`, without a password (give the whole
    /// URL as `url_env` when it needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Or the environment variable of the process running the sink that holds the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
    /// Or a named connection of the service (`PUT /v1/connections/{name}`), whose URL and
    /// password replace it when the job is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// `table` or `schema.table`: lower-case identifiers, so the name means the same quoted or not.
    pub table: String,
    /// The guarantee.
    #[serde(default)]
    pub mode: PostgresMode,
    /// Creates the table (with `key` as its primary key) if it is missing; column types come
    /// from `columns` or, where none is given, from the first values written.
    #[serde(default)]
    pub create: bool,
    /// Columns identifying a row: `INSERT ... ON CONFLICT (key) DO UPDATE`, the last value
    /// winning. Required for `upsert`; without it `exactly_once` appends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<String>,
    /// Column name -> what it holds.
    pub columns: BTreeMap<String, ColumnSpec>,
}

/// What a PostgreSQL sink guarantees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PostgresMode {
    /// Each subtask writes a checkpoint's rows in one transaction, prepared at the barrier
    /// (`PREPARE TRANSACTION`) and committed when the checkpoint completes: rows appear once.
    #[default]
    ExactlyOnce,
    /// Every batch is upserted at once by `key`: a replay writes the same rows again, so the
    /// table converges to the same content.
    Upsert,
}

/// One column: its source (`key`, `timestamp`, `value` or a JSON pointer such as `/total`),
/// and optionally its SQL type.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ColumnSpec {
    /// The source alone; the type is the table's (or, creating it, the first value's).
    From(String),
    /// The source and the column's type (checked against an existing table).
    Typed {
        /// The source.
        from: String,
        /// The SQL type (one of [`SqlType`]'s names), checked by validation.
        #[serde(rename = "type")]
        sql_type: String,
    },
}

/// Where a column's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnSource {
    /// The record's key.
    Key,
    /// The record's event time, ms.
    Timestamp,
    /// The whole value.
    Value,
    /// A field of the value (JSON pointer).
    Pointer(String),
}

impl ColumnSpec {
    /// The source, or why it is not one.
    pub fn source(&self) -> Result<ColumnSource, String> {
        let from = match self {
            ColumnSpec::From(f) | ColumnSpec::Typed { from: f, .. } => f,
        };
        match from.as_str() {
            "key" => Ok(ColumnSource::Key),
            "timestamp" => Ok(ColumnSource::Timestamp),
            "value" => Ok(ColumnSource::Value),
            p if p.starts_with('/') && p.len() <= MAX_POINTER_BYTES => Ok(ColumnSource::Pointer(p.to_owned())),
            p if p.starts_with('/') => Err(format!("a JSON pointer of {} bytes, above {MAX_POINTER_BYTES}", p.len())),
            _ => Err(format!(
                "`{}` is not `key`, `timestamp`, `value` or a JSON pointer such as `/total`",
                from.chars().take(80).collect::<String>()
            )),
        }
    }

    /// The declared type, if any, or why it is not one the sink writes.
    pub fn sql_type(&self) -> Result<Option<SqlType>, String> {
        match self {
            ColumnSpec::From(_) => Ok(None),
            ColumnSpec::Typed { sql_type, .. } => SqlType::parse(sql_type).map(Some).ok_or_else(|| {
                format!(
                    "type {:?} is not one the sink writes: {}",
                    sql_type.chars().take(80).collect::<String>(),
                    SqlType::ALL.iter().map(|t| t.sql()).collect::<Vec<_>>().join(", ")
                )
            }),
        }
    }
}

/// The column types the sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SqlType {
    /// `bigint`.
    Bigint,
    /// `integer`.
    Integer,
    /// `smallint`.
    Smallint,
    /// `double precision`.
    Double,
    /// `real`.
    Real,
    /// `numeric`.
    Numeric,
    /// `text`.
    Text,
    /// `character varying`.
    Varchar,
    /// `boolean`.
    Boolean,
    /// `jsonb`.
    Jsonb,
    /// `json`.
    Json,
    /// `timestamp with time zone` (from epoch ms or an ISO 8601 string).
    Timestamptz,
    /// `timestamp without time zone`.
    Timestamp,
}

impl SqlType {
    /// Every type, in the order messages list them.
    pub const ALL: [SqlType; 13] = [
        SqlType::Bigint,
        SqlType::Integer,
        SqlType::Smallint,
        SqlType::Double,
        SqlType::Real,
        SqlType::Numeric,
        SqlType::Text,
        SqlType::Varchar,
        SqlType::Boolean,
        SqlType::Jsonb,
        SqlType::Json,
        SqlType::Timestamptz,
        SqlType::Timestamp,
    ];

    /// The type a spec names: its SQL spelling, or `double` and PostgreSQL's long names.
    pub fn parse(name: &str) -> Option<SqlType> {
        match name {
            "double" => Some(SqlType::Double),
            _ => SqlType::ALL.into_iter().find(|t| t.sql() == name).or_else(|| Self::from_information_schema(name)),
        }
    }

    /// The type as SQL writes it.
    pub fn sql(self) -> &'static str {
        match self {
            SqlType::Bigint => "bigint",
            SqlType::Integer => "integer",
            SqlType::Smallint => "smallint",
            SqlType::Double => "double precision",
            SqlType::Real => "real",
            SqlType::Numeric => "numeric",
            SqlType::Text => "text",
            SqlType::Varchar => "varchar",
            SqlType::Boolean => "boolean",
            SqlType::Jsonb => "jsonb",
            SqlType::Json => "json",
            SqlType::Timestamptz => "timestamptz",
            SqlType::Timestamp => "timestamp",
        }
    }

    /// The type of `information_schema.columns.data_type`, if the sink writes it.
    pub fn from_information_schema(data_type: &str) -> Option<SqlType> {
        Some(match data_type {
            "bigint" => SqlType::Bigint,
            "integer" => SqlType::Integer,
            "smallint" => SqlType::Smallint,
            "double precision" => SqlType::Double,
            "real" => SqlType::Real,
            "numeric" => SqlType::Numeric,
            "text" => SqlType::Text,
            "character varying" => SqlType::Varchar,
            "boolean" => SqlType::Boolean,
            "jsonb" => SqlType::Jsonb,
            "json" => SqlType::Json,
            "timestamp with time zone" => SqlType::Timestamptz,
            "timestamp without time zone" => SqlType::Timestamp,
            _ => return None,
        })
    }
}

/// Whether `name` is a lower-case SQL identifier, the same quoted or not.
fn valid_identifier(name: &str) -> bool {
    (1..=MAX_IDENTIFIER_BYTES).contains(&name.len())
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn check_identifier(field: String, name: &str) -> Result<(), SpecError> {
    if valid_identifier(name) {
        return Ok(());
    }
    Err(invalid(
        field,
        format!(
            "{:?} is not a lower-case SQL identifier (1 to {MAX_IDENTIFIER_BYTES} bytes of `a-z`, `0-9`, `_`, not \
             starting with a digit)",
            name.chars().take(80).collect::<String>()
        ),
    ))
}

/// Checks a connection URL as a spec or a connection may give it: bounded, `postgresql://`,
/// and without a password (a spec is shown and stored; a connection keeps it apart).
pub fn check_url(url: &str) -> Result<(), String> {
    if url.len() > MAX_ADDRESS_BYTES {
        return Err(format!("above {MAX_ADDRESS_BYTES} bytes (MAX_ADDRESS_BYTES)"));
    }
    if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
        return Err("must start with `postgresql://`".into());
    }
    if has_password(url) {
        return Err("holds a password: a spec is shown and stored, so put the URL in an environment variable and \
                    name it with `url_env` (in the service: a connection's `password`)"
            .into());
    }
    Ok(())
}

/// Whether a connection URL carries a password (`user:password@` or a `password=` option).
fn has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
    userinfo.is_some_and(|u| u.contains(':'))
        || url.split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("password=")))
}

impl PostgresSinkSpec {
    /// Checks the fields; `field` names one (`sink.table`).
    pub(super) fn validate(&self, field: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
        match (&self.url, &self.url_env, &self.connection) {
            (None, None, Some(name)) => {
                check_connection_name(name).map_err(|problem| invalid(field("connection"), problem))?;
            }
            (Some(url), None, None) => {
                check_url(url).map_err(|problem| invalid(field("url"), problem))?;
            }
            (None, Some(env), None) => {
                let ok = !env.is_empty()
                    && env.len() <= 256
                    && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && !env.as_bytes()[0].is_ascii_digit();
                if !ok {
                    return Err(invalid(field("url_env"), "is not an environment variable name (`A-Z`, `0-9`, `_`)"));
                }
            }
            _ => return Err(invalid(field("url"), "give exactly one of `url`, `url_env` and `connection`")),
        }
        let mut parts = self.table.split('.');
        let (first, second, extra) = (parts.next(), parts.next(), parts.next());
        if extra.is_some() {
            return Err(invalid(field("table"), "is `table` or `schema.table`"));
        }
        for part in [first, second].into_iter().flatten() {
            check_identifier(field("table"), part)?;
        }
        if self.columns.is_empty() || self.columns.len() > MAX_COLUMNS {
            return Err(invalid(field("columns"), format!("needs 1 to {MAX_COLUMNS} columns")));
        }
        for (name, column) in &self.columns {
            check_identifier(field("columns"), name)?;
            let column_field = || field(&format!("columns.{name}"));
            column.source().map_err(|problem| invalid(column_field(), problem))?;
            column.sql_type().map_err(|problem| invalid(column_field(), problem))?;
        }
        for (i, key) in self.key.iter().enumerate() {
            if !self.columns.contains_key(key) {
                return Err(invalid(field("key"), format!("`{key}` is not one of `columns`")));
            }
            if self.key[..i].contains(key) {
                return Err(invalid(field("key"), format!("`{key}` is named twice")));
            }
        }
        if self.mode == PostgresMode::Upsert && self.key.is_empty() {
            return Err(invalid(field("key"), "an upsert needs the columns that identify a row"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{PipelineSpec, SinkSpec};

    use super::*;

    fn sink(text: &str) -> Result<PipelineSpec, SpecError> {
        PipelineSpec::from_yaml(&format!(
            "name: p\nsources: [{{type: generator, name: g, events: 1}}]\nsteps: [{{name: a, wasm: a.wasm}}]\nsink: \
             {text}"
        ))
    }

    fn problem(text: &str) -> String {
        sink(text).expect_err(text).to_string()
    }

    #[test]
    fn the_interface_of_the_issue_parses() {
        let spec = sink(
            "{type: postgres, url: \"postgresql://postgres@127.0.0.1:5432/postgres\", table: totals, mode: \
             exactly_once, create: true, key: [user_id, window_start], columns: {user_id: key, window_start: /start, \
             purchases: /result/purchases, total_cents: {from: /result/total_cents, type: bigint}}}",
        )
        .unwrap();
        let SinkSpec::Postgres(p) = &spec.sink else { panic!("a postgres sink") };
        assert_eq!((p.mode, p.create), (PostgresMode::ExactlyOnce, true));
        assert_eq!(p.key, ["user_id", "window_start"]);
        assert_eq!(p.columns["user_id"].source(), Ok(ColumnSource::Key));
        assert_eq!(p.columns["purchases"].source(), Ok(ColumnSource::Pointer("/result/purchases".into())));
        assert_eq!(p.columns["total_cents"].sql_type(), Ok(Some(SqlType::Bigint)));
        assert!(spec.sink.follows_input_parallelism(), "each input subtask writes on its own connection");
        let spec =
            sink("{type: postgres, url_env: PG_URL, table: public.t, mode: upsert, key: [k], columns: {k: key}}")
                .unwrap();
        let SinkSpec::Postgres(p) = &spec.sink else { panic!("a postgres sink") };
        assert_eq!((p.url_env.as_deref(), p.mode), (Some("PG_URL"), PostgresMode::Upsert));
    }

    #[test]
    fn bad_sinks_are_named() {
        for (text, expected) in [
            ("{type: postgres, url: 'postgresql://u:secret@h/d', table: t, columns: {a: key}}", "holds a password"),
            ("{type: postgres, url: 'postgresql://u@h/d?password=x', table: t, columns: {a: key}}", "holds a password"),
            ("{type: postgres, url: 'mysql://h/d', table: t, columns: {a: key}}", "postgresql://"),
            ("{type: postgres, table: t, columns: {a: key}}", "exactly one of `url`, `url_env` and `connection`"),
            ("{type: postgres, url: 'postgresql://h/d', url_env: X, table: t, columns: {a: key}}", "exactly one"),
            ("{type: postgres, url_env: 'A B', table: t, columns: {a: key}}", "sink.url_env"),
            (
                "{type: postgres, url: 'postgresql://h/d', table: Totals, columns: {a: key}}",
                "lower-case SQL identifier",
            ),
            ("{type: postgres, url: 'postgresql://h/d', table: 'a.b.c', columns: {a: key}}", "`schema.table`"),
            ("{type: postgres, url: 'postgresql://h/d', table: 't; drop', columns: {a: key}}", "sink.table"),
            ("{type: postgres, url: 'postgresql://h/d', table: t, columns: {}}", "needs 1 to 1600 columns"),
            ("{type: postgres, url: 'postgresql://h/d', table: t, columns: {\"a\\\"\": key}}", "sink.columns"),
            ("{type: postgres, url: 'postgresql://h/d', table: t, columns: {a: total}}", "sink.columns.a"),
            ("{type: postgres, url: 'postgresql://h/d', table: t, key: [b], columns: {a: key}}", "`b` is not one of"),
            ("{type: postgres, url: 'postgresql://h/d', table: t, key: [a, a], columns: {a: key}}", "named twice"),
            ("{type: postgres, url: 'postgresql://h/d', table: t, mode: upsert, columns: {a: key}}", "an upsert needs"),
            (
                "{type: postgres, url: 'postgresql://h/d', table: t, columns: {a: {from: key, type: blob}}}",
                "\"blob\" is not one",
            ),
        ] {
            let got = problem(text);
            assert!(got.contains(expected), "{text}: {got}");
        }
    }

    #[test]
    fn hostile_sinks_are_refused_at_their_bounds_with_short_messages() {
        let many: Vec<String> = (0..=MAX_COLUMNS).map(|i| format!("c{i}: value")).collect();
        let long_pointer = format!("/{}", "a".repeat(MAX_POINTER_BYTES));
        let long_type = "x".repeat(64 << 10);
        for (text, expected) in [
            (
                format!("{{type: postgres, url: 'postgresql://h/d', table: t, columns: {{{}}}}}", many.join(", ")),
                "1600",
            ),
            (
                format!("{{type: postgres, url: 'postgresql://h/d', table: t, columns: {{a: '{long_pointer}'}}}}"),
                "1024",
            ),
            (
                format!("{{type: postgres, url: 'postgresql://{}', table: t, columns: {{a: key}}}}", "h".repeat(5000)),
                "4096",
            ),
            (
                format!("{{type: postgres, url: 'postgresql://h/d', table: {}, columns: {{a: key}}}}", "t".repeat(64)),
                "63",
            ),
            (format!("{{type: postgres, url_env: {}, table: t, columns: {{a: key}}}}", "A".repeat(300)), "url_env"),
            (
                format!(
                    "{{type: postgres, url: 'postgresql://h/d', table: t, columns: {{a: {{from: key, type: {long_type}}}}}}}"
                ),
                "is not one the sink writes",
            ),
        ] {
            let got = problem(&text);
            assert!(got.contains(expected), "{}: {}", &text[..80], &got[..got.len().min(300)]);
            assert!(got.len() < 2000, "the message stays short: {} bytes", got.len());
        }
    }

    #[test]
    fn every_type_round_trips_through_the_information_schema_name() {
        for t in SqlType::ALL {
            assert_eq!(SqlType::parse(t.sql()), Some(t), "{t:?}");
        }
        for t in [SqlType::Bigint, SqlType::Double, SqlType::Numeric, SqlType::Text, SqlType::Jsonb] {
            assert_eq!(SqlType::from_information_schema(t.sql()), Some(t), "{t:?}");
        }
        assert_eq!(SqlType::from_information_schema("character varying"), Some(SqlType::Varchar));
        assert_eq!(SqlType::from_information_schema("timestamp with time zone"), Some(SqlType::Timestamptz));
        assert_eq!(SqlType::from_information_schema("bytea"), None);
    }
}
