//! One node's QUIC endpoint: it dials and accepts mutually authenticated connections (one per
//! pair of nodes, reused in both directions), opens one stream per channel it sends on, and
//! feeds the streams it accepts into the local gates of the channels registered with it.
//!
//! The data path keeps the credit protocol of [`crate::credit`] end to end: a receiving
//! node grants one credit per buffer it can take ([`CreditReceiver`]), the sending node ships
//! only against credit from a bounded queue ([`CreditSender`]) and announces its backlog, so a
//! receiver with free buffers grants them at once. QUIC's own stream windows sit above what
//! credit allows, so they never throttle a channel: credit is the one flow control.
//!
//! Task threads stay blocking, as the engine's tasks are: [`RemoteSender::send`] waits on a
//! condition variable while an async writer on the node's runtime drains the queue; an inbound
//! stream is pumped by a thread of its own into a local channel, whose credit it follows.
//!
//! A peer that breaks the protocol (bad frame, credit violation, a stream for no registered
//! channel) is dropped: its connection closes with the reason, the reason is logged and kept
//! ([`QuicNode::dropped_peers`]), and the node goes on serving everyone else.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::link::{LinkId, SIDE_MAGIC, decode_side_header, side_header};
use super::log_budget::LogBudget;
use super::tls::{NodeIdentity, TlsError};
use crate::channel::{ChannelSender, Disconnected, Message};
use crate::credit::{CreditReceiver, CreditSender};
use crate::frame::{Decoder, Frame};

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
    /// channel, for 8 buffers (~320 KiB) of memory per remote channel.
    pub channel_capacity: u32,
    /// Buffers a sender queues beyond its credit before the task waits.
    pub max_queued: usize,
    /// How long an accepted stream waits for its channel to be registered.
    pub registration_timeout: Duration,
}

impl Tuning {
    /// For the control plane between workers and the coordinator: a short idle timeout, so
    /// a worker notices a coordinator that died (and one restarted in its place) within
    /// seconds; its heartbeats keep the connection busy meanwhile.
    pub fn control() -> Self {
        Self { idle_timeout: Duration::from_secs(3), ..Self::default() }
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
        }
    }
}

impl Tuning {
    fn transport(&self) -> quinn::TransportConfig {
        let mut t = quinn::TransportConfig::default();
        t.stream_receive_window(VarInt::from_u32(self.stream_window))
            .receive_window(VarInt::from_u32(self.connection_window))
            .send_window(u64::from(self.connection_window))
            .max_concurrent_bidi_streams(VarInt::from_u32(MAX_STREAMS))
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
    fn mtu_upper_bound(&self) -> u16 {
        let bound = self.max_udp_payload.max(1200);
        if self.segmentation_offload { bound.min(MAX_UDP_PAYLOAD / GSO_SEGMENTS) } else { bound }
    }
}

/// Streams a peer may hold open on one connection: one per logical channel, so a keyed
/// exchange between two workers at the largest parallelism (128 subtasks, 64 on each) opens
/// 64 x 64 = 4 096 in each direction, and a job has several exchanges and a worker several
/// jobs. A stream costs memory only while open, and the connection window bounds the bytes
/// in flight on all of them; at the old limit of 4 096 the next `open_bi` waited for a
/// stream to close, which a running job never does.
const MAX_STREAMS: u32 = 1 << 16;

/// A [`NodeError::Connect`] to `peer` at `addr`, given the reason.
fn connect_error(peer: &str, addr: SocketAddr) -> impl Fn(String) -> NodeError + '_ {
    move |reason| NodeError::Connect { peer: peer.to_owned(), addr, reason }
}

/// The most bytes one UDP send can carry (65,535 less the IPv4 and UDP headers).
const MAX_UDP_PAYLOAD: u16 = 65_507;
/// Datagrams quinn 0.11 puts in one segmentation-offload send (its `MAX_TRANSMIT_SEGMENTS`).
const GSO_SEGMENTS: u16 = 10;
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

/// A peer this node dropped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedPeer {
    /// The peer's name from its certificate (or its address if it never got that far).
    pub peer: String,
    /// What it did.
    pub reason: String,
}

/// How many dropped peers [`QuicNode::dropped_peers`] remembers.
pub const MAX_DROPPED_KEPT: usize = 1024;

