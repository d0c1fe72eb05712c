//! # eddy-core: Eddy's shared vocabulary
//!
//! Records and record batches, key groups, time domains, the timer service and watermark
//! tracking. Nothing here does I/O; every other crate builds on these types.
//!
//! ```
//! use eddy_core::{KeyGroupRange, RecordBatch, key_group_of};
//!
//! let mut batch = RecordBatch::default();
//! batch.push(Some(b"\"alice\""), b"42", Some(1_000));
//! let rec = batch.get(0).expect("one record");
//! assert_eq!(rec.value, b"42");
//!
//! // Keys hash into max_parallelism key groups; subtasks own contiguous ranges of them.
//! let group = key_group_of(rec.key.expect("keyed"), 128);
//! let owner = (0..4).find(|&i| KeyGroupRange::for_subtask(128, 4, i).contains(group));
//! assert!(owner.is_some());
//! ```

pub mod batch_thread;
mod key_group;
pub mod limits;
mod record;
mod time;
mod timers;
mod watermark;

pub use key_group::{KeyGroup, KeyGroupRange, MAX_PARALLELISM_LIMIT, key_group_of, key_group_of_hash, key_hash};
pub use record::{BatchFull, MAX_BATCH_BYTES, Record, RecordBatch, RecordMeta, RecordView, Span};
pub use time::{TimeDomain, WATERMARK_MIN};
pub use timers::{FiredTimer, HeapTimerService, TimerService};
pub use watermark::{BoundedOutOfOrderness, WatermarkInterval, WatermarkTracker};
