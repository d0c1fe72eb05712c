//! Credit-based flow control between the two ends of one channel, as I/O-free state machines
//! (the same protocol for in-process channels and, later, QUIC streams).
//!
//! The receiver owns `capacity` buffers for the channel and grants one credit per free buffer;
//! the sender ships a buffer only against a credit. A slow consumer therefore stops granting,
//! the sender's bounded queue fills, and [`CreditSender::enqueue`] refuses: backpressure
//! reaches the producing task without unbounded memory anywhere.
//!
//! Sizing: `capacity` buffers of ~32 KiB per channel bound in-flight memory per channel;
//! 2-4 keep the link busy while one buffer is consumed. `announce_threshold` trades
//! credit-message count against latency (1 announces every freed buffer).

use std::collections::VecDeque;

/// The sender exceeded its credit: a protocol violation; the channel must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("buffer arrived without credit ({in_use} of {capacity} buffers already in use)")]
pub struct CreditViolation {
    /// Buffers held when the extra one arrived.
    pub in_use: u32,
    /// Buffers the receiver owns for the channel.
    pub capacity: u32,
}

/// Receiving end: tracks buffers in use and announces freed ones as credit.
#[derive(Debug, Clone)]
pub struct CreditReceiver {
    capacity: u32,
    in_use: u32,
    unannounced: u32,
    announce_threshold: u32,
}

impl CreditReceiver {
    /// A receiver owning `capacity` buffers (at least 1), announcing credit in groups of
    /// `announce_threshold` (clamped to 1..=capacity).
    pub fn new(capacity: u32, announce_threshold: u32) -> Self {
        let capacity = capacity.max(1);
        Self { capacity, in_use: 0, unannounced: 0, announce_threshold: announce_threshold.clamp(1, capacity) }
    }

    /// The credit granted when the channel opens: every buffer.
    pub fn initial_credit(&self) -> u32 {
        self.capacity
    }

    /// A buffer arrived.
    pub fn on_buffer(&mut self) -> Result<(), CreditViolation> {
        // Freed-but-unannounced buffers were never granted back, so they do not count as free.
        if self.in_use + self.unannounced >= self.capacity {
            return Err(CreditViolation { in_use: self.in_use, capacity: self.capacity });
        }
        self.in_use += 1;
        Ok(())
    }

    /// The task finished with a buffer. Returns credit to announce, when enough accumulated.
    pub fn on_consumed(&mut self) -> Option<u32> {
        if self.in_use == 0 {
            return None;
        }
        self.free();
        self.poll_announce(false)
    }

    /// The task finished with a buffer; its credit waits for [`Self::poll_announce`]. Until
    /// then the buffer still counts against the sender, which has not been granted it again.
    pub fn free(&mut self) {
        if self.in_use > 0 {
            self.in_use -= 1;
            self.unannounced += 1;
        }
    }

    /// Credit to announce now: accumulated credit once it reaches the threshold, or any
    /// accumulated credit when `force` (for example on a flush timer, so a trickle of records
    /// never waits for the threshold).
    pub fn poll_announce(&mut self, force: bool) -> Option<u32> {
        if self.unannounced >= self.announce_threshold || (force && self.unannounced > 0) {
            Some(std::mem::take(&mut self.unannounced))
        } else {
            None
        }
    }

    /// Buffers the receiver owns for the channel.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Buffers currently held by the receiving task.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }
}

/// Sending end: a bounded queue drained only against credit.
#[derive(Debug, Clone)]
pub struct CreditSender<B> {
    credit: u32,
    queue: VecDeque<B>,
    max_queued: usize,
}

impl<B> CreditSender<B> {
    /// A sender with no credit yet and room for `max_queued` buffers (at least 1).
    pub fn new(max_queued: usize) -> Self {
        Self { credit: 0, queue: VecDeque::new(), max_queued: max_queued.max(1) }
    }

    /// Credit announced by the receiver.
    pub fn on_credit(&mut self, credit: u32) {
        self.credit = self.credit.saturating_add(credit);
    }

    /// Queues a buffer, or hands it back when the queue is full: the producer must wait
    /// (backpressure) and retry after [`poll_send`](Self::poll_send) made room.
    pub fn enqueue(&mut self, buffer: B) -> Result<(), B> {
        if self.queue.len() >= self.max_queued {
            return Err(buffer);
        }
        self.queue.push_back(buffer);
        Ok(())
    }

    /// The next buffer to put on the wire, if there is one and credit for it.
    pub fn poll_send(&mut self) -> Option<B> {
        if self.credit == 0 {
            return None;
        }
        let buffer = self.queue.pop_front()?;
        self.credit -= 1;
        Some(buffer)
    }

