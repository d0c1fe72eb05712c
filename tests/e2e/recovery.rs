//! What a job finds when it starts again, tested the ways users lose output: a finished job run
//! a second time, a checkpoint that cannot be read, damaged files shared by every checkpoint,
//! output committed with no checkpoint left, a changed `max_parallelism` or pipeline, and a
//! checkpoint location shared with files Eddy did not write. Expected output comes from the
//! oracles in `checkpoints.rs` (computed from the generator) or from the input text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use eddy_checkpoint::store::StoreOp;
use eddy_engine::{Job, JobOptions, RunError};
use eddy_plan::PipelineSpec;
use eddy_tests::runtime;

use crate::checkpoints::{
    Setup, assert_exactly_once, committed, committed_counts, refused_after_edit, run_until, run_with, write_pipeline,
};

/// Every file under `dir` with its contents, to show that nothing was deleted or changed.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).expect("read"));
            }
        }
    }
    files
}

/// Ids of the completed checkpoints in `dir`, oldest first.
fn completed(dir: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .expect("checkpoint dir")
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .filter(|id| dir.join(format!("chk-{id}/_metadata")).exists())
        .collect();
    ids.sort_unstable();
    ids
}

/// The word count (file → split → count at parallelism 2, RocksDB, exactly-once files sink,
/// 50 ms checkpoints) over `lines` generated lines; returns the spec path and the input text.
pub(crate) fn wordcount(dir: &Path, lines: usize) -> (PathBuf, String) {
    let words = ["river", "eddy", "stream", "current", "flow", "delta", "tide", "brook"];
    let mut text = String::new();
    let mut x: u64 = 0x9e37_79b9 ^ lines as u64;
    for _ in 0..lines {
        for _ in 0..5 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            text.push_str(words[(x % words.len() as u64) as usize]);
            text.push(' ');
        }
        text.push('\n');
    }
    std::fs::write(dir.join("input.txt"), &text).expect("input");
    let yaml = format!(
        "name: wc-twice\nbatch_size: 64\nsources: [{{type: file, name: lines, path: input.txt}}]\n\
         steps:\n  - {{name: split, wasm: {split}}}\n  - {{name: count, wasm: {count}, key_by: key, parallelism: 2}}\n\
         state: {{backend: rocksdb, dir: state}}\ncheckpoints: {{dir: checkpoints, interval_ms: 50}}\n\
         restart: {{strategy: none}}\nsink: {{type: files, dir: out}}\n",
        split = eddy_guest_artifacts::WORDCOUNT_SPLIT,
        count = eddy_guest_artifacts::WORDCOUNT_COUNT,
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).expect("spec");
    (path, text)
}

/// The running counts a word count must emit, each exactly once: (word, 1..=total).
pub(crate) fn running_counts(text: &str) -> Vec<(String, u64)> {
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for w in text.split_whitespace() {
        *totals.entry(w).or_default() += 1;
    }
    let mut rows: Vec<(String, u64)> =
        totals.into_iter().flat_map(|(w, n)| (1..=n).map(move |k| (w.to_owned(), k))).collect();
    rows.sort();
    rows
}

#[test]
fn a_finished_word_count_run_again_emits_nothing_twice() {
    for lines in [300, 2_000, 7_000, 16_000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, text) = wordcount(dir.path(), lines);
        let first = run_until(&path, |_| false).expect("first run");
        assert!(first.finished, "{lines} lines: ran to the end");
        let again = run_until(&path, |_| false).expect_err("already finished");
        assert!(matches!(again, RunError::AlreadyFinished { .. }), "{lines} lines: {again}");
        let got = committed_counts(&dir.path().join("out"));
        let expected = running_counts(&text);
        assert!(got == expected, "{lines} lines: {} rows committed, {} expected", got.len(), expected.len());
    }
}

#[test]
fn a_finished_window_job_run_again_emits_nothing_twice() {
    for events in [3_000, 12_000, 30_000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let setup = Setup { events, rate: 400_000, backend: "rocksdb", interval_ms: 50, ..Setup::default() };
        let path = write_pipeline(dir.path(), &setup);
        assert!(run_until(&path, |_| false).expect("first run").finished);
        let again = run_until(&path, |_| false).expect_err("already finished");
        assert!(matches!(again, RunError::AlreadyFinished { .. }), "{events} events: {again}");
        assert_exactly_once(&path, &format!("{events} events, run twice"));
    }
}

