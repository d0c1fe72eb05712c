//! What an attempt's checkpoints were like, for progress displays: the newest few with their
//! statistics, how many completed in all, and each subtask's state size in the newest. Bounded:
//! a job checkpointing every 100 ms completes close to a million checkpoints a day, and a
//! service polls this several times a second.

use std::collections::VecDeque;

use eddy_checkpoint::{CheckpointId, CheckpointMetadata, CheckpointStats};

/// Completed checkpoints kept (a display shows the newest hundred at most).
pub const HISTORY_KEPT: usize = 128;

/// A completed checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletedCheckpoint {
    /// The checkpoint.
    pub id: CheckpointId,
    /// Durations and sizes.
    pub stats: CheckpointStats,
}

/// One subtask's share of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubtaskStateBytes {
    /// Task index in the plan.
    pub task: usize,
    /// Subtask index.
    pub subtask: u32,
    /// Bytes of its keyed state and timers (every file, shared ones too: what a restore reads).
    pub state_bytes: u64,
    /// Bytes of the records in flight it stored (unaligned checkpoints).
    pub in_flight_bytes: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct CheckpointHistory {
    newest: VecDeque<CompletedCheckpoint>,
    completed: u64,
    sizes: Vec<SubtaskStateBytes>,
}

impl CheckpointHistory {
    /// Records checkpoint `meta`, just completed.
    pub fn push(&mut self, meta: &CheckpointMetadata) {
        if self.newest.len() == HISTORY_KEPT {
            self.newest.pop_front();
        }
        self.newest.push_back(CompletedCheckpoint { id: meta.id, stats: meta.stats.clone() });
        self.completed += 1;
        let bytes = |files: &mut dyn Iterator<Item = &eddy_checkpoint::metadata::FileRef>| {
            files.fold(0u64, |sum, f| sum.saturating_add(f.bytes))
        };
        self.sizes = meta
            .subtasks
            .iter()
            .map(|s| {
                let in_flight_bytes = bytes(&mut s.in_flight.iter());
                SubtaskStateBytes {
                    task: s.task,
                    subtask: s.subtask,
                    state_bytes: bytes(&mut s.files()).saturating_sub(in_flight_bytes),
                    in_flight_bytes,
                }
            })
            .collect();
    }

    /// The newest [`HISTORY_KEPT`] completed checkpoints, oldest first.
    pub fn newest(&self) -> Vec<CompletedCheckpoint> {
        self.newest.iter().cloned().collect()
    }

    /// How many checkpoints completed in all.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Each subtask's share of the newest completed checkpoint (empty before the first).
    pub fn sizes(&self) -> Vec<SubtaskStateBytes> {
        self.sizes.clone()
    }
}

#[cfg(test)]
mod tests {
    use eddy_checkpoint::metadata::{FileRef, OperatorState, StoredState, SubtaskState};

    use super::*;

    fn file(bytes: u64) -> FileRef {
        FileRef { path: format!("f{bytes}"), bytes, crc32: 0 }
    }

    fn meta(id: CheckpointId) -> CheckpointMetadata {
        let subtask = |subtask: u32, state: Vec<FileRef>, timers: Vec<FileRef>, in_flight: Vec<FileRef>| SubtaskState {
            task: 1,
            subtask,
            parallelism: 2,
            keyed: true,
            source: None,
            sink: None,
            operators: vec![OperatorState {
                step: "count".into(),
                timers: Vec::new(),
                timer_files: timers,
                state: StoredState::Entries(state),
                usage: None,
                states: Vec::new(),
                schemas: Vec::new(),
                artifact: None,
                partial_input: false,
            }],
            in_flight,
        };
        CheckpointMetadata {
            version: eddy_checkpoint::metadata::FORMAT_VERSION,
            job: "counts".into(),
            max_parallelism: Some(128),
            id,
            completed_ms: 0,
            finished: false,
            subtasks: vec![
                subtask(0, vec![file(100), file(20)], vec![file(3)], vec![]),
                subtask(1, vec![file(7)], vec![], vec![file(50), file(5)]),
            ],
            stats: CheckpointStats::default(),
        }
    }

    /// Sizes summed by hand from [`meta`]'s files; the count goes on past what is kept.
    #[test]
    fn the_history_keeps_the_newest_counts_all_and_sizes_each_subtask() {
        let mut history = CheckpointHistory::default();
        assert!(history.sizes().is_empty(), "no sizes before the first checkpoint");
        for id in 1..=(HISTORY_KEPT as u64 + 5) {
            history.push(&meta(id));
        }
        assert_eq!(history.completed(), HISTORY_KEPT as u64 + 5);
        let ids: Vec<CheckpointId> = history.newest().iter().map(|c| c.id).collect();
        assert_eq!(ids, (6..=HISTORY_KEPT as u64 + 5).collect::<Vec<_>>());
        let expected = [
            SubtaskStateBytes { task: 1, subtask: 0, state_bytes: 123, in_flight_bytes: 0 },
            SubtaskStateBytes { task: 1, subtask: 1, state_bytes: 7, in_flight_bytes: 55 },
        ];
        assert_eq!(history.sizes(), expected);
    }
}