/// Application error codes on the wire.
const CODE_PROTOCOL: u32 = 1;
const CODE_STOPPED: u32 = 2;
const CODE_REFUSED: u32 = 3;

type LinkFailed = Box<dyn Fn(&LinkId, &str) + Send + Sync>;
/// Where a registered input's messages go.
type Registered = Box<dyn ChannelSender>;
/// A job attempt: (job, attempt).
type JobScope = (String, u64);

struct Shared {
    name: String,
    endpoint: Endpoint,
    handle: Handle,
    tuning: Tuning,
    peers: Mutex<HashMap<String, Connection>>,
    /// Registered inputs: the node expected to feed each, and where its messages go.
    inbox: Mutex<HashMap<LinkId, (String, Registered)>>,
    registered: Condvar,
    dropped: Mutex<Vec<DroppedPeer>>,
    /// Hooks told of failed input links, per job attempt.
    on_link_failed: Mutex<Vec<(JobScope, LinkFailed)>>,
    /// Handlers of named side streams (control traffic beside the data, such as a spread
    /// job's checkpoint protocol), by name.
    sides: Mutex<HashMap<String, (String, SideHandler)>>,
    side_registered: Condvar,
    /// The senders of each job attempt, so cancelling it can wake a task blocked on credit.
    senders: Mutex<Vec<(JobScope, std::sync::Weak<SenderShared>)>>,
    /// Warnings strangers can trigger, rate-limited.
    warnings: Mutex<LogBudget>,
}

/// Takes an accepted side stream: the peer's name, the bytes read past the stream's header,
/// and the stream's two halves. Runs inside the node's runtime, so it may spawn tasks.
pub type SideHandler = Box<dyn FnOnce(&str, Vec<u8>, SendStream, RecvStream) + Send>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn drop_peer(&self, conn: &Connection, peer: &str, reason: &str) {
        if let Some(left_out) = self.log_budget() {
            tracing::warn!(node = %self.name, peer, reason, left_out, "dropping peer");
        }
        conn.close(VarInt::from_u32(CODE_PROTOCOL), reason.as_bytes());
        lock(&self.peers).retain(|_, c| c.stable_id() != conn.stable_id());
        self.remember_dropped(peer, reason);
    }

    /// Whether a warning about a refused or dropped peer may be logged now, and how many
    /// were left out before it (see [`LogBudget`]).
    fn log_budget(&self) -> Option<u64> {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let now_ms = START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64;
        lock(&self.warnings).admit(now_ms)
    }

    /// Keeps the newest [`MAX_DROPPED_KEPT`] drops: anyone who can send UDP can fail handshakes.
    fn remember_dropped(&self, peer: &str, reason: &str) {
        let mut dropped = lock(&self.dropped);
        if dropped.len() >= MAX_DROPPED_KEPT {
            dropped.remove(0);
        }
        dropped.push(DroppedPeer { peer: peer.to_owned(), reason: reason.to_owned() });
    }

    fn link_failed(&self, link: &LinkId, reason: &str) {
        tracing::warn!(node = %self.name, job = %link.job, task = link.task, subtask = link.subtask, channel = link.channel, reason, "input link failed");
        let hooks = lock(&self.on_link_failed);
        for (_, hook) in hooks.iter().filter(|((job, attempt), _)| *job == link.job && *attempt == link.attempt) {
            hook(link, reason);
        }
    }
}

/// One node's QUIC endpoint. Cheap to clone.
#[derive(Clone)]
pub struct QuicNode {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for QuicNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicNode").field("name", &self.shared.name).finish_non_exhaustive()
    }
}

impl QuicNode {
    /// Binds `addr` (UDP) on `handle`'s runtime and starts accepting peers.
    pub fn bind(identity: &NodeIdentity, addr: SocketAddr, tuning: Tuning, handle: Handle) -> Result<Self, NodeError> {
        let endpoint = endpoint(identity, addr, &tuning, &handle)?;
        let shared = Arc::new(Shared {
            name: identity.name.clone(),
            endpoint,
            handle: handle.clone(),
            tuning,
            peers: Mutex::default(),
            inbox: Mutex::default(),
            registered: Condvar::new(),
            dropped: Mutex::default(),
            on_link_failed: Mutex::default(),
            sides: Mutex::default(),
            senders: Mutex::default(),
            warnings: Mutex::default(),
            side_registered: Condvar::new(),
        });
        handle.spawn(accept_loop(shared.clone()));
        Ok(Self { shared })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.shared.endpoint.local_addr()
    }

