//! The sending end of a channel to a subtask on another node: the task thread queues messages
//! under a mutex ([`CreditSender`]), an async writer drains the queue against the credit the
//! receiver grants, and a reader takes the credit frames.
//!
//! Every frame written is at most [`MAX_FRAME_BYTES`]: a batch whose frame would pass the
//! target size or record count ([`needs_cutting`]) is cut first ([`split_batch`]), and a frame
//! still above the target (one large record) waits until the receiver gave back every buffer
//! ([`may_send`]).

use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use eddy_core::RecordBatch;
use eddy_core::limits::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::sync::Notify;

use super::node::{CODE_STOPPED, Shared, lock};
use crate::admission::may_send;
use crate::channel::{ChannelSender, Disconnected, Message};
use crate::credit::CreditSender;
use crate::frame::{Decoder, Frame, MAX_FRAME_BYTES, frame_len, needs_cutting, split_batch};

struct SenderState {
    /// Messages with their frames' lengths.
    credit: CreditSender<(Message, u32)>,
    /// The most credit ever held: what the receiver granted at first, so all of it back means
    /// every buffer sent came back.
    full_credit: u32,
    /// Why the link cannot carry more (peer gone, stream reset).
    closed: Option<String>,
    /// The task let go of its sender: what is queued still goes out, then the stream ends.
    let_go: bool,
}

pub(super) struct SenderShared {
    state: Mutex<SenderState>,
    /// The queue has room (or the link closed).
    room: Condvar,
    /// Something to write (a message, or credit for a queued one).
    work: Notify,
}

/// The sending end of a channel to a subtask on another node.
pub struct RemoteSender {
    shared: Arc<SenderShared>,
    peer: String,
}

