//! A job spread over two workers in this process, each with its own QUIC node on loopback:
//! Nexmark q5 (a keyed window at parallelism 2, so half of every exchange crosses the network)
//! and q8 produce exactly the rows of the native baseline, as they do in one process; and a
//! checkpointed word count spread the same way, stopped in the middle and started again, commits
//! every running count exactly once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use eddy_cluster::QuicPlacement;
use eddy_engine::{Job, JobOptions, SinkFactory};
use eddy_plan::{PhysicalPlan, PipelineSpec, SinkSpec, SourceSpec};
use eddy_tests::{MemorySink, runtime};
use eddy_transport::Faults;
use eddy_transport::quic::{ClusterCa, QuicNode, Tuning};
use eddy_transport::relay::Relay;
use serde_json::Value;

const EVENTS: u64 = 12_000;

fn spread(query: &str, native: fn(Vec<eddy_nexmark::Event>) -> Vec<Value>) {
    spread_over(query, native, None);
}

/// [`spread`], every datagram between the workers passing a relay with `faults` (seeded).
fn spread_over(query: &str, native: fn(Vec<eddy_nexmark::Event>) -> Vec<Value>, faults: Option<(Faults, u64)>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/nexmark/{query}.yaml"));
    let mut spec = PipelineSpec::from_file(&path).expect("query spec is valid");
    spec.parallelism = 2;
    for step in &mut spec.steps {
        step.parallelism = None;
    }
    let SourceSpec::Nexmark(source) = &mut spec.sources[0] else { panic!("{query} reads the nexmark source") };
    source.events = Some(EVENTS);
    let events: Vec<eddy_nexmark::Event> = eddy_nexmark::events(&source.config()).collect();
    let mut expected: Vec<String> = native(events).iter().map(Value::to_string).collect();
    expected.sort();
    assert!(!expected.is_empty(), "{query}: the baseline must produce rows");
    spec.sink = SinkSpec::Blackhole;

    let net = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (nodes, mut addrs) = two_nodes(&net);
    let names: Vec<&str> = nodes.iter().map(QuicNode::name).collect();
    // Each worker is dialed through its own relay, so traffic both ways crosses a faulty network.
    let relays: Vec<Relay> = match &faults {
        Some((faults, seed)) => {
            println!("relay seed {seed}: {faults:?}");
            let relays: Vec<Relay> = names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    net.block_on(Relay::start(addrs[*n], faults.clone(), seed + 10 * i as u64)).expect("relay")
                })
                .collect();
            for (n, relay) in names.iter().zip(&relays) {
                addrs.insert((*n).to_owned(), relay.addr());
            }
            relays
        }
        None => Vec::new(),
    };
    // Slot sharing: subtask i of every task runs on worker i.
    let plan = PhysicalPlan::new(&spec);
    let assignment: Vec<Vec<String>> =
        plan.tasks.iter().map(|t| (0..t.parallelism).map(|i| names[i as usize % 2].to_owned()).collect()).collect();
    assert!(plan.edges.iter().any(|e| e.partitioning.to_string().starts_with("hash")), "{query} has a keyed exchange");

    let received = Arc::new(Mutex::new(Vec::new()));
    let jobs: Vec<Job> = nodes
        .iter()
        .map(|node| {
            let placement =
                QuicPlacement::new(node.clone(), format!("{query}-job"), 0, assignment.clone(), addrs.clone());
            let received = received.clone();
            let sinks: SinkFactory =
                Box::new(move |_| Box::new(MemorySink { received: received.clone(), ..MemorySink::default() }));
            let options = JobOptions {
                sink_per_subtask: Some(sinks),
                placement: Some(Arc::new(placement)),
                ..JobOptions::default()
            };
            Job::start(&spec, runtime(), options).expect("starts")
        })
        .collect();
    for job in jobs {
        assert!(job.wait().unwrap_or_else(|e| panic!("{query} runs: {e}")).finished);
    }
    let out = received.lock().expect("lock").clone();
    let mut got: Vec<String> = out.iter().map(|(_, r)| eddy_tests::value_json::<Value>(&r.value).to_string()).collect();
    got.sort();
    assert_eq!(got.len(), expected.len(), "{query}: row count");
    assert!(got == expected, "{query}: rows differ from the native baseline");
    for node in &nodes {
        assert!(node.dropped_peers().is_empty(), "{:?}", node.dropped_peers());
    }
    // Connections are reused both ways, so one relay may carry everything.
    let mut lost = 0;
    for relay in &relays {
        let stats = relay.stats();
        let (received, dropped) = (stats.received.load(Ordering::Relaxed), stats.dropped.load(Ordering::Relaxed));
        let duplicated = stats.duplicated.load(Ordering::Relaxed);
        println!("relay {}: {received} datagrams, {dropped} lost, {duplicated} duplicated", relay.addr());
        lost += dropped;
    }
    assert!(relays.is_empty() || lost > 0, "the faults must have struck for the test to mean anything");
}

#[test]
fn q5_spread_over_two_workers_equals_the_native_baseline() {
    spread("q5", eddy_nexmark::native::q5);
}

/// q7's window is two-phase: each worker's source subtasks send partials across.
#[test]
fn q7_spread_over_two_workers_equals_the_native_baseline() {
    spread("q7", eddy_nexmark::native::q7);
}

#[test]
fn q8_spread_over_two_workers_equals_the_native_baseline() {
    spread("q8", eddy_nexmark::native::q8);
}

