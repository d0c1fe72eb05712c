//! The engine's [`Placement`] over QUIC: a job's subtasks are assigned to workers by name, and
//! a channel between subtasks on two workers is a stream between their [`QuicNode`]s, named
//! by the job, its attempt and the receiving subtask's input channel.

use std::collections::HashMap;
use std::net::SocketAddr;

use eddy_engine::Placement;
use eddy_transport::channel::ChannelSender;
use eddy_transport::quic::{LinkId, QuicNode};

/// Which worker runs each subtask of a job attempt, as seen from one of them.
#[derive(Debug)]
pub struct QuicPlacement {
    node: QuicNode,
    job: String,
    attempt: u64,
    /// `assignment[task][subtask]`: the worker's name.
    assignment: Vec<Vec<String>>,
    /// Where each worker's data plane listens.
    addrs: HashMap<String, SocketAddr>,
}

impl QuicPlacement {
    /// The placement of `job`'s `attempt` for the worker of `node`.
    pub fn new(
        node: QuicNode,
        job: String,
        attempt: u64,
        assignment: Vec<Vec<String>>,
        addrs: HashMap<String, SocketAddr>,
    ) -> Self {
        Self { node, job, attempt, assignment, addrs }
    }

    fn link(&self, task: usize, subtask: u32, channel: u32) -> LinkId {
        LinkId { job: self.job.clone(), attempt: self.attempt, task: task as u32, subtask, channel }
    }

    fn worker(&self, task: usize, subtask: u32) -> Option<&str> {
        self.assignment.get(task)?.get(subtask as usize).map(String::as_str)
    }
}

impl Drop for QuicPlacement {
    fn drop(&mut self) {
        self.node.unregister_job(&self.job, self.attempt);
    }
}

impl Placement for QuicPlacement {
    fn is_local(&self, task: usize, subtask: u32) -> bool {
        self.worker(task, subtask) == Some(self.node.name())
    }

    fn runner(&self, task: usize, subtask: u32) -> String {
        self.worker(task, subtask).unwrap_or_default().to_owned()
    }

    fn register_input(
        &self,
        task: usize,
        subtask: u32,
        channel: u32,
        from: (usize, u32),
        into: Box<dyn ChannelSender>,
    ) {
        // Only the worker running the upstream subtask may feed this input.
        let feeder = self.worker(from.0, from.1).unwrap_or_default().to_owned();
        self.node.register(self.link(task, subtask, channel), &feeder, into);
    }

    fn on_input_failed(&self, failed: Box<dyn Fn(&str) + Send + Sync>) {
        self.node.on_job_link_failed(&self.job, self.attempt, move |link, reason| {
            failed(&format!("input {} of task {} subtask {}: {reason}", link.channel, link.task, link.subtask));
        });
    }

    fn cancel(&self) {
        self.node.close_senders(&self.job, self.attempt, "the job was cancelled");
    }

    fn open_output(&self, task: usize, subtask: u32, channel: u32) -> Result<Box<dyn ChannelSender>, String> {
        let peer = self.worker(task, subtask).ok_or_else(|| format!("no worker runs task {task} subtask {subtask}"))?;
        let addr = self.addrs.get(peer).ok_or_else(|| format!("no address for worker `{peer}`"))?;
        let sender =
            self.node.open_sender(peer, *addr, &self.link(task, subtask, channel)).map_err(|e| e.to_string())?;
        Ok(Box::new(sender))
    }
}
