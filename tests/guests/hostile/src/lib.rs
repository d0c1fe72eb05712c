//! A hostile operator. `config.mode` picks the misbehaviour, which starts at the first record:
//!
//! - `loop`: spins forever; `allocate`: allocates without bound; `recurse`: recurses without
//!   bound; `gigantic-output`: emits 1 MiB values without end; `panic`: panics with a message;
//! - `oversized-key`: writes map state under a 1 MiB map key;
//! - `foreign-key`: reads state through a key handle that names no record of the call;
//! - `state-in-open`: reads state in `open`, where there is no key;
//! - `torn-output`: emits a record table that is not a whole number of rows;
//! - `stray-write`: applies a value write whose bytes lie outside the buffer it sent;
//! - `probe`: tries the environment, files, clocks and network, and emits what it could see;
//! - `deep-row`: emits, per record, a row nested `count` (default 100 000) levels deep;
//! - `error`: returns an operator error (not a trap);
//! - `list-map` (well-behaved): per key, appends each value (a string) to a list state and
//!   counts it in a map state, then emits `{"list": [...], "map": [[k, n], ...]}`; the value
//!   `"clear"` clears both instead.
//! - `list-append` (well-behaved): appends each value to the key's list state, emits nothing;
//! - `state-flood`: writes new 1 KiB map entries under the record's key without end;
//! - `huge-map`: grows one key's map state past 16 MiB, then asks for all its entries.
//! - `aliased-emit`: emits `count` (default 100 000) rows that all point at one 1 MiB value;
//! - `timer-flood`: registers event-time timers on the record's key without end;
//! - `timer-burst`: registers `count` (default 1 000) event-time timers at 1..=count on the
//!   record's key; each that fires is emitted as its timestamp;
//! - `log-flood`: logs one 1 MiB line, then `count` (default 1 000 000) short lines, at error
//!   level;
//! - `raw-state`: reads value state for the record through the raw import (no SDK checks).
//! - `burn` (legal but greedy): spins `count` (default 10 000 000) rounds of arithmetic per
//!   record, then emits it: CPU-bound work that stays within each call's timeout.

use std::hint::black_box;

use eddy_sdk::raw::state as raw_state;
use eddy_sdk::raw::{output as raw_output, types as raw_types};
use eddy_sdk::{Context, Error, ListState, MapState, OpenContext, Operator, Record, Result, TimeDomain, Timer};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Config {
    mode: String,
    /// How many rows, timers or lines the `aliased-emit`, `timer-burst` and `log-flood` modes
    /// use, and how deep `deep-row` nests.
    #[serde(default)]
    count: Option<u64>,
}

#[derive(Debug)]
pub struct Hostile {
    mode: String,
    count: Option<u64>,
    map: MapState<String, u8>,
    list: ListState<String>,
    counts: MapState<String, u64>,
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    black_box(recurse(black_box(depth + 1))) + 1
}

fn probe() -> serde_json::Value {
    let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
    let file = std::fs::read_to_string("/etc/hostname").is_ok() || std::fs::read_dir("/").is_ok();
    let clock_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let network =
        std::net::TcpStream::connect(("127.0.0.1", 9)).is_ok() || std::net::TcpListener::bind(("127.0.0.1", 0)).is_ok();
    serde_json::json!({ "env": env, "file": file, "clock_ms": clock_ms, "network": network })
}

/// A row nested `depth` deep (each level's one field holds the next; 32 bytes a level, so
/// 100 000 levels stay well within a value's limit), written outside in.
fn deep_row(depth: u64) -> Vec<u8> {
    use eddy_wire::row::{Kind, RowFrame};
    let mut buf = Vec::new();
    let mut levels = Vec::new();
    for _ in 1..depth {
        let from = buf.len();
        levels.push((RowFrame::begin(&mut buf, 1, 0), from));
    }
    let innermost = buf.len();
    RowFrame::begin(&mut buf, 1, 0).u64(&mut buf, 0, 7);
    let starts: Vec<usize> = levels.iter().map(|(_, from)| *from).skip(1).chain([innermost]).collect();
    for ((frame, _), child) in levels.iter().zip(starts) {
        frame.close_variable(&mut buf, 0, Kind::Row, child);
    }
    buf
}

impl Operator for Hostile {
    type Config = Config;

