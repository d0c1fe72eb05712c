//! The checkpoint protocol of a spread job ([`eddy_engine::PartReport`],
//! [`eddy_engine::MasterCommand`]) over QUIC: the master part opens a side stream to every
//! other part's node, named after the job's attempt; commands go one way and reports the other,
//! each a length-prefixed JSON message of [`crate::protocol`]. The engine's ends stay the
//! blocking [`MasterLink`] and [`PartLink`], so the same checkpoint code runs whether the
//! parts share a process or not.

use std::net::SocketAddr;
use std::sync::mpsc;

use eddy_engine::{MasterCommand, MasterLink, PartLink, PartReport};
use eddy_transport::quic::{NodeError, QuicNode};
use quinn::{RecvStream, SendStream};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::protocol;

fn stream_name(job: &str, attempt: u64) -> String {
    format!("checkpoints/{job}/{attempt}")
}

/// Reads messages from `recv` (after `read_ahead`) into `into`, each made by `tag` with the
/// peer's name, until the stream or the receiver ends.
async fn pump_in<T: DeserializeOwned, M>(
    mut recv: RecvStream,
    mut buf: Vec<u8>,
    into: mpsc::Sender<M>,
    peer: String,
    tag: fn(&str, T) -> M,
) {
    loop {
        match protocol::read_limited::<T>(&mut recv, &mut buf, protocol::MAX_CHECKPOINT_MESSAGE_BYTES).await {
            Ok(Some(message)) => {
                if into.send(tag(&peer, message)).is_err() {
                    return;
                }
            }
            Ok(None) => return,
            // Dropping the sender tells the engine's end: the part's or the master's job fails.
            Err(reason) => return tracing::warn!(peer, reason, "checkpoint link broke"),
        }
    }
}

/// Writes what arrives on `from` to `send` until either ends.
async fn pump_out<T: Serialize>(mut send: SendStream, mut from: tokio::sync::mpsc::UnboundedReceiver<T>) {
    while let Some(message) = from.recv().await {
        if let Err(reason) = protocol::write_limited(&mut send, &message, protocol::MAX_CHECKPOINT_MESSAGE_BYTES).await
        {
            // The link ends: the master fails the job for it, rather than wait for a report.
            return tracing::warn!(reason, "checkpoint link broke");
        }
    }
    let _ = send.finish();
}

/// This node's end as a part of `job`'s `attempt`: it is connected once the master (node
/// `master`, and no other) dials.
pub fn part_link(node: &QuicNode, job: &str, attempt: u64, master: &str) -> PartLink {
    let (commands_tx, commands) = mpsc::channel();
    let (reports_tx, reports_rx) = tokio::sync::mpsc::unbounded_channel();
    node.on_side(
        &stream_name(job, attempt),
        master,
        Box::new(move |peer, read_ahead, send, recv| {
            tokio::spawn(pump_in::<MasterCommand, _>(recv, read_ahead, commands_tx, peer.to_owned(), |_, c| c));
            tokio::spawn(pump_out(send, reports_rx));
        }),
    );
    PartLink {
        commands,
        report: Box::new(move |r: PartReport| {
            let _ = reports_tx.send(r);
        }),
    }
}

/// The master's end for `job`'s `attempt`: dials every other part (`name`, address), which
/// must have called [`part_link`]. Each report comes tagged with the name of the part whose
/// stream it came on (the node the master dialed, checked against its certificate). Blocking.
pub fn master_link(
    node: &QuicNode,
    job: &str,
    attempt: u64,
    parts: &[(String, SocketAddr)],
) -> Result<MasterLink, NodeError> {
    let (reports_tx, reports) = mpsc::channel();
    let mut commands = Vec::new();
    for (peer, addr) in parts {
        let (send, recv) = node.open_side(peer, *addr, &stream_name(job, attempt))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let tag: fn(&str, PartReport) -> (String, PartReport) = |peer, report| (peer.to_owned(), report);
        node.handle().spawn(pump_in(recv, Vec::new(), reports_tx.clone(), peer.clone(), tag));
        node.handle().spawn(pump_out(send, rx));
        commands.push(tx);
    }
    Ok(MasterLink {
        reports,
        broadcast: Box::new(move |c: MasterCommand| {
            for tx in &commands {
                let _ = tx.send(c.clone());
            }
        }),
    })
}
