//! List and map state across languages: per user (the key), every tag it sent in order (list
//! state `tags`) and how often it sent each (map state `counts`, tag → times). Each record
//! `{"tag": ...}` emits `{"tags": [...], "count": n, "distinct": d}`: the user's tags so far,
//! how often this tag came, and how many distinct tags the map holds. Its twins in
//! `tests/guests/{python,js,ts}-tags` do the same over the same state, so a savepoint taken
//! under one resumes under another.

use eddy_sdk::{Context, ListState, MapState, OpenContext, Operator, Record, Result};
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
}

#[derive(Debug)]
pub struct Tags {
    tags: ListState<String>,
    counts: MapState<String, u64>,
}

impl Operator for Tags {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        Ok(Tags { tags: ctx.list_state("tags"), counts: ctx.map_state("counts") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let user: String = record.key()?;
        let Tagged { tag } = record.value()?;
        self.tags.push(&tag)?;
        let count = self.counts.get(&tag)?.unwrap_or(0) + 1;
        self.counts.insert(&tag, &count)?;
        let seen = Seen { tags: self.tags.get()?, count, distinct: self.counts.entries()?.len() };
        ctx.emit(&user, &seen)
    }
}

eddy_sdk::export_operator!(Tags);
