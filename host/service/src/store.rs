//! The service's own records (tenants, tokens, artifacts, jobs) in one embedded redb file.
//!
//! Each table maps a string key to a JSON document. A key starting with `<tenant>/` keeps a
//! tenant's records contiguous, so listing them is a range scan that decodes no other
//! tenant's records. A job's spec (up to a MiB) is kept apart from its record, so listing,
//! scraping and admission read summaries only. Every write is one
//! transaction, durable when [`Store::write`] returns (redb syncs at commit): a server killed
//! right after answering a request keeps what it answered.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A table of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Tenant id → [`crate::model::Tenant`].
    Tenants,
    /// sha256 of a token → [`crate::model::Token`].
    Tokens,
    /// `<tenant>/<digest>` → [`crate::model::Artifact`].
    Artifacts,
    /// `<tenant>/<name>@<version>` → the digest it names.
    ArtifactNames,
    /// `<tenant>/<job>` → [`crate::model::JobRecord`].
    Jobs,
    /// `<tenant>/<job>` → the pipeline spec as submitted (YAML or JSON text).
    JobSpecs,
    /// sha256 of a join token → [`crate::model::JoinToken`].
    JoinTokens,
    /// A worker name the cluster CA issued a certificate for → [`crate::model::IssuedName`].
    IssuedNames,
    /// `<tenant>/<name>` → a stored connection ([`crate::connections`]), secrets included.
    Connections,
    /// The store's own counters (`attempt`: the last job attempt number handed out).
    Meta,
}

impl Table {
    fn definition(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(match self {
            Table::Tenants => "tenants",
            Table::Tokens => "tokens",
            Table::Artifacts => "artifacts",
            Table::ArtifactNames => "artifact_names",
            Table::Jobs => "jobs",
            Table::JobSpecs => "job_specs",
            Table::JoinTokens => "join_tokens",
            Table::IssuedNames => "issued_names",
            Table::Connections => "connections",
            Table::Meta => "meta",
        })
    }

    const ALL: [Table; 10] = [
        Table::Tenants,
        Table::Tokens,
        Table::Artifacts,
        Table::ArtifactNames,
        Table::Jobs,
        Table::JobSpecs,
        Table::JoinTokens,
        Table::IssuedNames,
        Table::Connections,
        Table::Meta,
    ];
}

/// The store failed: disk, corruption, or a record this version cannot read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb refused.
    #[error("store: {0}")]
    Db(String),
    /// A record did not decode.
    #[error("store: record `{key}` in {table:?} is unreadable: {error}")]
    Corrupt {
        /// Its table.
        table: Table,
        /// Its key.
        key: String,
        /// Why.
        error: serde_json::Error,
    },
}

fn db_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::Db(e.to_string())
}

/// The open store.
#[derive(Debug)]
pub struct Store {
    db: Database,
}

impl Store {
    /// Opens (or creates) the store file and every table.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(db_error)?;
        let txn = db.begin_write().map_err(db_error)?;
        for table in Table::ALL {
            txn.open_table(table.definition()).map_err(db_error)?;
        }
        txn.commit().map_err(db_error)?;
        let store = Self { db };
        store.write(migrate_jobs)?;
        Ok(store)
    }

    /// One record.
    pub fn get<T: DeserializeOwned>(&self, table: Table, key: &str) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read().map_err(db_error)?;
        let t = txn.open_table(table.definition()).map_err(db_error)?;
        let Some(value) = t.get(key).map_err(db_error)? else { return Ok(None) };
        decode(table, key, value.value()).map(Some)
    }

    /// Every record whose key starts with `prefix`, in key order.
    pub fn list<T: DeserializeOwned>(&self, table: Table, prefix: &str) -> Result<Vec<T>, StoreError> {
        Ok(self.list_keyed(table, prefix)?.into_iter().map(|(_, v)| v).collect())
    }

    /// [`Store::list`] with the keys.
    pub fn list_keyed<T: DeserializeOwned>(&self, table: Table, prefix: &str) -> Result<Vec<(String, T)>, StoreError> {
        let txn = self.db.begin_read().map_err(db_error)?;
        scan(&txn.open_table(table.definition()).map_err(db_error)?, table, prefix)
    }

    /// Runs `f` in one write transaction, committed (and synced) only if `f` succeeds.
    pub fn write<R, E: From<StoreError>>(&self, f: impl FnOnce(&mut Txn<'_>) -> Result<R, E>) -> Result<R, E> {
        let txn = self.db.begin_write().map_err(db_error)?;
        let result = f(&mut Txn { txn: &txn })?;
        txn.commit().map_err(db_error)?;
        Ok(result)
    }
}

/// A write transaction in progress.
pub struct Txn<'a> {
    txn: &'a redb::WriteTransaction,
}

impl std::fmt::Debug for Txn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Txn")
    }
}

