//! The coordinator's side of the control plane: a QUIC endpoint (mutual TLS with the cluster
//! CA) where workers register and beat, and a clock task that declares silent workers dead.
//! The truth is the [`Membership`] state machine; this shell only feeds it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use eddy_transport::quic::{NodeError, NodeIdentity, Tuning, endpoint, peer_name};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use tokio::runtime::Handle;

use crate::membership::{Departed, Departure, Member, Membership};
use crate::protocol::{self, CoordinatorMessage, WorkerMessage};

/// How the control plane runs.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// A worker silent this long is dead.
    pub heartbeat_timeout: Duration,
    /// How often workers beat (a quarter of the timeout unless set).
    pub heartbeat_interval: Duration,
}

impl ControlConfig {
    /// Beats at a quarter of `heartbeat_timeout`.
    pub fn with_timeout(heartbeat_timeout: Duration) -> Self {
        Self { heartbeat_timeout, heartbeat_interval: (heartbeat_timeout / 4).max(Duration::from_millis(50)) }
    }
}

/// Milliseconds on the control plane's monotonic clock: a wall-clock step (NTP) must not
/// declare every worker dead at once.
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The coordinator's control plane. Cheap to clone.
#[derive(Clone)]
pub struct ControlPlane {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    config: ControlConfig,
    membership: Mutex<Membership>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").finish_non_exhaustive()
    }
}

impl Inner {
    fn membership(&self) -> MutexGuard<'_, Membership> {
        self.membership.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn departed(&self, gone: Vec<Departed>) {
        for d in &gone {
            match d.why {
                Departure::MissedHeartbeats { silent_ms } => {
                    tracing::warn!(worker = %d.member.name, silent_ms, "worker missed its heartbeats: declared dead")
                }
                Departure::Restarted => {
                    tracing::warn!(worker = %d.member.name, "worker registered again: its previous incarnation is gone")
                }
            }
        }
    }
}

impl ControlPlane {
    /// Listens on `addr` (UDP) with `identity`, on `handle`'s runtime.
    pub fn start(
        identity: &NodeIdentity,
        addr: SocketAddr,
        config: ControlConfig,
        handle: &Handle,
    ) -> Result<Self, NodeError> {
        let endpoint = endpoint(identity, addr, &Tuning::default(), handle)?;
        let timeout_ms = config.heartbeat_timeout.as_millis() as u64;
        let inner = Arc::new(Inner { endpoint, config, membership: Mutex::new(Membership::new(timeout_ms)) });
        handle.spawn(accept(inner.clone()));
        handle.spawn(clock(inner.clone()));
        Ok(Self { inner })
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// The live workers.
    pub fn workers(&self) -> Vec<Member> {
        self.inner.membership().members().cloned().collect()
    }

    /// Now on the clock of [`Member`]'s times (monotonic, ms).
    pub fn clock_ms(&self) -> u64 {
        now_ms()
    }
}

async fn clock(inner: Arc<Inner>) {
    let tick = (inner.config.heartbeat_timeout / 4).max(Duration::from_millis(20));
    loop {
        tokio::time::sleep(tick).await;
        let gone = inner.membership().expire(now_ms());
        inner.departed(gone);
    }
}

async fn accept(inner: Arc<Inner>) {
    while let Some(incoming) = inner.endpoint.accept().await {
        let inner = inner.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => return tracing::warn!(%remote, reason = %e, "refused a control connection"),
            };
            let Some(peer) = peer_name(&conn) else {
                return conn.close(1u32.into(), b"the client certificate names no node");
            };
            while let Ok((send, recv)) = conn.accept_bi().await {
                tokio::spawn(serve(inner.clone(), conn.clone(), peer.clone(), send, recv));
            }
        });
    }
}

/// One worker's control stream: a registration, then heartbeats.
async fn serve(inner: Arc<Inner>, conn: Connection, peer: String, mut send: SendStream, mut recv: RecvStream) {
    let mut buf = Vec::new();
    let refuse = |reason: String| {
        tracing::warn!(worker = %peer, reason, "dropping a worker's control stream");
        conn.close(1u32.into(), reason.as_bytes());
    };
    let (name, incarnation) = match protocol::read::<WorkerMessage>(&mut recv, &mut buf).await {
        Ok(Some(WorkerMessage::Register { name, slots, advertise, data_port })) => {
            if name != peer {
                let reason = format!("registering as `{name}` with a certificate for `{peer}`");
                let _ = protocol::write(&mut send, &CoordinatorMessage::Refused { reason: reason.clone() }).await;
                // Closing drops unsent stream data: let the refusal reach the worker first.
                let _ = send.finish();
                let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
                return refuse(reason);
            }
            let host = advertise.unwrap_or_else(|| conn.remote_address().ip().to_string());
            let data_addr =
                if host.contains(':') { format!("[{host}]:{data_port}") } else { format!("{host}:{data_port}") };
            let (incarnation, replaced) = inner.membership().register(&name, slots, &data_addr, now_ms());
            inner.departed(replaced.into_iter().collect());
            tracing::info!(worker = %name, incarnation, slots, data_addr, "worker registered");
            let reply = CoordinatorMessage::Registered {
                incarnation,
                heartbeat_interval_ms: inner.config.heartbeat_interval.as_millis() as u64,
            };
            if protocol::write(&mut send, &reply).await.is_err() {
                return;
            }
            (name, incarnation)
        }
        Ok(Some(other)) => return refuse(format!("expected a registration, got {other:?}")),
        Ok(None) => return,
        Err(reason) => return refuse(reason),
    };
    loop {
        match protocol::read::<WorkerMessage>(&mut recv, &mut buf).await {
            Ok(Some(WorkerMessage::Heartbeat { incarnation: beat })) if beat == incarnation => {
                let beat = inner.membership().heartbeat(&name, incarnation, now_ms());
                if let Err(e) = beat {
                    let _ = protocol::write(&mut send, &CoordinatorMessage::Reregister { reason: e.to_string() }).await;
                    return;
                }
            }
            Ok(Some(other)) => return refuse(format!("unexpected on a registered stream: {other:?}")),
            // The worker went away: its heartbeats stop and the clock declares it dead.
            Ok(None) | Err(_) => return,
        }
    }
}
