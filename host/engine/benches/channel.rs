//! One local channel end to end: a producer thread routes 100-byte records through an
//! [`OutputRouter`] (forward edge, 32 KiB buffers) into a one-channel local gate; the consumer
//! reads every record and hands each buffer back (or drops it, for comparison). Reported in ns per record, median of 7
//! samples, beside `std::sync::mpsc::sync_channel` carrying the same batches (a lock-free
//! bounded queue, the single-producer/single-consumer candidate) as the yardstick.
//!
//! Run: `cargo bench -p eddy-engine --bench channel`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use eddy_core::RecordBatch;
use eddy_engine::buffer::BufferBuilder;
use eddy_engine::router::OutputRouter;
use eddy_plan::Partitioning;
use eddy_transport::channel::{ChannelConfig, InputGate, Message, local_gate};

const RECORDS: usize = 4_000_000;
const SAMPLES: usize = 7;
const BUFFER_BYTES: usize = 32 * 1024;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[SAMPLES / 2]
}

/// The gate: router and credit as a task uses them, with or without handing buffers back.
fn through_gate(recycle: bool) -> f64 {
    let (_shared, mut gate, senders) = local_gate(1, ChannelConfig::default(), vec![Arc::default()]);
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        let senders = senders.into_iter().map(|s| Box::new(s) as _).collect();
        let mut router = OutputRouter::new(Partitioning::Forward, senders, 128, BUFFER_BYTES, 100, "bench".into());
        let value = [7u8; 100];
        let mut batch = RecordBatch::default();
        for i in 0..RECORDS {
            batch.push(None, &value, Some(i as i64));
            if batch.len() == 256 {
                router.emit(std::borrow::Cow::Borrowed(&batch), 0).expect("consumer alive");
                batch.clear();
            }
        }
        router.emit(std::borrow::Cow::Borrowed(&batch), 0).expect("consumer alive");
        router.broadcast(Message::EndOfStream).expect("consumer alive");
    });
    let mut bytes = 0usize;
    loop {
        match gate.recv(Duration::from_secs(10)).expect("producer alive") {
            Some((c, Message::Data { batch, .. })) => {
                bytes += batch.iter().map(|r| r.value.len()).sum::<usize>();
                if recycle {
                    gate.recycle(c, batch);
                }
            }
            Some((_, Message::EndOfStream)) => break,
            _ => {}
        }
    }
    producer.join().expect("producer finished");
    assert_eq!(black_box(bytes), RECORDS * 100);
    start.elapsed().as_nanos() as f64 / RECORDS as f64
}

/// The yardstick: the same records copied into a `BufferBuilder`'s buffers and sent over a
/// bounded std channel (no credit, no pooling).
fn through_std_channel() -> f64 {
    let (tx, rx) = std::sync::mpsc::sync_channel::<RecordBatch>(ChannelConfig::default().max_in_flight());
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        let mut builder = BufferBuilder::new(BUFFER_BYTES, 100);
        let value = [7u8; 100];
        let mut batch = RecordBatch::default();
        let mut ship = |batch: &RecordBatch| {
            for r in batch.iter() {
                if let Some(full) = builder.push(&r, 0) {
                    tx.send(full).expect("consumer alive");
                }
            }
        };
        for i in 0..RECORDS {
            batch.push(None, &value, Some(i as i64));
            if batch.len() == 256 {
                ship(&batch);
                batch.clear();
            }
        }
        ship(&batch);
        if let Some(rest) = builder.take() {
            tx.send(rest).expect("consumer alive");
        }
    });
    let mut bytes = 0usize;
    for batch in rx {
        bytes += batch.iter().map(|r| r.value.len()).sum::<usize>();
    }
    producer.join().expect("producer finished");
    assert_eq!(black_box(bytes), RECORDS * 100);
    start.elapsed().as_nanos() as f64 / RECORDS as f64
}

fn main() {
    let (mut pooled, mut fresh, mut std) = (Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so drift on a shared machine hits every path alike.
    for _ in 0..SAMPLES {
        pooled.push(through_gate(true));
        fresh.push(through_gate(false));
        std.push(through_std_channel());
    }
    let (pooled, fresh, std) = (median(pooled), median(fresh), median(std));
    println!("one local channel, {RECORDS} records of 100 bytes, median of {SAMPLES}:");
    println!("| path | ns/record |\n|---|---:|");
    println!("| router + local gate, buffers handed back (pooled) | {pooled:.1} |");
    println!("| router + local gate, a new buffer per batch | {fresh:.1} |");
    println!("| BufferBuilder + std sync_channel | {std:.1} |");
}
