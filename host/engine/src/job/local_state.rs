//! This run's local working directory (RocksDB databases, snapshot staging) under the spec's
//! state directory, locked for the run's life so that concurrent runs, on this host or on
//! another sharing the directory, never delete each other's.

use std::fs::File;
use std::path::PathBuf;

use super::RunError;
use eddy_plan::PipelineSpec;

/// This run's local state directory, and the lock that tells other processes it is in use.
pub(super) struct LocalStateDir {
    pub(super) dir: tempfile::TempDir,
    _lock: File,
}

/// Name of the lock file in each run directory: held (`flock`) for as long as the run lives.
const RUN_LOCK: &str = ".lock";

/// A fresh local directory for this run's state under the spec's state directory. Directories
/// of earlier runs whose lock nobody holds (their process is gone) are removed first. The lock,
/// not a process id, decides: a process id says nothing about another host or container
/// sharing the directory, and ids are reused.
pub(super) fn local_state_dir(spec: &PipelineSpec) -> Result<LocalStateDir, RunError> {
    let base = spec.state.dir.clone().unwrap_or_else(|| PathBuf::from(".eddy/state").join(&spec.name));
    let error = |problem: String| RunError::State { step: "*".into(), problem };
    std::fs::create_dir_all(&base).map_err(|e| error(format!("cannot create {}: {e}", base.display())))?;
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("run-")) {
            // A directory without a lock file is being created right now: leave it.
            let Ok(lock) = File::open(entry.path().join(RUN_LOCK)) else { continue };
            if lock.try_lock().is_ok() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("run-")
        .tempdir_in(&base)
        .map_err(|e| error(format!("cannot create a run directory in {}: {e}", base.display())))?;
    let lock_path = dir.path().join(RUN_LOCK);
    let lock = File::create(&lock_path).map_err(|e| error(format!("cannot create {}: {e}", lock_path.display())))?;
    lock.try_lock().map_err(|e| error(format!("cannot lock {}: {e}", lock_path.display())))?;
    Ok(LocalStateDir { dir, _lock: lock })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_whose_lock_is_held_survives_and_an_abandoned_one_is_removed() {
        let base = tempfile::tempdir().expect("tempdir");
        let yaml = "name: p\nsources: [{type: file, name: in, path: in.txt}]\nsteps: [{name: a, wasm: a.wasm}]\nsink: {type: print}\n";
        let mut spec = PipelineSpec::from_yaml(yaml).expect("spec");
        spec.state.dir = Some(base.path().to_path_buf());
        // A live run of another process (on this host or another sharing the directory): its
        // lock is held, and its process id means nothing here.
        let live = base.path().join("run-4000000-live");
        std::fs::create_dir(&live).expect("mkdir");
        File::create(live.join(RUN_LOCK)).expect("lock file");
        let held = File::open(live.join(RUN_LOCK)).expect("open");
        held.try_lock().expect("hold the lock");
        // A run that died: its lock file is there and nobody holds it.
        let dead = base.path().join("run-abandoned");
        std::fs::create_dir(&dead).expect("mkdir");
        File::create(dead.join(RUN_LOCK)).expect("lock file");

        let ours = local_state_dir(&spec).expect("state dir");
        assert!(live.exists(), "a run whose lock is held is never removed");
        assert!(!dead.exists(), "a run nobody holds is cleaned up");
        let probe = File::open(ours.dir.path().join(RUN_LOCK)).expect("our lock");
        assert!(probe.try_lock().is_err(), "our run holds its lock while it lives");
    }
}
