//! The QUIC data plane between two nodes in this process, over real UDP sockets on loopback:
//! records and events arrive in order under credit, a slow receiver stops the sender within
//! the buffers credit allows, and peers that break the protocol or hold no certificate of the
//! cluster CA are dropped with a reason while the node keeps serving. What a peer can make a
//! node hold without the node asking (streams for nothing registered, frames past the buffers
//! it was granted) stays bounded, and costs no thread.
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

    /// Opens a stream, writes `bytes`, and returns what comes back until the peer closes (or
    /// 20 s passed: a node that never answers fails the caller's check instead of hanging it).
    fn send(&self, rt: &tokio::runtime::Runtime, bytes: Vec<u8>) -> Vec<u8> {
        rt.block_on(async {
            let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
            let exchange = async {
                let _ = send.write_all(&bytes).await;
                let mut back = Vec::new();
                while let Ok(Some(chunk)) = recv.read_chunk(1 << 16, true).await {
                    back.extend_from_slice(&chunk.bytes);
                }
                back
            };
            tokio::time::timeout(Duration::from_secs(20), exchange).await.unwrap_or_default()
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

/// Threads of this process named `name` (their `comm`, which the kernel cuts to 15 bytes).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// A member that opens streams nobody registered (half never finish their header, half name
/// unknown links and send on past the header) ties up no thread and no more memory than their
/// headers: each waits as a task, those past the limit are refused at once and counted, a
/// connection refused as many as it may keep waiting is dropped, and meanwhile another peer's
/// channel carries its data.
#[test]
fn a_flood_of_streams_for_unregistered_links_is_bounded_per_connection_and_holds_no_thread() {
    const LIMIT: u32 = 64;
    const OVER: u32 = 40;
    let rt = runtime();
    // worker-b runs alone on a runtime whose threads (workers and blocking pool) carry this
    // name, so that the count is its own whatever other tests run meanwhile.
    let b_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("eddy-flood-b")
        .enable_all()
        .build()
        .unwrap();
    let ca = ClusterCa::generate().unwrap();
    let tuning = Tuning {
        registration_timeout: Duration::from_secs(120),
        header_timeout: Duration::from_secs(120),
        max_pending_streams: LIMIT,
        ..Tuning::default()
    };
    let b_identity = ca.issue("worker-b").unwrap();
    let b = QuicNode::bind(&b_identity, "127.0.0.1:0".parse().unwrap(), tuning, b_rt.handle().clone()).unwrap();
    let b_addr = b.local_addr().unwrap();
    let a = node(&ca, "worker-a", &rt, Tuning::default());
    let (_shared, mut gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
    b.register(link(0), "worker-a", Box::new(senders.into_iter().next().unwrap()));
    let mut tx = a.open_sender("worker-b", b_addr, &link(0)).unwrap();
    let threads_before = threads_named("eddy-flood-b");

    let hostile = RawPeer::dial(&rt, &ca.issue("worker-h").unwrap(), b_addr, "worker-b");
    let refused = Arc::new(AtomicUsize::new(0));
    let open = |streams: std::ops::Range<u32>| {
        rt.block_on(async {
            for i in streams {
                let Ok((mut send, mut recv)) = hostile.conn.open_bi().await else { return };
                let bytes =
                    if i % 2 == 0 { b"ED".to_vec() } else { [link(1_000 + i).encode(), vec![0; 256 << 10]].concat() };
                let refused = refused.clone();
                tokio::spawn(async move {
                    let _ = send.write_all(&bytes).await;
                    let read = recv.read_chunk(1 << 16, true).await;
                    if matches!(read, Err(quinn::ReadError::Reset(code)) if code == 3u32.into()) {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    drop(send);
                });
            }
        })
    };
    open(0..LIMIT + OVER);
    eventually("the streams past the limit to be refused", || refused.load(Ordering::SeqCst) == OVER as usize);
    let stats = b.inbound_stats();
    assert_eq!((stats.waiting_streams, stats.refused_streams), (u64::from(LIMIT), u64::from(OVER)), "{stats:?}");
    let header_bytes = u64::from(LIMIT) * eddy_core::limits::MAX_STREAM_HEADER_BYTES as u64;
    assert!(stats.buffered_bytes <= header_bytes, "{stats:?}: more than {LIMIT} headers held");
    let threads = threads_named("eddy-flood-b");
    assert!(threads <= threads_before + 2, "{threads_before} threads before the flood, {threads} during it");

    // worker-a's channel flows through all of it.
    let producer = std::thread::spawn(move || {
        for i in 0..100u32 {
            tx.send(Message::Data { side: None, batch: batch(i * 10, 10), watermark: None }).unwrap();
        }
        tx.send(Message::EndOfStream).unwrap();
    });
    assert_eq!(drain(&mut gate).0, (0..1_000).collect::<Vec<_>>());
    producer.join().unwrap();

    // Refused as many streams as it may keep waiting, the connection is dropped, and what
    // its waiting streams held goes with it.
    open(LIMIT + OVER..2 * LIMIT + OVER);
    eventually("worker-h to be dropped", || {
        b.dropped_peers().iter().any(|d| d.peer == "worker-h" && d.reason.starts_with("64 streams refused"))
    });
    eventually("the dropped connection's streams to stop waiting", || {
        let stats = b.inbound_stats();
        stats.waiting_streams == 0 && stats.buffered_bytes == 0
    });
    assert!(threads_named("eddy-flood-b") <= threads_before + 2);
}

/// A data frame holding one record of `value_bytes`.
fn record_frame(value_bytes: usize) -> Vec<u8> {
    let mut batch = RecordBatch::default();
    batch.push(Some(b"k"), &vec![7; value_bytes], Some(1));
    let mut wire = Vec::new();
    Frame::message(Message::Data { side: None, batch, watermark: None }).encode(&mut wire);
    wire
}

#[test]
fn a_frame_past_the_derived_limit_a_second_oversized_frame_and_an_unfinished_header_are_refused() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let tuning = Tuning {
        registration_timeout: Duration::from_millis(300),
        header_timeout: Duration::from_millis(300),
        ..Tuning::default()
    };
    let b = node(&ca, "worker-b", &rt, tuning);
    let b_addr = b.local_addr().unwrap();
    let hostile = ca.issue("worker-h").unwrap();
    // Registered, and never read.
    let mut gates = Vec::new();
    for channel in 0..2 {
        let (_shared, gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
        b.register(link(channel), "worker-h", Box::new(senders.into_iter().next().unwrap()));
        gates.push(gate);
    }
    let limit = eddy_core::limits::MAX_FRAME_BYTES;
    let cases: Vec<(Vec<u8>, String)> = vec![
        // A length one past the largest frame of one record (far below the 64 MiB of old).
        (
            [link(0).encode(), (limit as u32 + 1).to_le_bytes().to_vec()].concat(),
            format!("more than the limit of {limit}"),
        ),
        // Two frames of one 2 MiB record each, the second without waiting for the first to be
        // taken: credit allows 8 buffers, but only one above the frame target.
        (
            [link(1).encode(), record_frame(2 << 20), record_frame(2 << 20)].concat(),
            "needs the channel's whole credit".into(),
        ),
        // A header that never ends.
        (b"EDL2".to_vec(), "stream refused: no stream header within".into()),
    ];
    for (bytes, reason) in cases {
        let peer = RawPeer::dial(&rt, &hostile, b_addr, "worker-b");
        let _ = peer.send(&rt, bytes);
        eventually(&reason, || b.dropped_peers().iter().any(|d| d.peer == "worker-h" && d.reason.contains(&reason)));
        peer.endpoint.close(0u32.into(), b"");
    }
}

/// What a frame really carries: a batch of records with empty values (2.7 M of them: a buffer
/// counts keys and values only, and their frame would be 5.4 MB of record table decoding to
/// 108 MB of entries) crosses cut into frames of at most 32 768 records, with its watermark
/// after its last record; records of 4 MiB cross one at a time; nobody is dropped.
#[test]
fn batches_of_empty_records_and_records_of_megabytes_cross_within_the_frame_limit() {
    const EMPTY: usize = 2_700_000;
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let (a, b) = (node(&ca, "worker-a", &rt, Tuning::default()), node(&ca, "worker-b", &rt, Tuning::default()));
    let (_shared, mut gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
    b.register(link(0), "worker-a", Box::new(senders.into_iter().next().unwrap()));
    let mut tx = a.open_sender("worker-b", b.local_addr().unwrap(), &link(0)).unwrap();
    let producer = std::thread::spawn(move || {
        let mut empty = RecordBatch::default();
        for _ in 0..EMPTY {
            empty.push(None, b"", Some(5));
        }
        tx.send(Message::Data { side: None, batch: empty, watermark: Some(77) }).unwrap();
        for i in 0..6u8 {
            let mut large = RecordBatch::default();
            large.push(Some(&[i]), &vec![i; 4 << 20], None);
            tx.send(Message::Data { side: None, batch: large, watermark: None }).unwrap();
        }
        tx.send(Message::EndOfStream).unwrap();
    });
    let (mut empties, mut large, mut watermarks) = (0, Vec::new(), Vec::new());
    loop {
        let Some((channel, message)) = gate.recv(Duration::from_secs(20)).unwrap() else { panic!("gate went quiet") };
        match message {
            Message::Data { batch, watermark, .. } => {
                for r in batch.iter() {
                    if r.value.is_empty() {
                        assert!(large.is_empty(), "an empty record after a large one");
                        empties += 1;
                    } else {
                        assert!(r.value.len() == 4 << 20 && r.value.iter().all(|b| *b == r.key.unwrap()[0]));
                        large.push(r.key.unwrap()[0]);
                    }
                }
                if let Some(w) = watermark {
                    watermarks.push((w, empties));
                }
                gate.recycle(channel, batch);
            }
            Message::EndOfStream => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    producer.join().unwrap();
    assert_eq!(empties, EMPTY);
    assert_eq!(watermarks, [(77, EMPTY)], "one watermark, after the batch's last record");
    assert_eq!(large, (0..6).collect::<Vec<u8>>());
    assert!(a.dropped_peers().is_empty() && b.dropped_peers().is_empty());
}

/// A record past the key and value limits fits no frame: its sender refuses it (its job fails)
/// instead of sending what would get its node dropped, and every job between the two with it.
#[test]
fn a_record_too_large_for_any_frame_is_refused_by_its_sender_and_the_connection_lives_on() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let (a, b) = (node(&ca, "worker-a", &rt, Tuning::default()), node(&ca, "worker-b", &rt, Tuning::default()));
    let b_addr = b.local_addr().unwrap();
    let mut gates = Vec::new();
    for channel in 0..2 {
        let (_shared, gate, senders) = local_gate(1, ChannelConfig::default(), vec![Default::default()]);
        b.register(link(channel), "worker-a", Box::new(senders.into_iter().next().unwrap()));
        gates.push(gate);
    }
    let mut too_large = RecordBatch::default();
    too_large.push(Some(b"k"), &vec![1; eddy_core::limits::MAX_FRAME_BYTES], None);
    let mut tx = a.open_sender("worker-b", b_addr, &link(0)).unwrap();
    assert!(tx.send(Message::Data { side: None, batch: too_large, watermark: None }).is_err());
    let mut other = a.open_sender("worker-b", b_addr, &link(1)).unwrap();
    other.send(Message::Data { side: None, batch: batch(3, 2), watermark: None }).unwrap();
    other.send(Message::EndOfStream).unwrap();
    assert_eq!(drain(&mut gates[1]).0, vec![3, 4]);
    assert!(b.dropped_peers().is_empty(), "{:?}", b.dropped_peers());
}

/// `fut` polled once: its output if it is ready at once.
async fn poll_once<F: std::future::Future>(mut fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
    use std::task::Poll;
    match std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// The control plane's tuning: an enrolled node may hold 16 streams open on the coordinator
/// (its session and its artifact fetches), and a 17th only once some of them closed.
#[test]
fn the_control_tuning_lets_a_peer_have_16_streams_open_and_a_17th_only_once_some_closed() {
    let rt = runtime();
    let ca = ClusterCa::generate().unwrap();
    let identity = ca.issue("coordinator").unwrap();
    let server =
        eddy_transport::quic::endpoint(&identity, "127.0.0.1:0".parse().unwrap(), &Tuning::control(), rt.handle())
            .unwrap();
    let addr = server.local_addr().unwrap();
    // Reads each stream to its end, then ends its own half.
    rt.spawn(async move {
        while let Some(incoming) = server.accept().await {
            let Ok(conn) = incoming.await else { continue };
            tokio::spawn(async move {
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    tokio::spawn(async move {
                        while let Ok(Some(_)) = recv.read_chunk(1 << 16, true).await {}
                        let _ = send.finish();
                    });
                }
            });
        }
    });
    let peer = RawPeer::dial(&rt, &ca.issue("worker-1").unwrap(), addr, "coordinator");
    rt.block_on(async {
        let mut streams = Vec::new();
        for i in 0..16 {
            let opened = poll_once(std::pin::pin!(peer.conn.open_bi())).await;
            streams.push(opened.unwrap_or_else(|| panic!("stream {} of 16 had to wait", i + 1)).unwrap());
        }
        let mut seventeenth = std::pin::pin!(peer.conn.open_bi());
        assert!(poll_once(seventeenth.as_mut()).await.is_none(), "a 17th stream opened while 16 were open");
        // quinn grants more streams once an eighth of the limit closed (more than 2 of 16).
        for (mut send, mut recv) in streams.drain(..3) {
            send.write_all(b"done").await.unwrap();
            send.finish().unwrap();
            while let Ok(Some(_)) = recv.read_chunk(1 << 16, true).await {}
        }
        let opened = tokio::time::timeout(Duration::from_secs(20), seventeenth).await;
        assert!(opened.expect("the 17th stream opens once some closed").is_ok());
    });
}
