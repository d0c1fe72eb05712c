//! Surge pricing, step 2 (the `SurgePricingFunction` of the ride-sharing example): keyed by
//! zone, it turns each window result of step 1 (`{"start", "end", "result": {"zone",
//! "requests"}}`) into a price multiplier and emits
//! `{"zone", "window_end", "requests", "previous_requests", "multiplier"}` keyed by zone.
//!
//! The formula, with `baseline_requests` from the step's config (`{"baseline_requests": 10}`:
//! the demand a zone's drivers serve at normal prices in one window):
//!
//! ```text
//! multiplier = round_to_0.1(clamp(requests / baseline_requests, 1.0, 3.0))
//! ```
//!
//! (rounding half away from zero). In SQL terms, over the output of step 1 (`demand`):
//!
//! ```sql
//! SELECT zone, window_end, requests,
//!        LAG(requests) OVER (PARTITION BY zone ORDER BY window_end) AS previous_requests,
//!        ROUND(LEAST(GREATEST(requests / :baseline_requests, 1.0), 3.0), 1) AS multiplier
//! FROM demand
//! ```
//!
//! History lives in `ValueState`: the last window priced per zone. It gives
//! `previous_requests` (the demand trend; `null` for a zone's first window) and keeps prices
//! moving forward: a result for a window older than the last one priced (a late re-fire) is
//! ignored, and a re-fire of the last window re-prices it against the same predecessor.
//! A config without a positive, finite `baseline_requests` fails `open` with a bad-config error.

use eddy_sdk::{Context, Error, OpenContext, Operator, Record, Result, ValueState};
use serde::{Deserialize, Serialize};

/// The multiplier never goes below this (no discounts)...
pub const MIN_MULTIPLIER: f64 = 1.0;
/// ...nor above this (a cap riders accept).
pub const MAX_MULTIPLIER: f64 = 3.0;

/// The step's `config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SurgeConfig {
    /// Requests per window that a zone serves at the normal price; must be positive.
    pub baseline_requests: f64,
}

/// The demand of one zone in one window, as step 1 computes it.
#[derive(Debug, Deserialize)]
pub struct Demand {
    /// The zone.
    pub zone: String,
    /// Requests in the window.
    pub requests: u64,
}

/// A window step's output record.
#[derive(Debug, Deserialize)]
pub struct WindowResult {
    /// Window start (inclusive, ms).
    pub start: i64,
    /// Window end (exclusive, ms).
    pub end: i64,
    /// The aggregate's result.
    pub result: Demand,
}

/// The price of one zone for one window.
#[derive(Debug, Serialize)]
pub struct SurgePrice {
    /// The zone.
    pub zone: String,
    /// End of the window the price is based on (ms).
    pub window_end: i64,
    /// Requests in that window.
    pub requests: u64,
    /// Requests in the zone's window before (`None` for its first).
    pub previous_requests: Option<u64>,
    /// Price multiplier, 1.0 to 3.0 in steps of 0.1.
    pub multiplier: f64,
}

/// What is kept per zone: the last window priced.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct LastWindow {
    /// Its end.
    pub window_end: i64,
    /// Its requests.
    pub requests: u64,
    /// The requests of the window before it.
    pub previous_requests: Option<u64>,
}

/// `clamp(requests / baseline, 1.0, 3.0)` rounded to one decimal.
pub fn multiplier(requests: u64, baseline_requests: f64) -> f64 {
    let ratio = requests as f64 / baseline_requests;
    (ratio.clamp(MIN_MULTIPLIER, MAX_MULTIPLIER) * 10.0).round() / 10.0
}

/// The operator.
#[derive(Debug)]
pub struct SurgePricing {
    baseline_requests: f64,
    last: ValueState<LastWindow>,
}

impl Operator for SurgePricing {
    type Config = Option<SurgeConfig>;

    fn open(config: Option<SurgeConfig>, ctx: &mut OpenContext) -> Result<Self> {
        let Some(config) = config else {
            return Err(Error::bad_config("surge pricing needs `config: {baseline_requests: <positive number>}`"));
        };
        let baseline_requests = config.baseline_requests;
        if !(baseline_requests.is_finite() && baseline_requests > 0.0) {
            return Err(Error::bad_config(format!("baseline_requests must be positive, got {baseline_requests}")));
        }
        Ok(SurgePricing { baseline_requests, last: ctx.value_state("last-window") })
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()> {
        let window: WindowResult = record.value()?;
        let last = self.last.get()?;
        let previous_requests = match last {
            Some(last) if window.end < last.window_end => return Ok(()),
            Some(last) if window.end == last.window_end => last.previous_requests,
            Some(last) => Some(last.requests),
            None => None,
        };
        let requests = window.result.requests;
        self.last.set(&LastWindow { window_end: window.end, requests, previous_requests })?;
        let price = SurgePrice {
            multiplier: multiplier(requests, self.baseline_requests),
            zone: window.result.zone,
            window_end: window.end,
            requests,
            previous_requests,
        };
        ctx.emit(&price.zone, &price)
    }
}

eddy_sdk::export_operator!(SurgePricing);
