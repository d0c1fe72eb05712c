//! Channels between subtasks: buffers of records and in-band events, under credit-based flow
//! control.
//!
//! [`ChannelSender`] and [`InputGate`] are the transport contract: the in-process
//! implementation here and the QUIC transport (later) both keep it. A subtask reads one gate
//! that merges all its input channels; it writes through one sender per output channel.
//!
//! The local transport keeps each channel's protocol in the I/O-free state machines of
//! [`crate::credit`]: the receiver owns `capacity` buffers per channel and grants one credit
//! per free buffer; a sender ships only against credit and blocks (backpressure) once its small
//! queue is full. In-band events take credit like buffers, so they can never overtake records.
//!
//! A credit is a buffer: a `Data` message's credit stays with the receiving task until it
//! hands the batch back ([`InputGate::recycle`]) or asks for the next message, so the buffers
//! a task is still reading count against its channel. The recycled batch, emptied, goes back to
//! the channel's sender with the credit ([`ChannelSender::spare`]), and the sender's buffer
//! builder fills it again: after the first few batches a channel allocates nothing.
//!
//! Unaligned checkpoints: the receiver may ask a channel to let barriers of some checkpoints
//! overtake ([`InputGate::overtake_barriers`]). Such a barrier jumps everything queued in the
//! channel (on the wire and in the sender's queue), needs no credit, and carries copies of the
//! records it overtook ([`InputGate::take_overtaken`]): they come before the barrier but
//! reach the receiver after it, so the receiver stores them with its snapshot. The records
//! themselves stay queued and are delivered as usual.

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use eddy_core::RecordBatch;

use crate::credit::{CreditReceiver, CreditSender};

/// What travels on a channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Records of the main stream (`side: None`) or of a named side output on its way to the sink.
    Data {
        /// Side output name; side records bypass the operators downstream.
        side: Option<String>,
        /// The records.
        batch: RecordBatch,
        /// The sender's watermark advanced to this after these records: a watermark rides on
        /// the buffer it follows instead of flushing it early and taking a credit of its own.
        watermark: Option<i64>,
    },
    /// The sender's event time advanced: it will send no record older than this.
    Watermark(i64),
    /// Checkpoint barrier `n` (passed through; alignment comes with checkpoints).
    Barrier(u64),
    /// The sender is done; nothing follows.
    EndOfStream,
}

/// The receiving side went away (job cancelled or failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("channel closed: the job is stopping")]
pub struct Disconnected;

/// Sending end of one channel.
pub trait ChannelSender: Send {
    /// Sends `message`, waiting while the channel has no credit (backpressure).
    fn send(&mut self, message: Message) -> Result<(), Disconnected>;
    /// Sends `message` if the channel takes it without waiting, or gives it back (`Ok(Err)`).
    /// A sender that cannot tell gives every message back.
    fn try_send(&mut self, message: Message) -> Result<Result<(), Message>, Disconnected> {
        Ok(Err(message))
    }
    /// An empty buffer the receiver handed back, to fill instead of allocating one.
    fn spare(&mut self) -> Option<RecordBatch> {
        None
    }
    /// Waits until the receiver has taken every message sent so far: consumed it, or handed
    /// its buffer back ([`InputGate::recycle`]) or asked for the next message. A sender that
    /// cannot tell returns at once. The QUIC transport waits so after an oversized frame, so
    /// that a channel holds at most one in the receiving node.
    fn wait_taken(&mut self) -> Result<(), Disconnected> {
        Ok(())
    }
}

