//! Time domains and watermark conventions.

use serde::{Deserialize, Serialize};

/// The watermark before any has been seen: nothing is late yet.
pub const WATERMARK_MIN: i64 = i64::MIN;

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimeDomain {
    /// Fires when the watermark passes its timestamp.
    EventTime,
    /// Fires when processing time passes its timestamp.
    ProcessingTime,
}
