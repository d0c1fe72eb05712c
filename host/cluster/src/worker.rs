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

/// One session: dial `coordinator` (whose certificate must name `coordinator_name`), register,
/// then beat until something fails. `on_registered` is told the incarnation.
pub async fn session(
    endpoint: &Endpoint,
    coordinator: SocketAddr,
    coordinator_name: &str,
    me: &Registration,
    on_registered: &(dyn Fn(u64) + Sync),
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
    on_registered(incarnation);
    let mut ticker = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if let Err(e) = protocol::write(&mut send, &WorkerMessage::Heartbeat { incarnation }).await {
                    return lost(e);
                }
            }
            reply = protocol::read::<CoordinatorMessage>(&mut recv, &mut buf) => return match reply {
                Ok(Some(CoordinatorMessage::Refused { reason })) => SessionEnd::Refused(reason),
                Ok(Some(CoordinatorMessage::Reregister { reason })) => lost(reason),
                Ok(Some(other)) => lost(format!("unexpected: {other:?}")),
                Ok(None) => lost("the coordinator closed the stream".into()),
                Err(e) => lost(e),
            },
        }
    }
}