    /// Peers dropped for breaking the protocol, and streams refused (their reason starts with
    /// `stream refused:`), oldest first (the newest [`MAX_DROPPED_KEPT`]).
    pub fn dropped_peers(&self) -> Vec<DroppedPeer> {
        lock(&self.shared.dropped).clone()
    }

    /// Called when an input link of `job`'s `attempt` ends without end-of-stream, so the job
    /// can fail instead of waiting for input that will never come. Forgotten by
    /// [`QuicNode::unregister_job`].
    pub fn on_job_link_failed(&self, job: &str, attempt: u64, hook: impl Fn(&LinkId, &str) + Send + Sync + 'static) {
        lock(&self.shared.on_link_failed).push(((job.to_owned(), attempt), Box::new(hook)));
    }

    /// Registers the receiving end of `link`, fed by node `from`: the stream `from` opens for
    /// it is pumped into `into` (typically a local channel of the subtask's gate). Another
    /// node opening it is dropped, and the registration stays for `from`.
    pub fn register(&self, link: LinkId, from: &str, into: Box<dyn ChannelSender>) {
        lock(&self.shared.inbox).insert(link, (from.to_owned(), into));
        self.shared.registered.notify_all();
    }

    /// The runtime the node's I/O runs on.
    pub fn handle(&self) -> &Handle {
        &self.shared.handle
    }

    /// Registers the handler of the side stream node `from` will open under `name` (once).
    pub fn on_side(&self, name: &str, from: &str, handler: SideHandler) {
        lock(&self.shared.sides).insert(name.to_owned(), (from.to_owned(), handler));
        self.shared.side_registered.notify_all();
    }

    /// A new stream on `conn`, waiting at most the registration timeout for the peer to allow
    /// one more (it allows [`MAX_STREAMS`] open at once): a wait without end would hang the
    /// task opening its channels. Blocking.
    fn open_stream(
        &self,
        conn: &Connection,
        peer: &str,
        addr: SocketAddr,
    ) -> Result<(SendStream, RecvStream), NodeError> {
        let wait = self.shared.tuning.registration_timeout;
        // The timer is made inside the runtime: this thread is not one of its workers.
        match self.shared.handle.block_on(async { tokio::time::timeout(wait, conn.open_bi()).await }) {
            Ok(opened) => opened.map_err(|e| connect_error(peer, addr)(e.to_string())),
            Err(_) => Err(connect_error(peer, addr)(format!(
                "no stream free within {wait:?}: the peer allows {MAX_STREAMS} open at once and all are in use"
            ))),
        }
    }

    /// Opens side stream `name` to `peer`, which registered a handler for it. Blocking.
    pub fn open_side(&self, peer: &str, addr: SocketAddr, name: &str) -> Result<(SendStream, RecvStream), NodeError> {
        let (conn, err) = (self.connect(peer, addr)?, connect_error(peer, addr));
        let (mut send, recv) = self.open_stream(&conn, peer, addr)?;
        self.shared.handle.block_on(send.write_all(&side_header(name))).map_err(|e| err(e.to_string()))?;
        Ok((send, recv))
    }

    /// Forgets the registrations and hooks of a job's attempt (after it ended or failed).
    pub fn unregister_job(&self, job: &str, attempt: u64) {
        lock(&self.shared.inbox).retain(|l, _| !(l.job == job && l.attempt == attempt));
        lock(&self.shared.on_link_failed).retain(|((j, a), _)| !(j == job && *a == attempt));
        lock(&self.shared.senders).retain(|((j, a), _)| !(j == job && *a == attempt));
    }

    /// The connection to `peer`, dialing `addr` if there is none. Blocking.
    pub fn connect(&self, peer: &str, addr: SocketAddr) -> Result<Connection, NodeError> {
        // A peer that restarted listens elsewhere (or answers the old connection with a
        // stateless reset): only a live connection to the address asked for is reused.
        let live = |c: &&Connection| c.close_reason().is_none() && c.remote_address() == addr;
        if let Some(conn) = lock(&self.shared.peers).get(peer).filter(live) {
            return Ok(conn.clone());
        }
        let conn = self.shared.handle.block_on(dial(&self.shared.endpoint, peer, addr))?;
        lock(&self.shared.peers).insert(peer.to_owned(), conn.clone());
        // A peer may open streams on a connection we dialed, too.
        self.shared.handle.spawn(serve_connection(self.shared.clone(), conn.clone(), peer.to_owned()));
        Ok(conn)
    }

