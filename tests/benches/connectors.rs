//! `cargo bench -p eddy-tests --bench connectors`: what the Kafka source and the Kafka and
//! PostgreSQL sinks cost, side by side in one run against the brokers the tests use (tansu in
//! memory, a local PostgreSQL 15), medians of `EDDY_BENCH_RUNS` (default 3) runs each.
//!
//! - Kafka source: a job reading a topic (JSON values, Kafka keys) through the running count
//!   into a blackhole, next to a plain rdkafka consumer that reads and parses the same topic:
//!   records per second and per CPU second of this process (the broker's CPU is its own).
//! - Sinks: a generator through the running count into each sink, next to the same job into a
//!   blackhole, so that the difference is the sink's; and the median checkpoint duration.
//!
//! Figures, not assertions: these machines are shared.

use std::path::Path;
use std::time::Instant;

use eddy_engine::{Job, JobOptions};
use eddy_plan::PipelineSpec;
use eddy_tests::{KafkaBroker, KafkaRecord, PgServer, runtime};

/// CPU seconds this process used so far (user + system, from `/proc/self/stat`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; 100 ticks/s.
    (ticks(11) + ticks(12)) / 100.0
}

/// One measured run.
#[derive(Debug, Clone, Copy)]
struct Measured {
    records: u64,
    seconds: f64,
    cpu: f64,
    checkpoint_ms: f64,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.records as f64 / self.seconds
    }

    fn per_cpu_second(&self) -> f64 {
        self.records as f64 / self.cpu.max(1e-3)
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Medians over the runs.
fn summary(runs: &[Measured]) -> Measured {
    Measured {
        records: runs[0].records,
        seconds: median(runs.iter().map(|r| r.seconds).collect()),
        cpu: median(runs.iter().map(|r| r.cpu).collect()),
        checkpoint_ms: median(runs.iter().map(|r| r.checkpoint_ms).collect()),
    }
}

/// Runs the pipeline `yaml` to its end in a fresh directory.
fn run_job(yaml: &str, records: u64) -> Measured {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("write spec");
    let spec = PipelineSpec::from_file(Path::new(&path)).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let (cpu, started) = (cpu_seconds(), Instant::now());
    let summary = Job::start(&spec, runtime(), JobOptions::default()).expect("starts").wait().expect("runs");
    assert!(summary.finished, "the job ran to its end");
    let checkpoint_ms = median(summary.checkpoints.iter().map(|c| c.stats.total_ms).collect());
    Measured { records, seconds: started.elapsed().as_secs_f64(), cpu: cpu_seconds() - cpu, checkpoint_ms }
}

/// A plain consumer reading every partition of `topic` to `records` messages, parsing each value.
fn plain_consumer(broker: &KafkaBroker, topic: &str, partitions: i32, records: u64) -> Measured {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (cpu, started) = (cpu_seconds(), Instant::now());
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &broker.address)
        .set("group.id", "bench")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut list = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition_offset(topic, p, rdkafka::Offset::Beginning).expect("partition");
    }
    consumer.assign(&list).expect("assign");
    let mut read = 0;
    let mut checksum = 0usize;
    while read < records {
        if let Some(Ok(m)) = consumer.poll(std::time::Duration::from_millis(100)) {
            let value: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default()).expect("json");
            checksum = checksum.wrapping_add(value.as_object().map_or(0, serde_json::Map::len));
            read += 1;
        }
    }
    std::hint::black_box(checksum);
    Measured { records, seconds: started.elapsed().as_secs_f64(), cpu: cpu_seconds() - cpu, checkpoint_ms: f64::NAN }
}

fn purchases(n: u64, partitions: i32) -> Vec<KafkaRecord> {
    (0..n)
        .map(|i| {
            let user = format!("u{}", i % 1000);
            let value = serde_json::json!({"user_id": user, "amount_cents": i % 100, "ts": i});
            (
                i as i32 % partitions,
                Some(serde_json::to_vec(&user).expect("key")),
                serde_json::to_vec(&value).expect("v"),
            )
        })
        .collect()
}

fn generator_job(events: u64, sink: &str) -> String {
    format!(
        "name: bench\nsources: [{{type: generator, name: g, seed: 7, events: {events}, keys: 1000, key_field: user, \
         key_prefix: u-, value_field: v, min_value: 1, max_value: 9, start_ms: 0, interval_ms: 1}}]\n\
         steps: [{{name: count, wasm: {}, key_by: /user}}]\ncheckpoints: {{dir: checkpoints, interval_ms: 100}}\n\
         sink: {sink}\n",
        eddy_guest_artifacts::RUNNING_COUNT
    )
}