impl Txn<'_> {
    /// One record, as this transaction sees it.
    pub fn get<T: DeserializeOwned>(&self, table: Table, key: &str) -> Result<Option<T>, StoreError> {
        let t = self.txn.open_table(table.definition()).map_err(db_error)?;
        let Some(value) = t.get(key).map_err(db_error)? else { return Ok(None) };
        decode(table, key, value.value()).map(Some)
    }

    /// [`Store::list_keyed`], as this transaction sees it.
    pub fn list_keyed<T: DeserializeOwned>(&self, table: Table, prefix: &str) -> Result<Vec<(String, T)>, StoreError> {
        scan(&self.txn.open_table(table.definition()).map_err(db_error)?, table, prefix)
    }

    /// Inserts or replaces a record.
    pub fn put<T: Serialize>(&mut self, table: Table, key: &str, value: &T) -> Result<(), StoreError> {
        let bytes =
            serde_json::to_vec(value).map_err(|error| StoreError::Corrupt { table, key: key.to_string(), error })?;
        let mut t = self.txn.open_table(table.definition()).map_err(db_error)?;
        t.insert(key, bytes.as_slice()).map_err(db_error)?;
        Ok(())
    }

    /// Adds one to the counter `name` of [`Table::Meta`] (which starts at `first` when new) and
    /// returns the new value: numbers that never repeat, across restarts too, since the
    /// increment commits with the transaction.
    pub fn next(&mut self, name: &str, first: u64) -> Result<u64, StoreError> {
        let next = self.get::<u64>(Table::Meta, name)?.map_or(first, |n| n.saturating_add(1));
        self.put(Table::Meta, name, &next)?;
        Ok(next)
    }

    /// Removes a record; whether it existed.
    pub fn delete(&mut self, table: Table, key: &str) -> Result<bool, StoreError> {
        let mut t = self.txn.open_table(table.definition()).map_err(db_error)?;
        Ok(t.remove(key).map_err(db_error)?.is_some())
    }
}

/// Stores written before jobs were keyed by tenant kept `id → record with its spec inline`:
/// each such record moves to `<tenant>/<id>`, its spec to [`Table::JobSpecs`]. Idempotent
/// (a migrated key holds a `/`), and one transaction, so a crash midway migrates nothing.
fn migrate_jobs(txn: &mut Txn<'_>) -> Result<(), StoreError> {
    let old: Vec<(String, serde_json::Value)> =
        txn.list_keyed(Table::Jobs, "")?.into_iter().filter(|(key, _)| !key.contains('/')).collect();
    for (id, mut record) in old {
        let tenant = record.get("tenant").and_then(|t| t.as_str()).unwrap_or_default().to_owned();
        let spec = record.as_object_mut().and_then(|o| o.remove("spec"));
        let key = format!("{tenant}/{id}");
        if let Some(serde_json::Value::String(spec)) = spec {
            txn.put(Table::JobSpecs, &key, &spec)?;
        }
        txn.put(Table::Jobs, &key, &record)?;
        txn.delete(Table::Jobs, &id)?;
        tracing::info!(job = %id, tenant = %tenant, "moved a job record to its tenant's keys");
    }
    Ok(())
}

fn scan<T: DeserializeOwned>(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    table: Table,
    prefix: &str,
) -> Result<Vec<(String, T)>, StoreError> {
    let mut out = Vec::new();
    for entry in t.range(prefix..).map_err(db_error)? {
        let (key, value) = entry.map_err(db_error)?;
        if !key.value().starts_with(prefix) {
            break;
        }
        out.push((key.value().to_string(), decode(table, key.value(), value.value())?));
    }
    Ok(out)
}

fn decode<T: DeserializeOwned>(table: Table, key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|error| StoreError::Corrupt { table, key: key.to_string(), error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening_and_list_by_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eddy.redb");
        {
            let store = Store::open(&path).unwrap();
            store
                .write(|t| -> Result<(), StoreError> {
                    t.put(Table::Jobs, "a/1", &1u32)?;
                    t.put(Table::Jobs, "a/2", &2u32)?;
                    t.put(Table::Jobs, "ab/3", &3u32)?;
                    t.put(Table::Jobs, "b/4", &4u32)
                })
                .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.list::<u32>(Table::Jobs, "a/").unwrap(), [1, 2]);
        assert_eq!(store.get::<u32>(Table::Jobs, "b/4").unwrap(), Some(4));
        assert_eq!(store.get::<u32>(Table::Tenants, "b/4").unwrap(), None, "tables are separate");
    }

    #[test]
    fn a_failed_transaction_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("eddy.redb")).unwrap();
        let result = store.write(|t| -> Result<(), StoreError> {
            t.put(Table::Tenants, "t", &"half")?;
            Err(StoreError::Db("refused midway".into()))
        });
        assert!(result.is_err());
        assert_eq!(store.get::<String>(Table::Tenants, "t").unwrap(), None);
    }

    #[test]
    fn job_records_of_an_older_store_move_to_their_tenants_keys_with_the_spec_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eddy.redb");
        {
            let store = Store::open(&path).unwrap();
            let old = serde_json::json!({"id": "j_1", "tenant": "t_a", "name": "wc", "spec": "name: wc\n"});
            store.write(|t| t.put(Table::Jobs, "j_1", &old)).unwrap();
        }
        let store = Store::open(&path).unwrap();
        let moved: serde_json::Value = store.get(Table::Jobs, "t_a/j_1").unwrap().expect("moved");
        assert_eq!(moved, serde_json::json!({"id": "j_1", "tenant": "t_a", "name": "wc"}));
        assert_eq!(store.get::<String>(Table::JobSpecs, "t_a/j_1").unwrap().as_deref(), Some("name: wc\n"));
        assert_eq!(store.get::<serde_json::Value>(Table::Jobs, "j_1").unwrap(), None);
        // Opening again changes nothing.
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.list::<serde_json::Value>(Table::Jobs, "").unwrap().len(), 1);
    }

    #[test]
    fn counters_increase_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eddy.redb");
        let first = Store::open(&path).unwrap().write(|t| t.next("attempt", 100)).unwrap();
        let second = Store::open(&path).unwrap().write(|t| t.next("attempt", 100)).unwrap();
        assert_eq!((first, second), (100, 101));
    }

    #[test]
    fn an_unreadable_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("eddy.redb")).unwrap();
        store.write(|t| t.put(Table::Jobs, "j1", &"text")).unwrap();
        let err = store.get::<u64>(Table::Jobs, "j1").unwrap_err();
        assert!(err.to_string().contains("`j1`"), "{err}");
    }
}
