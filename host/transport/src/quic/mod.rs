//! The data plane between processes: QUIC (quinn) with mutual TLS, one connection per pair of
//! nodes, one stream per channel, the credit protocol of [`crate::credit`] in frames of
//! [`crate::Frame`].
//!
//! By role: [`endpoint`] sets up an endpoint and its [`Tuning`]; `node` keeps the
//! connections and the registrations ([`QuicNode`]); `inbound` serves the streams a peer
//! opens, `outbound` the ones this node opens ([`RemoteSender`]); [`log_budget`] rate-limits
//! the warnings strangers can cause.

mod endpoint;
mod inbound;
mod link;
pub mod log_budget;
mod node;
mod outbound;
mod registry;
mod tls;

pub use endpoint::{NodeError, Tuning, dial, endpoint, peer_name};
pub use link::LinkId;
pub use log_budget::LogBudget;
pub use node::{DroppedPeer, InboundStats, MAX_DROPPED_KEPT, QuicNode, SideHandler};
pub use outbound::RemoteSender;
pub use tls::{ALPN, CA_VALIDITY, ClusterCa, NODE_VALIDITY, NodeIdentity, TlsError, check_label, check_name};
