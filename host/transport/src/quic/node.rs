//! One node's QUIC endpoint: it dials and accepts mutually authenticated connections (one per
//! pair of nodes, reused in both directions), opens one stream per channel it sends on
//! ([`super::outbound`]), and feeds the streams it accepts into the local gates of the
//! channels registered with it ([`super::inbound`]).
//!
//! The data path keeps the credit protocol of [`crate::credit`] end to end: a receiving
//! node grants one credit per buffer it can take ([`crate::credit::CreditReceiver`]), the
//! sending node ships only against credit from a bounded queue
//! ([`crate::credit::CreditSender`]) and announces its backlog, so a receiver with free buffers
//! grants them at once. QUIC's own stream windows sit above what credit allows, so they never
//! throttle a channel: credit is the one flow control.
//!
//! Task threads stay blocking, as the engine's tasks are: [`RemoteSender::send`] waits on a
//! condition variable while an async writer on the node's runtime drains the queue; an inbound
//! stream is pumped by a thread of its own into a local channel, whose credit it follows.
//! Nothing a peer sends can make the node start a thread or wait on one: a stream waits for its
//! header and its registration as a task, and only a claimed channel gets a thread.
//!
//! A peer that breaks the protocol (bad frame, credit violation, a stream for a channel another
//! node feeds) is dropped: its connection closes with the reason, the reason is logged and kept
//! ([`QuicNode::dropped_peers`]), and the node goes on serving everyone else. What a peer can
//! make the node hold is bounded per connection and per channel: see [`crate::admission`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use tokio::runtime::Handle;

use super::endpoint::{NodeError, Tuning, connect_error, dial, endpoint, peer_name};
use super::inbound::{Inbound, Waiting};
use super::link::{LinkId, side_header};
use super::log_budget::LogBudget;
use super::outbound::{RemoteSender, SenderShared};
use super::registry::Registry;
use super::tls::NodeIdentity;
use crate::admission::{PendingStreams, StreamVerdict};
use crate::channel::ChannelSender;

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

/// What peers make this node hold now, and the streams it refused so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboundStats {
    /// Streams waiting for their header or for their channel to be registered, over all
    /// connections (at most [`Tuning::max_pending_streams`] per connection).
    pub waiting_streams: u64,
    /// Streams refused so far: too many waiting, no header in time, or nothing registered for
    /// them in time.
    pub refused_streams: u64,
    /// Bytes read from peers that the transport holds: headers read so far, frames read but not
    /// yet handed to their local channel, and an oversized frame until its subtask took it.
    pub buffered_bytes: u64,
}

/// Application error codes on the wire.
pub(super) const CODE_PROTOCOL: u32 = 1;
pub(super) const CODE_STOPPED: u32 = 2;
pub(super) const CODE_REFUSED: u32 = 3;

type LinkFailed = Box<dyn Fn(&LinkId, &str) + Send + Sync>;
/// Where a registered input's messages go.
pub(super) type Registered = Box<dyn ChannelSender>;
/// A job attempt: (job, attempt).
type JobScope = (String, u64);

/// Takes an accepted side stream: the peer's name, the bytes read past the stream's header
/// (none: a receiver reads no further than a header before the stream is claimed), and the
/// stream's two halves. Runs inside the node's runtime, so it may spawn tasks.
pub type SideHandler = Box<dyn FnOnce(&str, Vec<u8>, SendStream, RecvStream) + Send>;

pub(super) struct Shared {
    pub(super) name: String,
    endpoint: Endpoint,
    pub(super) handle: Handle,
    pub(super) tuning: Tuning,
    peers: Mutex<HashMap<String, Connection>>,
    /// Registered inputs: the node expected to feed each, and where its messages go.
    pub(super) inbox: Registry<LinkId, Registered>,
    /// Handlers of named side streams (control traffic beside the data, such as a spread
    /// job's checkpoint protocol), by name.
    pub(super) sides: Registry<String, SideHandler>,
    dropped: Mutex<Vec<DroppedPeer>>,
    /// Hooks told of failed input links, per job attempt.
    on_link_failed: Mutex<Vec<(JobScope, LinkFailed)>>,
    /// The senders of each job attempt, so cancelling it can wake a task blocked on credit.
    senders: Mutex<Vec<(JobScope, std::sync::Weak<SenderShared>)>>,
    /// Warnings strangers can trigger, rate-limited.
    warnings: Mutex<LogBudget>,
    pub(super) waiting_streams: AtomicU64,
    refused_streams: AtomicU64,
    pub(super) buffered_bytes: AtomicU64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(super) fn drop_peer(&self, conn: &Connection, peer: &str, reason: &str) {
        if let Some(left_out) = self.log_budget() {
            tracing::warn!(node = %self.name, peer, reason, left_out, "dropping peer");
        }
        conn.close(VarInt::from_u32(CODE_PROTOCOL), reason.as_bytes());
        lock(&self.peers).retain(|_, c| c.stable_id() != conn.stable_id());
        self.remember_dropped(peer, reason);
    }

