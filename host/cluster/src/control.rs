//! The coordinator's side of the control plane: a QUIC endpoint (mutual TLS with the cluster
//! CA) where workers register and beat, and a clock task that declares silent workers dead.
//! The truth is the [`Membership`] state machine; this shell only feeds it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use eddy_transport::quic::{NodeError, NodeIdentity, Tuning, endpoint, peer_name};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use tokio::runtime::Handle;

use crate::membership::{Departed, Departure, Member, Membership, NoSlots, SlotHolder};
use crate::protocol::{self, CoordinatorMessage, PartState, WorkerMessage};

/// Where an artifact's bytes are, by digest (`sha256:<hex>`, already checked for form).
pub type ArtifactLookup = Box<dyn Fn(&str) -> Option<PathBuf> + Send + Sync>;

/// A worker incarnation's control stream, for messages to it.
type Outbox = (u64, tokio::sync::mpsc::UnboundedSender<CoordinatorMessage>);

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
    /// Each registered worker's control stream, by name.
    outboxes: Mutex<HashMap<String, Outbox>>,
    /// What each worker last said about its part of each job attempt.
    parts: Mutex<HashMap<(String, u64), BTreeMap<String, PartState>>>,
    /// The newest metrics of each worker's part of each job attempt.
    metrics: Mutex<HashMap<(String, u64), BTreeMap<String, eddy_engine::MetricsSnapshot>>>,
    artifacts: OnceLock<ArtifactLookup>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    fn membership(&self) -> MutexGuard<'_, Membership> {
        lock(&self.membership)
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
        let endpoint = endpoint(identity, addr, &Tuning::control(), handle)?;
        let timeout_ms = config.heartbeat_timeout.as_millis() as u64;
        let inner = Arc::new(Inner {
            endpoint,
            config,
            membership: Mutex::new(Membership::new(timeout_ms)),
            outboxes: Mutex::default(),
            parts: Mutex::default(),
            metrics: Mutex::default(),
            artifacts: OnceLock::new(),
        });
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

    /// Serves workers' artifact fetches from `lookup` (set once; later calls are ignored).
    pub fn serve_artifacts(&self, lookup: ArtifactLookup) {
        let _ = self.inner.artifacts.set(lookup);
    }

    /// Gives `job` `slots` slots on the live workers (see [`Membership::schedule`]).
    pub fn schedule(&self, job: &str, slots: u32) -> Result<Vec<SlotHolder>, NoSlots> {
        self.inner.membership().schedule(job, slots)
    }

    /// Frees the slots `job` holds.
    pub fn release(&self, job: &str) {
        self.inner.membership().release(job);
    }

    /// The first of `holders` that is no longer the live incarnation it was.
    pub fn first_gone(&self, holders: &[SlotHolder]) -> Option<SlotHolder> {
        self.inner.membership().first_gone(holders).cloned()
    }

    /// Sends `message` to `worker`'s control stream, if that incarnation is still connected.
    pub fn send(&self, worker: &SlotHolder, message: CoordinatorMessage) -> Result<(), String> {
        match lock(&self.inner.outboxes).get(&worker.name) {
            Some((incarnation, tx)) if *incarnation == worker.incarnation => {
                tx.send(message).map_err(|_| format!("worker `{}`'s control stream closed", worker.name))
            }
            _ => Err(format!("worker `{}` incarnation {} is gone", worker.name, worker.incarnation)),
        }
    }

    /// Starts keeping the workers' reports on `job`'s `attempt` (before deploying it).
    pub fn expect_parts(&self, job: &str, attempt: u64) {
        lock(&self.inner.parts).entry((job.to_owned(), attempt)).or_default();
    }

    /// What each worker last reported of its part of `job`'s `attempt`.
    pub fn part_states(&self, job: &str, attempt: u64) -> BTreeMap<String, PartState> {
        lock(&self.inner.parts).get(&(job.to_owned(), attempt)).cloned().unwrap_or_default()
    }

    /// The newest metrics of each worker's part of `job`'s `attempt`.
    pub fn part_metrics(&self, job: &str, attempt: u64) -> Vec<eddy_engine::MetricsSnapshot> {
        lock(&self.inner.metrics)
            .get(&(job.to_owned(), attempt))
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets the reports of `job`'s `attempt` (it ended).
    pub fn forget_parts(&self, job: &str, attempt: u64) {
        let key = (job.to_owned(), attempt);
        lock(&self.inner.parts).remove(&key);
        lock(&self.inner.metrics).remove(&key);
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

/// Answers a fetch: the artifact's bytes after an [`CoordinatorMessage::Artifact`] header, or
/// a refusal naming why.
async fn send_artifact(inner: &Inner, digest: &str, mut send: SendStream) {
    let path = inner.artifacts.get().filter(|_| protocol::is_digest(digest)).and_then(|lookup| lookup(digest));
    let bytes = match path {
        Some(path) => tokio::fs::read(&path).await.map_err(|e| format!("cannot read artifact {digest}: {e}")),
        None => Err(format!("no artifact {digest} here")),
    };
    let header = match &bytes {
        Ok(bytes) => CoordinatorMessage::Artifact { size: bytes.len() as u64 },
        Err(reason) => CoordinatorMessage::Refused { reason: reason.clone() },
    };
    if protocol::write(&mut send, &header).await.is_ok()
        && let Ok(bytes) = bytes
    {
        let _ = send.write_all(&bytes).await;
    }
    let _ = send.finish();
    // Let the bytes leave before the task (and with it the stream) goes.
    let _ = send.stopped().await;
}

/// One stream a worker opened: a control session (registration, then heartbeats and part
/// states one way, deployments the other) or an artifact fetch.
async fn serve(inner: Arc<Inner>, conn: Connection, peer: String, mut send: SendStream, mut recv: RecvStream) {
    let mut buf = Vec::new();
    let refuse = |reason: String| {
        tracing::warn!(worker = %peer, reason, "dropping a worker's control stream");
        conn.close(1u32.into(), reason.as_bytes());
    };
    let (name, incarnation) = match protocol::read::<WorkerMessage>(&mut recv, &mut buf).await {
        Ok(Some(WorkerMessage::Fetch { digest })) => return send_artifact(&inner, &digest, send).await,
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
    let (tx, mut outbox) = tokio::sync::mpsc::unbounded_channel();
    lock(&inner.outboxes).insert(name.clone(), (incarnation, tx));
    session(&inner, &name, incarnation, &mut send, &mut recv, &mut buf, &mut outbox).await.unwrap_or_else(refuse);
    let mut outboxes = lock(&inner.outboxes);
    if outboxes.get(&name).is_some_and(|(i, _)| *i == incarnation) {
        outboxes.remove(&name);
    }
}

/// A registered worker's session until it ends; `Err`: drop the worker, for this reason.
async fn session(
    inner: &Inner,
    name: &str,
    incarnation: u64,
    send: &mut SendStream,
    recv: &mut RecvStream,
    buf: &mut Vec<u8>,
    outbox: &mut tokio::sync::mpsc::UnboundedReceiver<CoordinatorMessage>,
) -> Result<(), String> {
    loop {
        let message = tokio::select! {
            message = protocol::read::<WorkerMessage>(recv, buf) => message,
            Some(out) = outbox.recv() => {
                if protocol::write(send, &out).await.is_err() {
                    return Ok(());
                }
                continue;
            }
        };
        match message {
            Ok(Some(WorkerMessage::Heartbeat { incarnation: beat })) if beat == incarnation => {
                let beat = inner.membership().heartbeat(name, incarnation, now_ms());
                if let Err(e) = beat {
                    let _ = protocol::write(send, &CoordinatorMessage::Reregister { reason: e.to_string() }).await;
                    return Ok(());
                }
            }
            Ok(Some(WorkerMessage::Part { job, attempt, state })) => {
                tracing::info!(worker = %name, job, attempt, state = ?state, "a part of a job changed state");
                // Only attempts the coordinator deployed: a worker cannot grow this map at will.
                if let Some(parts) = lock(&inner.parts).get_mut(&(job, attempt)) {
                    parts.insert(name.to_owned(), state);
                }
            }
            Ok(Some(WorkerMessage::Metrics { job, attempt, metrics })) => {
                let key = (job, attempt);
                if lock(&inner.parts).contains_key(&key) {
                    lock(&inner.metrics).entry(key).or_default().insert(name.to_owned(), metrics);
                }
            }
            Ok(Some(other)) => return Err(format!("unexpected on a registered stream: {other:?}")),
            // The worker went away: its heartbeats stop and the clock declares it dead.
            Ok(None) | Err(_) => return Ok(()),
        }
    }
}