    /// Buffers waiting for credit (the backlog a receiver may use to hand out spare buffers).
    pub fn backlog(&self) -> usize {
        self.queue.len()
    }

    /// The buffers waiting for credit, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = &B> {
        self.queue.iter()
    }

    /// Takes the queued buffer at `index` out of the queue (an event that jumps it): it never
    /// needs credit.
    pub fn remove_queued(&mut self, index: usize) -> Option<B> {
        self.queue.remove(index)
    }

    /// Whether the producer must wait.
    pub fn is_backpressured(&self) -> bool {
        self.queue.len() >= self.max_queued
    }

    /// Unused credit.
    pub fn credit(&self) -> u32 {
        self.credit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn no_credit_no_send() {
        let mut s = CreditSender::new(2);
        s.enqueue(1).unwrap();
        s.enqueue(2).unwrap();
        assert_eq!(s.enqueue(3), Err(3), "queue full: backpressure");
        assert!(s.is_backpressured());
        assert_eq!(s.poll_send(), None);
        s.on_credit(1);
        assert_eq!(s.poll_send(), Some(1));
        assert_eq!(s.poll_send(), None);
        assert_eq!(s.backlog(), 1);
    }

    #[test]
    fn receiver_rejects_buffers_beyond_credit() {
        let mut r = CreditReceiver::new(2, 2);
        assert_eq!(r.initial_credit(), 2);
        r.on_buffer().unwrap();
        r.on_buffer().unwrap();
        assert_eq!(r.on_buffer(), Err(CreditViolation { in_use: 2, capacity: 2 }));
        assert_eq!(r.on_consumed(), None, "below the announce threshold");
        assert!(r.on_buffer().is_err(), "a freed but unannounced buffer was never granted");
        assert_eq!(r.on_consumed(), Some(2));
        r.on_buffer().unwrap();
    }

    #[test]
    fn forced_announce_releases_a_trickle() {
        let mut r = CreditReceiver::new(4, 4);
        r.on_buffer().unwrap();
        assert_eq!(r.on_consumed(), None);
        assert_eq!(r.poll_announce(true), Some(1));
        assert_eq!(r.poll_announce(true), None);
    }

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Produce,
        Transmit,
        Deliver,
        Consume,
        ReturnCredit,
        Tick,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Produce),
            Just(Step::Transmit),
            Just(Step::Deliver),
            Just(Step::Consume),
            Just(Step::ReturnCredit),
            Just(Step::Tick),
        ]
    }

    proptest! {
        /// Sender, network and receiver under an arbitrary schedule: the receiver never sees a
        /// buffer without credit, memory stays bounded, and every buffer arrives once, in order.
        #[test]
        fn flow_control_is_safe_and_lossless(
            capacity in 1u32..5, threshold in 1u32..5, max_queued in 1usize..5,
            schedule in proptest::collection::vec(step(), 0..300),
        ) {
            const TOTAL: u32 = 20;
            let mut sender = CreditSender::new(max_queued);
            let mut receiver = CreditReceiver::new(capacity, threshold);
            sender.on_credit(receiver.initial_credit());
            let (mut wire, mut credits) = (VecDeque::new(), VecDeque::new());
            let (mut held, mut received, mut produced) = (VecDeque::new(), Vec::new(), 0u32);
            // The schedule, then a fair drain so every run must finish.
            let drain = [Step::Produce, Step::Transmit, Step::Deliver, Step::Consume, Step::Tick, Step::ReturnCredit];
            for s in schedule.into_iter().chain(drain.iter().copied().cycle().take(600)) {
                match s {
                    Step::Produce if produced < TOTAL => {
                        if sender.enqueue(produced).is_ok() { produced += 1; }
                    }
                    Step::Transmit => { if let Some(b) = sender.poll_send() { wire.push_back(b); } }
                    Step::Deliver => {
                        if let Some(b) = wire.pop_front() {
                            prop_assert!(receiver.on_buffer().is_ok());
                            held.push_back(b);
                        }
                    }
                    Step::Consume => {
                        if let Some(b) = held.pop_front() {
                            received.push(b);
                            if let Some(c) = receiver.on_consumed() { credits.push_back(c); }
                        }
                    }
                    Step::Tick => { if let Some(c) = receiver.poll_announce(true) { credits.push_back(c); } }
                    Step::ReturnCredit => { if let Some(c) = credits.pop_front() { sender.on_credit(c); } }
                    Step::Produce => {}
                }
                let in_flight = wire.len() as u32 + receiver.in_use();
                prop_assert!(in_flight <= capacity, "{in_flight} buffers in flight with capacity {capacity}");
                prop_assert!(sender.backlog() <= max_queued);
            }
            prop_assert_eq!(received, (0..TOTAL).collect::<Vec<_>>());
        }
    }
}
