//! The PostgreSQL sink: each sink subtask writes on its own connection, a batch of rows per
//! statement (text arrays unnested and cast, see [`rows`]).
//!
//! - **`mode: exactly_once`**: a checkpoint's rows go in one transaction, prepared at the
//!   barrier (`PREPARE TRANSACTION 'eddy:<job>:<subtask>:<checkpoint>'`: durable, invisible)
//!   and committed (`COMMIT PREPARED`) when the checkpoint completes. A restore commits the
//!   transactions its checkpoint lists and rolls back every other one of the job's
//!   ([`PostgresSink::recover`]). The server needs `max_prepared_transactions` of at least the
//!   sink's parallelism times the checkpoints in flight. Without `checkpoints:` the whole run
//!   is one transaction, committed at the end of the input.
//! - **`mode: upsert`**: every batch is upserted at once by `key`; a replay writes the same rows.
//!
//! The table's columns are checked at start (each mapped column present, of a type the sink
//! writes, as declared), and the insert is prepared then, so a key without a unique constraint
//! fails before any record is read. A table created by the sink takes its types from the spec,
//! or from the first values written. Side outputs are not written to the table; each is named
//! once in the log.

mod rows;
mod transactions;

use std::collections::BTreeSet;

use eddy_core::RecordBatch;
use eddy_plan::{PostgresMode, PostgresSinkSpec, SqlType};
use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Statement};
use serde_json::Value;

use self::rows::Column;
pub use self::transactions::PostgresSinkState;
use super::Sink;

/// Rows buffered in an open transaction before they are sent (upserts are sent per batch).
const FLUSH_ROWS: usize = 4096;

/// Whether `CREATE TABLE IF NOT EXISTS` failed only because another session created the same
/// table at the same moment. PostgreSQL then reports, depending on where the two met, the
/// table (42P07), its row type of the same name (42710, "type ... already exists") or the
/// catalog's unique index (23505).
fn lost_a_creation_race(code: Option<&SqlState>) -> bool {
    code.is_some_and(|c| {
        [SqlState::DUPLICATE_TABLE, SqlState::DUPLICATE_OBJECT, SqlState::UNIQUE_VIOLATION].contains(c)
    })
}

/// A PostgreSQL error with the server's message, detail and hint (the client's own `Display`
/// says only "db error").
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut text = db.message().to_owned();
            if let Some(detail) = db.detail() {
                text.push_str(&format!(" ({detail})"));
            }
            if let Some(hint) = db.hint() {
                text.push_str(&format!("; hint: {hint}"));
            }
            text
        }
        None => e.to_string(),
    }
}

fn io_error(what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("postgres sink: {what}"))
}

/// `url` as it may be shown: a password a connection placed in it is left out.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split_once(':').map_or(user_info, |(user, _)| user);
            format!("{scheme}://{user}@{host}{}", &rest[authority_end..])
        }
        None => url.to_owned(),
    }
}

/// The connection URL of the spec and how to name it in messages (never with a password).
fn url(spec: &PostgresSinkSpec) -> std::io::Result<(String, String)> {
    if let Some(name) = &spec.connection {
        return Err(io_error(crate::unresolved_connection("the PostgreSQL sink", name)));
    }
    match (&spec.url, &spec.url_env) {
        (Some(url), _) => Ok((url.clone(), without_password(url))),
        (None, Some(env)) => std::env::var(env)
            .map(|url| (url, format!("the URL in ${env}")))
            .map_err(|_| io_error(format!("`url_env` names ${env}, which is not set in this process"))),
        (None, None) => Err(io_error("no `url`")),
    }
}

/// Connects on a thread of its own: the client drives its own runtime, which may not start
/// inside another (a worker starts jobs from its async loop).
fn connect(spec: &PostgresSinkSpec) -> std::io::Result<Client> {
    let (url, shown) = url(spec)?;
    std::thread::scope(|s| {
        s.spawn(|| Client::connect(&url, NoTls))
            .join()
            .map_err(|_| io_error("the connecting thread panicked"))?
            .map_err(|e| io_error(format!("cannot connect to {shown}: {}", describe(&e))))
    })
}

