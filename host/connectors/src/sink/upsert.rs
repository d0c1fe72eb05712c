//! The idempotent upsert sink: each record writes its value under its key into a table (a
//! RocksDB database with its write-ahead log on); the last write wins. Side outputs go under
//! `<name>/` before the key.
//!
//! Why this is exactly-once in effect without transactions: after a restore from checkpoint
//! `n`, the records after `n` come again, per key in the same order, with the same values, so
//! every key ends up with the value a run without failure gives it. Readers may briefly see a
//! key's older value again during the replay. At each checkpoint barrier the table's log is
//! synced, so no write a checkpoint covers is lost in a crash.

use std::path::Path;

use eddy_core::RecordBatch;
use eddy_state::{RocksDbBackend, RocksDbConfig, StateBackend, StateError};

use crate::sink::Sink;

/// See the module docs.
#[derive(Debug)]
pub struct UpsertSink {
    table: RocksDbBackend,
    key: Vec<u8>,
}

fn io(e: StateError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// The table key of a record: `<output>/` for side outputs, then the record key.
fn table_key(buf: &mut Vec<u8>, output: Option<&str>, key: &[u8]) {
    buf.clear();
    if let Some(name) = output {
        buf.extend_from_slice(name.as_bytes());
        buf.push(b'/');
    }
    buf.extend_from_slice(key);
}

impl UpsertSink {
    /// Opens (or creates) the table in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        let table = RocksDbBackend::open_durable(dir, RocksDbConfig::default()).map_err(io)?;
        Ok(Self { table, key: Vec::new() })
    }

    /// Every (key, value) of the table in `dir`, in key order (for readers and tests).
    pub fn read_table(dir: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut rows = Vec::new();
        Self::scan_table(dir, &mut |k, v| rows.push((k.to_vec(), v.to_vec())))?;
        Ok(rows)
    }

    /// Hands every (key, value) of the table in `dir` to `visit`, in key order, without
    /// holding the table in memory (a reader streaming it out).
    pub fn scan_table(dir: &Path, visit: &mut dyn FnMut(&[u8], &[u8])) -> std::io::Result<()> {
        let table = RocksDbBackend::open_read_only(dir).map_err(io)?;
        table.scan_prefix(b"", visit).map_err(io)
    }
}

impl Sink for UpsertSink {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        for (i, r) in batch.iter().enumerate() {
            let Some(key) = r.key else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("record {i} has no key; the upsert sink keys its table by record key (add key_by)"),
                ));
            };
            table_key(&mut self.key, output, key);
            self.table.put(&self.key, &crate::values::json_text(r.value)).map_err(io)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.table.sync().map_err(io)
    }

    fn pre_commit(&mut self, _checkpoint: u64) -> std::io::Result<Option<serde_json::Value>> {
        self.table.sync().map_err(io)?;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_write_per_key_wins_and_replays_change_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = |rows: &[(&str, &str)]| {
            let mut b = RecordBatch::default();
            for (k, v) in rows {
                b.push(Some(k.as_bytes()), v.as_bytes(), None);
            }
            b
        };
        {
            let mut sink = UpsertSink::open(dir.path()).expect("open");
            sink.write(None, &batch(&[("a", "1"), ("b", "1"), ("a", "2")])).expect("write");
            sink.pre_commit(1).expect("sync");
            // A replay of the same records after a restore.
            sink.write(None, &batch(&[("a", "1"), ("b", "1"), ("a", "2")])).expect("write");
            sink.write(Some("late"), &batch(&[("a", "9")])).expect("write");
            sink.finish().expect("finish");
            let err = sink.write(None, &{
                let mut b = RecordBatch::default();
                b.push(None, b"x", None);
                b
            });
            assert!(err.expect_err("no key").to_string().contains("key_by"));
        }
        let rows = UpsertSink::read_table(dir.path()).expect("read");
        let text: Vec<(String, String)> = rows
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), String::from_utf8_lossy(&v).into_owned()))
            .collect();
        assert_eq!(text, [("a".into(), "2".into()), ("b".into(), "1".into()), ("late/a".into(), "9".into())]);
    }
}