/// The window test pipeline on RocksDB (3 checkpoints retained), stopped after its third.
fn stopped_after_three_rocksdb_checkpoints() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), &Setup { retained: 3, backend: "rocksdb", ..Setup::default() });
    run_until(&path, |job| job.completed_checkpoints().len() >= 3).expect("first run");
    (dir, path)
}

/// `eddy savepoint PIPELINE --to DIR` when the newest checkpoint is damaged: the savepoint is the
/// newest intact checkpoint, the damaged one is named, nothing of its partial copy is left
/// beside the savepoint, and the savepoint restores.
#[test]
fn a_savepoint_passes_over_a_damaged_newest_checkpoint_and_keeps_nothing_of_it() {
    use eddy_checkpoint::savepoint::savepoint_from_latest;
    use eddy_checkpoint::{CheckpointMetadata, CheckpointStore, RestorePoint};
    let (dir, _) = stopped_after_three_rocksdb_checkpoints();
    let checkpoints = dir.path().join("checkpoints");
    let ids = completed(&checkpoints);
    let (intact, newest) = (ids[ids.len() - 2], ids[ids.len() - 1]);
    let store = CheckpointStore::local(&checkpoints).expect("store");
    let files = |id| -> Vec<String> {
        CheckpointMetadata::read(&store, id).expect("metadata").files().map(|f| f.path.clone()).collect()
    };
    let (of_intact, of_newest) = (files(intact), files(newest));
    // The newest checkpoint's last file of its own, so that the copy adds some before meeting it.
    let own: Vec<&String> = of_newest.iter().filter(|f| !of_intact.contains(f)).collect();
    assert!(own.len() >= 2, "the newest checkpoint has files of its own: {own:?}");
    let victim = checkpoints.join(own[own.len() - 1]);
    let mut bytes = std::fs::read(&victim).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&victim, bytes).expect("damage");

    let to = dir.path().join("savepoint");
    let (id, skipped) =
        savepoint_from_latest(&store, &CheckpointStore::local(&to).expect("savepoint dir")).expect("copy");
    assert_eq!(id, intact);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].0, newest);
    assert!(skipped[0].1.to_string().contains(own[own.len() - 1].as_str()), "{}", skipped[0].1);
    let mut kept: Vec<String> =
        tree(&to).into_keys().map(|p| p.strip_prefix(&to).expect("inside").to_string_lossy().into_owned()).collect();
    kept.sort();
    let mut expected = of_intact.clone();
    expected.push(format!("chk-{intact}/_metadata"));
    expected.sort();
    assert_eq!(kept, expected, "the savepoint holds the intact checkpoint and nothing else");
    let (point, passed_over) = RestorePoint::latest(&CheckpointStore::local(&to).expect("savepoint")).expect("read");
    assert!(passed_over.is_empty(), "{passed_over:?}");
    assert_eq!(point.expect("a restore point").metadata().id, intact);
}

#[test]
fn a_checkpoint_that_cannot_be_read_stops_the_start_and_deletes_nothing() {
    let (dir, path) = stopped_after_three_rocksdb_checkpoints();
    let checkpoints = dir.path().join("checkpoints");
    let newest = *completed(&checkpoints).last().expect("a checkpoint");
    let before = (tree(&checkpoints), tree(&dir.path().join("out")));

    // Every read of a file shared by the checkpoints (or of the newest one) is refused.
    let denied = format!("chk-{newest}/");
    let options = JobOptions {
        store_faults: Some(Arc::new(move |op: StoreOp, path: &str| match op {
            StoreOp::Get if path.starts_with(&denied) || path.starts_with("shared/") => Err("permission denied".into()),
            _ => Ok(()),
        })),
        ..JobOptions::default()
    };
    let err = run_with(&path, options, |_| false).expect_err("cannot read");
    let message = err.to_string();
    assert!(message.contains("permission denied") && message.contains("reading"), "{message}");
    assert!(before == (tree(&checkpoints), tree(&dir.path().join("out"))), "nothing deleted or changed");

    // Once the files can be read again, the job resumes from the newest checkpoint.
    let resumed = run_until(&path, |_| false).expect("resumed");
    assert_eq!(resumed.restored_from, Some(newest));
    assert_exactly_once(&path, "after an unreadable start");
}