    /// Opens the sending end of `link` towards `peer`. Blocking.
    pub fn open_sender(&self, peer: &str, addr: SocketAddr, link: &LinkId) -> Result<RemoteSender, NodeError> {
        let (conn, err) = (self.connect(peer, addr)?, connect_error(peer, addr));
        let (mut send, recv) = self.open_stream(&conn, peer, addr)?;
        self.shared.handle.block_on(send.write_all(&link.encode())).map_err(|e| err(e.to_string()))?;
        let sender = RemoteSender::start(&self.shared, conn, peer.to_owned(), send, recv);
        let mut senders = lock(&self.shared.senders);
        senders.retain(|(_, s)| s.strong_count() > 0);
        senders.push(((link.job.clone(), link.attempt), Arc::downgrade(&sender.shared)));
        Ok(sender)
    }

    /// Closes every sender of `job`'s `attempt` opened here, for `reason`: a task blocked on
    /// one's credit returns at once with a disconnect.
    pub fn close_senders(&self, job: &str, attempt: u64, reason: &str) {
        let senders = lock(&self.shared.senders);
        for shared in senders.iter().filter(|((j, a), _)| j == job && *a == attempt).filter_map(|(_, s)| s.upgrade()) {
            shared.close(reason.to_owned());
        }
    }

    /// Closes every connection and the endpoint.
    pub fn close(&self) {
        self.shared.endpoint.close(VarInt::from_u32(CODE_STOPPED), b"node stopping");
    }
}

async fn accept_loop(shared: Arc<Shared>) {
    while let Some(incoming) = shared.endpoint.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => {
                    // A certificate the CA did not sign ends here, inside the handshake.
                    if let Some(left_out) = shared.log_budget() {
                        tracing::warn!(node = %shared.name, %remote, reason = %e, left_out, "refused a connection");
                    }
                    shared.remember_dropped(&remote.to_string(), &e.to_string());
                    return;
                }
            };
            let Some(peer) = peer_name(&conn) else {
                shared.drop_peer(&conn, &remote.to_string(), "the client certificate names no node");
                return;
            };
            // The newest connection from a peer wins: an older one may belong to its
            // previous process.
            lock(&shared.peers).insert(peer.clone(), conn.clone());
            serve_connection(shared, conn, peer).await;
        });
    }
}

/// The node name in a peer's (already verified) certificate.
pub fn peer_name(conn: &Connection) -> Option<String> {
    let certs = conn.peer_identity()?.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>().ok()?;
    super::tls::node_name(certs.first()?)
}

async fn serve_connection(shared: Arc<Shared>, conn: Connection, peer: String) {
    while let Ok((send, recv)) = conn.accept_bi().await {
        let inbound =
            Inbound { shared: shared.clone(), conn: conn.clone(), peer: peer.clone(), send, recv, buf: Vec::new() };
        tokio::spawn(inbound.run());
    }
}

/// Why an inbound link ended early.
enum LinkEnd {
    /// The peer broke the protocol: drop it.
    Protocol(String),
    /// The stream or connection went away.
    Lost(String),
    /// The local gate closed (job stopping): not the peer's fault.
    Stopped,
}

/// One accepted stream. An async reader decodes frames and checks them against the credit it
/// granted; a thread hands them to the registered local channel, blocking on that channel's
/// credit, and reports each hand-over so the reader grants the buffer again. The reader keeps
/// reading while the thread is blocked, so a peer that sends beyond its credit is caught.
struct Inbound {
    shared: Arc<Shared>,
    conn: Connection,
    peer: String,
    send: SendStream,
    recv: RecvStream,
    buf: Vec<u8>,
}

