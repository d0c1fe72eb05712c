//! Nexmark q3, local item suggestion: who is selling in category 10 in Oregon, Idaho or
//! California, as an incremental join of auctions with their sellers. Nexmark's definition:
//!
//! ```sql
//! SELECT P.name, P.city, P.state, A.id
//! FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
//! WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')
//! ```
//!
//! The pipeline (`q3.yaml`): `nexmark-select` keeps persons keyed by `id` and auctions keyed
//! by `seller`; `key_by: key` brings a person and all auctions they sell to the same subtask
//! and key, where this operator joins them and emits `{"name", "city", "state", "id"}` (`id`
//! = the auction's id) once per matching auction, keyed by the person's id.
//!
//! Per person id it keeps, in keyed state:
//! - `seller` (`ValueState`): the person's name, city and state once the person arrived,
//!   whatever the state (so later auctions of a seller outside OR, ID, CA are dropped at once
//!   instead of waiting). Declared rare (read on demand): only category-10 auctions read it,
//!   a fifth of the auctions and none of the persons, and prefetching it for every record's
//!   key was a third of the join thread's time (`eddy bench nexmark --query q3`: 0.157 ->
//!   0.154 CPU s per M events);
//! - `waiting` (`ListState`): ids of category-10 auctions that arrived before their seller.
//!   When the person arrives they are emitted (if the state matches) and the list is cleared.
//!
//! So the result does not depend on the order in which a person and their auctions arrive
//! (Nexmark's generator names only existing persons as sellers, but with parallel sources
//! and bounded disorder an auction can overtake its seller). Auctions of other categories are
//! never stored. Like the SQL join it keeps every person forever (`state_ttl_ms` on the step
//! bounds that, at the price of missing auctions by sellers older than the TTL). Person ids
//! are unique in Nexmark; should one arrive twice, the later person replaces the earlier one
//! for auctions still to come.

use eddy_sdk::codec::Field;
use eddy_sdk::{Context, Error, ListState, OpenContext, Operator, Record, Result, Row, ValueState};
use serde::{Deserialize, Serialize};

/// The auction category the query looks for.
pub const CATEGORY: u64 = 10;
/// The states the query looks for.
pub const STATES: [&str; 3] = ["OR", "ID", "CA"];

/// What the join keeps of a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seller {
    /// Name.
    pub name: String,
    /// City.
    pub city: String,
    /// State.
    pub state: String,
}

impl Seller {
    /// Whether the person lives in one of [`STATES`].
    pub fn is_local(&self) -> bool {
        STATES.contains(&self.state.as_str())
    }
}

/// One output row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Suggestion<'a> {
    /// The seller's name.
    pub name: &'a str,
    /// The seller's city.
    pub city: &'a str,
    /// The seller's state.
    pub state: &'a str,
    /// The auction's id.
    pub id: u64,
}

/// The join.
#[derive(Debug)]
pub struct LocalItemSuggestion {
    seller: ValueState<Seller>,
    waiting: ListState<u64>,
    /// The events' `type`, its slot remembered per schema.
    kind: Field,
}

fn emit(ctx: &mut Context, person: u64, seller: &Seller, auction: u64) -> Result<()> {
    let row = Suggestion { name: &seller.name, city: &seller.city, state: &seller.state, id: auction };
    ctx.emit(&person, &row)
}

impl Operator for LocalItemSuggestion {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        Ok(LocalItemSuggestion {
            seller: ctx.rare_value_state("seller"),
            waiting: ctx.list_state("waiting-auctions"),
            kind: Field::new("type"),
        })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let kind = record.value_str_bytes(&self.kind)?.ok_or_else(|| Error::bad_record("an event without a `type`"))?;
        match &*kind {
            b"person" => {
                let p: PersonPlace = record.row()?;
                let seller = Seller { name: p.name, city: p.city, state: p.state };
                let waiting = self.waiting.get()?;
                if !waiting.is_empty() {
                    if seller.is_local() {
                        for auction in waiting {
                            emit(ctx, p.id, &seller, auction)?;
                        }
                    }
                    self.waiting.clear()?;
                }
                self.seller.set(&seller)
            }
            b"auction" => {
                let a: AuctionSeller = record.row()?;
                if a.category != CATEGORY {
                    return Ok(());
                }
                match self.seller.get()? {
                    Some(seller) if seller.is_local() => emit(ctx, a.seller, &seller, a.id),
                    Some(_) => Ok(()),
                    None => self.waiting.push(&a.id),
                }
            }
            _ => Ok(()),
        }
    }
}

/// The fields of a person this query reads.
#[derive(Debug, Deserialize, Row)]
struct PersonPlace {
    id: u64,
    name: String,
    city: String,
    state: String,
}

/// The fields of an auction this query reads.
#[derive(Debug, Deserialize, Row)]
struct AuctionSeller {
    id: u64,
    seller: u64,
    category: u64,
}

eddy_sdk::export_operator!(LocalItemSuggestion);
