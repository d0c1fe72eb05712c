//! Keyed state across languages: per user (the key), every tag it sent in order (list state
//! `tags`), how often it sent each (map state `counts`, tag → times), and its first tag with
//! its number of records (value state `first`, a struct, so this SDK stores it as a row). Each
//! record `{"tag": ...}` emits `{"tags": [...], "count": n, "distinct": d, "first": t,
//! "records": r}`. Its twins in `tests/guests/{python,js,ts,go}-tags` do the same over the
//! same state (writing `first` as JSON), so a savepoint taken under one resumes under another.

use eddy_sdk::{Context, ListState, MapState, OpenContext, Operator, Record, Result, ValueState};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Tagged {
    tag: String,
}

#[derive(Serialize)]
struct Seen {
    tags: Vec<String>,
    count: u64,
    distinct: usize,
    first: String,
    records: u64,
}

/// A user's first tag and how many records it sent.
#[derive(Debug, Serialize, Deserialize)]
struct First {
    tag: String,
    records: u64,
}

#[derive(Debug)]
pub struct Tags {
    tags: ListState<String>,
    counts: MapState<String, u64>,
    first: ValueState<First>,
}

impl Operator for Tags {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        Ok(Tags { tags: ctx.list_state("tags"), counts: ctx.map_state("counts"), first: ctx.value_state("first") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let user: String = record.key()?;
        let Tagged { tag } = record.value()?;
        self.tags.push(&tag)?;
        let count = self.counts.get(&tag)?.unwrap_or(0) + 1;
        self.counts.insert(&tag, &count)?;
        let mut first = self.first.get()?.unwrap_or(First { tag: tag.clone(), records: 0 });
        first.records += 1;
        self.first.set(&first)?;
        let seen = Seen {
            tags: self.tags.get()?,
            count,
            distinct: self.counts.entries()?.len(),
            first: first.tag,
            records: first.records,
        };
        ctx.emit(&user, &seen)
    }
}

eddy_sdk::export_operator!(Tags);
