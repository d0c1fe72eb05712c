//! The artifact cache: a second load does not recompile; a damaged entry is detected and rebuilt.

use std::fs;

use eddy_guest_artifacts as guests;
use eddy_runtime::{CacheOutcome, Runtime, RuntimeConfig, Subtask};
use eddy_tests::{json_batch, open_operator};

fn runtime_with_cache(dir: &std::path::Path) -> Runtime {
    Runtime::new(RuntimeConfig { cache_dir: Some(dir.to_owned()), ..RuntimeConfig::default() }).expect("runtime")
}

fn only_entry(dir: &std::path::Path) -> std::path::PathBuf {
    let entries: Vec<_> = fs::read_dir(dir).expect("cache dir").map(|e| e.expect("entry").path()).collect();
    assert_eq!(entries.len(), 1, "one artifact per digest: {entries:?}");
    entries[0].clone()
}

fn still_counts(component: &eddy_runtime::Component) {
    let mut op = open_operator(component, Subtask::single(128), "null");
    let out = op.process(&json_batch(&[(Some("w"), 1u64), (Some("w"), 1)])).expect("process");
    assert_eq!(out.main.len(), 2);
}

#[test]
fn second_load_hits_the_cache_and_damage_is_rebuilt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = runtime_with_cache(dir.path());
    let first = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");
    assert_eq!(first.cache_outcome(), &CacheOutcome::Compiled);
    let entry = only_entry(dir.path());

    // A new runtime (a restarted worker) finds the artifact instead of compiling.
    let again = runtime_with_cache(dir.path()).load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");
    assert_eq!(again.cache_outcome(), &CacheOutcome::Hit);
    still_counts(&again);

    // Flip one byte in the middle: the checksum catches it, the entry is rebuilt.
    let mut bytes = fs::read(&entry).expect("read entry");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    fs::write(&entry, &bytes).expect("damage entry");
    let rebuilt = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");
    let CacheOutcome::Rebuilt { reason } = rebuilt.cache_outcome() else {
        panic!("expected rebuild, got {:?}", rebuilt.cache_outcome())
    };
    assert!(reason.contains("checksum"), "{reason}");
    still_counts(&rebuilt);

    // A truncated entry (crash mid-write by something else) is caught too.
    fs::write(&entry, &bytes[..10]).expect("truncate entry");
    let rebuilt = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");
    assert!(matches!(rebuilt.cache_outcome(), CacheOutcome::Rebuilt { .. }));
    assert_eq!(
        runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load").cache_outcome(),
        &CacheOutcome::Hit
    );
}

/// Test threads (and the tasks of one job) load the same component at the same moment into an
/// empty cache; every load must succeed and leave exactly one valid entry.
#[test]
fn concurrent_first_loads_of_one_component_all_succeed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = runtime_with_cache(dir.path());
    let barrier = std::sync::Barrier::new(6);
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                barrier.wait();
                let component = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("concurrent load");
                still_counts(&component);
            });
        }
    });
    only_entry(dir.path());
    let again = runtime_with_cache(dir.path()).load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");
    assert_eq!(again.cache_outcome(), &CacheOutcome::Hit);
}
