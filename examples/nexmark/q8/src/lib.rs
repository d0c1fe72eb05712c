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
//! Both sides group by the same key and the same tumbling window, so the join is a window
//! co-group, as Flink runs a window join: the pipeline (`q8.yaml`) has `nexmark-select` keep
//! persons keyed by `id` and auctions keyed by `seller`, and a host tumbling window of 10 s
//! (`key_by: key`) folds both into this aggregate, whose accumulator per person id and window
//! is what the join needs of each side: the names registered and whether an auction was
//! created. When the window fires, the result holds the names if the person sold (else none),
//! and `nexmark-q8-rows` turns each into a row.
//! The window keeps the accumulators, fires them and judges lateness, so the order in which a
//! person and their auctions arrive does not matter.

use eddy_sdk::codec::Field;
use eddy_sdk::{Aggregate, Error, Record, Result, Row, RowWrite};
use serde::{Deserialize, Serialize};

/// One person id in one window: what both sides of the join contributed. A row read and
/// written by its derived layout (a window decodes and re-encodes it once per batch that
/// touches it). Names are few: Nexmark registers a person once, so `more` stays empty.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize, Row)]
pub struct Registered {
    /// Whether the person created an auction in the window.
    pub sold: bool,
    /// The smallest name the person registered with in the window, if they registered.
    pub name: Option<String>,
    /// The other names they registered with in the window, as a JSON array, sorted and
    /// distinct; absent when there are none.
    pub more: Option<String>,
}

impl Registered {
    /// Every name, sorted and distinct.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self.name.iter().cloned().collect();
        if let Some(more) = &self.more {
            let more: Vec<String> = serde_json::from_str(more)
                .map_err(|e| Error::bad_record(format!("a damaged accumulator's `more` names: {e}")))?;
            names.extend(more);
        }
        Ok(names)
    }

    /// Sets the names to `names` (any order, duplicates allowed).
    fn set_names(&mut self, mut names: Vec<String>) -> Result<()> {
        names.sort_unstable();
        names.dedup();
        let mut names = names.into_iter();
        self.name = names.next();
        let more: Vec<String> = names.collect();
        self.more = match more.is_empty() {
            true => None,
            false => Some(serde_json::to_string(&more).map_err(|e| Error::failed(e.to_string()))?),
        };
        Ok(())
    }

    /// Adds `name`. The first name, or one already held, costs no allocation beyond its own.
    fn register(&mut self, name: String) -> Result<()> {
        match &self.name {
            None => self.name = Some(name),
            Some(held) if *held == name => {}
            Some(_) => {
                let mut names = self.names()?;
                names.push(name);
                self.set_names(names)?;
            }
        }
        Ok(())
    }

    /// Adds `other`'s names and sale to these. `more` is only ever set beside `name`.
    fn union(&mut self, other: &Registered) -> Result<()> {
        self.sold |= other.sold;
        match (&self.name, &other.name) {
            (_, None) => Ok(()),
            (None, Some(_)) => {
                self.name.clone_from(&other.name);
                self.more.clone_from(&other.more);
                Ok(())
            }
            (Some(_), Some(_)) => {
                let mut names = self.names()?;
                names.extend(other.names()?);
                self.set_names(names)
            }
        }
    }
}

/// A window's result: the names of a person who created an auction in the window they
/// registered in, none otherwise (`{"names": [..]}`, read by `nexmark-q8-rows`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sold {
    /// Sorted and distinct.
    pub names: Vec<String>,
}

/// The field of a person this query reads.
#[derive(Debug, Deserialize, Row)]
struct PersonName {
    name: String,
}

/// The aggregate function.
#[derive(Debug)]
pub struct NewUsers {
    /// The events' `type`, its slot remembered per schema.
    kind: Field,
}

impl Aggregate for NewUsers {
    type Config = ();
    type Accumulator = Registered;
    type Output = Sold;

