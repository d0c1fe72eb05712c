//! A UDP relay that puts a seeded faulty network between QUIC peers: the shell around
//! [`FaultPlan`], for tests (this machine's kernel has no `netem`). Dial the relay instead of
//! the server; every datagram, either way, gets the plan's verdict: lost, delayed (with jitter,
//! so datagrams overtake each other), duplicated, or lost inside a cut that heals.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

use crate::faults::{FaultPlan, Faults, Verdict};

/// Datagrams the relay saw and what became of them.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Datagrams received from either side.
    pub received: AtomicU64,
    /// Datagrams lost (drops and cuts).
    pub dropped: AtomicU64,
    /// Extra copies sent.
    pub duplicated: AtomicU64,
}

/// A running relay; it stops when dropped.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    stats: Arc<RelayStats>,
    /// The front task, and one task per client carrying its replies.
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            task.abort();
        }
    }
}

struct Shared {
    started: Instant,
    to_server: Mutex<FaultPlan>,
    to_client: Mutex<FaultPlan>,
    stats: Arc<RelayStats>,
}

impl Shared {
    /// Sends `datagram` from `socket` to `to` as `plan` decides.
    fn forward(self: &Arc<Self>, plan: &Mutex<FaultPlan>, socket: &Arc<UdpSocket>, to: SocketAddr, datagram: Vec<u8>) {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let now_ms = self.started.elapsed().as_millis() as u64;
        let verdict = plan.lock().unwrap_or_else(|p| p.into_inner()).verdict(now_ms);
        let Verdict::Send(delays) = verdict else {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.stats.duplicated.fetch_add(delays.len().saturating_sub(1) as u64, Ordering::Relaxed);
        for delay in delays {
            let (socket, datagram) = (socket.clone(), datagram.clone());
            tokio::spawn(async move {
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                let _ = socket.send_to(&datagram, to).await;
            });
        }
    }
}

impl Relay {
    /// Relays to `server` through a network with `faults`, seeded by `seed`. Must run inside a
    /// tokio runtime.
    pub async fn start(server: SocketAddr, faults: Faults, seed: u64) -> std::io::Result<Relay> {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
        let addr = front.local_addr()?;
        let stats = Arc::new(RelayStats::default());
        let shared = Arc::new(Shared {
            started: Instant::now(),
            to_server: Mutex::new(FaultPlan::new(faults.clone(), seed)),
            to_client: Mutex::new(FaultPlan::new(faults, seed.wrapping_add(1))),
            stats: stats.clone(),
        });
        let tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let client_tasks = tasks.clone();
        let front_task = tokio::spawn(async move {
            // One socket towards the server per client, so replies find their way back.
            let mut backs: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
            let mut buf = vec![0u8; 65_536];
            loop {
                let Ok((n, client)) = front.recv_from(&mut buf).await else { return };
                let back = match backs.get(&client) {
                    Some(back) => back.clone(),
                    None => {
                        let Ok(back) = UdpSocket::bind("127.0.0.1:0").await.map(Arc::new) else { continue };
                        backs.insert(client, back.clone());
                        let (shared, back_rx, front) = (shared.clone(), back.clone(), front.clone());
                        let replies = tokio::spawn(async move {
                            let mut buf = vec![0u8; 65_536];
                            while let Ok((n, _)) = back_rx.recv_from(&mut buf).await {
                                shared.forward(&shared.to_client, &front, client, buf[..n].to_vec());
                            }
                        });
                        client_tasks.lock().unwrap_or_else(|p| p.into_inner()).push(replies.abort_handle());
                        back
                    }
                };
                shared.forward(&shared.to_server, &back, server, buf[..n].to_vec());
            }
        });
        tasks.lock().unwrap_or_else(|p| p.into_inner()).push(front_task.abort_handle());
        Ok(Relay { addr, stats, tasks })
    }

    /// The address to dial instead of the server's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it did so far.
    pub fn stats(&self) -> &RelayStats {
        &self.stats
    }
}
