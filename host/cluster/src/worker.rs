//! The worker's side of the control plane: register with the coordinator, beat, and register
//! again whenever the coordinator restarts or forgets this worker.

use std::net::SocketAddr;
use std::time::Duration;

use eddy_transport::quic::dial;
use quinn::Endpoint;

use crate::protocol::{self, CoordinatorMessage, WorkerMessage};

/// What a worker tells the coordinator about itself.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Its name (the DNS name in its certificate).
    pub name: String,
    /// Slots it offers.
    pub slots: u32,
    /// The host other workers dial; `None`: the address the coordinator sees.
    pub advertise: Option<String>,
    /// Its data plane's UDP port.
    pub data_port: u16,
}

/// Why a session with the coordinator ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionEnd {
    /// The coordinator refused this worker; retrying will not help.
    #[error("the coordinator refused this worker: {0}")]
    Refused(String),
    /// The connection or stream failed, or the coordinator asked for a new registration.
    #[error("{0}")]
    Lost(String),
}

/// Where a session delivers the coordinator's orders and finds what to tell it.
pub struct Mailbox<'a> {
    /// Told the incarnation at each registration.
    pub on_registered: &'a (dyn Fn(u64) + Sync),
    /// Deployments and cancellations.
    pub on_order: &'a (dyn Fn(CoordinatorMessage) + Sync),
    /// Messages for the coordinator (part states); kept across sessions, so what a part
    /// said while the coordinator was away reaches the next one.
    pub outbox: &'a mut tokio::sync::mpsc::UnboundedReceiver<WorkerMessage>,
}

impl std::fmt::Debug for Mailbox<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").finish_non_exhaustive()
    }
}

/// One session: dial `coordinator` (whose certificate must name `coordinator_name`), register,
/// then beat, take orders and send what the outbox holds until something fails.
pub async fn session(
    endpoint: &Endpoint,
    coordinator: SocketAddr,
    coordinator_name: &str,
    me: &Registration,
    mailbox: Mailbox<'_>,
) -> SessionEnd {
    let lost = |e: String| SessionEnd::Lost(e);
    let conn = match dial(endpoint, coordinator_name, coordinator).await {
        Ok(conn) => conn,
        Err(e) => return lost(e.to_string()),
    };
    let (mut send, mut recv) = match conn.open_bi().await {
        Ok(stream) => stream,
        Err(e) => return lost(e.to_string()),
    };
    let register = WorkerMessage::Register {
        name: me.name.clone(),
        slots: me.slots,
        advertise: me.advertise.clone(),
        data_port: me.data_port,
    };
    if let Err(e) = protocol::write(&mut send, &register).await {
        return lost(e);
    }
    let mut buf = Vec::new();
    let (incarnation, interval) = match protocol::read::<CoordinatorMessage>(&mut recv, &mut buf).await {
        Ok(Some(CoordinatorMessage::Registered { incarnation, heartbeat_interval_ms })) => {
            (incarnation, Duration::from_millis(heartbeat_interval_ms.max(10)))
        }
        Ok(Some(CoordinatorMessage::Refused { reason })) => return SessionEnd::Refused(reason),
        Ok(Some(other)) => return lost(format!("unexpected reply to a registration: {other:?}")),
        Ok(None) => return lost("the coordinator closed the stream".into()),
        Err(e) => return lost(e),
    };
    (mailbox.on_registered)(incarnation);
    let mut ticker = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if let Err(e) = protocol::write(&mut send, &WorkerMessage::Heartbeat { incarnation }).await {
                    return lost(e);
                }
            }
            Some(message) = mailbox.outbox.recv() => {
                // A message too large to send is dropped, not the session with it.
                let mut wire = Vec::new();
                if let Err(e) = protocol::encode(&message, &mut wire) {
                    tracing::warn!(error = %e, "a message to the coordinator was too large; dropped");
                    continue;
                }
                if let Err(e) = send.write_all(&wire).await {
                    return lost(e.to_string());
                }
            }
            reply = protocol::read::<CoordinatorMessage>(&mut recv, &mut buf) => match reply {
                Ok(Some(
                    order @ (CoordinatorMessage::Deploy(_)
                    | CoordinatorMessage::Cancel { .. }
                    | CoordinatorMessage::PrepareSwap { .. }),
                )) => {
                    (mailbox.on_order)(order);
                }
                Ok(Some(CoordinatorMessage::Refused { reason })) => return SessionEnd::Refused(reason),
                Ok(Some(CoordinatorMessage::Reregister { reason })) => return lost(reason),
                Ok(Some(other)) => return lost(format!("unexpected: {other:?}")),
                Ok(None) => return lost("the coordinator closed the stream".into()),
                Err(e) => return lost(e),
            },
        }
    }
}

/// Fetches artifact `digest` from the coordinator and checks that its bytes hash to it; at
/// most `limit` bytes.
pub async fn fetch(
    endpoint: &Endpoint,
    coordinator: SocketAddr,
    coordinator_name: &str,
    digest: &str,
    limit: u64,
) -> Result<Vec<u8>, String> {
    let conn = dial(endpoint, coordinator_name, coordinator).await.map_err(|e| e.to_string())?;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    protocol::write(&mut send, &WorkerMessage::Fetch { digest: digest.to_owned() }).await?;
    let _ = send.finish();
    let mut buf = Vec::new();
    let size = match protocol::read::<CoordinatorMessage>(&mut recv, &mut buf).await? {
        Some(CoordinatorMessage::Artifact { size }) if size <= limit => size,
        Some(CoordinatorMessage::Artifact { size }) => {
            return Err(format!("artifact {digest} has {size} bytes, more than the {limit} this worker takes"));
        }
        Some(CoordinatorMessage::Refused { reason }) => return Err(reason),
        other => return Err(format!("unexpected answer to a fetch: {other:?}")),
    };
    let rest = recv
        .read_to_end((size as usize).saturating_sub(buf.len()))
        .await
        .map_err(|e| format!("fetching {digest}: {e}"))?;
    buf.extend_from_slice(&rest);
    conn.close(0u32.into(), b"fetched");
    if buf.len() as u64 != size {
        return Err(format!("artifact {digest}: {} bytes arrived, {size} announced", buf.len()));
    }
    let actual = format!("sha256:{}", eddy_runtime::digest_of(&buf));
    if actual != digest {
        return Err(format!("artifact {digest} arrived with digest {actual}: refused"));
    }
    Ok(buf)
}
