//! Surge pricing, step 1: how many rides were requested in each zone per window. The host's
//! sliding window (5 minutes, every minute, keyed by zone) calls this aggregate; for every
//! zone and window it emits `{"start", "end", "result": {"zone", "requests"}}`.
//!
//! In SQL terms:
//!
//! ```sql
//! SELECT zone, HOP_END(ts, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE) AS window_end, COUNT(*) AS requests
//! FROM ride_requests
//! GROUP BY zone, HOP(ts, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE)
//! ```
//!
//! The accumulator is the count (plus the zone, so the result names it); merging adds counts,
//! so the host may add records in any grouping.

use eddy_sdk::{Aggregate, Record, Result};
use serde::{Deserialize, Serialize};

/// A ride request, e.g. `{"zone": "downtown", "rider": "r-17", "ts": 1704067200000}`.
/// Only `zone` is read; the event time (`ts`) is taken by the source.
#[derive(Debug, Deserialize)]
pub struct RideRequest {
    /// Where the rider wants to be picked up (also the key).
    pub zone: String,
}

/// Requests of one zone in one window; also the window's result.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    /// The zone (absent only in an empty accumulator).
    pub zone: Option<String>,
    /// Number of requests.
    pub requests: u64,
}

/// The aggregate function.
#[derive(Debug)]
pub struct RequestCounter;

impl Aggregate for RequestCounter {
    type Config = ();
    type Accumulator = Demand;
    type Output = Demand;

    fn open(_config: ()) -> Result<Self> {
        Ok(RequestCounter)
    }

    fn create_accumulator(&self) -> Demand {
        Demand::default()
    }

    fn add(&self, acc: &mut Demand, record: &Record<'_>) -> Result<()> {
        let request: RideRequest = record.value()?;
        acc.zone.get_or_insert(request.zone);
        acc.requests += 1;
        Ok(())
    }

    fn merge(&self, a: Demand, b: Demand) -> Demand {
        // All records of a window share its key, so both zones (when present) are the same.
        Demand { zone: a.zone.or(b.zone), requests: a.requests + b.requests }
    }

    fn result(&self, acc: Demand) -> Demand {
        acc
    }
}

eddy_sdk::export_aggregate!(RequestCounter);