/// Receiving end of all input channels of one subtask.
pub trait InputGate: Send {
    /// Number of input channels.
    fn channels(&self) -> usize;
    /// The next message and its channel, waiting at most `timeout`; `None` on timeout.
    /// Blocked channels deliver nothing.
    fn recv(&mut self, timeout: Duration) -> Result<Option<(usize, Message)>, Disconnected>;
    /// Holds `channel` back (or lets it go again). A held channel returns no credit, so its
    /// sender stops once its credit runs out: barrier alignment without unbounded buffering.
    fn set_blocked(&mut self, channel: usize, blocked: bool);
    /// Hands back the buffer of the `Data` message last received from `channel` once the task
    /// is done with it: its credit returns, and the sender fills the buffer again instead of
    /// allocating one. A batch not handed back returns its credit at the next `recv`.
    fn recycle(&mut self, channel: usize, batch: RecordBatch) {
        let _ = (channel, batch);
    }
    /// From now on, barriers of checkpoints in `ids` overtake the data queued in `channel`
    /// (one already queued there jumps ahead now). A gate that cannot do this keeps barriers
    /// in order, which is slower but as correct: the receiver records what arrives before them.
    fn overtake_barriers(&mut self, channel: usize, ids: RangeInclusive<u64>) {
        let _ = (channel, ids);
    }
    /// Copies of the `Data` messages the barrier last received from `channel` overtook,
    /// oldest first (empty if it overtook nothing).
    fn take_overtaken(&mut self, channel: usize) -> Vec<Message> {
        let _ = channel;
        Vec::new()
    }
}

/// Sizing of local channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Buffers the receiver holds per channel (credits granted at start).
    pub capacity: u32,
    /// Buffers a sender may queue beyond its credit before it blocks.
    pub max_queued: usize,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self { capacity: 4, max_queued: 1 }
    }
}

impl ChannelConfig {
    /// The most messages one channel can hold at once (received but unconsumed, on the wire,
    /// queued at the sender): what bounds memory under backpressure.
    pub fn max_in_flight(&self) -> usize {
        self.capacity as usize + self.max_queued
    }
}

struct LocalChannel {
    receiver: CreditReceiver,
    sender: CreditSender<Message>,
    wire: VecDeque<Message>,
    /// Emptied buffers on their way back to the sender, at most `capacity` of them.
    spares: Vec<RecordBatch>,
    waits: SendWaits,
    /// Barriers that overtook the queue, each with copies of the records it overtook; served
    /// before the wire and without credit.
    priority: VecDeque<(Message, Vec<Message>)>,
    /// Barriers of these checkpoints overtake.
    overtaking: Option<RangeInclusive<u64>>,
}

/// A buffer grown past this (one huge record) is freed rather than kept for reuse, so the pool
/// holds at most `capacity` ordinary buffers per channel.
const MAX_SPARE_BYTES: usize = 1 << 20;

/// How a channel's sender waited for credit: what tests synchronise on instead of time, and
/// what metrics can report as backpressure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendWaits {
    /// Sends waiting for credit right now (0 or 1: a channel has one sender).
    pub waiting: u32,
    /// Sends that had to wait at least once, since the channel opened.
    pub blocked_sends: u64,
    /// Times a waiting sender was woken, whether or not it could go on (credit came back, the
    /// gate closed, or a spurious wakeup).
    pub wakeups: u64,
}

impl LocalChannel {
    /// The receiving task is done with one buffer: its credit (and the emptied buffer, if the
    /// task handed it back) return to the sender.
    fn consumed(&mut self, buffer: Option<RecordBatch>) -> bool {
        if let Some(mut buffer) = buffer
            && self.spares.len() < self.receiver.capacity() as usize
            && buffer.allocated_bytes() <= MAX_SPARE_BYTES
        {
            buffer.clear();
            self.spares.push(buffer);
        }
        let Some(credit) = self.receiver.on_consumed() else { return false };
        self.sender.on_credit(credit);
        self.pump();
        true
    }

    fn overtakes(&self, message: &Message) -> bool {
        matches!((message, &self.overtaking), (Message::Barrier(id), Some(ids)) if ids.contains(id))
    }

    /// Copies of the records among the first `wire` messages on the wire and the first
    /// `queued` in the sender's queue.
    fn copies(&self, wire: usize, queued: usize) -> Vec<Message> {
        let ahead = self.wire.iter().take(wire).chain(self.sender.queued().take(queued));
        ahead.filter(|m| matches!(m, Message::Data { .. })).cloned().collect()
    }

    /// `barrier` jumps everything queued.
    fn overtake(&mut self, barrier: Message) {
        let copies = self.copies(self.wire.len(), self.sender.backlog());
        self.priority.push_back((barrier, copies));
    }

