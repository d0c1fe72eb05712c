//! Per-user purchase totals (the hourly job traced in the reference architecture): an
//! aggregate that the host's tumbling window calls per user and hour. Amounts are integer
//! cents, so merging in any order gives exactly the same total.

use eddy_sdk::{Aggregate, Record, Result};
use serde::{Deserialize, Serialize};

/// One purchase event.
#[derive(Debug, Deserialize)]
pub struct Purchase {
    /// Who bought.
    pub user_id: String,
    /// Price in cents.
    pub amount_cents: i64,
}

/// Running totals of one user in one window; also the window's result.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Number of purchases.
    pub purchases: u64,
    /// Sum of amounts in cents.
    pub total_cents: i64,
}

/// The aggregate function.
#[derive(Debug)]
pub struct PurchaseTotals;

impl Aggregate for PurchaseTotals {
    type Config = ();
    type Accumulator = Totals;
    type Output = Totals;

    fn open(_config: ()) -> Result<Self> {
        Ok(PurchaseTotals)
    }

    fn create_accumulator(&self) -> Totals {
        Totals::default()
    }

    fn add(&self, acc: &mut Totals, record: &Record<'_>) -> Result<()> {
        let p: Purchase = record.value()?;
        acc.purchases += 1;
        acc.total_cents += p.amount_cents;
        Ok(())
    }

    fn merge(&self, a: Totals, b: Totals) -> Totals {
        Totals { purchases: a.purchases + b.purchases, total_cents: a.total_cents + b.total_cents }
    }

    fn result(&self, acc: Totals) -> Totals {
        acc
    }
}

eddy_sdk::export_aggregate!(PurchaseTotals);
