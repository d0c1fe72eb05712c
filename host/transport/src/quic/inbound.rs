//! The streams a node accepts: each reads its header (no further), waits for its channel or
//! side stream to be registered, and, once claimed, is pumped into the registered local
//! channel under credit.
//!
//! Until a stream is claimed it is a task holding at most its header
//! ([`eddy_core::limits::MAX_STREAM_HEADER_BYTES`]), counted against its connection's
//! [`crate::admission::PendingStreams`], for at most [`Tuning::header_timeout`] and then
//! [`Tuning::registration_timeout`]; what its peer sends past the header stays unread in QUIC.
//!
//! [`Tuning::header_timeout`]: super::Tuning::header_timeout
//! [`Tuning::registration_timeout`]: super::Tuning::registration_timeout

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use eddy_core::limits::READ_CHUNK_BYTES;
use quinn::{Connection, RecvStream, SendStream, VarInt};

use super::link::{Header, LinkId};
use super::node::{CODE_STOPPED, Registered, Shared, lock};
use super::registry::Unregistered;
use crate::admission::{PendingStreams, admit_frame, is_oversized};
use crate::channel::{ChannelSender, Message};
use crate::credit::CreditReceiver;
use crate::frame::{Decoder, Frame, announced_len};

/// A stream counted as waiting (for its header or its registration) until this is dropped.
pub(super) struct Waiting {
    shared: Arc<Shared>,
    pending: Arc<Mutex<PendingStreams>>,
}

