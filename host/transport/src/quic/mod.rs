//! The data plane between processes: QUIC (quinn) with mutual TLS, one connection per pair of
//! nodes, one stream per channel, the credit protocol of [`crate::credit`] in frames of
//! [`crate::Frame`].

mod link;
mod log_budget;
mod node;
mod tls;

pub use link::LinkId;
pub use node::{
    DroppedPeer, MAX_DROPPED_KEPT, NodeError, QuicNode, RemoteSender, SideHandler, Tuning, dial, endpoint, peer_name,
};
pub use tls::{ALPN, ClusterCa, NodeIdentity, TlsError, check_name};
