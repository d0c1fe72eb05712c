//! Frames: `len u32 | kind u8 | body`, little-endian, `len` counting kind and body.
//!
//! ```text
//! Data         kind 1: flags u8 (1: watermark follows, 2: side output name follows)
//!                      | backlog u32 | [watermark i64] | [side len u16 | side UTF-8]
//!                      | records u32 | data len u32 | data
//!                      | per record: key offset u32 | key len u32 (u32::MAX: no key)
//!                                    | value offset u32 | value len u32 | has ts u8 | ts i64
//! Watermark    kind 2: i64
//! Barrier      kind 3: checkpoint id u64
//! EndOfStream  kind 4: (empty)
//! Credit       kind 5: buffers granted u32
//! ```
//!
//! `backlog` is how many buffers the sender holds queued behind this one, so a receiver with
//! spare buffers can grant more than one at a time.

use eddy_core::limits::{FRAME_BYTES_PER_RECORD, FRAME_TARGET_BYTES};
use eddy_core::{RecordBatch, RecordMeta, Span};

use crate::channel::Message;

/// The largest frame a decoder accepts by default, as its length prefix counts it (kind and
/// body): a frame of one record with its key and value at their limits
/// ([`eddy_core::limits::MAX_FRAME_BYTES`], where it is derived), since a sender cuts every
/// larger batch into frames of at most [`FRAME_TARGET_BYTES`] ([`split_batch`]).
pub const MAX_FRAME_BYTES: u32 = eddy_core::limits::MAX_FRAME_BYTES as u32;

const DATA: u8 = 1;
const WATERMARK: u8 = 2;
const BARRIER: u8 = 3;
const END_OF_STREAM: u8 = 4;
const CREDIT: u8 = 5;

const HAS_WATERMARK: u8 = 1;
const HAS_SIDE: u8 = 2;
const NO_KEY: u32 = u32::MAX;
/// Bytes of one record's entry in a data frame.
const RECORD_BYTES: usize = 4 * 4 + 1 + 8;
const _: () = assert!(RECORD_BYTES == FRAME_BYTES_PER_RECORD);

/// What travels on a channel between processes: a channel's [`Message`] one way, credit the
/// other.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A message of the channel.
    Message {
        /// The message.
        message: Message,
        /// Buffers the sender holds queued behind this one (encoded for data only: an event
        /// reads back with 0).
        backlog: u32,
    },
    /// The receiver grants this many more buffers.
    Credit(u32),
}

impl Frame {
    /// A message with nothing queued behind it.
    pub fn message(message: Message) -> Self {
        Frame::Message { message, backlog: 0 }
    }
}

