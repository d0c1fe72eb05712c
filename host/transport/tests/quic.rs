//! The QUIC data plane between two nodes in this process, over real UDP sockets on loopback:
//! records and events arrive in order under credit, a slow receiver stops the sender within
//! the buffers credit allows, and peers that break the protocol or hold no certificate of the
//! cluster CA are dropped with a reason while the node keeps serving.
#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eddy_core::RecordBatch;
use eddy_transport::Frame;
use eddy_transport::channel::{ChannelConfig, ChannelSender, InputGate, Message, local_gate};
use eddy_transport::quic::{ClusterCa, LinkId, NodeIdentity, QuicNode, Tuning};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn node(ca: &ClusterCa, name: &str, rt: &tokio::runtime::Runtime, tuning: Tuning) -> QuicNode {
    let identity = ca.issue(name).unwrap();
    QuicNode::bind(&identity, "127.0.0.1:0".parse().unwrap(), tuning, rt.handle().clone()).unwrap()
}

fn link(channel: u32) -> LinkId {
    LinkId { job: "job-1".into(), attempt: 0, task: 1, subtask: 0, channel }
}

fn batch(from: u32, n: u32) -> RecordBatch {
    let mut batch = RecordBatch::default();
    for i in from..from + n {
        batch.push(Some(&i.to_le_bytes()), format!("value-{i}").as_bytes(), Some(i64::from(i)));
    }
    batch
}

/// Waits until `done` holds, failing after a generous deadline (never a timing assertion).
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the gate until end-of-stream; returns the values and the events, in order.
fn drain(gate: &mut dyn InputGate) -> (Vec<u32>, Vec<Message>) {
    let (mut values, mut events) = (Vec::new(), Vec::new());
    loop {
        let Some((channel, message)) = gate.recv(Duration::from_secs(20)).unwrap() else { panic!("gate went quiet") };
        match message {
            Message::Data { batch, watermark, .. } => {
                values.extend(batch.iter().map(|r| u32::from_le_bytes(r.key.unwrap().try_into().unwrap())));
                if let Some(w) = watermark {
                    events.push(Message::Watermark(w));
                }
                gate.recycle(channel, batch);
            }
            Message::EndOfStream => return (values, events),
            other => events.push(other),
        }
    }
}

#[test]
fn records_and_events_cross_in_order_under_credit() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let (a, b) = (node(&ca, "worker-a", &rt, Tuning::default()), node(&ca, "worker-b", &rt, Tuning::default()));
    let (_shared, mut gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
    b.register(link(0), "worker-a", Box::new(senders.into_iter().next().unwrap()));

    let mut tx = a.open_sender("worker-b", b.local_addr().unwrap(), &link(0)).unwrap();
    let producer = std::thread::spawn(move || {
        for i in 0..200u32 {
            let watermark = (i % 10 == 9).then_some(i64::from(i));
            tx.send(Message::Data { side: None, batch: batch(i * 50, 50), watermark }).unwrap();
            if i == 100 {
                tx.send(Message::Barrier(7)).unwrap();
            }
        }
        tx.send(Message::Watermark(i64::MAX)).unwrap();
        tx.send(Message::EndOfStream).unwrap();
    });
    let (values, events) = drain(&mut gate);
    producer.join().unwrap();
    assert_eq!(values, (0..10_000).collect::<Vec<_>>());
    let barrier_at = events.iter().position(|e| *e == Message::Barrier(7)).unwrap();
    // The barrier follows the watermark of buffer 99 and precedes that of buffer 109.
    assert_eq!(events[barrier_at - 1], Message::Watermark(99));
    assert_eq!(events[barrier_at + 1], Message::Watermark(109));
    assert_eq!(events.last(), Some(&Message::Watermark(i64::MAX)));
    assert!(a.dropped_peers().is_empty() && b.dropped_peers().is_empty());
}

