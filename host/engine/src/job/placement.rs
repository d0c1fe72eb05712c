//! A job spread over several processes: each runs the subtasks placed on it, and the channels
//! between subtasks of different processes come from the placement (QUIC streams in a
//! cluster) while those within a process stay local. The engine sees only the channel
//! contract: [`ChannelSender`] ends it is handed and gives away.

use eddy_transport::channel::ChannelSender;

/// Where a job's subtasks run. Channel `channel` of subtask (`task`, `subtask`) is the same
/// index in every process: the gate's order of its upstream subtasks.
pub trait Placement: Send + Sync {
    /// Whether subtask (`task`, `subtask`) runs in this process.
    fn is_local(&self, task: usize, subtask: u32) -> bool;
    /// The name of the part that runs subtask (`task`, `subtask`): the node its checkpoint
    /// reports must come from (a worker's name, as its certificate says).
    fn runner(&self, task: usize, subtask: u32) -> String;
    /// Input channel `channel` of the local subtask (`task`, `subtask`) is fed by subtask
    /// `from` (task, subtask) in another process: hand what arrives from it to `into`.
    fn register_input(&self, task: usize, subtask: u32, channel: u32, from: (usize, u32), into: Box<dyn ChannelSender>);
    /// A sender into input channel `channel` of subtask (`task`, `subtask`) in another process.
    fn open_output(&self, task: usize, subtask: u32, channel: u32) -> Result<Box<dyn ChannelSender>, String>;
    /// Calls `failed` with the reason when an input from another process breaks (its peer
    /// died or was dropped): the job must fail, since that input will never end.
    fn on_input_failed(&self, failed: Box<dyn Fn(&str) + Send + Sync>);
    /// The job is cancelled: close its outputs to other processes, so a subtask blocked on
    /// their credit (a peer that died answers none) stops now rather than at a timeout.
    fn cancel(&self);
}
