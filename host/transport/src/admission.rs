//! What a peer may make a node hold without the node having asked for it, decided without I/O
//! (the QUIC shell feeds these state machines and carries out what they answer).
//!
//! Two things a peer can try:
//!
//! - **Streams nobody asked for.** Every stream is accepted before its header says which
//!   channel it is for, and it may then wait for that channel to be registered. Per connection
//!   [`PendingStreams`] lets a bounded number wait at once; one more is refused at once, and a
//!   connection that had as many refused as it may keep waiting is dropped.
//! - **Frames larger than the buffers it was granted.** A receiver grants one credit per buffer
//!   ([`crate::credit`]), and a sender cuts its batches into frames of at most
//!   [`FRAME_TARGET_BYTES`]; only a frame of one large record is larger (up to
//!   [`eddy_core::limits::MAX_FRAME_BYTES`]). Such an *oversized* frame needs the channel's
//!   whole credit: a sender sends one only when the receiver has given back every buffer it
//!   sent ([`may_send`]), and a receiver refuses one that arrives while it holds any
//!   ([`admit_frame`]) and gives its buffer back only once the subtask took it. So a channel
//!   has at most one oversized frame anywhere in the receiving node, and what a peer can make
//!   a node hold per channel is [`eddy_core::limits::max_channel_bytes`].
//!
//! Why this is per channel and not one pool per peer: a pool shared by a peer's channels can
//! deadlock a job. With aligned checkpoints a subtask holds back every channel that delivered
//! barrier `n` until all have; frames queued behind the barrier on those channels would keep
//! the pool, and a channel whose frame before its barrier needs the pool would wait for them,
//! for ever. Waiting inside QUIC instead (not reading a stream) is no better: bytes left unread
//! count against the connection's window, so a few stalled streams stall all of them. Here an
//! oversized frame waits only for its own channel's consumer, the way any buffer waits for
//! credit, so no channel waits for another.

use eddy_core::limits::FRAME_TARGET_BYTES;

/// What to do with a stream just accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamVerdict {
    /// Let it wait for its header and registration.
    Wait,
    /// Refuse it at once: too many wait already.
    Refuse,
    /// Refuse it and close the connection: it has been refused too often.
    DropPeer,
}

/// Per connection: the streams that wait for their header or their registration.
#[derive(Debug, Clone)]
pub struct PendingStreams {
    limit: u32,
    pending: u32,
    refused: u32,
}

impl PendingStreams {
    /// At most `limit` streams waiting at once (at least 1); the connection is dropped once it
    /// had `limit` refused.
    pub fn new(limit: u32) -> Self {
        Self { limit: limit.max(1), pending: 0, refused: 0 }
    }

    /// A stream was accepted.
    pub fn on_accepted(&mut self) -> StreamVerdict {
        if self.pending < self.limit {
            self.pending += 1;
            return StreamVerdict::Wait;
        }
        self.refused = self.refused.saturating_add(1);
        if self.refused >= self.limit { StreamVerdict::DropPeer } else { StreamVerdict::Refuse }
    }

    /// A stream that was let wait no longer does (claimed, refused after its wait, or gone).
    pub fn on_settled(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }

    /// Streams waiting now.
    pub fn pending(&self) -> u32 {
        self.pending
    }

    /// Streams refused so far because too many waited.
    pub fn refused(&self) -> u32 {
        self.refused
    }
}

/// Whether a frame of `len` bytes (as its length prefix counts them) is above the size credit
/// is meant for, and so needs the channel's whole credit.
pub fn is_oversized(len: u32) -> bool {
    len as usize > FRAME_TARGET_BYTES
}

/// A sender broke the rule for oversized frames: the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a frame of {len} bytes (above the {FRAME_TARGET_BYTES}-byte frame target, so it needs the channel's whole credit) arrived while {in_use} of its buffers were held"
)]
pub struct OversizedViolation {
    /// The frame's announced length.
    pub len: u32,
    /// Buffers of the channel the receiver still held.
    pub in_use: u32,
}

/// The receiver's rule: a frame announcing `len` bytes may arrive while the receiver holds
/// `in_use` of the channel's buffers (those it has not given back yet)? Checked on the length
/// prefix, before the body is read.
pub fn admit_frame(len: u32, in_use: u32) -> Result<(), OversizedViolation> {
    if is_oversized(len) && in_use > 0 { Err(OversizedViolation { len, in_use }) } else { Ok(()) }
}

