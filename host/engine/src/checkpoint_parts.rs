//! Checkpoints of a job spread over several processes ("parts"). One part is the job master:
//! its checkpoint thread runs the [`CheckpointCoordinator`](crate::checkpoint::CheckpointCoordinator)
//! over every subtask of the plan, numbered the same way in every part (tasks in plan order,
//! subtasks ascending). Every other part runs a [`PartThread`]: it uploads its own subtasks'
//! snapshots to the store all parts share, reports their states to the master, and follows
//! the master's commands. The master writes the metadata (the commit point) and each part
//! commits its own sinks on the master's word, since a sink's files live where it ran.
//!
//! The messages are typed and serializable, so the same protocol runs over in-process
//! channels (tests) or a network.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint::upload::Uploader;
use crate::checkpoint::{CheckpointError, CheckpointId, CheckpointStats, CheckpointStore, SubtaskState};
use crate::checkpointing::{Report, Signals, SinkCommitter, upload_snapshot};

/// What a part tells the job master.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PartReport {
    /// A subtask's snapshot for checkpoint `id` is in the store.
    Acknowledged {
        /// The checkpoint.
        id: CheckpointId,
        /// The subtask's global participant number.
        participant: usize,
        /// Its part of the metadata.
        state: SubtaskState,
        /// Its phase durations and sizes.
        stats: CheckpointStats,
    },
    /// A subtask could not take its part of checkpoint `id`.
    Declined {
        /// The checkpoint.
        id: CheckpointId,
        /// The subtask's global participant number.
        participant: usize,
        /// Why.
        reason: String,
    },
    /// A subtask ended; its final snapshot is in the store and stands for every later checkpoint.
    Finished {
        /// The subtask's global participant number.
        participant: usize,
        /// Its final state.
        state: SubtaskState,
    },
}

/// What the job master tells every other part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MasterCommand {
    /// Checkpoint `id` is triggered (at `at_ms`, ms since the epoch): sources take it.
    Trigger {
        /// The checkpoint.
        id: CheckpointId,
        /// When it was triggered.
        at_ms: i64,
    },
    /// Checkpoint `id` is complete: sinks commit up to it.
    Completed {
        /// The checkpoint.
        id: CheckpointId,
    },
    /// Every subtask finished and the final checkpoint `id` is written: commit the final
    /// sink files and stop.
    Final {
        /// The final checkpoint.
        id: CheckpointId,
    },
}

/// The job master's end of the protocol.
pub struct MasterLink {
    /// Reports of the other parts, each with the name of the part that sent it (from its
    /// link, never from the report): the master takes a part's word for its own subtasks only.
    pub reports: Receiver<(String, PartReport)>,
    /// Sends a command to every other part.
    pub broadcast: Box<dyn Fn(MasterCommand) + Send>,
}

impl std::fmt::Debug for MasterLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterLink").finish_non_exhaustive()
    }
}

/// Another part's end of the protocol.
pub struct PartLink {
    /// The master's commands.
    pub commands: Receiver<MasterCommand>,
    /// Sends a report to the master.
    pub report: Box<dyn Fn(PartReport) + Send>,
}

impl std::fmt::Debug for PartLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartLink").finish_non_exhaustive()
    }
}

/// Which end of the checkpoint protocol this part of a spread job holds.
pub enum CheckpointRole {
    /// Coordinates the checkpoints of every part.
    Master(MasterLink),
    /// Follows the master.
    Part(PartLink),
}

impl std::fmt::Debug for CheckpointRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CheckpointRole::Master(_) => "CheckpointRole::Master",
            CheckpointRole::Part(_) => "CheckpointRole::Part",
        })
    }
}

/// In-process links between a master and `parts` other parts, named `part-0`, `part-1`, ...
/// (tests, and a spread job whose parts share a process).
pub fn local_links(parts: usize) -> (MasterLink, Vec<PartLink>) {
    let (report_tx, reports) = std::sync::mpsc::channel();
    let mut command_txs = Vec::new();
    let mut links = Vec::new();
    for i in 0..parts {
        let (tx, commands) = std::sync::mpsc::channel();
        command_txs.push(tx);
        let report_tx = report_tx.clone();
        let name = format!("part-{i}");
        links.push(PartLink {
            commands,
            report: Box::new(move |r| {
                let _ = report_tx.send((name.clone(), r));
            }),
        });
    }
    let broadcast = Box::new(move |c: MasterCommand| {
        for tx in &command_txs {
            let _ = tx.send(c);
        }
    });
    (MasterLink { reports, broadcast }, links)
}

/// A part's checkpoint thread (see the module docs).
pub(crate) struct PartThread {
    pub job: String,
    pub store: CheckpointStore,
    pub uploader: Uploader,
    pub signals: Arc<Signals>,
    pub reports: Receiver<Report>,
    pub link: PartLink,
    pub cancel: Arc<AtomicBool>,
    pub commit_sink: SinkCommitter,
}

impl PartThread {
    /// Runs until the master's final command or the job's cancellation.
    pub fn run(mut self) -> Result<(), CheckpointError> {
        let mut finished_sinks: Vec<serde_json::Value> = Vec::new();
        let mut local_open = true;
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Ok(());
            }
            if local_open {
                match self.reports.recv_timeout(Duration::from_millis(5)) {
                    Ok(Report::Taken { id, snapshot }) => {
                        let participant = snapshot.participant;
                        let report = match upload_snapshot(&self.store, &mut self.uploader, Some(id), snapshot) {
                            Ok((state, stats)) => PartReport::Acknowledged { id, participant, state, stats },
                            Err(e) => PartReport::Declined { id, participant, reason: e.to_string() },
                        };
                        (self.link.report)(report);
                    }
                    Ok(Report::Finished(snapshot)) => {
                        let participant = snapshot.participant;
                        let (state, _) = upload_snapshot(&self.store, &mut self.uploader, None, snapshot)?;
                        finished_sinks.extend(state.sink.clone());
                        (self.link.report)(PartReport::Finished { participant, state });
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    // Every local subtask is gone: finished (the master's final word follows)
                    // or failed (the job is being cancelled).
                    Err(RecvTimeoutError::Disconnected) => local_open = false,
                }
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
            loop {
                match self.link.commands.try_recv() {
                    Ok(MasterCommand::Trigger { id, at_ms }) => {
                        self.signals.triggered_ms.store(at_ms, Ordering::SeqCst);
                        self.signals.trigger.store(id, Ordering::SeqCst);
                    }
                    Ok(MasterCommand::Completed { id }) => {
                        self.signals.completed.fetch_max(id, Ordering::SeqCst);
                    }
                    Ok(MasterCommand::Final { id }) => {
                        for state in &finished_sinks {
                            (self.commit_sink)(state).map_err(|e| CheckpointError::Storage {
                                what: "committing the sink's final files".into(),
                                problem: e.to_string(),
                            })?;
                        }
                        self.signals.completed.fetch_max(id, Ordering::SeqCst);
                        tracing::info!(job = %self.job, checkpoint = id, "final checkpoint written by the job master; sinks committed");
                        return Ok(());
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        return Err(CheckpointError::Storage {
                            what: "the job master".into(),
                            problem: "its link closed before the final checkpoint".into(),
                        });
                    }
                }
            }
        }
    }
}
