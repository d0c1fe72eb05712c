//! Fraud detection as in Flink's `FraudDetector` walkthrough: keyed by account, an alert is
//! raised when a small transaction (< $1.00) is followed by a large one (> $500.00) within
//! one minute. A flag in `ValueState<bool>` remembers the small transaction; a processing-time
//! timer clears it after a minute, and its time is kept in state so it can be deleted.

use eddy_sdk::{Context, OpenContext, Operator, Record, Result, TimeDomain, Timer, ValueState};
use serde::{Deserialize, Serialize};

/// Below this (in cents) a transaction is "small".
pub const SMALL_AMOUNT_CENTS: i64 = 100;
/// Above this (in cents) a transaction is "large".
pub const LARGE_AMOUNT_CENTS: i64 = 50_000;
/// How long a small transaction keeps the account flagged.
pub const ONE_MINUTE_MS: i64 = 60_000;

/// A card transaction.
#[derive(Debug, Deserialize)]
pub struct Transaction {
    /// The account (also the key).
    pub account_id: u64,
    /// Amount in cents.
    pub amount_cents: i64,
}

/// Emitted when the pattern matches.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Alert {
    /// The account.
    pub account_id: u64,
    /// The large transaction's amount.
    pub amount_cents: i64,
}

/// The detector.
#[derive(Debug)]
pub struct FraudDetector {
    flag: ValueState<bool>,
    timer: ValueState<i64>,
}

impl FraudDetector {
    fn clean_up(&self, ctx: &mut Context) -> Result<()> {
        if let Some(at) = self.timer.get()? {
            ctx.delete_timer(TimeDomain::ProcessingTime, at)?;
        }
        self.timer.clear()?;
        self.flag.clear()
    }
}

impl Operator for FraudDetector {
    type Config = ();

    fn open(_config: (), ctx: &mut OpenContext) -> Result<Self> {
        Ok(FraudDetector { flag: ctx.value_state("flag"), timer: ctx.rare_value_state("timer") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let tx: Transaction = record.value()?;
        if self.flag.get()?.unwrap_or(false) {
            if tx.amount_cents > LARGE_AMOUNT_CENTS {
                ctx.emit(&tx.account_id, &Alert { account_id: tx.account_id, amount_cents: tx.amount_cents })?;
            }
            self.clean_up(ctx)?;
        }
        if tx.amount_cents < SMALL_AMOUNT_CENTS {
            self.flag.set(&true)?;
            let at = ctx.current_processing_time() + ONE_MINUTE_MS;
            ctx.register_timer(TimeDomain::ProcessingTime, at)?;
            self.timer.set(&at)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, _timer: &Timer<'_>, _ctx: &mut Context) -> Result<()> {
        self.timer.clear()?;
        self.flag.clear()
    }
}

eddy_sdk::export_operator!(FraudDetector);