impl Inbound {
    async fn run(mut self) {
        while self.buf.len() < SIDE_MAGIC.len() {
            match self.read_more().await {
                Ok(true) => {}
                _ => return,
            }
        }
        if self.buf.starts_with(SIDE_MAGIC) {
            return self.side().await;
        }
        let link = match self.header().await {
            Ok(link) => link,
            Err(LinkEnd::Protocol(reason)) => return self.shared.drop_peer(&self.conn, &self.peer, &reason),
            Err(_) => return,
        };
        let missing = format!("a stream for {link:?}, which is not registered here");
        let taken_by = |expected: &str| format!("a stream for {link:?}, which `{expected}` feeds");
        let claimed = self.claim(|s| (&s.inbox, &s.registered), link.clone(), missing, taken_by).await;
        let Some((mut this, into)) = claimed else { return };
        match this.pump(into).await {
            Ok(()) => {}
            Err(LinkEnd::Protocol(reason)) => {
                this.shared.drop_peer(&this.conn, &this.peer, &reason);
                this.shared.link_failed(&link, &reason);
            }
            Err(LinkEnd::Lost(reason)) => this.shared.link_failed(&link, &reason),
            Err(LinkEnd::Stopped) => {
                let _ = this.recv.stop(VarInt::from_u32(CODE_STOPPED));
            }
        }
    }

    /// Waits for the registration of `key` for this stream's peer and takes it. None
    /// registered: this stream alone is refused (it may come from a slow or stale peer). One
    /// registered for another node: the peer is dropped.
    async fn claim<K, T>(
        self,
        registry: fn(&Shared) -> Registry<'_, K, T>,
        key: K,
        missing: String,
        taken_by: impl FnOnce(&str) -> String,
    ) -> Option<(Self, T)>
    where
        K: Eq + std::hash::Hash + Send + 'static,
        T: Send + 'static,
    {
        let (shared, peer) = (self.shared.clone(), self.peer.clone());
        let taken = tokio::task::spawn_blocking(move || {
            let (map, registered) = registry(&shared);
            take_registered(map, registered, &key, &peer, shared.tuning.registration_timeout)
        })
        .await;
        match taken {
            Ok(Ok(value)) => Some((self, value)),
            Ok(Err(Unregistered::Missing)) => {
                self.refuse(&missing);
                None
            }
            Ok(Err(Unregistered::OtherPeer(expected))) => {
                self.shared.drop_peer(&self.conn, &self.peer, &taken_by(&expected));
                None
            }
            Err(_) => None,
        }
    }

    /// Refuses this stream only.
    fn refuse(mut self, reason: &str) {
        tracing::warn!(node = %self.shared.name, peer = %self.peer, reason, "refusing a stream");
        let _ = self.send.reset(VarInt::from_u32(CODE_REFUSED));
        let _ = self.recv.stop(VarInt::from_u32(CODE_REFUSED));
        self.shared.remember_dropped(&self.peer, &format!("stream refused: {reason}"));
    }

    /// A side stream: its name, then its handler takes over.
    async fn side(mut self) {
        let (name, header_len) = loop {
            match decode_side_header(&self.buf) {
                Ok(Some(header)) => break header,
                Ok(None) => {}
                Err(reason) => return self.shared.drop_peer(&self.conn, &self.peer, &reason),
            }
            if !matches!(self.read_more().await, Ok(true)) {
                return;
            }
        };
        let missing = format!("a side stream `{name}`, which nobody here expects");
        let taken_by = |expected: &str| format!("a side stream `{name}`, which only `{expected}` may open");
        let claimed = self.claim(|s| (&s.sides, &s.side_registered), name.clone(), missing, taken_by).await;
        let Some((mut this, handler)) = claimed else { return };
        let read_ahead = this.buf.split_off(header_len);
        handler(&this.peer, read_ahead, this.send, this.recv);
    }

