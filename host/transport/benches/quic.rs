//! The QUIC data plane on loopback, in one process: two [`QuicNode`]s (each on a tokio runtime
//! of its own, as two workers would be) carrying 32 KiB buffers of 100-byte records from a
//! [`RemoteSender`] into a registered local gate, read and recycled by a consumer thread.
//!
//! 1. Throughput of one channel (one QUIC stream): payload MB/s and records/s.
//! 2. Throughput of 4 and 16 channels between the same two nodes at once (one connection, one
//!    stream and one sender thread per channel, one gate of N channels): aggregate MB/s.
//! 3. The yardstick: plain TCP (`std::net::TcpStream`, `TCP_NODELAY`, no TLS) carrying the same
//!    frames, encoded with [`Frame::encode`] and read back with [`Decoder`] into the same kind of
//!    local gate by a reader thread per connection, so framing, decoding and the gate cost the
//!    same on both paths. TCP gets one connection per channel in every case (TCP has no
//!    streams) and no credit frames (TCP's window and the gate's backpressure bound it). QUIC
//!    always encrypts (TLS 1.3 is part of the protocol; there is no plaintext QUIC to compare),
//!    so the gap to TCP is crypto, QUIC's user-space stack (a packet is built, acknowledged and
//!    tracked in user space) and the node's hand-offs (runtime tasks, the link's thread).
//! 4. One-way latency: the sender stamps each buffer's records with the time it builds it, the
//!    consumer subtracts that from the time `recv` returns it (one process, one clock), with
//!    the sender paced at half the peak rate of (1) in 32 KiB buffers, and at a trickle of
//!    one-record buffers; p50, p99 and p99.9 in microseconds over all samples pooled.
//! 5. What [`Tuning::default`] buys: quinn's own defaults (1.25 MB stream window, 10 MB
//!    connection send window, datagrams up to 1452 bytes), segmentation offload (GSO) off, and
//!    credit for 4 buffers per channel (the local channel's) instead of the default 8 (what one stream's credit round trip costs).
//!
//! Beside each throughput the process's CPU time (user + system, both nodes and every thread,
//! from `/proc/self/stat`) per GB of values: on a shared machine it holds steadier than MB/s.
//!
//! Samples are interleaved, so drift on a shared machine hits every path alike; throughput is
//! the median of the samples. Connections are set up (and MTU discovery has run) before any
//! timing; each sample opens fresh streams on them.
//!
//! Run: `cargo bench -p eddy-transport --bench quic` (about a minute on two cores).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use eddy_core::RecordBatch;
use eddy_transport::channel::{ChannelConfig, ChannelSender, InputGate, LocalSender, Message, local_gate};
use eddy_transport::quic::{ClusterCa, LinkId, QuicNode, RemoteSender, Tuning};
use eddy_transport::{Decoder, Frame};

const COMMAND: &str = "cargo bench -p eddy-transport --bench quic";
/// Payload bytes (record values) per throughput sample, over all channels of the sample.
const SAMPLE_BYTES: usize = 200_000_000;
const SAMPLES: usize = 5;
const RECORD_BYTES: usize = 100;
/// A 32 KiB buffer of 100-byte values.
const RECORDS_PER_BUFFER: usize = 32 * 1024 / RECORD_BYTES;
const BUFFER_BYTES: usize = RECORDS_PER_BUFFER * RECORD_BYTES;
const BUFFERS_PER_SAMPLE: usize = SAMPLE_BYTES / BUFFER_BYTES;
/// How long one latency sample runs.
const LATENCY_SAMPLE: Duration = Duration::from_millis(1500);
/// The trickle of one-record buffers for the light-load latency.
const TRICKLE_PER_SECOND: f64 = 2_000.0;
const TIMEOUT: Duration = Duration::from_secs(60);

/// The clock the records carry: nanoseconds since the bench started.
fn now_ns(epoch: Instant) -> i64 {
    epoch.elapsed().as_nanos() as i64
}

