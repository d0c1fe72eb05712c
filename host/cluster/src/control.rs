//! The coordinator's side of the control plane: a QUIC endpoint (mutual TLS with the cluster
//! CA) where workers register and beat, and a clock task that declares silent workers dead.
//! The truth is the [`Membership`] state machine, rights included (what a worker may report
//! and fetch); this shell only feeds it, with the sender's identity from its certificate and
//! its session's incarnation, never from what the message says.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use eddy_transport::quic::{LogBudget, NodeError, NodeIdentity, Tuning, endpoint, peer_name};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use tokio::runtime::Handle;

use crate::membership::{Departed, Departure, Member, Membership, NoSlots, SlotHolder, SwapAnswer};
use crate::protocol::{self, CoordinatorMessage, PartState, WorkerMessage};

/// Where an artifact's bytes are, by digest (`sha256:<hex>`, already checked for form).
pub type ArtifactLookup = Box<dyn Fn(&str) -> Option<PathBuf> + Send + Sync>;

/// A worker incarnation's control stream, for messages to it (encoded: a message too large
/// is refused before it is queued, so it can never end the session).
type Outbox = (u64, tokio::sync::mpsc::UnboundedSender<Vec<u8>>);

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
    /// The newest metrics of each worker's part of each job attempt.
    metrics: Mutex<HashMap<(String, u64), BTreeMap<String, eddy_engine::MetricsSnapshot>>>,
    artifacts: OnceLock<ArtifactLookup>,
    /// Warnings any UDP sender or enrolled node can trigger, rate-limited.
    warnings: Mutex<LogBudget>,
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

    /// Whether a warning strangers can cause may be logged now, and how many were left out.
    fn budget(&self) -> Option<u64> {
        lock(&self.warnings).admit(now_ms())
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
            metrics: Mutex::default(),
            artifacts: OnceLock::new(),
            warnings: Mutex::default(),
        });
        handle.spawn(accept(inner.clone()));
        handle.spawn(clock(inner.clone()));
        Ok(Self { inner })
    }

    /// How long a silent worker has before it is declared dead.
    pub fn heartbeat_timeout(&self) -> Duration {
        self.inner.config.heartbeat_timeout
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
    /// A message larger than the protocol takes is refused here, naming its size: sent, it
    /// would cost the worker its session, and every other job on it an attempt.
    pub fn send(&self, worker: &SlotHolder, message: &CoordinatorMessage) -> Result<(), String> {
        let mut wire = Vec::new();
        protocol::encode(message, &mut wire).map_err(|e| format!("not sent to worker `{}`: {e}", worker.name))?;
        match lock(&self.inner.outboxes).get(&worker.name) {
            Some((incarnation, tx)) if *incarnation == worker.incarnation => {
                tx.send(wire).map_err(|_| format!("worker `{}`'s control stream closed", worker.name))
            }
            _ => Err(format!("worker `{}` incarnation {} is gone", worker.name, worker.incarnation)),
        }
    }

    /// `job`'s `attempt` runs a part on `to` with artifacts `digests` (before it is deployed):
    /// that worker incarnation may now report on it and fetch them.
    pub fn deployed(&self, job: &str, attempt: u64, to: &SlotHolder, digests: &[String]) {
        self.inner.membership().deploy(job, attempt, to, digests);
    }

    /// Asks `to`'s part of `job`'s `attempt` to prepare a live swap of `step` to `digest`
    /// (allowing it to fetch that artifact, and forgetting its earlier answer).
    pub fn ask_swap(&self, to: &SlotHolder, job: &str, attempt: u64, step: &str, digest: &str) -> Result<(), String> {
        if !self.inner.membership().ask_swap(to, job, attempt, step, digest) {
            return Err(format!("worker `{}` runs no part of attempt {attempt}", to.name));
        }
        let order = CoordinatorMessage::PrepareSwap {
            job: job.to_owned(),
            attempt,
            step: step.to_owned(),
            digest: digest.to_owned(),
        };
        self.send(to, &order)
    }

    /// Each worker's answer to the live swap of `job`'s `attempt` it was last asked for.
    pub fn swap_answers(&self, job: &str, attempt: u64) -> BTreeMap<String, SwapAnswer> {
        self.inner.membership().swap_answers(job, attempt)
    }

    /// What each worker last reported of its part of `job`'s `attempt`.
    pub fn part_states(&self, job: &str, attempt: u64) -> BTreeMap<String, PartState> {
        self.inner.membership().part_states(job, attempt)
    }

    /// The newest metrics of each worker's part of `job`'s `attempt`.
    pub fn part_metrics(&self, job: &str, attempt: u64) -> Vec<(String, eddy_engine::MetricsSnapshot)> {
        lock(&self.inner.metrics)
            .get(&(job.to_owned(), attempt))
            .map(|m| m.iter().map(|(worker, metrics)| (worker.clone(), metrics.clone())).collect())
            .unwrap_or_default()
    }

    /// Forgets `job`'s `attempt` (it ended): its parts' reports, metrics and rights.
    pub fn forget_parts(&self, job: &str, attempt: u64) {
        self.inner.membership().forget_attempt(job, attempt);
        lock(&self.inner.metrics).remove(&(job.to_owned(), attempt));
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
                // Anyone who can send UDP can fail a handshake: budgeted, as the data plane's.
                Err(e) => {
                    if let Some(left_out) = inner.budget() {
                        tracing::warn!(%remote, reason = %e, left_out, "refused a control connection");
                    }
                    return;
                }
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

/// Answers a fetch by worker `peer`: the artifact's bytes after an
/// [`CoordinatorMessage::Artifact`] header, or a refusal naming why. Only an artifact of a part
/// deployed to that worker is served: any other looks exactly like a missing one.
async fn send_artifact(inner: &Inner, peer: &str, digest: &str, mut send: SendStream) {
    let entitled = protocol::is_digest(digest) && inner.membership().may_fetch(peer, digest);
    if !entitled && let Some(left_out) = inner.budget() {
        tracing::warn!(worker = %peer, digest, left_out, "refused a fetch of an artifact deployed to no part of the worker's");
    }
    let path = inner.artifacts.get().filter(|_| entitled).and_then(|lookup| lookup(digest));
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
        Ok(Some(WorkerMessage::Fetch { digest })) => return send_artifact(&inner, &peer, &digest, send).await,
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
            let registered = inner.membership().register(&name, slots, &data_addr, now_ms());
            let (incarnation, replaced) = match registered {
                Ok(registered) => registered,
                Err(e) => {
                    let reason = e.to_string();
                    let _ = protocol::write(&mut send, &CoordinatorMessage::Refused { reason: reason.clone() }).await;
                    let _ = send.finish();
                    let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
                    return refuse(reason);
                }
            };
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
    outbox: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) -> Result<(), String> {
    let me = SlotHolder { name: name.to_owned(), incarnation };
    loop {
        let message = tokio::select! {
            message = protocol::read::<WorkerMessage>(recv, buf) => message,
            Some(out) = outbox.recv() => {
                if send.write_all(&out).await.is_err() {
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
                let reported = inner.membership().part_report(&me, &job, attempt, state.clone());
                match reported {
                    Ok(()) => {
                        tracing::info!(worker = %name, job, attempt, state = ?state, "a part of a job changed state")
                    }
                    Err(e) => {
                        if let Some(left_out) = inner.budget() {
                            tracing::warn!(worker = %name, error = %e, left_out, "ignored a part report");
                        }
                    }
                }
            }
            Ok(Some(WorkerMessage::SwapPrepared { job, attempt, step, digest, problem })) => {
                // Another process's words: bounded before they are kept or shown.
                let problem = problem.map(eddy_engine::FailureDetail::bounded_message);
                let answer = SwapAnswer { step, digest, problem };
                if let Err(e) = inner.membership().swap_answer(&me, &job, attempt, answer)
                    && let Some(left_out) = inner.budget()
                {
                    tracing::warn!(worker = %name, error = %e, left_out, "ignored a live swap's answer");
                }
            }
            Ok(Some(WorkerMessage::Metrics { job, attempt, metrics })) => {
                // Only of a part deployed to this incarnation: a worker cannot grow this map,
                // nor add to another part's numbers.
                if inner.membership().runs_part(&me, &job, attempt) {
                    lock(&inner.metrics).entry((job, attempt)).or_default().insert(name.to_owned(), metrics);
                }
            }
            Ok(Some(other)) => return Err(format!("unexpected on a registered stream: {other:?}")),
            // The worker went away: its heartbeats stop and the clock declares it dead.
            Ok(None) | Err(_) => return Ok(()),
        }
    }
}