fn row(what: &str, m: &Measured, baseline: Option<&Measured>) {
    let per_m = m.cpu / m.records as f64 * 1e6;
    let versus = baseline.map_or(String::new(), |b| format!("{:>7.2}x", m.per_cpu_second() / b.per_cpu_second()));
    let checkpoint = if m.checkpoint_ms.is_nan() { "-".to_string() } else { format!("{:.1}", m.checkpoint_ms) };
    println!(
        "{what:<44} {:>10.0} {:>12.0} {:>9.2} {versus:>8} {checkpoint:>10}",
        m.per_second(),
        m.per_cpu_second(),
        per_m
    );
}

fn main() {
    let runs: usize = std::env::var("EDDY_BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let source_records: u64 = 100_000;
    let sink_records: u64 = 100_000;
    let broker = KafkaBroker::start();
    broker.create_topic("purchases", 2);
    broker.create_topic("out", 2);
    let produced = Instant::now();
    broker.produce("purchases", &purchases(source_records, 2));
    eprintln!("produced {source_records} records in {:.1} s", produced.elapsed().as_secs_f64());
    let pg = PgServer::start();

    let source_job = format!(
        "name: bench\nparallelism: 1\nsources: [{{type: kafka, name: purchases, brokers: \"{}\", topics: [purchases], \
         key: true, end: at_start, timestamp: /ts}}]\n\
         steps: [{{name: count, wasm: {}, key_by: key}}]\ncheckpoints: {{dir: checkpoints, interval_ms: 1000}}\n\
         sink: {{type: blackhole}}\n",
        broker.address,
        eddy_guest_artifacts::RUNNING_COUNT
    );
    let (mut plain, mut source, mut blackhole) = (Vec::new(), Vec::new(), Vec::new());
    let (mut kafka_alo, mut kafka_eos, mut pg_eos, mut pg_upsert) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Alternating, so that drift in the machine's load spreads over every row.
    for run in 0..runs {
        plain.push(plain_consumer(&broker, "purchases", 2, source_records));
        source.push(run_job(&source_job, source_records));
        blackhole.push(run_job(&generator_job(sink_records, "{type: blackhole}"), sink_records));
        let kafka = |delivery: &str| {
            format!("{{type: kafka, brokers: \"{}\", topic: out, delivery: {delivery}}}", broker.address)
        };
        kafka_alo.push(run_job(&generator_job(sink_records, &kafka("at_least_once")), sink_records));
        kafka_eos.push(run_job(&generator_job(sink_records, &kafka("exactly_once")), sink_records));
        let postgres = |table: &str, mode: &str, key: &str| {
            format!(
                "{{type: postgres, url: \"{}\", table: {table}, mode: {mode}, create: true, {key} \
                 columns: {{user_id: key, n: value}}}}",
                pg.url
            )
        };
        let appended = postgres(&format!("eos_{run}"), "exactly_once", "");
        pg_eos.push(run_job(&generator_job(sink_records, &appended), sink_records));
        let upserted = postgres(&format!("upsert_{run}"), "upsert", "key: [user_id],");
        pg_upsert.push(run_job(&generator_job(sink_records, &upserted), sink_records));
        eprintln!("run {} of {runs} done", run + 1);
    }
    println!("\nmedians of {runs} runs, {source_records} records each; CPU of this process only");
    println!(
        "{:<44} {:>10} {:>12} {:>9} {:>8} {:>10}",
        "", "records/s", "rec/CPU s", "CPU s/M", "vs base", "ckpt p50 ms"
    );
    let plain = summary(&plain);
    row("plain rdkafka consumer (read + parse JSON)", &plain, None);
    row("kafka source -> running count -> blackhole", &summary(&source), Some(&plain));
    let blackhole = summary(&blackhole);
    row("generator -> running count -> blackhole", &blackhole, None);
    row("  ... -> kafka sink, at least once", &summary(&kafka_alo), Some(&blackhole));
    row("  ... -> kafka sink, exactly once", &summary(&kafka_eos), Some(&blackhole));
    row("  ... -> postgres sink, exactly once", &summary(&pg_eos), Some(&blackhole));
    row("  ... -> postgres sink, upsert", &summary(&pg_upsert), Some(&blackhole));
}