    /// A barrier already queued that must overtake jumps ahead now. Returns whether one did.
    fn overtake_queued(&mut self) -> bool {
        if let Some(i) = self.wire.iter().position(|m| self.overtakes(m)) {
            let copies = self.copies(i, 0);
            let Some(barrier) = self.wire.remove(i) else { return false };
            self.priority.push_back((barrier, copies));
            // It held a credit like a buffer; it is consumed now.
            self.consumed(None);
            return true;
        }
        let queued = self.sender.queued().position(|m| self.overtakes(m));
        if let Some(i) = queued {
            let copies = self.copies(self.wire.len(), i);
            let Some(barrier) = self.sender.remove_queued(i) else { return false };
            self.priority.push_back((barrier, copies));
            return true;
        }
        false
    }

    /// Moves queued messages onto the wire as far as credit allows.
    fn pump(&mut self) {
        while let Some(m) = self.sender.poll_send() {
            // Cannot fail: the sender only ships against credit the receiver granted.
            if self.receiver.on_buffer().is_err() {
                tracing::error!("credit protocol violated on a local channel");
            }
            self.wire.push_back(m);
        }
    }
}

struct GateState {
    channels: Vec<LocalChannel>,
    next: usize,
}

/// One gate's shared state: its channels behind one lock, so the receiver waits on one condvar
/// for any channel; each channel's sender waits on its own condvar, so returning credit on one
/// channel wakes only that channel's sender.
pub struct LocalGateShared {
    state: Mutex<GateState>,
    readable: Condvar,
    writable: Vec<Condvar>,
    closed: AtomicBool,
}

impl std::fmt::Debug for LocalGateShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalGateShared").field("closed", &self.closed.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

impl LocalGateShared {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        // A panicking subtask thread is reported by the job; the queues themselves stay valid.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes every waiter and makes every further call fail with [`Disconnected`].
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _guard = self.lock();
        self.readable.notify_all();
        for writable in &self.writable {
            writable.notify_all();
        }
    }

    /// Messages currently held in channel `c` (wire + unconsumed + queued), for tests and metrics.
    pub fn in_flight(&self, c: usize) -> usize {
        let state = self.lock();
        state.channels.get(c).map_or(0, |ch| ch.wire.len() + ch.sender.backlog() + ch.priority.len())
    }

    /// How channel `c`'s sender has waited for credit so far (all zero for an unknown channel).
    pub fn send_waits(&self, c: usize) -> SendWaits {
        self.lock().channels.get(c).map_or_else(SendWaits::default, |ch| ch.waits)
    }
}

/// Creates a local gate with `channels` input channels; returns the gate and one sender per
/// channel. `blocked_ns[c]` accumulates the time channel `c`'s sender waited for credit.
pub fn local_gate(
    channels: usize,
    config: ChannelConfig,
    blocked_ns: Vec<Arc<AtomicU64>>,
) -> (Arc<LocalGateShared>, LocalInputGate, Vec<LocalSender>) {
    let state = GateState {
        channels: (0..channels)
            .map(|_| {
                let receiver = CreditReceiver::new(config.capacity, 1);
                let mut sender = CreditSender::new(config.max_queued);
                sender.on_credit(receiver.initial_credit());
                LocalChannel {
                    receiver,
                    sender,
                    wire: VecDeque::new(),
                    spares: Vec::new(),
                    waits: SendWaits::default(),
                    priority: VecDeque::new(),
                    overtaking: None,
                }
            })
            .collect(),
        next: 0,
    };
    let shared = Arc::new(LocalGateShared {
        state: Mutex::new(state),
        readable: Condvar::new(),
        writable: (0..channels).map(|_| Condvar::new()).collect(),
        closed: AtomicBool::new(false),
    });
    let senders = blocked_ns
        .into_iter()
        .take(channels)
        .enumerate()
        .map(|(channel, blocked_ns)| LocalSender { shared: shared.clone(), channel, blocked_ns, spare: None })
        .collect();
    let gate = LocalInputGate {
        shared: shared.clone(),
        channels,
        blocked: vec![false; channels],
        lent: None,
        overtaken: vec![Vec::new(); channels],
    };
    (shared, gate, senders)
}