    fn open(config: Config, ctx: &mut OpenContext) -> Result<Self> {
        let map = ctx.map_state("map");
        if config.mode == "state-in-open" {
            let id = raw_state::declare("v", raw_state::StateKind::Value, false);
            black_box(raw_state::value_get(id, 0));
        }
        Ok(Hostile {
            mode: config.mode,
            count: config.count,
            map,
            list: ctx.list_state("list"),
            counts: ctx.map_state("counts"),
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        match self.mode.as_str() {
            "loop" => loop {
                black_box(record);
            },
            "burn" => {
                let mut x = 0u64;
                for i in 0..self.count.unwrap_or(10_000_000) {
                    x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
                }
                ctx.emit_raw(None, record.key_bytes(), &x.to_le_bytes(), record.timestamp())?;
            }
            "allocate" => {
                let mut hoard = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "recurse" => {
                black_box(recurse(0));
            }
            "gigantic-output" => {
                let value = vec![b'x'; 1 << 20];
                loop {
                    ctx.emit_raw(None, None, &value, None)?;
                }
            }
            "panic" => panic!("hostile operator gave up on purpose"),
            "oversized-key" => self.map.insert(&"k".repeat(1 << 20), &1)?,
            "foreign-key" => {
                let id = raw_state::declare("v", raw_state::StateKind::Value, false);
                black_box(raw_state::value_get(id, 1_000));
            }
            "torn-output" => {
                raw_output::emit(&raw_types::OutputBatch { data: b"v".to_vec(), records: vec![0; 33] });
            }
            "stray-write" => {
                let id = raw_state::declare("v", raw_state::StateKind::Value, false);
                // One 16-byte write: state, key handle 0, value at offset 8 with 4 bytes, in a
                // buffer of 2 bytes.
                let write: Vec<u8> = [id, 0, 8, 4].iter().flat_map(|w| w.to_le_bytes()).collect();
                raw_state::value_set_many(b"no", &write);
            }
            "probe" => ctx.emit_value(&probe())?,
            "deep-row" => ctx.emit_raw(None, None, &deep_row(self.count.unwrap_or(100_000)), record.timestamp())?,
            // Not hostile: every record back unchanged, the crossing benchmark's guest.
            "echo" => ctx.emit_raw(None, record.key_bytes(), record.value_bytes(), record.timestamp())?,
            "list-map" => {
                let value: String = record.value()?;
                if value == "clear" {
                    self.list.clear()?;
                    self.counts.clear()?;
                } else {
                    self.list.push(&value)?;
                    let n = self.counts.get(&value)?.unwrap_or(0) + 1;
                    self.counts.insert(&value, &n)?;
                }
                let summary = serde_json::json!({ "list": self.list.get()?, "map": self.counts.entries()? });
                ctx.emit_raw(None, record.key_bytes(), &serde_json::to_vec(&summary)?, record.timestamp())?;
            }
            "error" => return Err(Error::bad_record("hostile operator rejects every record")),
            "list-append" => self.list.push(&record.value::<String>()?)?,
            "state-flood" => {
                for i in 0u64.. {
                    self.counts.insert(&format!("{i:0>1024}"), &i)?;
                }
            }
            "huge-map" => {
                // 17 Ki entries with 1 KiB map keys: just past the default read bound (16 MiB).
                for i in 0..17 * 1024 {
                    self.map.insert(&format!("{i:0>1024}"), &1)?;
                }
                ctx.emit_value(&self.map.entries()?.len())?;
            }
            "aliased-emit" => aliased_emit(self.count.unwrap_or(100_000)),
            "raw-state" => {
                let id = raw_state::declare("v", raw_state::StateKind::Value, false);
                black_box(raw_state::value_get(id, 0));
            }
            "timer-flood" => {
                for t in 0i64.. {
                    ctx.register_timer(TimeDomain::EventTime, t)?;
                }
            }
            "timer-burst" => {
                for t in 1..=self.count.unwrap_or(1_000) as i64 {
                    ctx.register_timer(TimeDomain::EventTime, t)?;
                }
            }
            "log-flood" => {
                eddy_sdk::log::error(&"x".repeat(1 << 20));
                for i in 0..self.count.unwrap_or(1_000_000) {
                    eddy_sdk::log::error(&format!("flood line {i}"));
                }
            }
            other => return Err(Error::bad_config(format!("unknown mode {other}"))),
        }
        Ok(())
    }

    fn on_timer(&mut self, timer: &Timer<'_>, ctx: &mut Context) -> Result<()> {
        if self.mode == "timer-burst" {
            ctx.emit_value(&timer.timestamp())?;
        }
        Ok(())
    }
}

/// Emits `rows` records whose values all point at the same 1 MiB span of a 1 MiB buffer:
/// cheap for the guest to send, `rows` MiB for the host to copy.
fn aliased_emit(rows: u64) {
    const VALUE_BYTES: u32 = 1 << 20;
    const ABSENT: u32 = u32::MAX;
    // One packed output row (see `types.batch`): key span (absent), value span, timestamp,
    // flags (no timestamp), output 0.
    let row: Vec<u8> = [ABSENT, ABSENT, 0, VALUE_BYTES]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .chain(0i64.to_le_bytes())
        .chain([0u32, 0].iter().flat_map(|w| w.to_le_bytes()))
        .collect();
    raw_output::emit(&raw_types::OutputBatch {
        data: vec![b'x'; VALUE_BYTES as usize],
        records: row.repeat(rows as usize),
    });
}

eddy_sdk::export_operator!(Hostile);