/// A buffer as a task's output router fills it: `records` values of 100 bytes, stamped `ts`.
fn buffer(records: usize, ts: i64) -> Message {
    let value = [7u8; RECORD_BYTES];
    let mut batch = RecordBatch::with_capacity(records, records * RECORD_BYTES);
    for _ in 0..records {
        batch.push(None, &value, Some(ts));
    }
    Message::Data { side: None, batch, watermark: None }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The `q` quantile of sorted `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    xs[((xs.len() as f64 * q) as usize).min(xs.len() - 1)]
}

/// What one channel's sender does in a sample.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// `buffers` full buffers as fast as credit allows.
    Flood { buffers: usize },
    /// Buffers of `records` records, `per_second` of them, for `for_how_long`.
    Paced { records: usize, per_second: f64, for_how_long: Duration },
}

impl Load {
    /// Runs the load into `tx`, then ends the stream.
    fn drive(self, tx: &mut dyn ChannelSender, epoch: Instant) {
        match self {
            Load::Flood { buffers } => {
                for i in 0..buffers {
                    tx.send(buffer(RECORDS_PER_BUFFER, i as i64)).expect("receiver alive");
                }
            }
            Load::Paced { records, per_second, for_how_long } => {
                let interval = Duration::from_secs_f64(1.0 / per_second);
                let start = Instant::now();
                let mut next = start;
                while next - start < for_how_long {
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    tx.send(buffer(records, now_ns(epoch))).expect("receiver alive");
                    next += interval;
                }
            }
        }
        tx.send(Message::EndOfStream).expect("receiver alive");
    }
}

/// CPU seconds this process has used (user + system, all threads).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// What the consumer saw.
struct Received {
    elapsed: Duration,
    /// CPU seconds the process used meanwhile.
    cpu: f64,
    records: usize,
    /// Microseconds from stamp to `recv`, one per buffer (paced loads only).
    latencies_us: Vec<f64>,
}

/// Starts one sender thread per channel (held at a barrier), then reads the gate as a task
/// would until every channel ended, handing each buffer back.
fn run(senders: Vec<Box<dyn ChannelSender>>, gate: &mut dyn InputGate, load: Load, epoch: Instant) -> Received {
    let channels = senders.len();
    let go = Arc::new(Barrier::new(channels + 1));
    let threads: Vec<_> = senders
        .into_iter()
        .map(|mut tx| {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                load.drive(&mut *tx, epoch);
            })
        })
        .collect();
    let paced = matches!(load, Load::Paced { .. });
    let (mut ended, mut records, mut latencies_us) = (0, 0, Vec::new());
    go.wait();
    let (start, cpu) = (Instant::now(), cpu_seconds());
    while ended < channels {
        let (channel, message) = gate.recv(TIMEOUT).expect("gate open").expect("the senders went quiet");
        match message {
            Message::Data { batch, .. } => {
                if paced {
                    let stamp = batch.get(0).and_then(|r| r.timestamp).expect("stamped");
                    latencies_us.push((now_ns(epoch) - stamp) as f64 / 1e3);
                }
                records += batch.len();
                gate.recycle(channel, batch);
            }
            Message::EndOfStream => ended += 1,
            _ => {}
        }
    }
    let (elapsed, cpu) = (start.elapsed(), cpu_seconds() - cpu);
    for t in threads {
        t.join().expect("sender finished");
    }
    Received { elapsed, cpu, records, latencies_us }
}

/// A gate of `channels` local channels, as the receiving subtask holds it.
fn gate(channels: usize) -> (impl InputGate, Vec<LocalSender>) {
    let (_shared, gate, senders) =
        local_gate(channels, ChannelConfig::default(), (0..channels).map(|_| Arc::default()).collect());
    (gate, senders)
}

/// Two nodes of one cluster, each on its own runtime, connected once.
struct QuicPair {
    a: QuicNode,
    b: QuicNode,
    b_addr: SocketAddr,
    // Dropped last: the nodes' tasks run on them.
    _runtimes: [tokio::runtime::Runtime; 2],
}

static ATTEMPT: AtomicU64 = AtomicU64::new(0);

impl QuicPair {
    fn new(ca: &ClusterCa, tuning: &Tuning) -> Self {
        let runtime =
            || tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let runtimes = [runtime(), runtime()];
        let node = |name: &str, rt: &tokio::runtime::Runtime| {
            let identity = ca.issue(name).expect("certificate");
            QuicNode::bind(&identity, "127.0.0.1:0".parse().expect("address"), tuning.clone(), rt.handle().clone())
                .expect("bind")
        };
        let (a, b) = (node("worker-a", &runtimes[0]), node("worker-b", &runtimes[1]));
        let b_addr = b.local_addr().expect("bound");
        let pair = Self { a, b, b_addr, _runtimes: runtimes };
        // Warm up: the handshake, MTU discovery, the congestion window.
        pair.flood(1, BUFFERS_PER_SAMPLE / 4, Instant::now());
        pair
    }

    /// The datagram size the connection uses now (MTU discovery's result, or 1200 after a
    /// black hole was detected).
    fn mtu(&self) -> u16 {
        self.a.connect("worker-b", self.b_addr).expect("connected").stats().path.current_mtu
    }

    /// `channels` fresh streams from a to b, each into a channel of one gate on b.
    fn run(&self, channels: usize, load: Load, epoch: Instant) -> Received {
        let attempt = ATTEMPT.fetch_add(1, Ordering::Relaxed);
        let link = |channel| LinkId { job: "bench".into(), attempt, task: 1, subtask: 0, channel };
        let (mut gate, locals) = gate(channels);
        for (c, local) in locals.into_iter().enumerate() {
            self.b.register(link(c as u32), "worker-a", Box::new(local));
        }
        let senders = (0..channels)
            .map(|c| {
                let tx: RemoteSender = self.a.open_sender("worker-b", self.b_addr, &link(c as u32)).expect("open");
                Box::new(tx) as Box<dyn ChannelSender>
            })
            .collect();
        run(senders, &mut gate, load, epoch)
    }

    fn flood(&self, channels: usize, buffers: usize, epoch: Instant) -> Received {
        self.run(channels, Load::Flood { buffers: buffers / channels }, epoch)
    }
}

/// The sending end of a TCP channel: encodes each message as the QUIC writer does.
struct TcpSender {
    stream: TcpStream,
    wire: Vec<u8>,
}

impl ChannelSender for TcpSender {
    fn send(&mut self, message: Message) -> Result<(), eddy_transport::channel::Disconnected> {
        self.wire.clear();
        Frame::Message { message, backlog: 0 }.encode(&mut self.wire);
        self.stream.write_all(&self.wire).map_err(|_| eddy_transport::channel::Disconnected)
    }
}

/// The receiving end of a TCP channel: reads chunks, decodes whole frames and hands them to
/// the local channel, as the QUIC node's inbound stream does.
fn tcp_receive(mut stream: TcpStream, mut into: LocalSender) {
    let decoder = Decoder::default();
    let (mut chunk, mut buf) = (vec![0u8; 1 << 20], Vec::new());
    loop {
        let n = stream.read(&mut chunk).expect("read");
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some((frame, used)) = decoder.decode(&buf[at..]).expect("valid frames") {
            at += used;
            let Frame::Message { message, .. } = frame else { panic!("a credit frame from the sender") };
            let end = message == Message::EndOfStream;
            into.send(message).expect("gate open");
            if end {
                return;
            }
        }
        buf.drain(..at);
    }
}

/// `channels` fresh TCP connections, one per channel, into a gate of `channels` channels.
fn tcp_run(channels: usize, load: Load, epoch: Instant) -> Received {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("bound");
    let (mut gate, locals) = gate(channels);
    let mut senders: Vec<Box<dyn ChannelSender>> = Vec::new();
    let mut receivers = Vec::new();
    for local in locals {
        let out = TcpStream::connect(addr).expect("connect");
        let (inbound, _) = listener.accept().expect("accept");
        for s in [&out, &inbound] {
            s.set_nodelay(true).expect("TCP_NODELAY");
        }
        senders.push(Box::new(TcpSender { stream: out, wire: Vec::new() }));
        receivers.push(std::thread::spawn(move || tcp_receive(inbound, local)));
    }
    let received = run(senders, &mut gate, load, epoch);
    for r in receivers {
        r.join().expect("receiver finished");
    }
    received
}

fn mb_per_s(r: &Received) -> f64 {
    (r.records * RECORD_BYTES) as f64 / r.elapsed.as_secs_f64() / 1e6
}

fn records_per_s(r: &Received) -> f64 {
    r.records as f64 / r.elapsed.as_secs_f64()
}

fn cpu_s_per_gb(r: &Received) -> f64 {
    r.cpu / ((r.records * RECORD_BYTES) as f64 / 1e9)
}

/// One throughput row: QUIC on a pair, or TCP.
#[derive(Clone, Copy)]
enum Path<'a> {
    Quic(&'a QuicPair),
    Tcp,
}

struct Row<'a> {
    name: String,
    path: Path<'a>,
    channels: usize,
    mb: Vec<f64>,
    recs: Vec<f64>,
    cpu: Vec<f64>,
}

fn main() {
    let epoch = Instant::now();
    println!("$ {COMMAND}");
    println!(
        "loopback, one process, {} cores; {RECORDS_PER_BUFFER} records of {RECORD_BYTES} B per buffer ({BUFFER_BYTES} B of values, {} B on the wire); \
         {} MB of values per throughput sample, {SAMPLES} samples interleaved, medians",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        {
            let mut wire = Vec::new();
            Frame::message(buffer(RECORDS_PER_BUFFER, 0)).encode(&mut wire);
            wire.len()
        },
        SAMPLE_BYTES / 1_000_000,
    );

    let ca = ClusterCa::generate().expect("cluster CA");
    let tuned = QuicPair::new(&ca, &Tuning::default());
    let quinn_defaults =
        Tuning { stream_window: 1_250_000, connection_window: 10_000_000, max_udp_payload: 1452, ..Tuning::default() };
    let quinn = QuicPair::new(&ca, &quinn_defaults);
    let no_gso = QuicPair::new(&ca, &Tuning { segmentation_offload: false, ..Tuning::default() });
    let credit4 = QuicPair::new(&ca, &Tuning { channel_capacity: 4, ..Tuning::default() });

    let mut rows: Vec<Row<'_>> = Vec::new();
    let mut row = |name: &str, path, channels| {
        rows.push(Row { name: name.into(), path, channels, mb: Vec::new(), recs: Vec::new(), cpu: Vec::new() });
    };
    for channels in [1, 4, 16] {
        row("QUIC, Tuning::default()", Path::Quic(&tuned), channels);
        row("TCP, a connection per channel", Path::Tcp, channels);
    }
    row("QUIC, quinn's defaults", Path::Quic(&quinn), 1);
    row("QUIC, quinn's defaults", Path::Quic(&quinn), 16);
    row("QUIC, Tuning::default(), GSO off", Path::Quic(&no_gso), 1);
    row("QUIC, Tuning::default(), credit for 4 buffers", Path::Quic(&credit4), 1);

    for _ in 0..SAMPLES {
        for row in &mut rows {
            let r = match row.path {
                Path::Quic(pair) => pair.flood(row.channels, BUFFERS_PER_SAMPLE, epoch),
                Path::Tcp => tcp_run(row.channels, Load::Flood { buffers: BUFFERS_PER_SAMPLE / row.channels }, epoch),
            };
            row.mb.push(mb_per_s(&r));
            row.recs.push(records_per_s(&r));
            row.cpu.push(cpu_s_per_gb(&r));
        }
    }

    let tcp_mb = |channels: usize| {
        rows.iter().find(|r| matches!(r.path, Path::Tcp) && r.channels == channels).map(|r| median(r.mb.clone()))
    };
    println!("\nthroughput (payload: record values only)");
    println!("| path | channels | MB/s | Mrecords/s | of TCP | CPU s/GB |\n|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        let mb = median(r.mb.clone());
        let of_tcp = tcp_mb(r.channels).map_or_else(String::new, |t| format!("{:.0}%", 100.0 * mb / t));
        let (recs, cpu) = (median(r.recs.clone()) / 1e6, median(r.cpu.clone()));
        println!("| {} | {} | {mb:.0} | {recs:.2} | {of_tcp} | {cpu:.2} |", r.name, r.channels);
    }
    println!(
        "\ndatagram size (path MTU) after the runs: Tuning::default() {} B, quinn's defaults {} B, GSO off {} B, credit for 4 {} B",
        tuned.mtu(),
        quinn.mtu(),
        no_gso.mtu(),
        credit4.mtu()
    );

    // Latency at half the one-channel QUIC peak (the same offered load for TCP), and at a trickle.
    let peak = median(rows[0].recs.clone()) / RECORDS_PER_BUFFER as f64;
    let half = Load::Paced { records: RECORDS_PER_BUFFER, per_second: peak / 2.0, for_how_long: LATENCY_SAMPLE };
    let trickle = Load::Paced { records: 1, per_second: TRICKLE_PER_SECOND, for_how_long: LATENCY_SAMPLE };
    let mut lat: [Vec<f64>; 4] = Default::default();
    for _ in 0..SAMPLES {
        lat[0].extend(tuned.run(1, half, epoch).latencies_us);
        lat[1].extend(tcp_run(1, half, epoch).latencies_us);
        lat[2].extend(tuned.run(1, trickle, epoch).latencies_us);
        lat[3].extend(tcp_run(1, trickle, epoch).latencies_us);
    }
    println!(
        "\none-way latency, one channel, stamp at the sender to recv at the consumer (µs, {SAMPLES} samples of {:.1} s pooled)",
        LATENCY_SAMPLE.as_secs_f64()
    );
    println!("| path | load | buffers | p50 | p99 | p99.9 |\n|---|---|---:|---:|---:|---:|");
    let loads = [
        format!(
            "{:.0} buffers/s of 32 KiB ({:.0} MB/s, half the QUIC peak)",
            peak / 2.0,
            peak / 2.0 * BUFFER_BYTES as f64 / 1e6
        ),
        format!("{TRICKLE_PER_SECOND:.0} buffers/s of one record"),
    ];
    for (i, xs) in lat.iter_mut().enumerate() {
        xs.sort_by(f64::total_cmp);
        let path = if i % 2 == 0 { "QUIC, Tuning::default()" } else { "TCP" };
        println!(
            "| {path} | {} | {} | {:.0} | {:.0} | {:.0} |",
            loads[i / 2],
            xs.len(),
            quantile(xs, 0.5),
            quantile(xs, 0.99),
            quantile(xs, 0.999)
        );
    }
    for pair in [&tuned, &quinn, &no_gso, &credit4] {
        pair.a.close();
        pair.b.close();
    }
}
