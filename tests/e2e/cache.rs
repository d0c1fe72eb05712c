//! The artifact cache: a second load does not recompile; a damaged entry is detected and rebuilt;
//! an entry this host did not write for this exact component is never loaded.
//!
//! Loading an entry runs native code from it, so every test that plants an entry checks both the
//! outcome and that the component then behaves as the `.wasm` that was asked for (the oracles are
//! literal outputs of the word counter and the line splitter).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use eddy_guest_artifacts as guests;
use eddy_runtime::{CacheOutcome, Component, Runtime, RuntimeConfig, Subtask, digest_of};
use eddy_tests::{decode, json_batch, open_operator};

/// One host: a cache directory and a host key file kept outside it, as in production.
struct Host {
    cache_dir: PathBuf,
    key_path: PathBuf,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Host {
    fn new() -> Self {
        let cache = tempfile::tempdir().expect("tempdir");
        let home = tempfile::tempdir().expect("tempdir");
        // Subdirectories the runtime must create itself (a tempdir is already 0700).
        Self {
            cache_dir: cache.path().join("artifacts"),
            key_path: home.path().join("eddy").join("host.key"),
            _dirs: (cache, home),
        }
    }

    fn runtime(&self) -> Runtime {
        Runtime::new(RuntimeConfig {
            cache_dir: Some(self.cache_dir.clone()),
            host_key_path: Some(self.key_path.clone()),
            ..RuntimeConfig::default()
        })
        .expect("runtime")
    }

    fn load(&self, path: &str) -> Component {
        self.runtime().load_file("op", path.as_ref()).expect("load")
    }

    fn only_entry(&self) -> PathBuf {
        let entries = self.entries();
        assert_eq!(entries.len(), 1, "one artifact per digest: {entries:?}");
        entries[0].clone()
    }

    fn entries(&self) -> Vec<PathBuf> {
        let mut entries: Vec<_> =
            fs::read_dir(&self.cache_dir).expect("cache dir").map(|e| e.expect("entry").path()).collect();
        entries.sort();
        entries
    }

    /// The entry `load(path)` wrote (the cache must hold no other entry for that digest).
    fn entry_of(&self, path: &str) -> PathBuf {
        let digest = digest_of(&fs::read(path).expect("read wasm"));
        let found: Vec<_> = self.entries().into_iter().filter(|e| file_name(e).starts_with(&digest)).collect();
        assert_eq!(found.len(), 1, "one entry for {digest}: {found:?}");
        found[0].clone()
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().expect("file name").to_string_lossy().into_owned()
}

fn mode(path: &Path) -> String {
    format!("{:o}", fs::metadata(path).expect("metadata").permissions().mode() & 0o777)
}

/// Loads `wasm` over a planted entry: it must be recompiled (not loaded), the component must
/// behave as `wasm` does, and the entry must have been replaced by one that is loaded next time.
fn recompiled_not_loaded(host: &Host, wasm: &str, behaves_as_asked: fn(&Component)) {
    let loaded = host.load(wasm);
    assert!(
        matches!(loaded.cache_outcome(), CacheOutcome::Untrusted { .. }),
        "a planted entry must be recompiled, not loaded; got {:?}",
        loaded.cache_outcome()
    );
    behaves_as_asked(&loaded);
    assert_eq!(host.load(wasm).cache_outcome(), &CacheOutcome::Hit, "the planted entry was replaced");
}

/// The word counter: a running count per key.
fn counts_words(component: &Component) {
    let mut op = open_operator(component, Subtask::single(128), "null");
    let out = op.process(&json_batch(&[(Some("w"), 1u64), (Some("x"), 1), (Some("w"), 1)])).expect("process");
    let expected = vec![(Some("w".to_string()), 1u64), (Some("x".to_string()), 1), (Some("w".to_string()), 2)];
    assert_eq!(decode::<String, u64>(&out.main), expected);
}

/// The splitter: one `(word, 1)` per word of a line.
fn splits_lines(component: &Component) {
    let mut op = open_operator(component, Subtask::single(128), "null");
    let out = op.process(&json_batch(&[(None::<String>, "To be")])).expect("process");
    assert_eq!(decode::<String, u64>(&out.main), vec![(Some("to".to_string()), 1u64), (Some("be".to_string()), 1)]);
}

#[test]
fn second_load_hits_the_cache_and_damage_is_rebuilt() {
    let host = Host::new();
    let runtime = host.runtime();
    let first = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("load");
    assert_eq!(first.cache_outcome(), &CacheOutcome::Compiled);
    let entry = host.only_entry();

    // A new runtime (a restarted worker) finds the artifact instead of compiling.
    let again = host.load(guests::WORDCOUNT_COUNT);
    assert_eq!(again.cache_outcome(), &CacheOutcome::Hit);
    counts_words(&again);

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
    counts_words(&rebuilt);

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
/// empty cache with no host key yet; every load must succeed and leave exactly one valid entry
/// and one key.
#[test]
fn concurrent_first_loads_of_one_component_all_succeed() {
    let host = Host::new();
    let runtime = host.runtime();
    let barrier = std::sync::Barrier::new(6);
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                barrier.wait();
                let component = runtime.load_file("count", guests::WORDCOUNT_COUNT.as_ref()).expect("concurrent load");
                counts_words(&component);
            });
        }
    });
    host.only_entry();
    assert_eq!(host.load(guests::WORDCOUNT_COUNT).cache_outcome(), &CacheOutcome::Hit);
}