#[test]
fn damaged_files_in_every_checkpoint_stop_the_start_instead_of_starting_over() {
    let (dir, path) = stopped_after_three_rocksdb_checkpoints();
    let checkpoints = dir.path().join("checkpoints");
    assert!(!committed(&dir.path().join("out")).is_empty(), "output was committed");
    // Damage every shared SST (same size, one bit flipped): no checkpoint passes its checks.
    let mut damaged = 0;
    for entry in std::fs::read_dir(checkpoints.join("shared")).expect("shared files").filter_map(Result::ok) {
        let mut bytes = std::fs::read(entry.path()).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        std::fs::write(entry.path(), bytes).expect("write");
        damaged += 1;
    }
    assert!(damaged > 0, "RocksDB checkpoints share SST files");
    let before = (tree(&checkpoints), tree(&dir.path().join("out")));
    let err = run_until(&path, |_| false).expect_err("nothing valid to resume from");
    assert!(matches!(err, RunError::WillNotStartOver { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("damaged") && message.contains("committed") && message.contains("delete"), "{message}");
    assert!(before == (tree(&checkpoints), tree(&dir.path().join("out"))), "nothing deleted or changed");
}

#[test]
fn committed_output_without_a_checkpoint_stops_the_start_instead_of_starting_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), &Setup::default());
    run_until(&path, |job| job.completed_checkpoints().len() >= 3).expect("first run");
    assert!(!committed(&dir.path().join("out")).is_empty(), "output was committed");
    std::fs::remove_dir_all(dir.path().join("checkpoints")).expect("lose the checkpoints");
    let err = run_until(&path, |_| false).expect_err("would duplicate");
    assert!(matches!(err, RunError::WillNotStartOver { .. }), "{err}");
    assert!(err.to_string().contains("committed file"), "{err}");
}

#[test]
fn retained_checkpoints_are_kept_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_pipeline(dir.path(), &Setup { retained: 3, rate: 4_000, ..Setup::default() });
    run_until(&path, |job| job.completed_checkpoints().len() >= 5).expect("first run");
    let checkpoints = dir.path().join("checkpoints");
    let kept = completed(&checkpoints);
    assert_eq!(kept.len(), 3, "retained: 3 while running");
    let spec = PipelineSpec::from_file(&path).expect("spec");
    let job = Job::start(&spec, runtime(), JobOptions::default()).expect("restart");
    assert_eq!(completed(&checkpoints), kept, "start-up keeps all three");
    while job.completed_checkpoints().is_empty() && !job.is_done() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    job.cancel();
    job.wait().expect("cancelled");
    // New checkpoints retire the oldest first: what is left of the old ones is the newest.
    let after = completed(&checkpoints);
    let old_left: Vec<u64> = after.iter().copied().filter(|id| kept.contains(id)).collect();
    assert_eq!(after.len(), 3, "still three: {after:?}");
    assert!(kept.ends_with(&old_left), "kept {kept:?}, then {after:?}: the restored checkpoint was retired first");
}

#[test]
fn a_changed_max_parallelism_is_refused_with_the_reason() {
    let message = refused_after_edit(|text| text.replace("parallelism: 2\n", "parallelism: 2\nmax_parallelism: 64\n"));
    assert!(message.contains("max_parallelism 128") && message.contains("64"), "{message}");
}

#[test]
fn a_checkpoint_of_another_pipeline_is_refused() {
    let message = refused_after_edit(|text| text.replace("name: exactly-once-test", "name: another-job"));
    assert!(message.contains("belongs to pipeline `exactly-once-test`"), "{message}");
}

#[test]
fn files_eddy_did_not_write_in_the_checkpoint_location_are_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let checkpoints = dir.path().join("checkpoints");
    let foreign =
        [checkpoints.join("NOTES.txt"), checkpoints.join("other-tool/data.bin"), checkpoints.join("chk-x/readme")];
    for file in &foreign {
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(file, b"not Eddy's").expect("write");
    }
    let path = write_pipeline(dir.path(), &Setup::default());
    run_until(&path, |job| job.completed_checkpoints().len() >= 3).expect("first run");
    assert!(run_until(&path, |_| false).expect("second run").finished);
    for file in &foreign {
        assert_eq!(std::fs::read(file).expect("still there"), b"not Eddy's", "{}", file.display());
    }
    assert_exactly_once(&path, "beside foreign files");
}
