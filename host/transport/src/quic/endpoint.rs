//! Setting up a QUIC endpoint: the [`Tuning`] of its connections, its socket, its TLS, and
//! dialing a peer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use eddy_core::limits::{MAX_CONTROL_STREAMS, MAX_DATA_STREAMS, MAX_PENDING_STREAMS};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, VarInt};
use tokio::runtime::Handle;

use super::tls::{NodeIdentity, TlsError};

/// QUIC settings for a data centre link: windows far above what credit lets a channel have in
/// flight, segmentation offload on, MTU discovery up to jumbo frames.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Bytes one stream may have unacknowledged (QUIC's per-stream window).
    pub stream_window: u32,
    /// Bytes all streams of a connection may have unacknowledged.
    pub connection_window: u32,
    /// A peer silent this long is gone (keep-alives flow at a third of it).
    pub idle_timeout: Duration,
    /// The largest UDP payload MTU discovery tries (1452 is safe on any Ethernet path); with
    /// segmentation offload at most 6550, so that ten datagrams fit one send.
    pub max_udp_payload: u16,
    /// Let the kernel segment large sends (GSO) where it can.
    pub segmentation_offload: bool,
    /// Buffers a receiver holds per channel: the credit it grants at first. 8 rather than the
    /// local channel's 4: each wake-up of a link's thread then moves more buffers, which
    /// `cargo bench -p eddy-transport --bench quic` measured at 648 against 493 MB/s on one
    /// channel, for 8 buffers (~320 KiB of 32 KiB buffers) of memory per remote channel; a
    /// peer can make it at most `eddy_core::limits::max_channel_bytes`.
    pub channel_capacity: u32,
    /// Buffers a sender queues beyond its credit before the task waits.
    pub max_queued: usize,
    /// How long an accepted stream waits for its channel to be registered, once its header
    /// came.
    pub registration_timeout: Duration,
    /// How long an accepted stream may take to send its header; then it is refused. A sender
    /// writes its header as it opens the stream, and QUIC only shows the stream once its first
    /// bytes arrived, so this only frees the place of a stream that never completes its header.
    pub header_timeout: Duration,
    /// Streams the peer of a connection may have open at once (QUIC's stream limit; one more
    /// waits, in the peer, for one to close): [`MAX_DATA_STREAMS`] on the data plane,
    /// [`MAX_CONTROL_STREAMS`] on the control plane.
    pub max_streams: u32,
    /// Streams of one connection that may wait for their header or their registration at
    /// once ([`MAX_PENDING_STREAMS`]); one more is refused at once, and a connection that had
    /// this many refused is closed.
    pub max_pending_streams: u32,
}

impl Tuning {
    /// For the control plane between workers and the coordinator: a short idle timeout, so
    /// a worker notices a coordinator that died (and one restarted in its place) within
    /// seconds (its heartbeats keep the connection busy meanwhile), and only
    /// [`MAX_CONTROL_STREAMS`] streams at once (a session and its artifact fetches), so an
    /// enrolled node cannot open thousands that each buffer a control message.
    pub fn control() -> Self {
        Self { idle_timeout: Duration::from_secs(3), max_streams: MAX_CONTROL_STREAMS, ..Self::default() }
    }
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            stream_window: 8 << 20,
            connection_window: 64 << 20,
            idle_timeout: Duration::from_secs(10),
            max_udp_payload: 8952,
            segmentation_offload: true,
            channel_capacity: 8,
            max_queued: 2,
            registration_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            max_streams: MAX_DATA_STREAMS,
            max_pending_streams: MAX_PENDING_STREAMS,
        }
    }
}

impl Tuning {
    pub(super) fn transport(&self) -> quinn::TransportConfig {
        let mut t = quinn::TransportConfig::default();
        t.stream_receive_window(VarInt::from_u32(self.stream_window))
            .receive_window(VarInt::from_u32(self.connection_window))
            .send_window(u64::from(self.connection_window))
            .max_concurrent_bidi_streams(VarInt::from_u32(self.max_streams))
            // Nothing here reads unidirectional streams: quinn would let a peer open 100 and
            // leave their bytes unread in the connection's window.
            .max_concurrent_uni_streams(VarInt::from_u32(0))
            .keep_alive_interval(Some(self.idle_timeout / 3))
            .enable_segmentation_offload(self.segmentation_offload);
        if let Ok(idle) = quinn::IdleTimeout::try_from(self.idle_timeout) {
            t.max_idle_timeout(Some(idle));
        }
        let mut mtu = quinn::MtuDiscoveryConfig::default();
        mtu.upper_bound(self.mtu_upper_bound());
        t.mtu_discovery_config(Some(mtu));
        t
    }

    /// The datagram size MTU discovery may reach. With segmentation offload quinn hands the
    /// kernel up to [`GSO_SEGMENTS`] datagrams in one send, and they must fit one UDP payload
    /// (65,507 bytes): a larger send fails with `EMSGSIZE`, which quinn counts as sent, so the
    /// whole batch is lost and the black hole detector drops the path to 1200 bytes.
    pub(super) fn mtu_upper_bound(&self) -> u16 {
        let bound = self.max_udp_payload.max(1200);
        if self.segmentation_offload { bound.min(MAX_UDP_PAYLOAD / GSO_SEGMENTS) } else { bound }
    }
}