#[test]
fn a_receiver_that_stops_reading_stops_the_sender_within_its_credit() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let tuning = Tuning::default();
    let (remote_capacity, remote_queue) = (tuning.channel_capacity as usize, tuning.max_queued);
    let (a, b) = (node(&ca, "worker-a", &rt, tuning.clone()), node(&ca, "worker-b", &rt, tuning));
    let config = ChannelConfig::default();
    let (_shared, mut gate, senders) = local_gate(1, config, vec![Default::default()]);
    b.register(link(0), "worker-a", Box::new(senders.into_iter().next().unwrap()));
    let mut tx = a.open_sender("worker-b", b.local_addr().unwrap(), &link(0)).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let producer = std::thread::spawn(move || {
        for i in 0..100u32 {
            tx.send(Message::Data { side: None, batch: batch(i, 1), watermark: None }).unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
        }
        tx.send(Message::EndOfStream).unwrap();
    });
    // Nobody reads: the sends stop once every buffer credit allows is taken, and stay stopped.
    let bound = remote_capacity + remote_queue + config.max_in_flight() + 1;
    eventually("the sender to stall", || sent.load(Ordering::SeqCst) >= bound.min(8));
    let mut last = usize::MAX;
    eventually("the sender count to settle", || {
        std::thread::sleep(Duration::from_millis(300));
        let now = sent.load(Ordering::SeqCst);
        std::mem::replace(&mut last, now) == now
    });
    assert!(last <= bound, "{last} sends went through with nobody reading; credit allows {bound}");
    let (values, _) = drain(&mut gate);
    producer.join().unwrap();
    assert_eq!(values, (0..100).collect::<Vec<_>>(), "everything arrives once the receiver reads");
}

