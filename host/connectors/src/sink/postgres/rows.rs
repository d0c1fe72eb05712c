//! Records to table rows, without a database: which part of a record each column holds, how a
//! JSON value becomes the text of a column's type (refused with the column named when it does
//! not fit), and the SQL that writes a batch of rows in one statement.

use eddy_core::RecordView;
use eddy_plan::{ColumnSource, PostgresSinkSpec, SqlType};
use serde_json::Value;

use crate::values::json_text;

/// One column of the table: its name, where its value comes from and, once known, its type.
#[derive(Debug, Clone)]
pub(super) struct Column {
    pub(super) name: String,
    pub(super) source: ColumnSource,
    /// Declared in the spec, read from the table, or inferred when creating it.
    pub(super) sql_type: Option<SqlType>,
    pub(super) declared: bool,
}

/// The spec's columns, in its (sorted) order, with the key columns' positions.
pub(super) fn columns(spec: &PostgresSinkSpec) -> Result<Vec<Column>, String> {
    spec.columns
        .iter()
        .map(|(name, c)| {
            let sql_type = c.sql_type()?;
            Ok(Column { name: name.clone(), source: c.source()?, sql_type, declared: sql_type.is_some() })
        })
        .collect()
}

/// `bytes` as JSON: JSON as it is, anything else (raw bytes) as a string.
fn embed(bytes: &[u8]) -> Value {
    let text = json_text(bytes);
    serde_json::from_slice(&text).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&text).into_owned()))
}

/// One record's values, a JSON value per column (`Null`: SQL NULL). A pointer that selects
/// nothing is an error: a mistyped pointer would otherwise fill a column with NULLs unseen.
pub(super) fn extract(columns: &[Column], record: &RecordView<'_>) -> Result<Vec<Value>, String> {
    let needs_value = columns.iter().any(|c| matches!(c.source, ColumnSource::Value | ColumnSource::Pointer(_)));
    let value = needs_value.then(|| embed(record.value));
    columns
        .iter()
        .map(|c| match &c.source {
            ColumnSource::Key => record
                .key
                .map(embed)
                .ok_or_else(|| format!("column `{}` holds the key, but the record has none", c.name)),
            ColumnSource::Timestamp => Ok(record.timestamp.map_or(Value::Null, Value::from)),
            ColumnSource::Value => Ok(value.clone().unwrap_or(Value::Null)),
            ColumnSource::Pointer(p) => value
                .as_ref()
                .and_then(|v| v.pointer(p))
                .cloned()
                .ok_or_else(|| format!("column `{}` reads `{p}`, which the record's value does not have", c.name)),
        })
        .collect()
}

/// The type a new table gives a column first seen holding `value`.
pub(super) fn infer(value: &Value) -> SqlType {
    match value {
        Value::Number(n) if n.is_i64() => SqlType::Bigint,
        Value::Number(_) => SqlType::Double,
        Value::Bool(_) => SqlType::Boolean,
        Value::String(_) | Value::Null => SqlType::Text,
        Value::Array(_) | Value::Object(_) => SqlType::Jsonb,
    }
}

/// Epoch milliseconds as a PostgreSQL timestamp literal in UTC (`1970-01-01 00:00:00.000+00`).
fn timestamp_text(ms: i64) -> String {
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar, 400-year eras).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}.{milli:03}+00")
}

/// `value` as the text input of `sql_type` (`None`: NULL), or why it does not fit.
pub(super) fn to_sql_text(sql_type: SqlType, value: &Value) -> Result<Option<String>, String> {
    let integer = |min: i64, max: i64| match value.as_i64() {
        Some(n) if (min..=max).contains(&n) => Ok(Some(n.to_string())),
        _ => Err(format!("{value} is not an integer in {min}..={max}")),
    };
    match (sql_type, value) {
        (_, Value::Null) => Ok(None),
        (SqlType::Bigint, _) => integer(i64::MIN, i64::MAX),
        (SqlType::Integer, _) => integer(i32::MIN.into(), i32::MAX.into()),
        (SqlType::Smallint, _) => integer(i16::MIN.into(), i16::MAX.into()),
        (SqlType::Double | SqlType::Real | SqlType::Numeric, Value::Number(n)) => Ok(Some(n.to_string())),
        (SqlType::Boolean, Value::Bool(b)) => Ok(Some(b.to_string())),
        (SqlType::Text | SqlType::Varchar, Value::String(s)) => Ok(Some(s.clone())),
        (SqlType::Text | SqlType::Varchar | SqlType::Jsonb | SqlType::Json, v) => Ok(Some(v.to_string())),
        (SqlType::Timestamptz | SqlType::Timestamp, Value::Number(n)) => {
            n.as_i64().map(|ms| Some(timestamp_text(ms))).ok_or_else(|| format!("{n} is not epoch milliseconds"))
        }
        (SqlType::Timestamptz | SqlType::Timestamp, Value::String(s)) => Ok(Some(s.clone())),
        (t, v) => Err(format!("{v} is not a {}", t.sql())),
    }
}