impl Waiting {
    pub(super) fn new(shared: &Arc<Shared>, pending: Arc<Mutex<PendingStreams>>) -> Self {
        shared.waiting_streams.fetch_add(1, Ordering::Relaxed);
        Self { shared: shared.clone(), pending }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        lock(&self.pending).on_settled();
        self.shared.waiting_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes an inbound stream holds, mirrored into the node's [`super::InboundStats`].
struct Held {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Held {
    fn set(&mut self, bytes: usize) {
        let bytes = bytes as u64;
        if bytes > self.bytes {
            self.shared.buffered_bytes.fetch_add(bytes - self.bytes, Ordering::Relaxed);
        } else {
            self.shared.buffered_bytes.fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// Why an inbound link ended early.
enum LinkEnd {
    /// The peer broke the protocol: drop it.
    Protocol(String),
    /// The stream or connection went away.
    Lost(String),
    /// The local gate closed (job stopping): not the peer's fault.
    Stopped,
}

/// One accepted stream. Once claimed, an async reader decodes frames and checks them against
/// the credit it granted, and hands them to the registered local channel itself while that
/// channel has room ([`LinkState`]). Otherwise a thread hands them over, blocking on the
/// channel's credit, and reports each hand-over so the reader grants the buffer again. The
/// reader keeps reading while the thread is blocked, so a peer that sends beyond its credit
/// is caught.
pub(super) struct Inbound {
    shared: Arc<Shared>,
    conn: Connection,
    peer: String,
    send: SendStream,
    recv: RecvStream,
    buf: Vec<u8>,
    held: Held,
}

/// Frames read but not yet given back (their buffers), oldest first: their lengths, and the
/// sum.
#[derive(Default)]
struct Custody {
    lens: VecDeque<usize>,
    bytes: usize,
}

impl Inbound {
    pub(super) fn new(shared: Arc<Shared>, conn: Connection, peer: String, send: SendStream, recv: RecvStream) -> Self {
        let held = Held { shared: shared.clone(), bytes: 0 };
        Self { shared, conn, peer, send, recv, buf: Vec::new(), held }
    }

    /// Reads the header within the header timeout, claims what it names within the
    /// registration timeout, and serves it.
    pub(super) async fn run(mut self, waiting: Waiting) {
        let header_timeout = self.shared.tuning.header_timeout;
        let header = match tokio::time::timeout(header_timeout, self.header()).await {
            Ok(Ok(header)) => header,
            Ok(Err(LinkEnd::Protocol(reason))) => return self.shared.drop_peer(&self.conn, &self.peer, &reason),
            Ok(Err(_)) => return,
            Err(_) => return self.refuse(&format!("no stream header within {header_timeout:?}")),
        };
        let deadline = tokio::time::Instant::now() + self.shared.tuning.registration_timeout;
        match header {
            Header::Link(link) => {
                let claim = self.shared.inbox.claim(&link, &self.peer, deadline);
                let Some(claimed) = until_gone(&mut self.recv, claim).await else { return };
                drop(waiting);
                match claimed {
                    Ok(into) => self.serve(link, into).await,
                    Err(Unregistered::Missing) => {
                        self.refuse(&format!("a stream for {link:?}, which is not registered here"))
                    }
                    Err(Unregistered::OtherPeer(expected)) => {
                        let reason = format!("a stream for {link:?}, which `{expected}` feeds");
                        self.shared.drop_peer(&self.conn, &self.peer, &reason);
                    }
                }
            }
            Header::Side(name) => {
                let claim = self.shared.sides.claim(&name, &self.peer, deadline);
                let Some(claimed) = until_gone(&mut self.recv, claim).await else { return };
                drop(waiting);
                match claimed {
                    Ok(handler) => handler(&self.peer, Vec::new(), self.send, self.recv),
                    Err(Unregistered::Missing) => {
                        self.refuse(&format!("a side stream `{name}`, which nobody here expects"))
                    }
                    Err(Unregistered::OtherPeer(expected)) => {
                        let reason = format!("a side stream `{name}`, which only `{expected}` may open");
                        self.shared.drop_peer(&self.conn, &self.peer, &reason);
                    }
                }
            }
        }
    }

    /// Refuses this stream only.
    fn refuse(mut self, reason: &str) {
        self.shared.refuse(&self.peer, &mut self.send, &mut self.recv, reason);
    }

    /// Reads the stream's header, never a byte past it.
    async fn header(&mut self) -> Result<Header, LinkEnd> {
        loop {
            if let Some(header) = Header::decode(&self.buf).map_err(LinkEnd::Protocol)? {
                self.buf.clear();
                self.held.set(0);
                return Ok(header);
            }
            let wanted = Header::wanted(&self.buf).saturating_sub(self.buf.len()).max(1);
            match self.recv.read_chunk(wanted, true).await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk.bytes),
                Ok(None) => return Err(LinkEnd::Lost("the stream ended inside its header".into())),
                Err(e) => return Err(LinkEnd::Lost(e.to_string())),
            }
            self.held.set(self.buf.len());
        }
    }

    /// Pumps a claimed link and reports how it ended.
    async fn serve(mut self, link: LinkId, into: Registered) {
        match self.pump(into).await {
            Ok(()) => {}
            Err(LinkEnd::Protocol(reason)) => {
                self.shared.drop_peer(&self.conn, &self.peer, &reason);
                self.shared.link_failed(&link, &reason);
            }
            Err(LinkEnd::Lost(reason)) => self.shared.link_failed(&link, &reason),
            Err(LinkEnd::Stopped) => {
                let _ = self.recv.stop(VarInt::from_u32(CODE_STOPPED));
            }
        }
    }

    async fn credit(&mut self, n: u32) -> Result<(), LinkEnd> {
        let mut wire = Vec::with_capacity(9);
        Frame::Credit(n).encode(&mut wire);
        self.send.write_all(&wire).await.map_err(|e| LinkEnd::Lost(e.to_string()))
    }

    /// Decodes every whole frame read so far and hands each to the local channel; true once
    /// end-of-stream came. A frame's length is checked before its body is read: within the
    /// decoder's limit, and oversized only when the channel holds nothing else
    /// ([`admit_frame`]).
    fn decode(&mut self, link: &mut LinkState<'_>) -> Result<bool, LinkEnd> {
        let decoder = Decoder::default();
        let mut at = 0;
        let mut ended = false;
        while !ended {
            let Some(len) = announced_len(&self.buf[at..]) else { break };
            if len <= decoder.max_frame_bytes {
                admit_frame(len, link.receiver.in_use()).map_err(|e| LinkEnd::Protocol(e.to_string()))?;
            }
            let Some((frame, used)) = decoder.decode(&self.buf[at..]).map_err(|e| LinkEnd::Protocol(e.to_string()))?
            else {
                break;
            };
            at += used;
            let Frame::Message { message, backlog: behind } = frame else {
                return Err(LinkEnd::Protocol("a credit frame on a sender's stream".into()));
            };
            link.receiver.on_buffer().map_err(|e| LinkEnd::Protocol(e.to_string()))?;
            link.backlog = behind;
            ended = message == Message::EndOfStream;
            link.custody.lens.push_back(used);
            link.custody.bytes += used;
            link.hand_over(message, is_oversized(len))?;
        }
        self.buf.drain(..at);
        self.held.set(self.buf.len() + link.custody.bytes);
        Ok(ended)
    }

    async fn pump(&mut self, into: Box<dyn ChannelSender>) -> Result<(), LinkEnd> {
        let capacity = self.shared.tuning.channel_capacity;
        let into = Arc::new(Mutex::new(into));
        let (queue, queued) = tokio::sync::mpsc::channel(capacity as usize);
        let (handed_tx, mut handed) = tokio::sync::mpsc::unbounded_channel();
        let thread_into = into.clone();
        std::thread::Builder::new()
            .name(format!("eddy-link-{}", self.peer))
            .spawn(move || {
                eddy_core::batch_thread::enter();
                hand_over(&thread_into, queued, handed_tx)
            })
            .map_err(|e| LinkEnd::Lost(format!("cannot start the link's thread: {e}")))?;
        let mut link = LinkState {
            into: &into,
            queue,
            in_thread: 0,
            receiver: CreditReceiver::new(capacity, 1),
            custody: Custody::default(),
            backlog: 0,
        };
        self.credit(link.receiver.initial_credit()).await?;
        let mut ended = false;
        loop {
            tokio::select! {
                chunk = self.recv.read_chunk(READ_CHUNK_BYTES, true), if !ended => match chunk {
                    Ok(Some(chunk)) => {
                        self.buf.extend_from_slice(&chunk.bytes);
                        ended = self.decode(&mut link)?;
                        if let Some(n) = link.due()
                            && !ended
                        {
                            self.credit(n).await?;
                        }
                    }
                    Ok(None) => return Err(LinkEnd::Lost("the stream ended without end-of-stream".into())),
                    Err(e) => return Err(LinkEnd::Lost(e.to_string())),
                },
                done = handed.recv() => match done {
                    Some(true) => {
                        let credit = link.handed();
                        self.held.set(self.buf.len() + link.custody.bytes);
                        if let Some(n) = credit
                            && !ended
                        {
                            self.credit(n).await?;
                        }
                    }
                    Some(false) => return Err(LinkEnd::Stopped),
                    // The thread handed over end-of-stream and ended.
                    None => {
                        let _ = self.send.finish();
                        return Ok(());
                    }
                },
            }
        }
    }
}

/// A claimed link's hand-over to its local channel: straight from the async reader while the
/// channel has room and nothing waits in the link's thread (no thread hop, no wake-up of the
/// reader to learn it was done), else through the thread, which may block on the channel's
/// credit. Messages reach the channel in the order they were read either way.
struct LinkState<'a> {
    into: &'a Mutex<Box<dyn ChannelSender>>,
    /// To the link's thread.
    queue: tokio::sync::mpsc::Sender<(Message, bool)>,
    /// Messages given to the thread and not yet reported handed over.
    in_thread: usize,
    receiver: CreditReceiver,
    custody: Custody,
    /// Buffers the sender said it holds behind the last one read.
    backlog: u32,
}

impl LinkState<'_> {
    /// Hands `message` over. End-of-stream and oversized messages always go through the
    /// thread (it ends with the one and waits until the subtask took the other).
    fn hand_over(&mut self, message: Message, oversized: bool) -> Result<(), LinkEnd> {
        let mut message = message;
        if self.in_thread == 0 && !oversized && message != Message::EndOfStream {
            match lock(self.into).try_send(message).map_err(|_| LinkEnd::Stopped)? {
                Ok(()) => {
                    // Its credit is granted once the read is decoded ([`Self::due`]); until
                    // then the buffer counts, so a peer sending past its credit is caught.
                    self.release_oldest();
                    self.receiver.free();
                    return Ok(());
                }
                Err(back) => message = back,
            }
        }
        self.in_thread += 1;
        // Never full: the queue holds `capacity` and credit allows no more in use.
        self.queue.try_send((message, oversized)).map_err(|_| LinkEnd::Stopped)?;
        Ok(())
    }

    /// The thread handed the oldest message over: the credit to grant now.
    fn handed(&mut self) -> Option<u32> {
        self.in_thread -= 1;
        self.release_oldest();
        self.receiver.on_consumed().or_else(|| self.receiver.poll_announce(self.backlog > 0))
    }

    /// The credit for the messages the reader handed over itself, in one grant per read.
    fn due(&mut self) -> Option<u32> {
        self.receiver.poll_announce(true)
    }

    fn release_oldest(&mut self) {
        self.custody.bytes -= self.custody.lens.pop_front().unwrap_or(0);
    }
}

/// What `claim` answers, or `None` once the stream's peer reset it or the connection ended:
/// waiting on would keep the stream counted for nothing.
async fn until_gone<T>(recv: &mut RecvStream, claim: impl Future<Output = T>) -> Option<T> {
    tokio::pin!(claim);
    let mut watching = true;
    loop {
        tokio::select! {
            taken = &mut claim => return Some(taken),
            reset = recv.received_reset(), if watching => match reset {
                // Finished after its header: still a stream to claim.
                Ok(None) => watching = false,
                Ok(Some(_)) | Err(_) => return None,
            },
        }
    }
}

/// The link's thread: hands each message to the local channel (blocking on its credit) and
/// reports `true` per message handed over, `false` if the local gate closed. An oversized
/// message is reported only once the subtask took it ([`ChannelSender::wait_taken`]): its
/// buffer, and with it the whole credit the sender needs for the next oversized one, comes
/// back only then, so a channel has at most one oversized frame in the node.
fn hand_over(
    into: &Mutex<Box<dyn ChannelSender>>,
    mut queued: tokio::sync::mpsc::Receiver<(Message, bool)>,
    handed: tokio::sync::mpsc::UnboundedSender<bool>,
) {
    while let Some((message, oversized)) = queued.blocking_recv() {
        let end = message == Message::EndOfStream;
        let ok = {
            let mut into = lock(into);
            into.send(message).is_ok() && (!oversized || into.wait_taken().is_ok())
        };
        if handed.send(ok).is_err() || !ok || end {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_core::RecordBatch;

    /// A local channel that takes messages only while `room` says so, and records them.
    struct Fake {
        room: Arc<Mutex<bool>>,
        taken: Taken,
    }

    type Taken = Arc<Mutex<Vec<Message>>>;

    impl ChannelSender for Fake {
        fn send(&mut self, message: Message) -> Result<(), crate::channel::Disconnected> {
            lock(&self.taken).push(message);
            Ok(())
        }

        fn try_send(&mut self, message: Message) -> Result<Result<(), Message>, crate::channel::Disconnected> {
            if !*lock(&self.room) {
                return Ok(Err(message));
            }
            lock(&self.taken).push(message);
            Ok(Ok(()))
        }
    }

    fn data(n: i64) -> Message {
        Message::Data { side: None, batch: RecordBatch::default(), watermark: Some(n) }
    }

    type ToThread = tokio::sync::mpsc::Receiver<(Message, bool)>;

    fn link_state(into: &Mutex<Box<dyn ChannelSender>>, capacity: u32) -> (LinkState<'_>, ToThread) {
        let (queue, to_thread) = tokio::sync::mpsc::channel(capacity as usize);
        let receiver = CreditReceiver::new(capacity, 1);
        (LinkState { into, queue, in_thread: 0, receiver, custody: Custody::default(), backlog: 0 }, to_thread)
    }

    /// One frame of a read taken in and handed over, as `decode` does.
    fn take(link: &mut LinkState<'_>, message: Message, oversized: bool) {
        link.receiver.on_buffer().expect("within credit");
        link.custody.lens.push_back(10);
        link.custody.bytes += 10;
        link.hand_over(message, oversized).map_err(|_| "stopped").expect("handed over");
    }

    /// A read of one frame; the credit granted after it.
    fn read(link: &mut LinkState<'_>, message: Message, oversized: bool) -> Option<u32> {
        take(link, message, oversized);
        link.due()
    }

    /// A fake channel with room as given: its room switch, what it took, and the channel.
    fn fake(room: bool) -> (Arc<Mutex<bool>>, Taken, Mutex<Box<dyn ChannelSender>>) {
        let (room, taken) = (Arc::new(Mutex::new(room)), Taken::default());
        let into: Mutex<Box<dyn ChannelSender>> =
            Mutex::new(Box::new(Fake { room: room.clone(), taken: taken.clone() }));
        (room, taken, into)
    }

    #[test]
    fn messages_go_straight_to_the_channel_only_while_nothing_waits_in_the_links_thread() {
        let (room, taken, into) = fake(true);
        let (mut link, mut to_thread) = link_state(&into, 8);
        // Room: straight in, its buffer granted again after the read.
        assert_eq!(read(&mut link, data(1), false), Some(1));
        // No room: to the thread, and so is what follows while the thread holds anything,
        // room or not, or it would overtake.
        *lock(&room) = false;
        assert_eq!(read(&mut link, data(2), false), None);
        *lock(&room) = true;
        assert_eq!(read(&mut link, data(3), false), None);
        assert_eq!((link.in_thread, link.custody.bytes), (2, 20));
        // The thread reports both handed over: their buffers come back one by one.
        for _ in 0..2 {
            assert_eq!(link.handed(), Some(1));
        }
        assert_eq!(link.custody.bytes, 0);
        // Nothing waits any more: straight in again, but never an oversized message or the
        // end of the stream (the thread waits for the first to be taken and ends with the other).
        assert_eq!(read(&mut link, data(4), false), Some(1));
        assert_eq!(read(&mut link, data(5), true), None);
        assert_eq!(link.handed(), Some(1));
        assert_eq!(read(&mut link, Message::EndOfStream, false), None);
        assert_eq!(*lock(&taken), vec![data(1), data(4)]);
        let mut through_thread = Vec::new();
        while let Ok((message, oversized)) = to_thread.try_recv() {
            through_thread.push((message, oversized));
        }
        assert_eq!(
            through_thread,
            vec![(data(2), false), (data(3), false), (data(5), true), (Message::EndOfStream, false)]
        );
    }

    /// A hostile peer sends past its credit in one read while the local channel keeps
    /// taking everything: the buffers handed over count until their credit is sent, so the
    /// frame past the credit is a violation, not a free ride on credit never granted.
    #[test]
    fn a_peer_sending_past_its_credit_is_caught_although_the_channel_takes_everything() {
        let (_room, taken, into) = fake(true);
        let (mut link, _to_thread) = link_state(&into, 2);
        for n in 0..2 {
            take(&mut link, data(n), false);
        }
        assert_eq!(lock(&taken).len(), 2, "both went straight in");
        assert!(link.receiver.on_buffer().is_err(), "a third buffer in the same read had no credit");
        // Once the read's credit is granted, the peer may send as many again.
        assert_eq!(link.due(), Some(2));
        assert!(link.receiver.on_buffer().is_ok());
    }
}