/// Loss, duplicates, reordering and a partition of one second that heals: QUIC retransmits
/// and the credit protocol rides on it, so the job slows down but loses and repeats nothing.
#[test]
fn q5_over_a_lossy_reordering_network_with_a_partition_equals_the_native_baseline() {
    let seed = std::env::var("EDDY_RELAY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let faults = Faults { drop: 0.03, duplicate: 0.02, delay_ms: 1, jitter_ms: 4, cuts: vec![(150, 1_150)] };
    spread_over("q5", eddy_nexmark::native::q5, Some((faults, seed)));
}

/// Two QUIC nodes on `net`, and the addresses to reach them.
pub(crate) fn two_nodes(net: &tokio::runtime::Runtime) -> (Vec<QuicNode>, HashMap<String, std::net::SocketAddr>) {
    let ca = ClusterCa::generate().expect("ca");
    let nodes: Vec<QuicNode> = ["worker-a", "worker-b"]
        .iter()
        .map(|n| {
            let identity = ca.issue(n).expect("certificate");
            QuicNode::bind(&identity, "127.0.0.1:0".parse().expect("addr"), Tuning::default(), net.handle().clone())
                .expect("bind")
        })
        .collect();
    let addrs = nodes.iter().map(|n| (n.name().to_owned(), n.local_addr().expect("addr"))).collect();
    (nodes, addrs)
}

/// Starts attempt `attempt` of `spec` on the two nodes (subtask i on node i mod 2), the first
/// node's part the checkpoint master, talking to the other over QUIC; every operator held to a small CPU share, so a run lasts
/// long enough to be stopped in the middle.
pub(crate) fn start_parts(
    spec: &PipelineSpec,
    nodes: &[QuicNode],
    addrs: &HashMap<String, std::net::SocketAddr>,
    attempt: u64,
) -> Vec<Job> {
    let plan = PhysicalPlan::new(spec);
    let assignment: Vec<Vec<String>> = plan
        .tasks
        .iter()
        .map(|t| (0..t.parallelism).map(|i| nodes[i as usize % 2].name().to_owned()).collect())
        .collect();
    // The checkpoint protocol between the two parts runs over QUIC too.
    let part = eddy_cluster::checkpoint_link::part_link(&nodes[1], &spec.name, attempt, nodes[0].name());
    let other = [(nodes[1].name().to_owned(), addrs[nodes[1].name()])];
    let master = eddy_cluster::checkpoint_link::master_link(&nodes[0], &spec.name, attempt, &other).expect("link");
    let mut roles = vec![eddy_engine::CheckpointRole::Master(master), eddy_engine::CheckpointRole::Part(part)];
    let share = Arc::new(eddy_runtime::CpuShare::new(0.05, std::time::Duration::from_millis(10)));
    nodes
        .iter()
        .map(|node| {
            let placement =
                QuicPlacement::new(node.clone(), spec.name.clone(), attempt, assignment.clone(), addrs.clone());
            let options = JobOptions {
                placement: Some(Arc::new(placement)),
                checkpoint_role: Some(roles.remove(0)),
                cpu_share: Some(share.clone()),
                ..JobOptions::default()
            };
            // One after the other: each part recovers the sink's files of the newest checkpoint.
            Job::start(spec, runtime(), options).expect("starts")
        })
        .collect()
}

#[test]
fn a_checkpointed_word_count_spread_over_two_workers_stopped_and_restarted_counts_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, text) = crate::recovery::wordcount(dir.path(), 20_000);
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let net = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (nodes, addrs) = two_nodes(&net);

    let first = start_parts(&spec, &nodes, &addrs, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while first[0].completed_checkpoints().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "two checkpoints never completed");
        if first.iter().any(Job::is_done) {
            let outcomes: Vec<String> =
                first.into_iter().map(|j| format!("{:?}", j.wait().map(|s| s.finished))).collect();
            panic!("the first run must still be running when it is stopped: {outcomes:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let stopped_after = first[0].completed_checkpoints().last().map(|c| c.id).expect("a checkpoint");
    for job in &first {
        job.cancel();
    }
    for job in first {
        let _ = job.wait();
    }
    let partial = crate::checkpoints::committed_counts(&dir.path().join("out"));
    let all = crate::recovery::running_counts(&text);
    assert!(
        !partial.is_empty() && partial.len() < all.len(),
        "stopped in the middle: {} of {}",
        partial.len(),
        all.len()
    );

    let second = start_parts(&spec, &nodes, &addrs, 1);
    assert_eq!(second[0].restored_from(), Some(stopped_after), "resumed from the newest checkpoint");
    assert_eq!(second[1].restored_from(), Some(stopped_after), "both parts resume from the same checkpoint");
    for job in second {
        assert!(job.wait().expect("second run").finished);
    }
    let got = crate::checkpoints::committed_counts(&dir.path().join("out"));
    assert!(got == all, "{} rows committed, {} expected: nothing lost, nothing twice", got.len(), all.len());
}

/// A part whose peer part stops (here: cancelled, as a killed process would be) does not wait
/// forever for input that will never come: its broken inputs cancel it.
#[test]
fn a_part_whose_peer_part_dies_stops_instead_of_waiting_forever() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, _) = crate::recovery::wordcount(dir.path(), 20_000);
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let net = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (nodes, addrs) = two_nodes(&net);
    let mut parts = start_parts(&spec, &nodes, &addrs, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while parts[0].completed_checkpoints().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint completed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let survivor = parts.pop().expect("the second part");
    let master = parts.pop().expect("the master part");
    master.cancel();
    let _ = master.wait();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(survivor.wait().map(|s| s.finished).map_err(|e| e.to_string())));
    let outcome = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the other part stops on its own");
    assert!(!matches!(outcome, Ok(true)), "it cannot have finished: {outcome:?}");
}