/// `name` quoted (validation allows lower-case identifiers only; quoting keeps it exact).
pub(super) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `table` or `schema.table`, quoted.
pub(super) fn quoted_table(table: &str) -> String {
    table.split('.').map(quote).collect::<Vec<_>>().join(".")
}

/// One statement writing any number of rows: every column bound as a text array, unnested
/// and cast, so a batch costs one round trip. With `key`, an upsert.
pub(super) fn insert_sql(table: &str, columns: &[Column], key: &[String]) -> String {
    let names: Vec<String> = columns.iter().map(|c| quote(&c.name)).collect();
    let casts: Vec<String> = columns
        .iter()
        .map(|c| format!("x.{}::{}", quote(&c.name), c.sql_type.unwrap_or(SqlType::Text).sql()))
        .collect();
    let params: Vec<String> = (1..=columns.len()).map(|i| format!("${i}::text[]")).collect();
    let mut sql = format!(
        "INSERT INTO {} ({}) SELECT {} FROM unnest({}) AS x({})",
        quoted_table(table),
        names.join(", "),
        casts.join(", "),
        params.join(", "),
        names.join(", ")
    );
    if !key.is_empty() {
        let updates: Vec<String> = columns
            .iter()
            .filter(|c| !key.contains(&c.name))
            .map(|c| format!("{0} = EXCLUDED.{0}", quote(&c.name)))
            .collect();
        let target = key.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", ");
        if updates.is_empty() {
            sql.push_str(&format!(" ON CONFLICT ({target}) DO NOTHING"));
        } else {
            sql.push_str(&format!(" ON CONFLICT ({target}) DO UPDATE SET {}", updates.join(", ")));
        }
    }
    sql
}

/// `CREATE TABLE IF NOT EXISTS` with every column typed and `key` as the primary key.
pub(super) fn create_sql(table: &str, columns: &[Column], key: &[String]) -> String {
    let mut parts: Vec<String> =
        columns.iter().map(|c| format!("{} {}", quote(&c.name), c.sql_type.unwrap_or(SqlType::Text).sql())).collect();
    if !key.is_empty() {
        parts.push(format!("PRIMARY KEY ({})", key.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", ")));
    }
    format!("CREATE TABLE IF NOT EXISTS {} ({})", quoted_table(table), parts.join(", "))
}