/// In-process sending end.
pub struct LocalSender {
    shared: Arc<LocalGateShared>,
    channel: usize,
    blocked_ns: Arc<AtomicU64>,
    /// A recycled buffer picked up while holding the lock for a send.
    spare: Option<RecordBatch>,
}

impl std::fmt::Debug for LocalSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSender").field("channel", &self.channel).finish_non_exhaustive()
    }
}

/// Puts `message` into `channel` if it has room now, or gives it back; picks up a recycled
/// buffer into `spare` if it has none. A free function over the sender's fields, so a send
/// borrows the gate's shared part and its spare slot side by side.
fn offer(
    state: &mut GateState,
    channel: usize,
    closed: &AtomicBool,
    spare: &mut Option<RecordBatch>,
    message: Message,
) -> Result<Result<(), Message>, Disconnected> {
    if closed.load(Ordering::SeqCst) {
        return Err(Disconnected);
    }
    let channel = &mut state.channels[channel];
    if channel.overtakes(&message) {
        channel.overtake(message);
        return Ok(Ok(()));
    }
    match channel.sender.enqueue(message) {
        Ok(()) => {
            channel.pump();
            if spare.is_none() {
                *spare = channel.spares.pop();
            }
            Ok(Ok(()))
        }
        Err(back) => Ok(Err(back)),
    }
}

