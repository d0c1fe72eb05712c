//! The state write path as a keyed task drives it: a bounded heap backend (the state quota
//! over the heap map) taking a word count's entries (28-byte keys, 8-byte values). Reported in
//! ns per put, median of 7 samples: inserting 1 M new keys, overwriting random existing keys
//! with values of the same length (a counter), and with values whose length changes each time
//! (a growing and shrinking aggregate, 8 and 40 bytes).
//!
//! Run: `cargo bench -p eddy-state --bench bounded_put`.

use std::hint::black_box;
use std::time::Instant;

use eddy_state::{BoundedBackend, HashedKey, HeapStateBackend, StateBackend, StateKey, StateLimits, state_id};

const KEYS: u64 = 1_000_000;
const OVERWRITES: u64 = 2_000_000;
const SAMPLES: usize = 7;
const UNLIMITED: StateLimits = StateLimits { max_bytes: u64::MAX, max_entries: u64::MAX };

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[SAMPLES / 2]
}

/// Every key the bench writes, encoded once, so encoding is not measured.
fn keys() -> Vec<Vec<u8>> {
    let mut enc = StateKey::default();
    (0..KEYS)
        .map(|i| {
            let word = format!("\"w{i:07}\"");
            enc.encode(HashedKey::new(word.as_bytes(), 128), state_id("count"), b"").to_vec()
        })
        .collect()
}

fn bounded() -> BoundedBackend {
    BoundedBackend::new(Box::new(HeapStateBackend::default()), UNLIMITED, "").expect("empty backend")
}

fn filled(keys: &[Vec<u8>]) -> BoundedBackend {
    let mut backend = bounded();
    for k in keys {
        backend.put(k, &[0; 8]).expect("unlimited");
    }
    backend
}

fn insert(keys: &[Vec<u8>]) -> f64 {
    let started = Instant::now();
    let backend = black_box(filled(keys));
    let ns = started.elapsed().as_nanos() as f64 / keys.len() as f64;
    drop(backend);
    ns
}

/// Overwrites random keys of `backend`, the value's length chosen by `len(i)`.
fn overwrite(backend: &mut BoundedBackend, keys: &[Vec<u8>], len: fn(u64) -> usize) -> f64 {
    let value = [5u8; 64];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let started = Instant::now();
    for i in 0..OVERWRITES {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        backend.put(&keys[(rng % KEYS) as usize], &value[..len(i)]).expect("unlimited");
    }
    started.elapsed().as_nanos() as f64 / OVERWRITES as f64
}

fn main() {
    let keys = keys();
    let inserts = median((0..SAMPLES).map(|_| insert(&keys)).collect());
    let mut backend = filled(&keys);
    let same = median((0..SAMPLES).map(|_| overwrite(&mut backend, &keys, |_| 8)).collect());
    let changing =
        median((0..SAMPLES).map(|_| overwrite(&mut backend, &keys, |i| if i % 2 == 0 { 8 } else { 40 })).collect());
    println!("insert 1 M keys:                      {inserts:7.1} ns/put");
    println!("overwrite, same length:               {same:7.1} ns/put");
    println!("overwrite, length changing (8 / 40):  {changing:7.1} ns/put");
}