    /// Refuses one stream of `peer`, for `reason`; its other streams go on.
    pub(super) fn refuse(&self, peer: &str, send: &mut SendStream, recv: &mut RecvStream, reason: &str) {
        if let Some(left_out) = self.log_budget() {
            tracing::warn!(node = %self.name, peer, reason, left_out, "refusing a stream");
        }
        // Counted before the peer can learn of it.
        self.refused_streams.fetch_add(1, Ordering::Relaxed);
        self.remember_dropped(peer, &format!("stream refused: {reason}"));
        let _ = send.reset(VarInt::from_u32(CODE_REFUSED));
        let _ = recv.stop(VarInt::from_u32(CODE_REFUSED));
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

    pub(super) fn link_failed(&self, link: &LinkId, reason: &str) {
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
            inbox: Registry::default(),
            sides: Registry::default(),
            dropped: Mutex::default(),
            on_link_failed: Mutex::default(),
            senders: Mutex::default(),
            warnings: Mutex::default(),
            waiting_streams: AtomicU64::new(0),
            refused_streams: AtomicU64::new(0),
            buffered_bytes: AtomicU64::new(0),
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

    /// What peers make this node hold now, and the streams it refused so far.
    pub fn inbound_stats(&self) -> InboundStats {
        InboundStats {
            waiting_streams: self.shared.waiting_streams.load(Ordering::Relaxed),
            refused_streams: self.shared.refused_streams.load(Ordering::Relaxed),
            buffered_bytes: self.shared.buffered_bytes.load(Ordering::Relaxed),
        }
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
        self.shared.inbox.register(link, from, into);
    }

    /// The runtime the node's I/O runs on.
    pub fn handle(&self) -> &Handle {
        &self.shared.handle
    }

    /// Registers the handler of the side stream node `from` will open under `name` (once).
    pub fn on_side(&self, name: &str, from: &str, handler: SideHandler) {
        self.shared.sides.register(name.to_owned(), from, handler);
    }

    /// A new stream on `conn`, waiting at most the registration timeout for the peer to allow
    /// one more (it allows [`Tuning::max_streams`] open at once): a wait without end would
    /// hang the task opening its channels. Blocking.
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
                "no stream free within {wait:?}: the peer allows {} open at once and all are in use",
                self.shared.tuning.max_streams
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
        self.shared.inbox.retain(|l| !(l.job == job && l.attempt == attempt));
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
        senders.push(((link.job.clone(), link.attempt), Arc::downgrade(sender.shared())));
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

/// Accepts the streams `peer` opens on `conn`: each waits for its header and registration as
/// a task of its own, up to [`Tuning::max_pending_streams`] at once ([`PendingStreams`]).
async fn serve_connection(shared: Arc<Shared>, conn: Connection, peer: String) {
    let limit = shared.tuning.max_pending_streams;
    let pending = Arc::new(Mutex::new(PendingStreams::new(limit)));
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        let verdict = lock(&pending).on_accepted();
        let too_many = || format!("more than {limit} streams of this connection wait for their header or registration");
        match verdict {
            StreamVerdict::Wait => {
                let waiting = Waiting::new(&shared, pending.clone());
                let inbound = Inbound::new(shared.clone(), conn.clone(), peer.clone(), send, recv);
                tokio::spawn(inbound.run(waiting));
            }
            StreamVerdict::Refuse => shared.refuse(&peer, &mut send, &mut recv, &too_many()),
            StreamVerdict::DropPeer => {
                shared.refuse(&peer, &mut send, &mut recv, &too_many());
                let reason = format!("{limit} streams refused: {}", too_many());
                return shared.drop_peer(&conn, &peer, &reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::channel::{ChannelConfig, InputGate, Message, local_gate};
    use crate::quic::ClusterCa;
    use eddy_core::RecordBatch;

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