impl ChannelSender for LocalSender {
    fn send(&mut self, message: Message) -> Result<(), Disconnected> {
        let shared = &*self.shared;
        let mut state = shared.lock();
        let mut message = message;
        let mut waited_since: Option<Instant> = None;
        while let Err(back) = offer(&mut state, self.channel, &shared.closed, &mut self.spare, message)? {
            message = back;
            let waits = &mut state.channels[self.channel].waits;
            if waited_since.is_none() {
                waited_since = Some(Instant::now());
                waits.blocked_sends += 1;
            }
            waits.waiting += 1;
            state = shared.writable[self.channel].wait(state).unwrap_or_else(|p| p.into_inner());
            let waits = &mut state.channels[self.channel].waits;
            waits.waiting -= 1;
            waits.wakeups += 1;
        }
        if let Some(since) = waited_since {
            self.blocked_ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        shared.readable.notify_one();
        Ok(())
    }

    fn try_send(&mut self, message: Message) -> Result<Result<(), Message>, Disconnected> {
        let shared = &*self.shared;
        let taken = offer(&mut shared.lock(), self.channel, &shared.closed, &mut self.spare, message)?;
        if taken.is_ok() {
            shared.readable.notify_one();
        }
        Ok(taken)
    }

    fn spare(&mut self) -> Option<RecordBatch> {
        self.spare.take()
    }

    fn wait_taken(&mut self) -> Result<(), Disconnected> {
        let shared = &*self.shared;
        let mut state = shared.lock();
        loop {
            if shared.closed.load(Ordering::SeqCst) {
                return Err(Disconnected);
            }
            // Every buffer taken returns its credit at once (threshold 1), which wakes this
            // channel's sender; a barrier that overtook needs no credit and is not waited for.
            let channel = &state.channels[self.channel];
            if channel.receiver.in_use() == 0 && channel.sender.backlog() == 0 {
                return Ok(());
            }
            state = shared.writable[self.channel].wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// In-process receiving end.
pub struct LocalInputGate {
    shared: Arc<LocalGateShared>,
    channels: usize,
    blocked: Vec<bool>,
    /// The channel of the `Data` message the task holds, whose credit has not come back yet.
    lent: Option<usize>,
    /// Per channel, what the barrier last received from it overtook.
    overtaken: Vec<Vec<Message>>,
}

impl std::fmt::Debug for LocalInputGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalInputGate").field("channels", &self.channels).finish_non_exhaustive()
    }
}

impl InputGate for LocalInputGate {
    fn channels(&self) -> usize {
        self.channels
    }

    fn recycle(&mut self, channel: usize, batch: RecordBatch) {
        if self.lent != Some(channel) {
            return;
        }
        self.lent = None;
        let shared = &*self.shared;
        if shared.lock().channels[channel].consumed(Some(batch)) {
            shared.writable[channel].notify_one();
        }
    }

    fn set_blocked(&mut self, channel: usize, blocked: bool) {
        if let Some(b) = self.blocked.get_mut(channel) {
            *b = blocked;
        }
        // A released channel may hold messages a waiting `recv` should see.
        self.shared.readable.notify_all();
    }

    fn overtake_barriers(&mut self, channel: usize, ids: RangeInclusive<u64>) {
        let shared = &*self.shared;
        let mut state = shared.lock();
        let Some(ch) = state.channels.get_mut(channel) else { return };
        ch.overtaking = Some(ids);
        if ch.overtake_queued() {
            shared.readable.notify_all();
        }
        // A sender waiting for credit with such a barrier in hand may send it now.
        shared.writable[channel].notify_one();
    }

    fn take_overtaken(&mut self, channel: usize) -> Vec<Message> {
        self.overtaken.get_mut(channel).map(std::mem::take).unwrap_or_default()
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<(usize, Message)>, Disconnected> {
        let shared = &*self.shared;
        let deadline = Instant::now() + timeout;
        let mut state = shared.lock();
        // Asking for more means the task is done with what it held.
        if let Some(c) = self.lent.take()
            && state.channels[c].consumed(None)
        {
            shared.writable[c].notify_one();
        }
        loop {
            if shared.closed.load(Ordering::SeqCst) {
                return Err(Disconnected);
            }
            // Barriers that overtook come first, even from a held channel: they exist to jump.
            let n = state.channels.len();
            if let Some(c) = (0..n).find(|&c| !state.channels[c].priority.is_empty())
                && let Some((barrier, copies)) = state.channels[c].priority.pop_front()
            {
                self.overtaken[c] = copies;
                return Ok(Some((c, barrier)));
            }
            // Round robin over channels with data, so one busy channel cannot starve the others.
            let start = state.next;
            let blocked = &self.blocked;
            let ready = |c: usize| !blocked.get(c).copied().unwrap_or(false) && !state.channels[c].wire.is_empty();
            if let Some(c) = (0..n).map(|i| (start + i) % n).find(|&c| ready(c)) {
                state.next = (c + 1) % n;
                let channel = &mut state.channels[c];
                let Some(message) = channel.wire.pop_front() else { continue };
                if matches!(message, Message::Data { .. }) {
                    // Records are read after `recv` returns: the buffer stays the task's.
                    self.lent = Some(c);
                } else if channel.consumed(None) {
                    shared.writable[c].notify_one();
                }
                return Ok(Some((c, message)));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            state = shared.readable.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u8) -> Message {
        let mut b = RecordBatch::default();
        b.push(None, &[n], None);
        Message::Data { side: None, batch: b, watermark: None }
    }

    /// Polls until `done` holds. The deadline only turns a hang into a failure; nothing is timed.
    fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "never {what}");
            std::thread::yield_now();
        }
    }

    /// Waits until channel `c`'s sender is waiting in its `blocks`-th blocked send.
    fn wait_blocked(shared: &LocalGateShared, c: usize, blocks: u64) {
        poll_until(&format!("blocked {blocks} times on channel {c}"), || {
            let w = shared.send_waits(c);
            w.waiting == 1 && w.blocked_sends >= blocks
        });
    }

    #[test]
    fn a_slow_receiver_blocks_the_sender_with_bounded_in_flight_and_loses_nothing() {
        let config = ChannelConfig { capacity: 2, max_queued: 1 };
        let blocked = Arc::new(AtomicU64::new(0));
        let (shared, mut gate, mut senders) = local_gate(1, config, vec![blocked.clone()]);
        let mut tx = senders.pop().unwrap();
        let producer = std::thread::spawn(move || {
            for i in 0..50u8 {
                tx.send(batch(i)).unwrap();
            }
            tx.send(Message::EndOfStream).unwrap();
        });
        let mut got = Vec::new();
        for taken in 1u64.. {
            // The receiver takes a message only once the sender is stuck again (or done): as slow
            // as a receiver can be, whatever the scheduler does.
            poll_until("the sender blocked again or finished", || {
                let w = shared.send_waits(0);
                (w.waiting == 1 && w.blocked_sends >= taken) || producer.is_finished()
            });
            assert!(shared.in_flight(0) <= config.max_in_flight(), "in flight {}", shared.in_flight(0));
            match gate.recv(Duration::from_secs(5)).unwrap() {
                Some((0, Message::Data { batch, .. })) => {
                    got.push(batch.get(0).unwrap().value[0]);
                    gate.recycle(0, batch);
                }
                Some((0, Message::EndOfStream)) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        producer.join().unwrap();
        assert_eq!(got, (0..50).collect::<Vec<u8>>(), "in order, nothing lost or duplicated");
        // 51 messages through 3 slots, each taken only once the sender was stuck: every send from
        // the fourth on found the channel full.
        let waits = shared.send_waits(0);
        assert_eq!(waits.blocked_sends, 51 - config.max_in_flight() as u64, "{waits:?}");
        assert_eq!(waits.waiting, 0);
        assert!(blocked.load(Ordering::Relaxed) > 0, "the sender's wait is timed for metrics");
    }

    #[test]
    fn wait_taken_returns_once_the_task_is_done_with_everything_sent() {
        let config = ChannelConfig { capacity: 2, max_queued: 1 };
        let (shared, mut gate, mut senders) = local_gate(1, config, vec![Arc::default()]);
        let mut tx = senders.pop().unwrap();
        tx.wait_taken().expect("nothing sent: nothing to wait for");
        tx.send(batch(0)).unwrap();
        let (done_tx, done) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let taken = tx.wait_taken();
            done_tx.send(()).unwrap();
            (tx, taken)
        });
        let Some((0, Message::Data { batch: first, .. })) = gate.recv(Duration::ZERO).unwrap() else { panic!() };
        // Received, but the task still holds the batch: the wait cannot be over.
        assert!(done.try_recv().is_err(), "wait_taken returned while the task held the batch");
        gate.recycle(0, first);
        let (mut tx, taken) = waiter.join().unwrap();
        assert_eq!(taken, Ok(()));
        assert_eq!(shared.in_flight(0), 0);
        tx.send(batch(1)).unwrap();
        shared.close();
        assert_eq!(tx.wait_taken(), Err(Disconnected), "a closed gate ends the wait");
    }

    #[test]
    fn closing_wakes_blocked_senders_and_receivers() {
        let config = ChannelConfig { capacity: 1, max_queued: 1 };
        let (shared, mut gate, mut senders) = local_gate(2, config, vec![Arc::default(), Arc::default()]);
        let mut tx = senders.remove(0);
        let (result_tx, result_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Two sends fill the channel; the third blocks until the gate closes.
            let result = (0..3).try_for_each(|i| tx.send(batch(i)));
            result_tx.send(result).unwrap();
        });
        wait_blocked(&shared, 0, 1);
        shared.close();
        let result = result_rx.recv_timeout(Duration::from_secs(30)).expect("closing wakes the blocked sender");
        assert_eq!(result, Err(Disconnected));
        assert_eq!(shared.send_waits(0), SendWaits { waiting: 0, blocked_sends: 1, wakeups: 1 });
        assert_eq!(gate.recv(Duration::from_secs(1)), Err(Disconnected));
    }

    #[test]
    fn a_blocked_channel_delivers_nothing_and_its_sender_runs_out_of_credit() {
        let config = ChannelConfig { capacity: 2, max_queued: 1 };
        let blocked = vec![Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
        let (shared, mut gate, mut senders) = local_gate(2, config, blocked);
        let mut tx1 = senders.pop().unwrap();
        let mut tx0 = senders.pop().unwrap();
        tx0.send(batch(0)).unwrap();
        gate.set_blocked(0, true);
        assert!(gate.recv(Duration::ZERO).unwrap().is_none(), "channel 0 is held");
        tx1.send(batch(1)).unwrap();
        assert!(matches!(gate.recv(Duration::ZERO).unwrap(), Some((1, _))));
        // Channel 0 fills up to its credit and queue, and no further while held.
        let producer = std::thread::spawn(move || {
            for i in 2..10u8 {
                tx0.send(batch(i)).unwrap();
            }
        });
        wait_blocked(&shared, 0, 1);
        assert_eq!(shared.in_flight(0), config.max_in_flight(), "full, and not beyond");
        assert!(gate.recv(Duration::ZERO).unwrap().is_none(), "a held channel delivers nothing, even when full");
        assert_eq!(shared.send_waits(0).blocked_sends, 1);
        gate.set_blocked(0, false);
        let mut got = Vec::new();
        while got.len() < 9 {
            if let Some((0, Message::Data { batch, .. })) = gate.recv(Duration::from_secs(5)).unwrap() {
                got.push(batch.get(0).unwrap().value[0]);
            }
        }
        producer.join().unwrap();
        assert_eq!(got, (0..10u8).filter(|i| *i != 1).collect::<Vec<_>>(), "in order, nothing lost");
    }

    #[test]
    fn receiving_wakes_only_the_sender_whose_credit_came_back() {
        let config = ChannelConfig { capacity: 1, max_queued: 1 };
        let (shared, mut gate, senders) = local_gate(2, config, vec![Arc::default(), Arc::default()]);
        let producers: Vec<_> = senders
            .into_iter()
            .map(|mut tx| std::thread::spawn(move || (0..10u8).try_for_each(|i| tx.send(batch(i)))))
            .collect();
        for c in 0..2 {
            wait_blocked(&shared, c, 1);
        }
        gate.set_blocked(1, true);
        // Each message taken from channel 0 frees one of its buffers: its sender moves on and
        // blocks again; channel 1's sender must sleep through all of it.
        for taken in 1..=5 {
            let Some((0, Message::Data { batch, .. })) = gate.recv(Duration::from_secs(5)).unwrap() else {
                panic!("expected data from channel 0")
            };
            gate.recycle(0, batch);
            wait_blocked(&shared, 0, taken + 1);
        }
        assert_eq!(shared.send_waits(1), SendWaits { waiting: 1, blocked_sends: 1, wakeups: 0 });
        assert!(shared.send_waits(0).wakeups >= 5);
        shared.close();
        for producer in producers {
            assert_eq!(producer.join().unwrap(), Err(Disconnected));
        }
    }

    #[test]
    fn a_buffer_is_credit_held_until_handed_back_and_then_refilled_by_its_sender() {
        let config = ChannelConfig { capacity: 1, max_queued: 1 };
        let (shared, mut gate, mut senders) = local_gate(1, config, vec![Arc::default()]);
        let mut tx = senders.pop().unwrap();
        let mut big = RecordBatch::with_capacity(64, 4096);
        big.push(None, b"first", None);
        tx.send(Message::Data { side: None, batch: big, watermark: None }).unwrap();
        tx.send(batch(1)).unwrap();
        assert_eq!(tx.spare(), None, "nothing recycled yet");
        let Some((0, Message::Data { batch: first, .. })) = gate.recv(Duration::ZERO).unwrap() else { panic!() };
        // The task still reads `first`: its credit is out, so the queued message stays queued.
        assert_eq!(shared.in_flight(0), 1);
        let allocated = first.allocated_bytes();
        gate.recycle(0, first);
        assert_eq!(shared.in_flight(0), 1, "the credit came back and moved the queued message onto the wire");
        tx.send(batch(2)).unwrap();
        let spare = tx.spare().expect("the recycled buffer came back with the credit");
        assert!(spare.is_empty());
        assert_eq!(spare.allocated_bytes(), allocated, "the same allocation, not a new one");
        // A batch the task keeps (a side output passed on) returns its credit at the next recv.
        let Some((0, Message::Data { batch: kept, .. })) = gate.recv(Duration::ZERO).unwrap() else { panic!() };
        assert_eq!(kept.get(0).unwrap().value, [1]);
        let Some((0, Message::Data { batch: next, .. })) = gate.recv(Duration::ZERO).unwrap() else { panic!() };
        assert_eq!(next.get(0).unwrap().value, [2]);
        gate.recycle(0, kept);
        assert_eq!(tx.spare(), None, "a batch recycled out of turn is dropped, not credited twice");
    }

    fn values(messages: &[Message]) -> Vec<u8> {
        messages
            .iter()
            .filter_map(|m| match m {
                Message::Data { batch, .. } => Some(batch.get(0).unwrap().value[0]),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_overtaking_barrier_jumps_the_queue_with_copies_of_what_it_overtook() {
        let config = ChannelConfig { capacity: 2, max_queued: 1 };
        let (shared, mut gate, mut senders) = local_gate(1, config, vec![Arc::default()]);
        let mut tx = senders.pop().unwrap();
        gate.overtake_barriers(0, 0..=u64::MAX);
        // Two on the wire (credit 2), one queued; a further send would block, the barrier does not.
        for i in 0..3 {
            tx.send(batch(i)).unwrap();
        }
        tx.send(Message::Barrier(1)).unwrap();
        assert_eq!(shared.send_waits(0).blocked_sends, 0, "the barrier needed no credit");
        assert_eq!(gate.recv(Duration::ZERO).unwrap(), Some((0, Message::Barrier(1))));
        assert_eq!(values(&gate.take_overtaken(0)), [0, 1, 2]);
        assert!(gate.take_overtaken(0).is_empty(), "taken once");
        let mut got = Vec::new();
        while let Some((0, m)) = gate.recv(Duration::ZERO).unwrap() {
            got.push(m);
        }
        assert_eq!(values(&got), [0, 1, 2], "the records themselves still arrive, in order");
    }

    #[test]
    fn a_barrier_already_queued_or_waiting_for_credit_overtakes_once_asked() {
        let config = ChannelConfig { capacity: 1, max_queued: 1 };
        let (shared, mut gate, mut senders) = local_gate(2, config, vec![Arc::default(), Arc::default()]);
        let mut tx1 = senders.pop().unwrap();
        let mut tx0 = senders.pop().unwrap();
        // Channel 0: one on the wire, the barrier queued behind it.
        tx0.send(batch(0)).unwrap();
        tx0.send(Message::Barrier(5)).unwrap();
        // Channel 1: wire and queue full; the barrier's send waits for credit.
        tx1.send(batch(10)).unwrap();
        tx1.send(batch(11)).unwrap();
        let waiting = std::thread::spawn(move || tx1.send(Message::Barrier(5)));
        wait_blocked(&shared, 1, 1);
        gate.overtake_barriers(0, 5..=5);
        gate.overtake_barriers(1, 5..=5);
        waiting.join().unwrap().unwrap();
        let mut barriers = Vec::new();
        for _ in 0..2 {
            let Some((c, Message::Barrier(5))) = gate.recv(Duration::from_secs(5)).unwrap() else { panic!() };
            barriers.push((c, values(&gate.take_overtaken(c))));
        }
        barriers.sort();
        assert_eq!(barriers, [(0, vec![0]), (1, vec![10, 11])]);
        let mut rest = Vec::new();
        while let Some((_, m)) = gate.recv(Duration::ZERO).unwrap() {
            rest.push(m);
        }
        let mut rest = values(&rest);
        rest.sort();
        assert_eq!(rest, [0, 10, 11], "nothing lost, no barrier twice");
    }

    #[test]
    fn recv_times_out_and_serves_channels_round_robin() {
        let (_shared, mut gate, mut senders) =
            local_gate(2, ChannelConfig::default(), vec![Arc::default(), Arc::default()]);
        assert_eq!(gate.recv(Duration::from_millis(10)).unwrap(), None);
        for _ in 0..2 {
            senders[0].send(batch(0)).unwrap();
            senders[1].send(batch(1)).unwrap();
        }
        let order: Vec<usize> = (0..4).map(|_| gate.recv(Duration::ZERO).unwrap().unwrap().0).collect();
        assert_eq!(order, [0, 1, 0, 1]);
    }
}