    async fn read_more(&mut self) -> Result<bool, LinkEnd> {
        match self.recv.read_chunk(1 << 20, true).await {
            Ok(Some(chunk)) => {
                self.buf.extend_from_slice(&chunk.bytes);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(LinkEnd::Lost(e.to_string())),
        }
    }

    async fn header(&mut self) -> Result<LinkId, LinkEnd> {
        loop {
            if let Some((link, used)) = LinkId::decode(&self.buf).map_err(LinkEnd::Protocol)? {
                self.buf.drain(..used);
                return Ok(link);
            }
            if !self.read_more().await? {
                return Err(LinkEnd::Lost("the stream ended inside its header".into()));
            }
        }
    }

    async fn credit(&mut self, n: u32) -> Result<(), LinkEnd> {
        let mut wire = Vec::with_capacity(9);
        Frame::Credit(n).encode(&mut wire);
        self.send.write_all(&wire).await.map_err(|e| LinkEnd::Lost(e.to_string()))
    }

    /// Decodes every whole frame read so far into `queue`; true once end-of-stream came.
    fn decode(
        &mut self,
        receiver: &mut CreditReceiver,
        queue: &tokio::sync::mpsc::Sender<Message>,
        backlog: &mut u32,
    ) -> Result<bool, LinkEnd> {
        let decoder = Decoder::default();
        let mut at = 0;
        let mut ended = false;
        while !ended {
            let Some((frame, used)) = decoder.decode(&self.buf[at..]).map_err(|e| LinkEnd::Protocol(e.to_string()))?
            else {
                break;
            };
            at += used;
            let Frame::Message { message, backlog: behind } = frame else {
                return Err(LinkEnd::Protocol("a credit frame on a sender's stream".into()));
            };
            receiver.on_buffer().map_err(|e| LinkEnd::Protocol(e.to_string()))?;
            *backlog = behind;
            ended = message == Message::EndOfStream;
            // Never full: the queue holds `capacity` and credit allows no more in use.
            queue.try_send(message).map_err(|_| LinkEnd::Stopped)?;
        }
        self.buf.drain(..at);
        Ok(ended)
    }

    async fn pump(&mut self, into: Box<dyn ChannelSender>) -> Result<(), LinkEnd> {
        let capacity = self.shared.tuning.channel_capacity;
        let mut receiver = CreditReceiver::new(capacity, 1);
        let (queue, queued) = tokio::sync::mpsc::channel(capacity as usize);
        let (handed_tx, mut handed) = tokio::sync::mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name(format!("eddy-link-{}", self.peer))
            .spawn(move || hand_over(into, queued, handed_tx))
            .map_err(|e| LinkEnd::Lost(format!("cannot start the link's thread: {e}")))?;
        self.credit(receiver.initial_credit()).await?;
        let (mut backlog, mut ended) = (0, self.decode(&mut receiver, &queue, &mut 0)?);
        loop {
            tokio::select! {
                chunk = self.recv.read_chunk(1 << 20, true), if !ended => match chunk {
                    Ok(Some(chunk)) => {
                        self.buf.extend_from_slice(&chunk.bytes);
                        ended = self.decode(&mut receiver, &queue, &mut backlog)?;
                    }
                    Ok(None) => return Err(LinkEnd::Lost("the stream ended without end-of-stream".into())),
                    Err(e) => return Err(LinkEnd::Lost(e.to_string())),
                },
                done = handed.recv() => match done {
                    Some(true) => {
                        let freed = receiver.on_consumed();
                        if let Some(n) = freed.or_else(|| receiver.poll_announce(backlog > 0))
                            && !ended
                        {
                            self.credit(n).await?;
                        }
                    }
                    Some(false) => return Err(LinkEnd::Stopped),
                    // The thread handed over end-of-stream and ended.
                    None => {
                        let _ = self.send.finish();
                        return Ok(());
                    }
                },
            }
        }
    }
}

/// A table of registrations (by key: the node that may open the stream, and what takes it)
/// and the condition variable told of new ones.
type Registry<'a, K, T> = (&'a Mutex<HashMap<K, (String, T)>>, &'a Condvar);

/// Why a stream found no registration.
enum Unregistered {
    /// Nothing registered under its name within the registration timeout.
    Missing,
    /// It is registered for another node (named).
    OtherPeer(String),
}

/// Waits up to `timeout` for `key` to be registered and takes it, if `peer` is the node it
/// was registered for (otherwise it stays for that node).
fn take_registered<K: Eq + std::hash::Hash, T>(
    map: &Mutex<HashMap<K, (String, T)>>,
    registered: &Condvar,
    key: &K,
    peer: &str,
    timeout: Duration,
) -> Result<T, Unregistered> {
    let deadline = Instant::now() + timeout;
    let mut entries = lock(map);
    loop {
        match entries.get(key) {
            Some((expected, _)) if expected != peer => return Err(Unregistered::OtherPeer(expected.clone())),
            Some(_) => return entries.remove(key).map(|(_, value)| value).ok_or(Unregistered::Missing),
            None => {}
        }
        let left = deadline.checked_duration_since(Instant::now()).ok_or(Unregistered::Missing)?;
        entries = registered.wait_timeout(entries, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// The link's thread: hands each message to the local channel (blocking on its credit) and
/// reports `true` per message handed over, `false` if the local gate closed.
fn hand_over(
    mut into: Box<dyn ChannelSender>,
    mut queued: tokio::sync::mpsc::Receiver<Message>,
    handed: tokio::sync::mpsc::UnboundedSender<bool>,
) {
    while let Some(message) = queued.blocking_recv() {
        let end = message == Message::EndOfStream;
        let ok = into.send(message).is_ok();
        if handed.send(ok).is_err() || !ok || end {
            return;
        }
    }
}

struct SenderState {
    credit: CreditSender<Message>,
    /// Why the link cannot carry more (peer gone, stream reset).
    closed: Option<String>,
    /// The task let go of its sender: what is queued still goes out, then the stream ends.
    let_go: bool,
}

struct SenderShared {
    state: Mutex<SenderState>,
    /// The queue has room (or the link closed).
    room: Condvar,
    /// Something to write (a message, or credit for a queued one).
    work: Notify,
}

/// The sending end of a channel to a subtask on another node.
pub struct RemoteSender {
    shared: Arc<SenderShared>,
    peer: String,
}

impl std::fmt::Debug for RemoteSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSender").field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl RemoteSender {
    fn start(node: &Arc<Shared>, conn: Connection, peer: String, send: SendStream, recv: RecvStream) -> Self {
        let shared = Arc::new(SenderShared {
            state: Mutex::new(SenderState {
                credit: CreditSender::new(node.tuning.max_queued),
                closed: None,
                let_go: false,
            }),
            room: Condvar::new(),
            work: Notify::new(),
        });
        node.handle.spawn(write_loop(shared.clone(), send));
        node.handle.spawn(credit_loop(shared.clone(), node.clone(), conn, peer.clone(), recv));
        Self { shared, peer }
    }
}

impl Drop for RemoteSender {
    fn drop(&mut self) {
        lock(&self.shared.state).let_go = true;
        self.shared.work.notify_one();
    }
}

impl ChannelSender for RemoteSender {
    fn send(&mut self, message: Message) -> Result<(), Disconnected> {
        let mut state = lock(&self.shared.state);
        let mut message = message;
        loop {
            if let Some(reason) = &state.closed {
                tracing::debug!(peer = %self.peer, reason, "send on a closed link");
                return Err(Disconnected);
            }
            match state.credit.enqueue(message) {
                Ok(()) => break,
                Err(back) => {
                    message = back;
                    state = self.shared.room.wait(state).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
        drop(state);
        self.shared.work.notify_one();
        Ok(())
    }
}

impl SenderShared {
    fn close(&self, reason: String) {
        lock(&self.state).closed.get_or_insert(reason);
        self.room.notify_all();
        self.work.notify_one();
    }
}

async fn write_loop(shared: Arc<SenderShared>, mut send: SendStream) {
    let mut size = 64;
    loop {
        shared.work.notified().await;
        loop {
            let next = {
                let mut state = lock(&shared.state);
                state.credit.poll_send().map(|m| (m, state.credit.backlog() as u32))
            };
            let Some((message, backlog)) = next else {
                // The link closed (the receiver is gone), or the task let go of its sender with
                // nothing left to send and no end-of-stream sent (the job stopped): reset the
                // stream so the receiver learns at once, and end. A queued end-of-stream of a
                // task that let go still waits for its credit.
                let state = lock(&shared.state);
                if state.closed.is_some() || (state.let_go && state.credit.backlog() == 0) {
                    drop(state);
                    let _ = send.reset(VarInt::from_u32(CODE_STOPPED));
                    return;
                }
                break;
            };
            shared.room.notify_all();
            let end = message == Message::EndOfStream;
            // Encoded into a buffer of its own that quinn takes as it is (no copy of the
            // frame), sized like the last one: a channel's frames are mostly alike.
            let mut wire = Vec::with_capacity(size);
            Frame::Message { message, backlog }.encode(&mut wire);
            size = wire.len();
            if let Err(e) = send.write_chunk(Bytes::from(wire)).await {
                return shared.close(e.to_string());
            }
            if end {
                let _ = send.finish();
                return shared.close("end of stream sent".into());
            }
        }
    }
}

async fn credit_loop(
    shared: Arc<SenderShared>,
    node: Arc<Shared>,
    conn: Connection,
    peer: String,
    mut recv: RecvStream,
) {
    let decoder = Decoder::default();
    let mut buf = Vec::new();
    loop {
        match recv.read_chunk(64 << 10, true).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
            Ok(None) => return shared.close("the receiver finished the link".into()),
            Err(e) => return shared.close(e.to_string()),
        }
        let mut at = 0;
        loop {
            match decoder.decode(&buf[at..]) {
                Ok(Some((Frame::Credit(n), used))) => {
                    at += used;
                    lock(&shared.state).credit.on_credit(n);
                    shared.work.notify_one();
                }
                Ok(Some((Frame::Message { .. }, _))) => {
                    let reason = "a message frame on a receiver's credit stream".to_owned();
                    node.drop_peer(&conn, &peer, &reason);
                    return shared.close(reason);
                }
                Ok(None) => break,
                Err(e) => {
                    node.drop_peer(&conn, &peer, &e.to_string());
                    return shared.close(e.to_string());
                }
            }
        }
        buf.drain(..at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{ChannelConfig, InputGate, local_gate};
    use crate::quic::ClusterCa;
    use eddy_core::RecordBatch;

    #[test]
    fn with_segmentation_offload_a_full_batch_of_datagrams_fits_one_send() {
        let tuned = Tuning::default();
        assert_eq!(tuned.mtu_upper_bound(), 6550);
        assert!(usize::from(tuned.mtu_upper_bound()) * usize::from(GSO_SEGMENTS) <= usize::from(MAX_UDP_PAYLOAD));
        assert_eq!(Tuning { segmentation_offload: false, ..Tuning::default() }.mtu_upper_bound(), 8952);
        assert_eq!(Tuning { max_udp_payload: 900, ..Tuning::default() }.mtu_upper_bound(), 1200);
    }

    /// Loopback carries 64 KiB datagrams, so MTU discovery reaches the tuned bound (not the
    /// 1472 bytes quinn's endpoint announces by default), and bulk data keeps it there (no
    /// segmentation-offload send too large to go out, lost, and taken for a black hole).
    #[test]
    fn large_datagrams_are_found_on_loopback_and_survive_bulk_data() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let ca = ClusterCa::generate().expect("CA");
        let node = |name: &str| {
            let identity = ca.issue(name).expect("certificate");
            let addr = "127.0.0.1:0".parse().expect("address");
            QuicNode::bind(&identity, addr, Tuning::default(), rt.handle().clone()).expect("bind")
        };
        let (a, b) = (node("worker-a"), node("worker-b"));
        let b_addr = b.local_addr().expect("bound");
        let conn = a.connect("worker-b", b_addr).expect("connect");
        let bound = Tuning::default().mtu_upper_bound();
        let deadline = Instant::now() + Duration::from_secs(20);
        while conn.stats().path.current_mtu < bound {
            assert!(Instant::now() < deadline, "MTU discovery stopped at {}", conn.stats().path.current_mtu);
            std::thread::sleep(Duration::from_millis(10));
        }

        let (_shared, mut gate, senders) = local_gate(1, ChannelConfig::default(), vec![Arc::default()]);
        let link = LinkId { job: "job".into(), attempt: 0, task: 0, subtask: 0, channel: 0 };
        b.register(link.clone(), "worker-a", Box::new(senders.into_iter().next().expect("one sender")));
        let mut tx = a.open_sender("worker-b", b_addr, &link).expect("open");
        let producer = std::thread::spawn(move || {
            for _ in 0..500 {
                let mut batch = RecordBatch::default();
                for _ in 0..300 {
                    batch.push(None, &[7; 100], None);
                }
                tx.send(Message::Data { side: None, batch, watermark: None }).expect("send");
            }
            tx.send(Message::EndOfStream).expect("send");
        });
        let mut records = 0;
        loop {
            match gate.recv(Duration::from_secs(20)).expect("gate open").expect("data flows") {
                (c, Message::Data { batch, .. }) => {
                    records += batch.len();
                    gate.recycle(c, batch);
                }
                (_, Message::EndOfStream) => break,
                _ => {}
            }
        }
        producer.join().expect("producer");
        assert_eq!(records, 500 * 300);
        assert_eq!(conn.stats().path.current_mtu, bound, "bulk data knocked the datagram size down");
    }
}
