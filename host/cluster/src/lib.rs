//! # eddy-cluster: workers, the coordinator, and what they say to each other
//!
//! Workers register with the coordinator over QUIC (mutual TLS with the cluster CA: a worker
//! whose certificate the CA did not sign never gets a stream), offer their slots, and beat; the
//! coordinator declares a worker dead once it has been silent for the heartbeat timeout, or
//! when it registers again under its name. The membership, with the slots each job holds, is
//! an I/O-free state machine ([`Membership`]); the control protocol is typed messages with a
//! length-prefixed JSON encoding ([`protocol`]); [`ControlPlane`] and [`worker::session`] are
//! the thin async shells. The coordinator deploys a job's parts with
//! [`protocol::Deployment`]s; a worker's [`executor::Executor`] runs them over
//! [`QuicPlacement`], fetching artifacts by digest ([`worker::fetch`]), and the job master
//! talks to the parts over [`checkpoint_link`].
//!
//! ```
//! use eddy_cluster::{Departure, Membership};
//!
//! let mut cluster = Membership::new(3_000);
//! let (w1, _) = cluster.register("worker-1", 2, "10.0.0.1:7000", 0)?;
//! cluster.register("worker-2", 2, "10.0.0.2:7000", 0)?;
//! cluster.heartbeat("worker-1", w1, 2_500)?;
//! let dead = cluster.expire(3_001);
//! assert_eq!(dead[0].member.name, "worker-2");
//! assert_eq!(dead[0].why, Departure::MissedHeartbeats { silent_ms: 3_001 });
//! assert_eq!(cluster.free_slots(), 2);
//! // A job at parallelism 2 takes both of worker-1's slots; a third slot is not there.
//! let slots = cluster.schedule("job-1", 2).expect("room");
//! assert!(slots.iter().all(|s| s.name == "worker-1"));
//! assert!(cluster.schedule("job-2", 1).is_err());
//! // A worker is trusted with what it was given: only the part deployed to worker-1 may
//! // report on the job, and fetch its artifacts.
//! cluster.deploy("job-1", 1, &slots[0], &["sha256:ab".to_owned()]);
//! assert!(cluster.may_fetch("worker-1", "sha256:ab"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod checkpoint_link;
mod control;
pub mod executor;
mod membership;
mod placement;
pub mod protocol;
pub mod worker;

pub use control::{ArtifactLookup, ControlConfig, ControlPlane};
pub use membership::{
    Departed, Departure, MAX_SLOTS_PER_WORKER, Member, Membership, NoSlots, NotDeployed, SlotHolder, SwapAnswer,
    TooManySlots, UnknownIncarnation,
};
pub use placement::QuicPlacement;