    fn open(_config: ()) -> Result<Self> {
        Ok(NewUsers { kind: Field::new("type") })
    }

    fn create_accumulator(&self) -> Registered {
        Registered::default()
    }

    fn add(&self, acc: &mut Registered, record: &Record<'_>) -> Result<()> {
        let kind = record.value_str_bytes(&self.kind)?.ok_or_else(|| Error::bad_record("an event without a `type`"))?;
        match &*kind {
            b"person" => acc.register(record.row::<PersonName>()?.name),
            b"auction" => {
                acc.sold = true;
                Ok(())
            }
            other => Err(Error::bad_record(format!(
                "nexmark-q8 joins persons and auctions, not `{}` events: keep only those two (nexmark-select)",
                String::from_utf8_lossy(other)
            ))),
        }
    }

    fn merge(&self, mut a: Registered, b: Registered) -> Registered {
        // Only `set_names` writes `more`, as a JSON list. Were it damaged, `add` and the rows
        // step would fail naming it; a merge that cannot read it keeps `a`'s names.
        let _unreadable_names_kept = a.union(&b);
        a
    }

    /// A damaged accumulator's names (see `merge`) are left out rather than failing here,
    /// where the trait has no error to return.
    fn result(&self, acc: Registered) -> Sold {
        let names = if acc.sold { acc.names().unwrap_or_else(|_| acc.name.into_iter().collect()) } else { Vec::new() };
        Sold { names }
    }

    fn read_accumulator(bytes: &[u8]) -> Result<Registered> {
        eddy_sdk::row::decode(bytes)
    }

    fn write_accumulator(acc: &Registered, buf: &mut Vec<u8>) -> Result<()> {
        acc.write_row(buf);
        Ok(())
    }
}

eddy_sdk::export_aggregate!(NewUsers);

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(sold: bool, names: &[&str]) -> Registered {
        let mut acc = Registered { sold, ..Registered::default() };
        for name in names {
            acc.register(name.to_string()).expect("registers");
        }
        acc
    }

    /// Names stay a sorted set however they arrive, the first in `name` and the rest in
    /// `more`, and merging is a union: the definition's `GROUP BY id, name, window`.
    #[test]
    fn names_are_a_sorted_set_and_merging_unions_them() {
        let cases: [(&[&str], Option<&str>, Option<&str>); 4] = [
            (&[], None, None),
            (&["Peter"], Some("Peter"), None),
            (&["Peter", "Peter"], Some("Peter"), None),
            (&["Walt", "Ann", "Walt", "Bo"], Some("Ann"), Some(r#"["Bo","Walt"]"#)),
        ];
        for (names, name, more) in cases {
            let acc = registered(false, names);
            assert_eq!((acc.name.as_deref(), acc.more.as_deref()), (name, more), "{names:?}");
        }
        let agg = NewUsers::open(()).expect("opens");
        let merged = agg.merge(registered(false, &["Walt"]), registered(true, &["Ann", "Walt"]));
        assert_eq!(merged, Registered { sold: true, name: Some("Ann".into()), more: Some(r#"["Walt"]"#.into()) });
        let merged = agg.merge(registered(true, &[]), registered(false, &["Bo"]));
        assert_eq!(merged, Registered { sold: true, name: Some("Bo".into()), more: None });
        assert_eq!(agg.merge(registered(false, &[]), registered(false, &[])), Registered::default());
    }

    #[test]
    fn the_accumulator_is_a_row_and_reads_back() {
        let acc = registered(true, &["Peter Walton", "Ann"]);
        let mut bytes = Vec::new();
        NewUsers::write_accumulator(&acc, &mut bytes).expect("writes");
        assert!(eddy_wire::row::is_row(&bytes));
        assert_eq!(NewUsers::read_accumulator(&bytes).expect("reads"), acc);
        assert_eq!(eddy_sdk::codec::encode_value(&acc).expect("serde writes"), bytes, "the bytes serde writes");
    }
}