/// A frame that cannot be read: the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix passes the limit.
    #[error("frame of {len} bytes announced, more than the limit of {limit}")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// The decoder's limit.
        limit: u32,
    },
    /// A kind this version does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The body is shorter or longer than its kind needs.
    #[error("{kind} frame body malformed: {problem}")]
    Malformed {
        /// The frame's kind.
        kind: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl Frame {
    /// Appends the frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        match self {
            Frame::Message { message: Message::Data { side, batch, watermark }, backlog } => {
                out.push(DATA);
                let flags = u8::from(watermark.is_some()) * HAS_WATERMARK + u8::from(side.is_some()) * HAS_SIDE;
                out.push(flags);
                out.extend_from_slice(&backlog.to_le_bytes());
                if let Some(w) = watermark {
                    out.extend_from_slice(&w.to_le_bytes());
                }
                if let Some(side) = side {
                    // Side output names are declared identifiers, far below 64 KiB.
                    let name = &side.as_bytes()[..side.len().min(usize::from(u16::MAX))];
                    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                    out.extend_from_slice(name);
                }
                let (data, records) = batch.parts();
                out.extend_from_slice(&(records.len() as u32).to_le_bytes());
                out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                out.extend_from_slice(data);
                for r in records {
                    let (key_offset, key_len) = r.key.map_or((0, NO_KEY), |k| (k.offset, k.len));
                    for v in [key_offset, key_len, r.value.offset, r.value.len] {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                    out.push(u8::from(r.timestamp.is_some()));
                    out.extend_from_slice(&r.timestamp.unwrap_or(0).to_le_bytes());
                }
            }
            Frame::Message { message: Message::Watermark(w), .. } => {
                out.push(WATERMARK);
                out.extend_from_slice(&w.to_le_bytes());
            }
            Frame::Message { message: Message::Barrier(id), .. } => {
                out.push(BARRIER);
                out.extend_from_slice(&id.to_le_bytes());
            }
            Frame::Message { message: Message::EndOfStream, .. } => out.push(END_OF_STREAM),
            Frame::Credit(n) => {
                out.push(CREDIT);
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        // A batch holds at most u32::MAX bytes (its spans are u32), so this fits but for the
        // per-record table of a batch that large; a sender cuts batches into frames of about
        // a MiB first (`split_batch`).
        let len = u32::try_from(out.len() - start - 4).unwrap_or(u32::MAX);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// The length prefix `message`'s frame will carry (kind and body), without encoding it.
pub fn frame_len(message: &Message) -> usize {
    match message {
        Message::Data { side, batch, watermark } => {
            data_frame_overhead(side.as_deref(), watermark.is_some()) + batch.byte_len() + batch.len() * RECORD_BYTES
        }
        Message::Watermark(_) | Message::Barrier(_) => 1 + 8,
        Message::EndOfStream => 1,
    }
}

/// What a data frame spends besides its data and record table.
fn data_frame_overhead(side: Option<&str>, watermark: bool) -> usize {
    let side = side.map_or(0, |s| 2 + s.len().min(usize::from(u16::MAX)));
    1 + 1 + 4 + usize::from(watermark) * 8 + side + 4 + 4
}

/// Cuts `batch` (bound for a data frame with `side` and, on its last frame, a watermark) into
/// batches whose frames are at most [`FRAME_TARGET_BYTES`] each, records in order; a record
/// whose frame alone is larger goes in a batch of its own. Each record is copied, so bytes of
/// the buffer no record refers to are left behind. A channel buffer counts only keys and
/// values, so a batch of many tiny or empty records can cost far more on the wire than its
/// payload: this is what keeps every frame a sender writes within [`MAX_FRAME_BYTES`].
pub fn split_batch(batch: &RecordBatch, side: Option<&str>) -> Vec<RecordBatch> {
    let overhead = data_frame_overhead(side, true);
    let mut pieces = Vec::new();
    let (mut piece, mut len) = (RecordBatch::default(), overhead);
    for record in batch.iter() {
        let cost = record.key.map_or(0, <[u8]>::len) + record.value.len() + RECORD_BYTES;
        if !piece.is_empty() && len + cost > FRAME_TARGET_BYTES {
            pieces.push(std::mem::take(&mut piece));
            len = overhead;
        }
        piece.push_view(&record);
        len += cost;
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// The length a frame at the start of `buf` announces, once its prefix is there.
pub fn announced_len(buf: &[u8]) -> Option<u32> {
    buf.get(..4).map(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]]))
}

/// Reads frames from bytes received so far.
#[derive(Debug, Clone, Copy)]
pub struct Decoder {
    /// Frames announcing more bytes than this are refused.
    pub max_frame_bytes: u32,
}

impl Default for Decoder {
    fn default() -> Self {
        Self { max_frame_bytes: MAX_FRAME_BYTES }
    }
}

/// Reads fixed-size fields from a frame body, refusing to read past it.
struct Body<'a> {
    kind: &'static str,
    bytes: &'a [u8],
}

impl<'a> Body<'a> {
    fn malformed(&self, problem: impl Into<String>) -> FrameError {
        FrameError::Malformed { kind: self.kind, problem: problem.into() }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FrameError> {
        if self.bytes.len() < n {
            return Err(self.malformed(format!("ends inside {what} ({} of {n} bytes)", self.bytes.len())));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FrameError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, FrameError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, FrameError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    fn end(&self) -> Result<(), FrameError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("{} bytes left over", self.bytes.len())))
        }
    }
}

impl Decoder {
    /// The first frame of `buf` and the bytes it took, `None` if `buf` does not hold a whole
    /// frame yet, or why the stream cannot be read.
    pub fn decode(&self, buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
        let Some(prefix) = buf.get(..4) else { return Ok(None) };
        let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        if len > self.max_frame_bytes {
            return Err(FrameError::TooLarge { len, limit: self.max_frame_bytes });
        }
        let total = 4 + len as usize;
        let Some(frame) = buf.get(4..total) else { return Ok(None) };
        let Some((&kind, body)) = frame.split_first() else {
            return Err(FrameError::Malformed { kind: "empty", problem: "no kind byte".into() });
        };
        let frame = match kind {
            DATA => data(Body { kind: "data", bytes: body })?,
            WATERMARK => {
                fixed(body, "watermark", |b| b.i64("the watermark").map(|w| Frame::message(Message::Watermark(w))))?
            }
            BARRIER => {
                fixed(body, "barrier", |b| b.u64("the checkpoint id").map(|id| Frame::message(Message::Barrier(id))))?
            }
            END_OF_STREAM => fixed(body, "end-of-stream", |_| Ok(Frame::message(Message::EndOfStream)))?,
            CREDIT => fixed(body, "credit", |b| b.u32("the credit").map(Frame::Credit))?,
            other => return Err(FrameError::UnknownKind(other)),
        };
        Ok(Some((frame, total)))
    }
}

/// A frame of fixed fields, with nothing after them.
fn fixed(
    bytes: &[u8],
    kind: &'static str,
    read: impl FnOnce(&mut Body<'_>) -> Result<Frame, FrameError>,
) -> Result<Frame, FrameError> {
    let mut body = Body { kind, bytes };
    let frame = read(&mut body)?;
    body.end()?;
    Ok(frame)
}

fn data(mut body: Body<'_>) -> Result<Frame, FrameError> {
    let flags = body.u8("the flags")?;
    if flags & !(HAS_WATERMARK | HAS_SIDE) != 0 {
        return Err(body.malformed(format!("unknown flags {flags:#04x}")));
    }
    let backlog = body.u32("the backlog")?;
    let watermark = if flags & HAS_WATERMARK != 0 { Some(body.i64("the watermark")?) } else { None };
    let side = if flags & HAS_SIDE != 0 {
        let len = body.u16("the side output's name length")?;
        let name = body.take(usize::from(len), "the side output's name")?;
        Some(String::from_utf8(name.to_vec()).map_err(|_| body.malformed("the side output's name is not UTF-8"))?)
    } else {
        None
    };
    let records = body.u32("the record count")? as usize;
    let data_len = body.u32("the data length")? as usize;
    let data = body.take(data_len, "the data")?.to_vec();
    // The count is checked against the bytes that are there before anything is allocated by it.
    if records.checked_mul(RECORD_BYTES) != Some(body.bytes.len()) {
        return Err(body.malformed(format!("{records} records announced, {} bytes of record table", body.bytes.len())));
    }
    let mut metas = Vec::with_capacity(records);
    for _ in 0..records {
        let (key_offset, key_len) = (body.u32("a key offset")?, body.u32("a key length")?);
        let value = Span { offset: body.u32("a value offset")?, len: body.u32("a value length")? };
        let has_ts = body.u8("a timestamp flag")?;
        let ts = body.i64("a timestamp")?;
        let timestamp = match has_ts {
            0 => None,
            1 => Some(ts),
            other => return Err(body.malformed(format!("timestamp flag {other}"))),
        };
        let key = (key_len != NO_KEY).then_some(Span { offset: key_offset, len: key_len });
        metas.push(RecordMeta { key, value, timestamp });
    }
    let batch =
        RecordBatch::adopt(data, metas).map_err(|_| body.malformed("a record's key or value lies outside the data"))?;
    Ok(Frame::Message { message: Message::Data { side, batch, watermark }, backlog })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = (Option<Vec<u8>>, Vec<u8>, Option<i64>)> {
        (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            proptest::collection::vec(any::<u8>(), 0..16),
            proptest::option::of(any::<i64>()),
        )
    }

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                proptest::collection::vec(record(), 0..8),
                proptest::option::of(any::<i64>()),
                any::<u32>(),
                proptest::option::of("[a-z-]{0,12}")
            )
                .prop_map(|(records, watermark, backlog, side)| {
                    let mut batch = RecordBatch::default();
                    for (k, v, t) in &records {
                        batch.push(k.as_deref(), v, *t);
                    }
                    Frame::Message { message: Message::Data { side, batch, watermark }, backlog }
                }),
            any::<i64>().prop_map(|w| Frame::message(Message::Watermark(w))),
            any::<u64>().prop_map(|id| Frame::message(Message::Barrier(id))),
            Just(Frame::message(Message::EndOfStream)),
            any::<u32>().prop_map(Frame::Credit),
        ]
    }

    proptest! {
        /// A stream of frames reads back as the same frames, in order.
        #[test]
        fn frames_round_trip(frames in proptest::collection::vec(frame(), 0..12)) {
            let mut wire = Vec::new();
            for f in &frames {
                f.encode(&mut wire);
            }
            let (decoder, mut at, mut got) = (Decoder::default(), 0, Vec::new());
            while let Some((f, used)) = decoder.decode(&wire[at..]).expect("valid stream") {
                got.push(f);
                at += used;
            }
            prop_assert_eq!(at, wire.len());
            prop_assert_eq!(got, frames);
        }

        /// Every proper prefix of a frame is "not yet", never an error or a frame.
        #[test]
        fn a_partial_frame_waits_for_more(f in frame()) {
            let mut wire = Vec::new();
            f.encode(&mut wire);
            for cut in 0..wire.len() {
                prop_assert_eq!(Decoder::default().decode(&wire[..cut]), Ok(None));
            }
        }

        /// The length a frame announces is known before it is encoded.
        #[test]
        fn frame_len_is_the_announced_length(f in frame()) {
            let Frame::Message { message, .. } = &f else { return Ok(()) };
            let mut wire = Vec::new();
            f.encode(&mut wire);
            prop_assert_eq!(frame_len(message), wire.len() - 4);
            prop_assert_eq!(announced_len(&wire), Some((wire.len() - 4) as u32));
        }

        /// Cut batches hold the same records in the same order, and every frame of more than
        /// one record is within the target.
        #[test]
        fn a_cut_batch_keeps_its_records_in_order_within_the_target(
            sizes in proptest::collection::vec((0usize..3, 0usize..400_000), 0..12),
            side in proptest::option::of("[a-z]{1,8}"),
        ) {
            let mut batch = RecordBatch::default();
            for (i, (key, value)) in sizes.iter().enumerate() {
                batch.push(Some(&vec![i as u8; *key]), &vec![7; *value], Some(i as i64));
            }
            let pieces = split_batch(&batch, side.as_deref());
            let records = |b: &RecordBatch| b.iter().map(|r| r.to_owned()).collect::<Vec<_>>();
            prop_assert_eq!(pieces.iter().flat_map(records).collect::<Vec<_>>(), records(&batch));
            for piece in &pieces {
                let message = Message::Data { side: side.clone(), batch: piece.clone(), watermark: Some(1) };
                prop_assert!(piece.len() == 1 || frame_len(&message) <= FRAME_TARGET_BYTES);
            }
        }

        /// Arbitrary bytes never panic, and a frame read from them never claims more bytes
        /// than there are.
        #[test]
        fn hostile_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((_, used))) = Decoder::default().decode(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }
    }

    fn with_body(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut wire = ((body.len() + 1) as u32).to_le_bytes().to_vec();
        wire.push(kind);
        wire.extend_from_slice(body);
        wire
    }

    /// A channel buffer counts keys and values only: records with empty values never fill one,
    /// and a frame of them would be all table. Cut, every frame is within the target.
    #[test]
    fn a_batch_of_empty_records_is_cut_into_frames_within_the_target() {
        let mut batch = RecordBatch::default();
        for _ in 0..100_000 {
            batch.push(None, b"", None);
        }
        let whole = Message::Data { side: None, batch: batch.clone(), watermark: None };
        assert_eq!(frame_len(&whole), 14 + 100_000 * 25, "2.5 MB of frame for 0 bytes of payload");
        let pieces = split_batch(&batch, None);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.iter().map(RecordBatch::len).sum::<usize>(), 100_000);
        for piece in pieces {
            let m = Message::Data { side: None, batch: piece, watermark: Some(0) };
            assert!(frame_len(&m) <= FRAME_TARGET_BYTES);
        }
    }

    #[test]
    fn the_largest_record_fits_the_largest_frame_with_the_longest_side_name() {
        use eddy_core::limits::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
        let mut batch = RecordBatch::default();
        batch.push(Some(&vec![1; MAX_KEY_BYTES]), &vec![2; MAX_VALUE_BYTES], Some(3));
        let side = "s".repeat(usize::from(u16::MAX) + 10);
        let m = Message::Data { side: Some(side), batch, watermark: Some(4) };
        assert_eq!(frame_len(&m), MAX_FRAME_BYTES as usize);
        let mut wire = Vec::new();
        Frame::message(m).encode(&mut wire);
        assert!(Decoder::default().decode(&wire).expect("within the limit").is_some());
    }

    #[test]
    fn hostile_frames_are_refused_naming_the_problem() {
        let d = Decoder { max_frame_bytes: 1024 };
        assert_eq!(d.decode(&u32::MAX.to_le_bytes()), Err(FrameError::TooLarge { len: u32::MAX, limit: 1024 }));
        assert_eq!(d.decode(&with_body(9, &[])), Err(FrameError::UnknownKind(9)));
        assert!(matches!(d.decode(&0u32.to_le_bytes()), Err(FrameError::Malformed { kind: "empty", .. })));
        let err = |wire: Vec<u8>| d.decode(&wire).expect_err("refused").to_string();
        assert!(err(with_body(CREDIT, &[1, 0, 0])).contains("ends inside the credit"));
        assert!(err(with_body(BARRIER, &[0; 9])).contains("1 bytes left over"));
        // A record count the table cannot hold is refused before anything is allocated for it.
        let mut body = vec![0u8];
        body.extend_from_slice(&0u32.to_le_bytes()); // backlog
        body.extend_from_slice(&u32::MAX.to_le_bytes()); // records
        body.extend_from_slice(&0u32.to_le_bytes()); // data
        assert!(err(with_body(DATA, &body)).contains("4294967295 records announced"));
        // A value span outside the data.
        let mut body = vec![0u8];
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(b"ab");
        for v in [0, NO_KEY, 1, 5] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.push(0);
        body.extend_from_slice(&0i64.to_le_bytes());
        assert!(err(with_body(DATA, &body)).contains("outside the data"));
        assert!(err(with_body(DATA, &[0x80])).contains("unknown flags"));
    }
}