/// The sender's rule: may it send a frame of `len` bytes now, holding `credit` of the
/// `full_credit` the receiver granted at first? An oversized frame waits until every buffer
/// sent before it came back; any other only needs a credit.
pub fn may_send(len: u32, credit: u32, full_credit: u32) -> bool {
    credit > 0 && (!is_oversized(len) || credit >= full_credit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::{CreditReceiver, CreditSender};
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn streams_past_the_limit_are_refused_and_a_peer_refused_as_often_is_dropped() {
        let mut streams = PendingStreams::new(3);
        assert_eq!([(); 3].map(|()| streams.on_accepted()), [StreamVerdict::Wait; 3]);
        assert_eq!(streams.on_accepted(), StreamVerdict::Refuse);
        assert_eq!(streams.pending(), 3, "a refused stream never waited");
        streams.on_settled();
        assert_eq!(streams.on_accepted(), StreamVerdict::Wait, "room again once one settled");
        assert_eq!(streams.on_accepted(), StreamVerdict::Refuse);
        assert_eq!(streams.on_accepted(), StreamVerdict::DropPeer, "the third refusal of three");
        assert_eq!(streams.refused(), 3);
    }

    #[test]
    fn settling_more_than_waited_never_underflows() {
        let mut streams = PendingStreams::new(0);
        streams.on_settled();
        assert_eq!(streams.on_accepted(), StreamVerdict::Wait, "the limit is at least 1");
        assert_eq!(streams.on_accepted(), StreamVerdict::DropPeer);
    }

    #[test]
    fn an_oversized_frame_needs_the_whole_credit_and_an_empty_channel() {
        let big = FRAME_TARGET_BYTES as u32 + 1;
        let target = FRAME_TARGET_BYTES as u32;
        assert!(may_send(target, 1, 8), "a frame at the target takes one credit");
        assert!(!may_send(target, 0, 8));
        assert!(!may_send(big, 7, 8), "one buffer is still out");
        assert!(may_send(big, 8, 8));
        assert_eq!(admit_frame(target, 7), Ok(()));
        assert_eq!(admit_frame(big, 0), Ok(()));
        let err = admit_frame(big, 2).expect_err("two buffers held");
        assert_eq!(err, OversizedViolation { len: big, in_use: 2 });
        assert!(err.to_string().contains("needs the channel's whole credit"), "{err}");
    }

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Produce,
        Transmit,
        Deliver,
        Consume,
        ReturnCredit,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Produce),
            Just(Step::Transmit),
            Just(Step::Deliver),
            Just(Step::Consume),
            Just(Step::ReturnCredit),
        ]
    }

    proptest! {
        /// A sender following `may_send` and a receiver checking `admit_frame` under any
        /// schedule: no frame is refused, the receiver never holds two oversized frames of the
        /// channel, and every frame arrives, in order.
        #[test]
        fn an_honest_sender_is_never_refused_and_holds_one_oversized_frame_at_most(
            capacity in 1u32..6,
            oversized in proptest::collection::vec(proptest::bool::ANY, 1..30),
            schedule in proptest::collection::vec(step(), 0..300),
        ) {
            let sizes: Vec<u32> = oversized.iter()
                .map(|&o| if o { FRAME_TARGET_BYTES as u32 * 4 } else { 100 })
                .collect();
            let mut sender = CreditSender::new(2);
            let mut receiver = CreditReceiver::new(capacity, 1);
            sender.on_credit(receiver.initial_credit());
            let full = sender.credit();
            let (mut wire, mut credits) = (VecDeque::new(), VecDeque::new());
            let (mut held, mut received, mut produced) = (VecDeque::new(), Vec::new(), 0);
            let drain = [Step::Produce, Step::Transmit, Step::Deliver, Step::Consume, Step::ReturnCredit];
            for s in schedule.into_iter().chain(drain.iter().copied().cycle().take(20 * sizes.len())) {
                match s {
                    Step::Produce if produced < sizes.len() => {
                        if sender.enqueue(produced).is_ok() { produced += 1; }
                    }
                    Step::Transmit => {
                        let front = sender.queued().next().map(|&i| sizes[i]);
                        if front.is_some_and(|len| may_send(len, sender.credit(), full))
                            && let Some(i) = sender.poll_send()
                        {
                            wire.push_back(i);
                        }
                    }
                    Step::Deliver => {
                        if let Some(i) = wire.pop_front() {
                            prop_assert_eq!(admit_frame(sizes[i], receiver.in_use()), Ok(()));
                            prop_assert!(receiver.on_buffer().is_ok());
                            held.push_back(i);
                        }
                    }
                    Step::Consume => {
                        if let Some(i) = held.pop_front() {
                            received.push(i);
                            if let Some(c) = receiver.on_consumed() { credits.push_back(c); }
                        }
                    }
                    Step::ReturnCredit => { if let Some(c) = credits.pop_front() { sender.on_credit(c); } }
                    Step::Produce => {}
                }
                let big = held.iter().chain(wire.iter()).filter(|&&i| is_oversized(sizes[i])).count();
                prop_assert!(big <= 1, "{big} oversized frames in flight on one channel");
            }
            prop_assert_eq!(received, (0..sizes.len()).collect::<Vec<_>>());
        }
    }
}