/// The mapped columns' types in the table (`None`: no such table).
fn table_types(client: &mut Client, table: &str) -> Result<Option<Vec<(String, String)>>, postgres::Error> {
    let (schema, name) = match table.split_once('.') {
        Some((s, t)) => (Some(s), t),
        None => (None, table),
    };
    let rows = client.query(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_schema = coalesce($1::text, current_schema()) AND table_name = $2::text",
        &[&schema, &name],
    )?;
    Ok((!rows.is_empty()).then(|| rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
}

/// Gives every column its type in the existing table, refusing a missing column, a type the
/// sink cannot write, or one other than the spec declares.
fn apply_table_types(table: &str, columns: &mut [Column], found: &[(String, String)]) -> std::io::Result<()> {
    for column in columns {
        let Some((_, data_type)) = found.iter().find(|(name, _)| name == &column.name) else {
            return Err(io_error(format!(
                "table `{table}` has no column `{}` (it has {}); add it, or map another column",
                column.name,
                found.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            )));
        };
        let Some(sql_type) = SqlType::from_information_schema(data_type) else {
            return Err(io_error(format!(
                "column `{}` of table `{table}` is {data_type}, which the sink does not write",
                column.name
            )));
        };
        if let Some(declared) = column.sql_type.filter(|d| column.declared && *d != sql_type) {
            return Err(io_error(format!(
                "column `{}` of table `{table}` is {data_type}, but the spec declares {}",
                column.name,
                declared.sql()
            )));
        }
        column.sql_type = Some(sql_type);
    }
    Ok(())
}

/// The names of the transactions prepared in the connected database.
fn prepared_transactions(client: &mut Client) -> Result<Vec<String>, postgres::Error> {
    let rows = client.query("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()", &[])?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Ends prepared transaction `gid` (`commit` or roll back); one already ended is done.
fn finish_prepared(client: &mut Client, gid: &str, commit: bool) -> Result<(), postgres::Error> {
    let verb = if commit { "COMMIT PREPARED" } else { "ROLLBACK PREPARED" };
    match client.batch_execute(&format!("{verb} {}", literal(gid))) {
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(()),
        other => other,
    }
}

/// One sink subtask's connection and open transaction.
pub struct PostgresSink {
    spec: PostgresSinkSpec,
    job: String,
    subtask: u32,
    checkpointing: bool,
    client: Client,
    /// Commits prepared transactions: `COMMIT PREPARED` may not run inside the transaction
    /// the writing connection has open by then.
    committer: Option<Client>,
    columns: Vec<Column>,
    /// Prepared once every column's type is known (at start, or once a created table exists).
    insert: Option<Statement>,
    buffered: Vec<Vec<Value>>,
    in_transaction: bool,
    /// Prepared, not known to be committed: `(checkpoint, name)`, oldest first.
    prepared: Vec<(u64, String)>,
    side_outputs_seen: BTreeSet<String>,
}

impl std::fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSink").field("table", &self.spec.table).field("subtask", &self.subtask).finish()
    }
}

impl PostgresSink {
    /// Connects subtask `subtask` of `job`'s sink and checks the table (created at the first
    /// write when missing and `create` is set). `checkpointing`: the job takes checkpoints.
    pub fn open(spec: &PostgresSinkSpec, job: &str, subtask: u32, checkpointing: bool) -> std::io::Result<Self> {
        let mut client = connect(spec)?;
        let mut columns = rows::columns(spec).map_err(io_error)?;
        let transactional = spec.mode == PostgresMode::ExactlyOnce;
        if transactional && checkpointing {
            let row = client.query_one("SHOW max_prepared_transactions", &[]).map_err(|e| io_error(describe(&e)))?;
            let max: String = row.get(0);
            if max.trim() == "0" {
                return Err(io_error(
                    "the server's max_prepared_transactions is 0, and exactly_once prepares a transaction per sink \
                     subtask and checkpoint: set it to at least twice the sink's parallelism (and restart the \
                     server), or use `mode: upsert`",
                ));
            }
        }
        let found = table_types(&mut client, &spec.table).map_err(|e| io_error(describe(&e)))?;
        let mut sink = PostgresSink {
            spec: spec.clone(),
            job: job.to_owned(),
            subtask,
            checkpointing,
            client,
            committer: None,
            columns: Vec::new(),
            insert: None,
            buffered: Vec::new(),
            in_transaction: false,
            prepared: Vec::new(),
            side_outputs_seen: BTreeSet::new(),
        };
        match found {
            Some(found) => {
                apply_table_types(&spec.table, &mut columns, &found)?;
                sink.columns = columns;
                sink.prepare_insert()?;
            }
            None if spec.create => sink.columns = columns,
            None => {
                return Err(io_error(format!(
                    "table `{}` does not exist: create it, or set `create: true` to have the sink create it",
                    spec.table
                )));
            }
        }
        Ok(sink)
    }

    fn prepare_insert(&mut self) -> std::io::Result<()> {
        let sql = rows::insert_sql(&self.spec.table, &self.columns, &self.spec.key);
        let refused = |e: postgres::Error| {
            io_error(format!("table `{}` does not take the sink's rows: {}", self.spec.table, describe(&e)))
        };
        let statement = self.client.prepare(&sql).map_err(refused)?;
        // Planning finds what preparing does not (a key without a unique constraint): write
        // no rows once, and take nothing back.
        let none: Vec<Option<String>> = Vec::new();
        let params: Vec<&(dyn ToSql + Sync)> = self.columns.iter().map(|_| &none as &(dyn ToSql + Sync)).collect();
        let mut trial = self.client.transaction().map_err(refused)?;
        trial.execute(&statement, &params).map_err(refused)?;
        trial.rollback().map_err(refused)?;
        self.insert = Some(statement);
        Ok(())
    }

    /// Creates the missing table, typing undeclared columns by the first values buffered.
    fn create_table(&mut self) -> std::io::Result<()> {
        for (i, column) in self.columns.iter_mut().enumerate() {
            if column.sql_type.is_none() {
                let first = self.buffered.iter().map(|r| &r[i]).find(|v| !v.is_null()).unwrap_or(&Value::Null);
                column.sql_type = Some(rows::infer(first));
            }
        }
        let sql = rows::create_sql(&self.spec.table, &self.columns, &self.spec.key);
        match self.client.batch_execute(&sql) {
            Ok(()) => {}
            // Another subtask created it at the same moment: its types win.
            Err(e) if lost_a_creation_race(e.code()) => {}
            Err(e) => return Err(io_error(format!("cannot create table `{}`: {}", self.spec.table, describe(&e)))),
        }
        let found = table_types(&mut self.client, &self.spec.table)
            .map_err(|e| io_error(describe(&e)))?
            .ok_or_else(|| io_error(format!("table `{}` is gone right after it was created", self.spec.table)))?;
        apply_table_types(&self.spec.table, &mut self.columns, &found)?;
        tracing::info!(table = %self.spec.table, job = %self.job, "postgres sink created its table");
        self.prepare_insert()
    }

    /// Sends the buffered rows (in the open transaction, for exactly once).
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffered.is_empty() {
            return Ok(());
        }
        if self.insert.is_none() {
            self.create_table()?;
        }
        let table = &self.spec.table;
        let columns = rows::to_columns(&self.columns, &self.spec.key, &self.buffered)
            .map_err(|e| io_error(format!("table `{table}`: {e}")))?;
        if self.spec.mode == PostgresMode::ExactlyOnce && !self.in_transaction {
            self.client.batch_execute("BEGIN").map_err(|e| io_error(describe(&e)))?;
            self.in_transaction = true;
        }
        let params: Vec<&(dyn ToSql + Sync)> = columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
        let Some(insert) = &self.insert else { return Err(io_error("no insert statement")) };
        self.client
            .execute(insert, &params)
            .map_err(|e| io_error(format!("writing {} rows to `{table}`: {}", self.buffered.len(), describe(&e))))?;
        self.buffered.clear();
        Ok(())
    }

    fn committer(&mut self) -> std::io::Result<&mut Client> {
        if self.committer.is_none() {
            self.committer = Some(connect(&self.spec)?);
        }
        self.committer.as_mut().ok_or_else(|| io_error("no committing connection"))
    }

    /// Readies the database for a run of `job` that restored a checkpoint whose sink subtasks
    /// stored `restored` (none: a fresh start): the transactions listed are committed (that
    /// checkpoint completed), every other one the job left prepared is rolled back (its rows
    /// come again from the sources' restored positions).
    pub fn recover(spec: &PostgresSinkSpec, job: &str, restored: &[PostgresSinkState]) -> std::io::Result<()> {
        if spec.mode != PostgresMode::ExactlyOnce {
            return Ok(());
        }
        let mut client = connect(spec)?;
        let found = prepared_transactions(&mut client).map_err(|e| io_error(describe(&e)))?;
        let resolution = transactions::resolve(job, &found, restored);
        for (gids, commit) in [(&resolution.commit, true), (&resolution.roll_back, false)] {
            for gid in gids {
                finish_prepared(&mut client, gid, commit)
                    .map_err(|e| io_error(format!("ending prepared transaction {gid}: {}", describe(&e))))?;
            }
        }
        if !found.is_empty() {
            tracing::info!(
                job,
                table = %spec.table,
                committed = resolution.commit.len(),
                rolled_back = resolution.roll_back.len(),
                "postgres sink recovered the transactions its job left prepared"
            );
        }
        Ok(())
    }

    /// Commits what a checkpoint's sink state lists (the job's final checkpoint).
    pub fn commit(spec: &PostgresSinkSpec, state: &PostgresSinkState) -> std::io::Result<()> {
        if state.prepared.is_empty() {
            return Ok(());
        }
        let mut client = connect(spec)?;
        for gid in &state.prepared {
            finish_prepared(&mut client, gid, true)
                .map_err(|e| io_error(format!("committing prepared transaction {gid}: {}", describe(&e))))?;
        }
        Ok(())
    }
}