/// Seen: another component's `.cwasm` copied over the word counter's entry was loaded
/// (`outcome=Hit`) and every output line came from the substitute.
#[test]
fn an_entry_copied_from_another_component_is_recompiled_not_loaded() {
    let host = Host::new();
    host.load(guests::WORDCOUNT_COUNT);
    host.load(guests::WORDCOUNT_SPLIT);
    let counter_entry = host.entry_of(guests::WORDCOUNT_COUNT);
    fs::copy(host.entry_of(guests::WORDCOUNT_SPLIT), &counter_entry).expect("plant the splitter's entry");

    recompiled_not_loaded(&host, guests::WORDCOUNT_COUNT, counts_words);
}

/// A valid entry from another host (a shared volume, a cloned repository) is not valid here.
#[test]
fn an_entry_written_under_another_host_key_is_recompiled() {
    let elsewhere = Host::new();
    elsewhere.load(guests::WORDCOUNT_COUNT);
    let foreign = elsewhere.only_entry();
    let host = Host::new();
    fs::create_dir_all(&host.cache_dir).expect("cache dir");
    fs::copy(&foreign, host.cache_dir.join(file_name(&foreign))).expect("plant the foreign entry");

    recompiled_not_loaded(&host, guests::WORDCOUNT_COUNT, counts_words);
}

/// An entry is bound to the digest of the `.wasm` it was compiled from, not just to its name.
#[test]
fn an_entry_renamed_to_another_digest_is_recompiled() {
    let host = Host::new();
    host.load(guests::WORDCOUNT_COUNT);
    let counter_entry = host.only_entry();
    let counter_digest = digest_of(&fs::read(guests::WORDCOUNT_COUNT).expect("read wasm"));
    let split_digest = digest_of(&fs::read(guests::WORDCOUNT_SPLIT).expect("read wasm"));
    let renamed = host.cache_dir.join(file_name(&counter_entry).replace(&counter_digest, &split_digest));
    fs::rename(&counter_entry, &renamed).expect("rename the counter's entry to the splitter's digest");

    recompiled_not_loaded(&host, guests::WORDCOUNT_SPLIT, splits_lines);
}

/// Entry layout, written here from the format's description rather than taken from the code:
/// an 8-byte magic, the sha256 of the body, a 32-byte authentication tag, then the body.
const CHECKSUM_AT: usize = 8;
const CHECKSUM_END: usize = CHECKSUM_AT + 32;
const BODY_AT: usize = CHECKSUM_END + 32;

/// The raw sha256 (the public `digest_of` is its hex form).
fn sha256(bytes: &[u8]) -> Vec<u8> {
    let hex = digest_of(bytes);
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digest")).collect()
}

/// Anyone can recompute a checksum; an edit must still be caught.
#[test]
fn an_edited_body_with_its_checksum_recomputed_is_recompiled() {
    let host = Host::new();
    host.load(guests::WORDCOUNT_COUNT);
    let entry = host.only_entry();
    let mut bytes = fs::read(&entry).expect("read entry");
    let middle = BODY_AT + (bytes.len() - BODY_AT) / 2;
    bytes[middle] ^= 0x55;
    let checksum = sha256(&bytes[BODY_AT..]);
    bytes[CHECKSUM_AT..CHECKSUM_END].copy_from_slice(&checksum);
    fs::write(&entry, &bytes).expect("edit entry");

    recompiled_not_loaded(&host, guests::WORDCOUNT_COUNT, counts_words);
}

#[test]
fn the_cache_directory_and_the_host_key_are_private() {
    let host = Host::new();
    host.load(guests::WORDCOUNT_COUNT);
    assert_eq!(mode(&host.cache_dir), "700", "cache directory mode");
    assert_eq!(mode(&host.key_path), "600", "host key mode");
    assert_eq!(fs::read(&host.key_path).expect("read key").len(), 32, "host key length");
}