#[test]
fn a_node_whose_certificate_the_cluster_ca_did_not_sign_is_refused_both_ways() {
    let rt = runtime();
    let (ca, other_ca) = (ClusterCa::generate().unwrap(), ClusterCa::generate().unwrap());
    let b = node(&ca, "worker-b", &rt, Tuning::default());
    let intruder = node(&other_ca, "worker-x", &rt, Tuning::default());
    let b_addr = b.local_addr().unwrap();
    let err = intruder.open_sender("worker-b", b_addr, &link(0)).expect_err("refused");
    assert!(err.to_string().contains("connecting to worker-b"), "{err}");
    eventually("worker-b to log the refusal", || !b.dropped_peers().is_empty());
    // And a member does not accept the intruder as a server either.
    let err = b.open_sender("worker-x", intruder.local_addr().unwrap(), &link(0)).expect_err("refused");
    assert!(err.to_string().contains("certificate") || err.to_string().contains("handshake"), "{err}");
    // A member dialing a node under the wrong name is refused: the certificate names someone else.
    let c = node(&ca, "worker-c", &rt, Tuning::default());
    let err = c.open_sender("worker-z", b_addr, &link(0)).expect_err("wrong name");
    assert!(err.to_string().contains("connecting to worker-z"), "{err}");
    // worker-b still serves members.
    let (_shared, mut gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
    b.register(link(0), "worker-c", Box::new(senders.into_iter().next().unwrap()));
    let mut tx = c.open_sender("worker-b", b_addr, &link(0)).unwrap();
    tx.send(Message::Data { side: None, batch: batch(0, 3), watermark: None }).unwrap();
    tx.send(Message::EndOfStream).unwrap();
    assert_eq!(drain(&mut gate).0, vec![0, 1, 2]);
}

/// A member of the cluster (valid certificate) that writes whatever it likes on a stream.
struct RawPeer {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
}

impl RawPeer {
    fn dial(rt: &tokio::runtime::Runtime, identity: &NodeIdentity, to: SocketAddr, name: &str) -> Self {
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(identity.client_config().unwrap()).unwrap();
        let mut endpoint = {
            let _guard = rt.enter();
            quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap()
        };
        endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let connecting = {
            let _guard = rt.enter();
            endpoint.connect(to, name).unwrap()
        };
        let conn = rt.block_on(connecting).unwrap();
        Self { endpoint, conn }
    }

    /// Opens a stream, writes `bytes`, and returns what comes back until the peer closes.
    fn send(&self, rt: &tokio::runtime::Runtime, bytes: Vec<u8>) -> Vec<u8> {
        rt.block_on(async {
            let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
            let _ = send.write_all(&bytes).await;
            let mut back = Vec::new();
            while let Ok(Some(chunk)) = recv.read_chunk(1 << 16, true).await {
                back.extend_from_slice(&chunk.bytes);
            }
            back
        })
    }
}

fn data(i: u32) -> Vec<u8> {
    let mut wire = Vec::new();
    Frame::message(Message::Data { side: None, batch: batch(i, 1), watermark: None }).encode(&mut wire);
    wire
}

#[test]
fn peers_that_break_the_protocol_are_dropped_with_a_reason_and_the_node_keeps_serving() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let tuning = Tuning { registration_timeout: Duration::from_millis(300), ..Tuning::default() };
    let b = node(&ca, "worker-b", &rt, tuning.clone());
    let b_addr = b.local_addr().unwrap();
    let hostile = ca.issue("worker-h").unwrap();
    let mut gates = Vec::new();
    for channel in 0..4 {
        let (_shared, gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
        b.register(
            link(channel),
            if channel == 3 { "worker-c" } else { "worker-h" },
            Box::new(senders.into_iter().next().unwrap()),
        );
        gates.push(gate);
    }
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // An unknown frame kind after a valid header.
        ([link(0).encode(), vec![1, 0, 0, 0, 99]].concat(), "unknown frame kind 99"),
        // A length far past the limit.
        ([link(1).encode(), u32::MAX.to_le_bytes().to_vec()].concat(), "more than the limit"),
        // Twenty buffers without waiting for credit, to a gate nobody reads: the link grants
        // 4, plus one per buffer the gate takes (5 at most), so the tenth is a violation.
        ([link(2).encode(), (0..20).flat_map(data).collect()].concat(), "without credit"),
        // A stream for a channel nobody registered.
        (link(9).encode(), "not registered"),
        // Not a header at all.
        (b"GET / HTTP/1.1\r\n\r\n".to_vec(), "link header"),
        // A link that another node feeds (it stays registered for that node).
        (link(3).encode(), "which `worker-c` feeds"),
    ];
    for (bytes, reason) in cases {
        let peer = RawPeer::dial(&rt, &hostile, b_addr, "worker-b");
        let _ = peer.send(&rt, bytes);
        eventually(reason, || b.dropped_peers().iter().any(|d| d.peer == "worker-h" && d.reason.contains(reason)));
        peer.endpoint.close(0u32.into(), b"");
    }
    // Still serving: a well-behaved member gets through on channel 3.
    let c = node(&ca, "worker-c", &rt, tuning);
    let mut tx = c.open_sender("worker-b", b_addr, &link(3)).unwrap();
    tx.send(Message::Data { side: None, batch: batch(5, 2), watermark: None }).unwrap();
    tx.send(Message::EndOfStream).unwrap();
    assert_eq!(drain(&mut gates[3]).0, vec![5, 6]);
}

#[test]
fn a_sender_let_go_without_end_of_stream_fails_the_receivers_link_at_once() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let (a, b) = (node(&ca, "worker-a", &rt, Tuning::default()), node(&ca, "worker-b", &rt, Tuning::default()));
    let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = failed.clone();
    b.on_job_link_failed("job-1", 0, move |link, reason| seen.lock().unwrap().push((link.clone(), reason.to_owned())));
    let (_shared, mut gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
    b.register(link(0), "worker-a", Box::new(senders.into_iter().next().unwrap()));
    let mut tx = a.open_sender("worker-b", b.local_addr().unwrap(), &link(0)).unwrap();
    tx.send(Message::Data { side: None, batch: batch(0, 2), watermark: None }).unwrap();
    let Some((_, Message::Data { batch, .. })) = gate.recv(Duration::from_secs(20)).unwrap() else { panic!("data") };
    assert_eq!(batch.len(), 2);
    drop(tx);
    eventually("the receiver to learn the link is gone", || !failed.lock().unwrap().is_empty());
    let (failed_link, reason) = failed.lock().unwrap()[0].clone();
    assert_eq!(failed_link, link(0));
    assert!(reason.contains("reset") || reason.contains("stopped"), "{reason}");
}

