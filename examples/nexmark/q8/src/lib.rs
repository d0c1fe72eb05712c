//! Nexmark q8, monitor new users: the persons who created an auction in the same 10-second
//! tumbling window in which they registered. Nexmark's definition:
//!
//! ```sql
//! SELECT P.id, P.name, P.starttime
//! FROM (SELECT id, name, TUMBLE_START(date_time, INTERVAL '10' SECOND) AS starttime,
//!              TUMBLE_END(date_time, INTERVAL '10' SECOND) AS endtime
//!       FROM person GROUP BY id, name, TUMBLE(date_time, INTERVAL '10' SECOND)) P
//! JOIN (SELECT seller, TUMBLE_START(date_time, INTERVAL '10' SECOND) AS starttime,
//!              TUMBLE_END(date_time, INTERVAL '10' SECOND) AS endtime
//!       FROM auction GROUP BY seller, TUMBLE(date_time, INTERVAL '10' SECOND)) A
//! ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime
//! ```
//!
//! Rows: `{"id", "name", "window_start"}`, once per person (and name) and window, however many
//! auctions the person created in it.
//!
//! The pipeline (`q8.yaml`): `nexmark-select` keeps persons keyed by `id` and auctions keyed
//! by `seller`; `key_by: key` brings a person and their auctions to the same key, where this
//! operator is both windows and the join. Per person id it keeps, in one `ValueState`, the
//! windows still open: for each, the names registered in it and whether an auction was
//! created in it. An event-time timer at the window's last millisecond (`end - 1`, when a
//! host window would fire) emits the row if both happened, then forgets the window; so the
//! order in which a person and their auctions arrive does not matter. Like a host window
//! without allowed lateness, a record whose window already fired (`end - 1` at or behind
//! the watermark) goes to the side output `late` instead. Rows carry the timestamp `end - 1`
//! and the person's id as key.

use eddy_sdk::codec::Field;
use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result, Row, SideOutput, TimeDomain, Timer, ValueState};
use nexmark_model::tumble_start;
use serde::{Deserialize, Serialize};

/// The tumbling window.
pub const WINDOW_MS: i64 = 10_000;

/// What happened for one person id in one window. Stored positionally, as the JSON array
/// `[window_start, names, sold]`: the state is read on every record of the key, and parsing
/// the field names of `{"window_start": .., "names": .., "sold": ..}` was a third of that.
/// Its derived `Deserialize` reads either form, so state written before reads back.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Seen {
    /// The window's start (ms).
    pub window_start: i64,
    /// Names the person registered with in the window (sorted, distinct; one in Nexmark).
    pub names: Vec<String>,
    /// Whether the person created an auction in the window.
    pub sold: bool,
}

impl Serialize for Seen {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        (self.window_start, &self.names, self.sold).serialize(serializer)
    }
}

/// One output row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewUser<'a> {
    /// The person's id.
    pub id: u64,
    /// The person's name.
    pub name: &'a str,
    /// Start of the window (ms).
    pub window_start: i64,
}

/// The operator.
#[derive(Debug)]
pub struct MonitorNewUsers {
    windows: ValueState<Vec<Seen>>,
    late: SideOutput,
    /// The events' `type`, its slot remembered per schema.
    kind: Field,
}

impl Operator for MonitorNewUsers {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        Ok(MonitorNewUsers {
            windows: ctx.value_state("open-windows"),
            late: ctx.side_output("late"),
            kind: Field::new("type"),
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let Some(t) = record.timestamp() else {
            return Err(Error::bad_record("an event without event time: set `timestamp` on the source"));
        };
        let window_start = tumble_start(t, WINDOW_MS);
        let fire_at = window_start + WINDOW_MS - 1;
        if fire_at <= ctx.current_watermark() {
            return ctx.emit_raw(Some(self.late), record.key_bytes(), record.value_bytes(), Some(t));
        }
        let kind = record.value_str_bytes(&self.kind)?.ok_or_else(|| Error::bad_record("an event without a `type`"))?;
        let person_name = match &*kind {
            b"person" => Some(record.row::<PersonName>()?.name),
            b"auction" => None,
            _ => return Ok(()),
        };
        let mut windows = self.windows.get()?.unwrap_or_default();
        let (i, new) = match windows.iter().position(|w| w.window_start == window_start) {
            Some(i) => (i, false),
            None => {
                windows.push(Seen { window_start, names: Vec::new(), sold: false });
                (windows.len() - 1, true)
            }
        };
        let seen = &mut windows[i];
        let changed = match person_name {
            Some(name) => match seen.names.binary_search(&name) {
                Ok(_) => false,
                Err(at) => {
                    seen.names.insert(at, name);
                    true
                }
            },
            None => !std::mem::replace(&mut seen.sold, true),
        };
        // A seller's further auctions in a window already sold change nothing: no write.
        if changed {
            self.windows.set(&windows)?;
        }
        // A window already in the state has its timer (both are created here, and both leave
        // when it fires): registering again would be a crossing for nothing.
        if new {
            ctx.register_timer(TimeDomain::EventTime, fire_at)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, timer: &Timer<'_>, ctx: &mut Context) -> Result<()> {
        let window_start = timer.timestamp() + 1 - WINDOW_MS;
        let Some(mut windows) = self.windows.get()? else { return Ok(()) };
        let Some(i) = windows.iter().position(|w| w.window_start == window_start) else { return Ok(()) };
        let seen = windows.swap_remove(i);
        if windows.is_empty() {
            self.windows.clear()?
        } else {
            self.windows.set(&windows)?
        }
        if seen.sold {
            let id: u64 = timer.key()?;
            for name in &seen.names {
                ctx.emit(&id, &NewUser { id, name, window_start })?;
            }
        }
        Ok(())
    }
}

/// The field of a person this query reads.
#[derive(Debug, Deserialize, Row)]
struct PersonName {
    name: String,
}

eddy_sdk::export_operator!(MonitorNewUsers);

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(window_start: i64, names: &[&str], sold: bool) -> Seen {
        Seen { window_start, names: names.iter().map(|n| n.to_string()).collect(), sold }
    }

    #[test]
    fn open_windows_are_stored_positionally_and_state_written_before_reads_back() {
        let windows = vec![seen(1_700_000_000_000, &["Peter Walton"], false), seen(-10_000, &[], true)];
        let stored = eddy_sdk::codec::encode_value(&windows).expect("encodes");
        assert_eq!(
            String::from_utf8(stored.clone()).expect("JSON"),
            r#"[[1700000000000,["Peter Walton"],false],[-10000,[],true]]"#
        );
        assert_eq!(eddy_sdk::codec::decode_value::<Vec<Seen>>(&stored).expect("reads back"), windows);
        // As the state was written before: an object per window.
        let before = br#"[{"window_start":1700000000000,"names":["Peter Walton"],"sold":false},{"window_start":-10000,"names":[],"sold":true}]"#;
        assert_eq!(eddy_sdk::codec::decode_value::<Vec<Seen>>(before).expect("reads the old form"), windows);
    }
}