impl std::fmt::Debug for RemoteSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSender").field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl RemoteSender {
    pub(super) fn start(
        node: &Arc<Shared>,
        conn: Connection,
        peer: String,
        send: SendStream,
        recv: RecvStream,
    ) -> Self {
        let shared = Arc::new(SenderShared {
            state: Mutex::new(SenderState {
                credit: CreditSender::new(node.tuning.max_queued),
                full_credit: 0,
                closed: None,
                let_go: false,
            }),
            room: Condvar::new(),
            work: Notify::new(),
        });
        node.handle.spawn(write_loop(shared.clone(), send));
        node.handle.spawn(credit_loop(shared.clone(), node.clone(), conn, peer.clone(), recv));
        Self { shared, peer }
    }

    pub(super) fn shared(&self) -> &Arc<SenderShared> {
        &self.shared
    }

    /// Queues one frame's message, waiting for room (backpressure).
    fn enqueue(&mut self, message: Message, len: usize) -> Result<(), Disconnected> {
        if len > MAX_FRAME_BYTES as usize {
            // Only a record past the key and value limits gets here: refusing it fails this
            // channel's job with the reason, where sending it would get this node dropped by
            // the receiver, and every other job between the two with it.
            let reason = format!(
                "a frame of {len} bytes, more than the {MAX_FRAME_BYTES} a receiver reads (a record's key and value are at most {MAX_KEY_BYTES} and {MAX_VALUE_BYTES} bytes)"
            );
            tracing::warn!(peer = %self.peer, reason, "refusing to send");
            self.shared.close(reason);
            return Err(Disconnected);
        }
        let mut state = lock(&self.shared.state);
        let mut queued = (message, len as u32);
        loop {
            if let Some(reason) = &state.closed {
                tracing::debug!(peer = %self.peer, reason, "send on a closed link");
                return Err(Disconnected);
            }
            match state.credit.enqueue(queued) {
                Ok(()) => break,
                Err(back) => {
                    queued = back;
                    state = self.shared.room.wait(state).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
        drop(state);
        self.shared.work.notify_one();
        Ok(())
    }
}

impl Drop for RemoteSender {
    fn drop(&mut self) {
        lock(&self.shared.state).let_go = true;
        self.shared.work.notify_one();
    }
}

impl ChannelSender for RemoteSender {
    fn send(&mut self, message: Message) -> Result<(), Disconnected> {
        let len = frame_len(&message);
        if !needs_cutting(&message, len) {
            return self.enqueue(message, len);
        }
        let Message::Data { side, batch, watermark } = message else { return self.enqueue(message, len) };
        // Records in order, the watermark after the last of them; a batch of no records (a
        // buffer nothing refers to) still carries its watermark.
        let mut pieces = split_batch(&batch, side.as_deref());
        if pieces.is_empty() {
            pieces.push(RecordBatch::default());
        }
        let last = pieces.len() - 1;
        for (i, batch) in pieces.into_iter().enumerate() {
            let piece = Message::Data { side: side.clone(), batch, watermark: watermark.filter(|_| i == last) };
            let len = frame_len(&piece);
            self.enqueue(piece, len)?;
        }
        Ok(())
    }
}

impl SenderShared {
    pub(super) fn close(&self, reason: String) {
        lock(&self.state).closed.get_or_insert(reason);
        self.room.notify_all();
        self.work.notify_one();
    }

    /// The next message to write and the backlog behind it, if credit allows one now.
    fn next(&self) -> Option<(Message, u32)> {
        let mut state = lock(&self.state);
        let (credit, full) = (state.credit.credit(), state.full_credit);
        if !state.credit.queued().next().is_some_and(|(_, len)| may_send(*len, credit, full)) {
            return None;
        }
        let (message, _) = state.credit.poll_send()?;
        Some((message, state.credit.backlog() as u32))
    }
}

async fn write_loop(shared: Arc<SenderShared>, mut send: SendStream) {
    let mut size = 64;
    loop {
        shared.work.notified().await;
        loop {
            let Some((message, backlog)) = shared.next() else {
                // The link closed (the receiver is gone), or the task let go of its sender with
                // nothing left to send and no end-of-stream sent (the job stopped): reset the
                // stream so the receiver learns at once, and end. A queued end-of-stream of a
                // task that let go still waits for its credit.
                let state = lock(&shared.state);
                if state.closed.is_some() || (state.let_go && state.credit.backlog() == 0) {
                    drop(state);
                    let _ = send.reset(VarInt::from_u32(CODE_STOPPED));
                    return;
                }
                break;
            };
            shared.room.notify_all();
            let end = message == Message::EndOfStream;
            // Encoded into a buffer of its own that quinn takes as it is (no copy of the
            // frame), sized like the last one: a channel's frames are mostly alike.
            let mut wire = Vec::with_capacity(size);
            Frame::Message { message, backlog }.encode(&mut wire);
            size = wire.len();
            if let Err(e) = send.write_chunk(Bytes::from(wire)).await {
                return shared.close(e.to_string());
            }
            if end {
                let _ = send.finish();
                return shared.close("end of stream sent".into());
            }
        }
    }
}

async fn credit_loop(
    shared: Arc<SenderShared>,
    node: Arc<Shared>,
    conn: Connection,
    peer: String,
    mut recv: RecvStream,
) {
    let decoder = Decoder::default();
    let mut buf = Vec::new();
    loop {
        match recv.read_chunk(64 << 10, true).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
            Ok(None) => return shared.close("the receiver finished the link".into()),
            Err(e) => return shared.close(e.to_string()),
        }
        let mut at = 0;
        loop {
            match decoder.decode(&buf[at..]) {
                Ok(Some((Frame::Credit(n), used))) => {
                    at += used;
                    let mut state = lock(&shared.state);
                    state.credit.on_credit(n);
                    state.full_credit = state.full_credit.max(state.credit.credit());
                    drop(state);
                    shared.work.notify_one();
                }
                Ok(Some((Frame::Message { .. }, _))) => {
                    let reason = "a message frame on a receiver's credit stream".to_owned();
                    node.drop_peer(&conn, &peer, &reason);
                    return shared.close(reason);
                }
                Ok(None) => break,
                Err(e) => {
                    node.drop_peer(&conn, &peer, &e.to_string());
                    return shared.close(e.to_string());
                }
            }
        }
        buf.drain(..at);
    }
}