#[test]
fn side_streams_reach_their_registered_handler_and_unexpected_ones_drop_the_peer() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let tuning = Tuning { registration_timeout: Duration::from_millis(300), ..Tuning::default() };
    let (a, b) = (node(&ca, "worker-a", &rt, tuning.clone()), node(&ca, "worker-b", &rt, tuning));
    let (got_tx, got_rx) = std::sync::mpsc::channel();
    b.on_side(
        "control/1",
        "worker-a",
        Box::new(move |peer, mut bytes, _send, mut recv| {
            let peer = peer.to_owned();
            tokio::spawn(async move {
                while let Ok(Some(chunk)) = recv.read_chunk(1 << 16, true).await {
                    bytes.extend_from_slice(&chunk.bytes);
                }
                got_tx.send((peer, bytes)).unwrap();
            });
        }),
    );
    let (mut send, _recv) = a.open_side("worker-b", b.local_addr().unwrap(), "control/1").unwrap();
    rt.block_on(send.write_all(b"hello")).unwrap();
    send.finish().unwrap();
    let (peer, bytes) = got_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!((peer.as_str(), bytes.as_slice()), ("worker-a", &b"hello"[..]));
    // Nobody registered `control/2`: after the registration timeout the peer is dropped.
    let _streams = a.open_side("worker-b", b.local_addr().unwrap(), "control/2").unwrap();
    eventually("the unexpected side stream to be refused", || {
        b.dropped_peers().iter().any(|d| d.peer == "worker-a" && d.reason.contains("nobody here expects"))
    });
}

/// One stream per channel: a keyed exchange between two workers at parallelism 128 alone
/// holds 4 096 open (64 x 64), and a job has several. 5 000 channels are all opened before
/// any sends (a running job keeps its channels open), then each delivers its records.
#[test]
fn more_channels_than_one_exchange_at_full_parallelism_open_at_once_between_two_nodes() {
    const CHANNELS: u32 = 5_000;
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let (a, b) = (node(&ca, "worker-a", &rt, Tuning::default()), node(&ca, "worker-b", &rt, Tuning::default()));
    let blocked = (0..CHANNELS).map(|_| Default::default()).collect();
    let (_shared, mut gate, senders) = local_gate(CHANNELS as usize, ChannelConfig::default(), blocked);
    for (channel, sender) in senders.into_iter().enumerate() {
        b.register(link(channel as u32), "worker-a", Box::new(sender));
    }
    let addr = b.local_addr().unwrap();
    let mut open: Vec<_> = (0..CHANNELS).map(|c| a.open_sender("worker-b", addr, &link(c)).unwrap()).collect();
    for (channel, tx) in open.iter_mut().enumerate() {
        tx.send(Message::Data { side: None, batch: batch(channel as u32, 1), watermark: None }).unwrap();
        tx.send(Message::EndOfStream).unwrap();
    }
    let (mut values, mut ended) = (Vec::new(), 0);
    while ended < CHANNELS {
        let Some((channel, message)) = gate.recv(Duration::from_secs(20)).unwrap() else { panic!("gate went quiet") };
        match message {
            Message::Data { batch, .. } => {
                values.extend(batch.iter().map(|r| u32::from_le_bytes(r.key.unwrap().try_into().unwrap())));
                gate.recycle(channel, batch);
            }
            Message::EndOfStream => ended += 1,
            _ => {}
        }
    }
    values.sort_unstable();
    assert_eq!(values, (0..CHANNELS).collect::<Vec<_>>());
}