impl Sink for PostgresSink {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        if let Some(name) = output {
            if self.side_outputs_seen.insert(name.to_owned()) {
                tracing::warn!(
                    job = %self.job, table = %self.spec.table, output = name,
                    "side output records are not written to the postgres table"
                );
            }
            return Ok(());
        }
        for record in batch.iter() {
            let row = rows::extract(&self.columns, &record)
                .map_err(|e| io_error(format!("table `{}`: {e}", self.spec.table)))?;
            self.buffered.push(row);
        }
        if self.spec.mode == PostgresMode::Upsert || self.buffered.len() >= FLUSH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.flush()?;
        if !self.checkpointing && self.in_transaction {
            self.client.batch_execute("COMMIT").map_err(|e| io_error(describe(&e)))?;
            self.in_transaction = false;
        }
        Ok(())
    }

    /// Exactly once: the rows since the last barrier become a prepared transaction; the state
    /// lists every prepared one not yet committed.
    fn pre_commit(&mut self, checkpoint: u64) -> std::io::Result<Option<Value>> {
        self.flush()?;
        if self.spec.mode != PostgresMode::ExactlyOnce {
            return Ok(None);
        }
        if self.in_transaction {
            let gid = transactions::transaction_name(&self.job, self.subtask, checkpoint);
            self.client
                .batch_execute(&format!("PREPARE TRANSACTION {}", literal(&gid)))
                .map_err(|e| io_error(format!("preparing transaction {gid}: {}", describe(&e))))?;
            self.in_transaction = false;
            self.prepared.push((checkpoint, gid));
        }
        let state = PostgresSinkState { prepared: self.prepared.iter().map(|(_, g)| g.clone()).collect() };
        serde_json::to_value(state).map(Some).map_err(io_error)
    }

    fn notify_complete(&mut self, checkpoint: u64) -> std::io::Result<()> {
        let done = self.prepared.iter().take_while(|(n, _)| *n <= checkpoint).count();
        if done == 0 {
            return Ok(());
        }
        let gids: Vec<String> = self.prepared[..done].iter().map(|(_, g)| g.clone()).collect();
        let client = self.committer()?;
        for gid in &gids {
            finish_prepared(client, gid, true)
                .map_err(|e| io_error(format!("committing prepared transaction {gid}: {}", describe(&e))))?;
        }
        self.prepared.drain(..done);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_concurrent_creation_of_the_same_table_counts_as_created() {
        let lost = |code: &str| lost_a_creation_race(Some(&SqlState::from_code(code)));
        assert!(lost("42P07") && lost("42710") && lost("23505"), "table, row type, catalog index");
        assert!(!lost("42501") && !lost("42601") && !lost("3F000"), "no permission, bad SQL, no schema");
        assert!(!lost_a_creation_race(None), "no server error at all (the connection dropped)");
    }
}
