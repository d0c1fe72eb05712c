//! Checkpoints of a job spread over several processes ("parts"). One part is the job master:
//! its checkpoint thread runs the [`CheckpointCoordinator`](crate::checkpoint::CheckpointCoordinator)
//! over every subtask of the plan, numbered the same way in every part (tasks in plan order,
//! subtasks ascending). Every other part runs a [`PartThread`]: it uploads its own subtasks'
//! snapshots to the store all parts share, reports their states to the master, and follows
//! the master's commands. The master writes the metadata (the commit point); each part's sinks
//! commit completed checkpoints on the master's word, and the master itself commits every
//! sink's final files before the job counts as finished (a part told `Final` may be slow or
//! gone by the time a reader looks).
//!
//! The messages are typed and serializable, so the same protocol runs over in-process
//! channels (tests) or a network.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use eddy_checkpoint::upload::Uploader;
use eddy_checkpoint::upload::upload_snapshot;
use eddy_checkpoint::{CheckpointError, CheckpointId, CheckpointStore};

use crate::messages::{MasterCommand, PartLink, PartReport, Report, Signals, SwapOrder, SwapRequest};

/// A part's checkpoint thread (see the module docs).
pub(crate) struct PartThread {
    pub job: String,
    pub store: CheckpointStore,
    pub uploader: Uploader,
    pub signals: Arc<Signals>,
    pub reports: Receiver<Report>,
    pub link: PartLink,
    pub cancel: Arc<AtomicBool>,
}

impl PartThread {
    /// Runs until the master's final command or the job's cancellation.
    pub fn run(mut self) -> Result<(), CheckpointError> {
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
                    Ok(MasterCommand::Trigger { id, at_ms, swap }) => {
                        if let Some(order) = swap {
                            self.arm_swap(id, &order)?;
                        }
                        self.signals.triggered_ms.store(at_ms, Ordering::SeqCst);
                        self.signals.trigger.store(id, Ordering::SeqCst);
                    }
                    Ok(MasterCommand::Completed { id }) => {
                        self.signals.completed.fetch_max(id, Ordering::SeqCst);
                    }
                    Ok(MasterCommand::Final { id }) => {
                        self.signals.completed.fetch_max(id, Ordering::SeqCst);
                        tracing::info!(job = %self.job, checkpoint = id, "final checkpoint written by the job master");
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

    /// Arms the live swap the master's trigger `id` carries, with the code prepared for it
    /// here, before any source sees the trigger. Code this part did not prepare fails it: its
    /// subtasks would go on with the old code while the master records the new.
    fn arm_swap(&self, id: CheckpointId, order: &SwapOrder) -> Result<(), CheckpointError> {
        let refused = |problem: String| CheckpointError::Storage { what: "a live swap".into(), problem };
        let poisoned = || refused("the job's swap lock is poisoned".into());
        let mut request = self.signals.swap.lock().map_err(|_| poisoned())?;
        if request.as_ref().is_some_and(|r| r.step == order.step && r.component.digest() == order.digest) {
            return Ok(());
        }
        let prepared = self.signals.prepared_swap.lock().map_err(|_| poisoned())?;
        let Some(ready) = prepared.as_ref().filter(|p| p.step == order.step && p.component.digest() == order.digest)
        else {
            return Err(refused(format!(
                "the job master swaps step `{}` to {} at checkpoint {id}, code this part was not given first",
                order.step, order.digest
            )));
        };
        *request = Some(SwapRequest {
            step: order.step.clone(),
            component: ready.component.clone(),
            checkpoint: Some(id),
            outcome: None,
        });
        tracing::info!(job = %self.job, checkpoint = id, step = %order.step, "checkpoint carries a live swap");
        Ok(())
    }
}