/// Rows as one text array per column, ready to bind to [`insert_sql`]. With `key`, only the
/// last row of each key is kept: one statement may not update a row twice.
pub(super) fn to_columns(
    columns: &[Column],
    key: &[String],
    rows: &[Vec<Value>],
) -> Result<Vec<Vec<Option<String>>>, String> {
    let key_at: Vec<usize> = key.iter().filter_map(|k| columns.iter().position(|c| &c.name == k)).collect();
    let mut out: Vec<Vec<Option<String>>> = vec![Vec::with_capacity(rows.len()); columns.len()];
    let mut seen = std::collections::HashSet::new();
    let mut kept = Vec::with_capacity(rows.len());
    for row in rows.iter().rev() {
        if key_at.is_empty() || seen.insert(key_at.iter().map(|&i| row[i].to_string()).collect::<Vec<_>>()) {
            kept.push(row);
        }
    }
    for row in kept.into_iter().rev() {
        for ((column, value), out) in columns.iter().zip(row).zip(&mut out) {
            let sql_type = column.sql_type.unwrap_or(SqlType::Text);
            let text = to_sql_text(sql_type, value)
                .map_err(|e| format!("column `{}` ({}): {e}", column.name, sql_type.sql()))?;
            if text.is_none() && key.contains(&column.name) {
                return Err(format!("column `{}` is part of the key and may not be null", column.name));
            }
            out.push(text);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn column(name: &str, sql_type: SqlType) -> Column {
        Column { name: name.into(), source: ColumnSource::Key, sql_type: Some(sql_type), declared: true }
    }

    #[test]
    fn values_become_the_text_of_their_column_type_or_a_named_refusal() {
        // (type, value, text or the start of the refusal): a table from the types' definitions.
        type Case = (SqlType, Value, Result<Option<&'static str>, &'static str>);
        let table: &[Case] = &[
            (SqlType::Bigint, json!(-9_007_199_254_740_993_i64), Ok(Some("-9007199254740993"))),
            (SqlType::Bigint, json!(1.5), Err("1.5 is not an integer")),
            (SqlType::Bigint, json!("7"), Err("\"7\" is not an integer")),
            (SqlType::Integer, json!(2_147_483_648_i64), Err("2147483648 is not an integer in -2147483648")),
            (SqlType::Smallint, json!(-32768), Ok(Some("-32768"))),
            (SqlType::Double, json!(0.25), Ok(Some("0.25"))),
            (SqlType::Numeric, json!(12), Ok(Some("12"))),
            (SqlType::Real, json!(true), Err("true is not a real")),
            (SqlType::Boolean, json!(false), Ok(Some("false"))),
            (SqlType::Boolean, json!(1), Err("1 is not a boolean")),
            (SqlType::Text, json!("a\"b"), Ok(Some("a\"b"))),
            (SqlType::Text, json!(3), Ok(Some("3"))),
            (SqlType::Jsonb, json!({"a": [1]}), Ok(Some("{\"a\":[1]}"))),
            (SqlType::Jsonb, json!("s"), Ok(Some("\"s\""))),
            (SqlType::Timestamptz, json!(0), Ok(Some("1970-01-01 00:00:00.000+00"))),
            (SqlType::Timestamptz, json!(951_782_400_123_i64), Ok(Some("2000-02-29 00:00:00.123+00"))),
            (SqlType::Timestamptz, json!(-1), Ok(Some("1969-12-31 23:59:59.999+00"))),
            (SqlType::Timestamp, json!(1_700_000_000_000_i64), Ok(Some("2023-11-14 22:13:20.000+00"))),
            (SqlType::Timestamptz, json!("2024-01-01T00:00:00Z"), Ok(Some("2024-01-01T00:00:00Z"))),
            (SqlType::Timestamptz, json!(1.5), Err("1.5 is not epoch milliseconds")),
            (SqlType::Bigint, Value::Null, Ok(None)),
        ];
        for (sql_type, value, expected) in table {
            let got = to_sql_text(*sql_type, value);
            match expected {
                Ok(text) => assert_eq!(got.as_ref().map(Option::as_deref), Ok(*text), "{sql_type:?} {value}"),
                Err(start) => {
                    assert!(got.as_ref().is_err_and(|e| e.starts_with(start)), "{sql_type:?} {value}: {got:?}")
                }
            }
        }
    }

    #[test]
    fn an_upsert_keeps_the_last_row_of_each_key_and_names_a_misfit_column() {
        let columns = [column("user_id", SqlType::Text), column("n", SqlType::Bigint)];
        let key = ["user_id".to_string()];
        let rows = vec![vec![json!("a"), json!(1)], vec![json!("b"), json!(1)], vec![json!("a"), json!(2)]];
        let out = to_columns(&columns, &key, &rows).unwrap();
        assert_eq!(out[0], [Some("b".to_string()), Some("a".to_string())]);
        assert_eq!(out[1], [Some("1".to_string()), Some("2".to_string())]);
        // Appends keep every row.
        assert_eq!(to_columns(&columns, &[], &rows).unwrap()[1].len(), 3);
        let err = to_columns(&columns, &key, &[vec![json!("a"), json!("x")]]).unwrap_err();
        assert_eq!(err, "column `n` (bigint): \"x\" is not an integer in -9223372036854775808..=9223372036854775807");
        let err = to_columns(&columns, &key, &[vec![Value::Null, json!(1)]]).unwrap_err();
        assert!(err.contains("`user_id` is part of the key"), "{err}");
    }

    #[test]
    fn the_statements_quote_every_name_and_cast_every_column() {
        let columns = [column("user_id", SqlType::Text), column("total", SqlType::Bigint)];
        assert_eq!(
            insert_sql("s.t", &columns, &["user_id".into()]),
            "INSERT INTO \"s\".\"t\" (\"user_id\", \"total\") SELECT x.\"user_id\"::text, x.\"total\"::bigint FROM \
             unnest($1::text[], $2::text[]) AS x(\"user_id\", \"total\") ON CONFLICT (\"user_id\") DO UPDATE SET \
             \"total\" = EXCLUDED.\"total\""
        );
        assert!(insert_sql("t", &columns[..1], &["user_id".into()]).ends_with("ON CONFLICT (\"user_id\") DO NOTHING"));
        assert!(!insert_sql("t", &columns, &[]).contains("ON CONFLICT"));
        assert_eq!(
            create_sql("t", &columns, &["user_id".into()]),
            "CREATE TABLE IF NOT EXISTS \"t\" (\"user_id\" text, \"total\" bigint, PRIMARY KEY (\"user_id\"))"
        );
    }

    #[test]
    fn a_new_column_takes_the_type_of_its_first_value() {
        let cases = [
            (json!(3), SqlType::Bigint),
            (json!(3.5), SqlType::Double),
            (json!(true), SqlType::Boolean),
            (json!("x"), SqlType::Text),
            (json!([1]), SqlType::Jsonb),
        ];
        for (value, expected) in cases {
            assert_eq!(infer(&value), expected, "{value}");
        }
    }
}