/// A [`NodeError::Connect`] to `peer` at `addr`, given the reason.
pub(super) fn connect_error(peer: &str, addr: SocketAddr) -> impl Fn(String) -> NodeError + '_ {
    move |reason| NodeError::Connect { peer: peer.to_owned(), addr, reason }
}

/// The most bytes one UDP send can carry (65,535 less the IPv4 and UDP headers).
pub(super) const MAX_UDP_PAYLOAD: u16 = 65_507;
/// Datagrams quinn 0.11 puts in one segmentation-offload send (its `MAX_TRANSMIT_SEGMENTS`).
pub(super) const GSO_SEGMENTS: u16 = 10;
/// Socket buffers asked of the kernel (it caps them at `net.core.rmem_max` and `wmem_max`):
/// every channel's credit arriving at once must not overflow the receive queue, since each
/// datagram dropped there costs a cut of the congestion window and, with large datagrams, can
/// pass for an MTU black hole.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Asks for [`SOCKET_BUFFER_BYTES`] of socket buffers; the kernel's defaults (about 200 KiB)
/// are less than a few channels' credit.
fn size_buffers(socket: &std::net::UdpSocket, addr: SocketAddr) {
    let state = match quinn::udp::UdpSocketState::new(socket.into()) {
        Ok(state) => state,
        Err(e) => return tracing::debug!(%addr, reason = %e, "cannot size the socket's buffers"),
    };
    let sized = state
        .set_recv_buffer_size(socket.into(), SOCKET_BUFFER_BYTES)
        .and_then(|()| state.set_send_buffer_size(socket.into(), SOCKET_BUFFER_BYTES));
    if let Err(e) = sized {
        tracing::debug!(%addr, reason = %e, "cannot size the socket's buffers");
    }
}

/// A QUIC endpoint on `addr` that accepts and dials peers of `identity`'s cluster only.
pub fn endpoint(
    identity: &NodeIdentity,
    addr: SocketAddr,
    tuning: &Tuning,
    handle: &Handle,
) -> Result<Endpoint, NodeError> {
    let transport = Arc::new(tuning.transport());
    let config_error = |e: &dyn std::fmt::Display| TlsError::Config(rustls::Error::General(e.to_string()));
    let server_crypto = QuicServerConfig::try_from(identity.server_config()?).map_err(|e| config_error(&e))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
    server.transport_config(transport.clone());
    let client_crypto = QuicClientConfig::try_from(identity.client_config()?).map_err(|e| config_error(&e))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto));
    client.transport_config(transport);
    // The largest datagram an endpoint takes is a transport parameter it announces, and a
    // peer's MTU discovery stops there: left at quinn's 1472 bytes, `max_udp_payload` would
    // never be reached.
    let mut config = quinn::EndpointConfig::new(Arc::new(reset_key(identity)));
    config.max_udp_payload_size(tuning.max_udp_payload.clamp(1200, 65527)).map_err(|e| config_error(&e))?;
    let socket = std::net::UdpSocket::bind(addr).map_err(|source| NodeError::Bind { addr, source })?;
    size_buffers(&socket, addr);
    let mut endpoint = {
        let _guard = handle.enter();
        Endpoint::new(config, Some(server), socket, Arc::new(quinn::TokioRuntime))
            .map_err(|source| NodeError::Bind { addr, source })?
    };
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// The key of the endpoint's stateless resets, derived from the node's private key so that it
/// survives a restart: a restarted node answers a peer still talking to its previous process
/// with a reset the peer can verify, and the peer's stale connection ends at once instead of
/// at its idle timeout.
fn reset_key(identity: &NodeIdentity) -> ring::hmac::Key {
    let secret =
        ring::digest::digest(&ring::digest::SHA256, format!("eddy stateless reset\n{}", identity.key_pem).as_bytes());
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_ref())
}

/// Dials `peer` at `addr`, checking its certificate names `peer`. Blocking is the caller's
/// choice: this is async.
pub async fn dial(endpoint: &Endpoint, peer: &str, addr: SocketAddr) -> Result<Connection, NodeError> {
    let err = |reason: String| NodeError::Connect { peer: peer.to_owned(), addr, reason };
    endpoint.connect(addr, peer).map_err(|e| err(e.to_string()))?.await.map_err(|e| err(e.to_string()))
}

/// The node name in a peer's (already verified) certificate.
pub fn peer_name(conn: &Connection) -> Option<String> {
    let certs = conn.peer_identity()?.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>().ok()?;
    super::tls::node_name(certs.first()?)
}

/// Why the endpoint could not start or a peer could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Certificates or keys.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The UDP socket.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Dialing a peer failed (unreachable, refused our certificate, not the node we meant).
    #[error("connecting to {peer} at {addr}: {reason}")]
    Connect {
        /// The peer's name.
        peer: String,
        /// Its address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_segmentation_offload_a_full_batch_of_datagrams_fits_one_send() {
        let tuned = Tuning::default();
        assert_eq!(tuned.mtu_upper_bound(), 6550);
        assert!(usize::from(tuned.mtu_upper_bound()) * usize::from(GSO_SEGMENTS) <= usize::from(MAX_UDP_PAYLOAD));
        assert_eq!(Tuning { segmentation_offload: false, ..Tuning::default() }.mtu_upper_bound(), 8952);
        assert_eq!(Tuning { max_udp_payload: 900, ..Tuning::default() }.mtu_upper_bound(), 1200);
    }
}
