//! # eddy-cluster: workers, the coordinator, and what they say to each other
//!
//! Workers register with the coordinator over QUIC (mutual TLS with the cluster CA: a worker
//! whose certificate the CA did not sign never gets a stream), offer their slots, and beat; the
//! coordinator declares a worker dead once it has been silent for the heartbeat timeout, or
//! when it registers again under its name. The membership is an I/O-free state machine
//! ([`Membership`]); the control protocol is typed messages with a length-prefixed JSON
//! encoding ([`protocol`]); [`ControlPlane`] and [`worker::session`] are the thin async shells.
//!
//! ```
//! use eddy_cluster::{Departure, Membership};
//!
//! let mut cluster = Membership::new(3_000);
//! let (w1, _) = cluster.register("worker-1", 2, "10.0.0.1:7000", 0);
//! cluster.register("worker-2", 2, "10.0.0.2:7000", 0);
//! cluster.heartbeat("worker-1", w1, 2_500)?;
//! let dead = cluster.expire(3_001);
//! assert_eq!(dead[0].member.name, "worker-2");
//! assert_eq!(dead[0].why, Departure::MissedHeartbeats { silent_ms: 3_001 });
//! assert_eq!(cluster.free_slots(), 2);
//! # Ok::<(), eddy_cluster::UnknownIncarnation>(())
//! ```

pub mod checkpoint_link;
mod control;
pub mod executor;
mod membership;
mod placement;
pub mod protocol;
pub mod worker;

pub use control::{ArtifactLookup, ControlConfig, ControlPlane};
pub use membership::{Departed, Departure, Member, Membership, NoSlots, SlotHolder, UnknownIncarnation};
pub use placement::QuicPlacement;
