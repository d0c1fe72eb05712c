//! Frames: `len u32 | kind u8 | body`, little-endian, `len` counting kind and body.
//!
//! ```text
//! Data         kind 1: flags u8 (1: watermark follows, 2: side output name follows)
//!                      | backlog u32 | [watermark i64] | [side len u16 | side UTF-8]
//!                      | records u32 | data len u32 | data | record table
//!              data: each record's key, then its value, in record order
//!              record table, per record: parts u8 (1: key, 2: event time)
//!                      | [key len varint] | value len varint
//!                      | [event time: zigzag varint of its difference to the previous one]
//! Watermark    kind 2: i64
//! Barrier      kind 3: checkpoint id u64
//! EndOfStream  kind 4: (empty)
//! Credit       kind 5: buffers granted u32
//! ```
//!
//! `backlog` is how many buffers the sender holds queued behind this one, so a receiver with
//! spare buffers can grant more than one at a time.
//!
//! A record's place in the data follows from the lengths before it, and event times within a
//! batch are close together, so a record's entry takes 3-5 bytes where fixed-width offsets,
//! lengths and times took 25: with keys of a few bytes and no value (a count by key), the
//! entries were most of a frame and of what QUIC encrypts and sends. A varint is LEB128: 7
//! bits a byte, low bits first, the high bit set on every byte but the last.

use eddy_core::limits::{FRAME_BYTES_PER_RECORD, FRAME_TARGET_BYTES, MAX_FRAME_RECORDS};
use eddy_core::{RecordBatch, RecordMeta, RecordView, Span};

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
/// A record entry's parts.
const HAS_KEY: u8 = 1;
const HAS_TIME: u8 = 2;
/// The most bytes of one record's entry: parts, two u32 varints and a u64 varint.
const MAX_ENTRY_BYTES: usize = 1 + 5 + 5 + 10;
const _: () = assert!(MAX_ENTRY_BYTES == FRAME_BYTES_PER_RECORD);

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
                out.reserve(batch.byte_len() + batch.len() * MAX_ENTRY_BYTES);
                out.extend_from_slice(&(batch.len() as u32).to_le_bytes());
                let data_len_at = out.len();
                out.extend_from_slice(&[0; 4]);
                for r in batch.iter() {
                    out.extend_from_slice(r.key.unwrap_or_default());
                    out.extend_from_slice(r.value);
                }
                // A batch's keys and values are within u32 (its spans are), and so are the
                // copies of them a frame holds but for records sharing bytes of one buffer,
                // which a sender cuts into frames of about a MiB first (`split_batch`).
                let data_len = u32::try_from(out.len() - data_len_at - 4).unwrap_or(u32::MAX);
                out[data_len_at..data_len_at + 4].copy_from_slice(&data_len.to_le_bytes());
                let mut previous = 0;
                for r in batch.iter() {
                    write_entry(&r, &mut previous, out);
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
            let mut previous = 0;
            let records: usize =
                batch.iter().map(|r| r.key.map_or(0, <[u8]>::len) + r.value.len() + entry_len(&r, &mut previous)).sum();
            data_frame_overhead(side.as_deref(), watermark.is_some()) + records
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

/// Appends `r`'s record table entry; `previous` is the event time of the last record before it
/// that had one (0 at first).
fn write_entry(r: &RecordView<'_>, previous: &mut i64, out: &mut Vec<u8>) {
    out.push(u8::from(r.key.is_some()) * HAS_KEY + u8::from(r.timestamp.is_some()) * HAS_TIME);
    if let Some(key) = r.key {
        write_varint(key.len() as u64, out);
    }
    write_varint(r.value.len() as u64, out);
    if let Some(ts) = r.timestamp {
        write_varint(zigzag(ts.wrapping_sub(*previous)), out);
        *previous = ts;
    }
}

/// The bytes [`write_entry`] appends for `r`.
fn entry_len(r: &RecordView<'_>, previous: &mut i64) -> usize {
    let key = r.key.map_or(0, |k| varint_len(k.len() as u64));
    let time = r.timestamp.map_or(0, |ts| varint_len(zigzag(ts.wrapping_sub(std::mem::replace(previous, ts)))));
    1 + key + varint_len(r.value.len() as u64) + time
}

/// A signed difference as an unsigned number that is small when the difference is near 0.
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    // 1 byte per started 7 bits, at least 1.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Whether `message`, whose frame is `len` long ([`frame_len`]), must be cut ([`split_batch`]):
/// a frame above [`FRAME_TARGET_BYTES`] or of more than [`MAX_FRAME_RECORDS`] records.
pub fn needs_cutting(message: &Message, len: usize) -> bool {
    len > FRAME_TARGET_BYTES || matches!(message, Message::Data { batch, .. } if batch.len() > MAX_FRAME_RECORDS)
}

/// Cuts `batch` (bound for a data frame with `side` and, on its last frame, a watermark) into
/// batches whose frames are at most [`FRAME_TARGET_BYTES`] and [`MAX_FRAME_RECORDS`] records each,
/// records in order; a record whose frame alone is larger goes in a batch of its own. Each record
/// is copied, so bytes of the buffer no record refers to are left behind. A channel buffer counts
/// only keys and values, so a batch of many tiny or empty records can cost far more on the wire
/// than its payload: this is what keeps every frame a sender writes within [`MAX_FRAME_BYTES`].
pub fn split_batch(batch: &RecordBatch, side: Option<&str>) -> Vec<RecordBatch> {
    let overhead = data_frame_overhead(side, true);
    let mut pieces = Vec::new();
    let (mut piece, mut len) = (RecordBatch::default(), overhead);
    for record in batch.iter() {
        // The entry's largest size: the first record of the next piece is timed against 0.
        let cost = record.key.map_or(0, <[u8]>::len) + record.value.len() + MAX_ENTRY_BYTES;
        if !piece.is_empty() && (len + cost > FRAME_TARGET_BYTES || piece.len() == MAX_FRAME_RECORDS) {
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

    /// A LEB128 varint of at most `bits` bits.
    #[inline]
    fn varint(&mut self, bits: u32, what: &str) -> Result<u64, FrameError> {
        // Most lengths and event-time differences in a batch take one byte.
        if let Some((&byte, rest)) = self.bytes.split_first()
            && byte < 0x80
        {
            self.bytes = rest;
            return Ok(u64::from(byte));
        }
        self.long_varint(bits, what)
    }

    fn long_varint(&mut self, bits: u32, what: &str) -> Result<u64, FrameError> {
        let (mut v, mut shift) = (0u64, 0);
        for (i, &byte) in self.bytes.iter().enumerate() {
            let part = u64::from(byte & 0x7f);
            if shift >= bits || (shift + 7 > bits && part >> (bits - shift) != 0) {
                return Err(self.malformed(format!("{what} passes {bits} bits")));
            }
            v |= part << shift;
            if byte & 0x80 == 0 {
                self.bytes = &self.bytes[i + 1..];
                return Ok(v);
            }
            shift += 7;
        }
        Err(self.malformed(format!("ends inside {what} ({} bytes)", self.bytes.len())))
    }

    /// The span of the next `len` bytes of the data, which hold `data_len`, from `at` on.
    fn place(&self, at: &mut u32, len: u32, data_len: usize) -> Result<Span, FrameError> {
        let span = Span { offset: *at, len };
        *at = at
            .checked_add(len)
            .filter(|&end| end as usize <= data_len)
            .ok_or_else(|| self.malformed(format!("the records' keys and values pass the {data_len} bytes of data")))?;
        Ok(span)
    }

    fn varint_u32(&mut self, what: &str) -> Result<u32, FrameError> {
        // At most 32 bits, so the cast keeps every bit.
        Ok(self.varint(32, what)? as u32)
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
    // The count is checked before anything is allocated by it: against the limit, and against
    // the bytes that are there (an entry takes at least two).
    if records > MAX_FRAME_RECORDS {
        return Err(
            body.malformed(format!("{records} records announced, more than the {MAX_FRAME_RECORDS} a frame holds"))
        );
    }
    if records * 2 > body.bytes.len() {
        return Err(body.malformed(format!("{records} records announced, {} bytes of record table", body.bytes.len())));
    }
    let mut metas = Vec::with_capacity(records);
    let (mut at, mut previous) = (0u32, 0i64);
    for _ in 0..records {
        let parts = body.u8("a record's parts")?;
        if parts & !(HAS_KEY | HAS_TIME) != 0 {
            return Err(body.malformed(format!("unknown record parts {parts:#04x}")));
        }
        let key = if parts & HAS_KEY != 0 { Some(body.varint_u32("a key length")?) } else { None };
        let value = body.varint_u32("a value length")?;
        let key = key.map(|len| body.place(&mut at, len, data_len)).transpose()?;
        let value = body.place(&mut at, value, data_len)?;
        let timestamp = if parts & HAS_TIME != 0 {
            previous = previous.wrapping_add(unzigzag(body.varint(64, "an event time")?));
            Some(previous)
        } else {
            None
        };
        metas.push(RecordMeta { key, value, timestamp });
    }
    body.end()?;
    if at as usize != data_len {
        return Err(body.malformed(format!("{} bytes of data no record refers to", data_len - at as usize)));
    }
    let batch = RecordBatch::adopt(data, metas).map_err(|_| body.malformed("the data passes what a batch may hold"))?;
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
        // Event times that jump between 0 and i64::MAX: entries at their largest but for the
        // key (1 + 1 + 10 bytes), the first (timed against 0) 3.
        for i in 0..200_000 {
            batch.push(None, b"", Some(if i % 2 == 0 { 0 } else { i64::MAX }));
        }
        let whole = Message::Data { side: None, batch: batch.clone(), watermark: None };
        assert_eq!(frame_len(&whole), 14 + 200_000 * 12 - 9, "2.4 MB of frame for 0 bytes of payload");
        assert!(needs_cutting(&whole, frame_len(&whole)));
        let pieces = split_batch(&batch, None);
        assert!(pieces.len() >= 3, "{} pieces", pieces.len());
        assert_eq!(pieces.iter().map(RecordBatch::len).sum::<usize>(), 200_000);
        for piece in pieces {
            assert!(piece.len() <= MAX_FRAME_RECORDS);
            let m = Message::Data { side: None, batch: piece, watermark: Some(0) };
            assert!(frame_len(&m) <= FRAME_TARGET_BYTES);
        }
    }

    /// A key of a few bytes, no value and close event times (a count by key): the entry is three
    /// bytes and the frame a third of what fixed-width entries made it.
    #[test]
    fn a_keyed_record_without_a_value_takes_its_key_and_three_bytes() {
        let mut batch = RecordBatch::default();
        for i in 0..1_000 {
            batch.push(Some(b"123456"), b"", Some(1_700_000_000_000 + i));
        }
        let m = Message::Data { side: None, batch, watermark: None };
        // The first time, ~2^40.6 from 0, takes 6 bytes (42 bits zigzagged) instead of 1.
        assert_eq!(frame_len(&m), 14 + 1_000 * (6 + 4) + 5);
    }

    /// A guest's output batch may leave bytes no record refers to, and records may share bytes:
    /// a frame carries each record's own key and value.
    #[test]
    fn records_sharing_or_skipping_bytes_of_their_buffer_cross_as_their_own() {
        let (shared, value) = (Span { offset: 2, len: 3 }, Span { offset: 6, len: 2 });
        let records = vec![
            RecordMeta { key: Some(shared), value, timestamp: Some(5) },
            RecordMeta { key: Some(shared), value: shared, timestamp: None },
        ];
        let batch = RecordBatch::adopt(b"..keyxva..".to_vec(), records).expect("spans within");
        let mut wire = Vec::new();
        let m = Message::Data { side: None, batch: batch.clone(), watermark: None };
        Frame::message(m.clone()).encode(&mut wire);
        assert_eq!(frame_len(&m), wire.len() - 4);
        let Some((Frame::Message { message: Message::Data { batch: got, .. }, .. }, _)) =
            Decoder::default().decode(&wire).expect("valid")
        else {
            panic!("not a data frame");
        };
        let owned = |b: &RecordBatch| b.iter().map(|r| r.to_owned()).collect::<Vec<_>>();
        assert_eq!(owned(&got), owned(&batch));
        assert_eq!(got.byte_len(), 3 + 2 + 3 + 3);
    }

    #[test]
    fn the_largest_record_fits_the_largest_frame_with_the_longest_side_name() {
        use eddy_core::limits::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
        let mut batch = RecordBatch::default();
        batch.push(Some(&vec![1; MAX_KEY_BYTES]), &vec![2; MAX_VALUE_BYTES], Some(3));
        let side = "s".repeat(usize::from(u16::MAX) + 10);
        let m = Message::Data { side: Some(side), batch, watermark: Some(4) };
        assert!(frame_len(&m) <= MAX_FRAME_BYTES as usize);
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
        // A count past the limit is refused even with the bytes for it there (a record decodes
        // to 40 bytes however few it took on the wire); one at the limit is read.
        let at_most = |records: usize| {
            let mut body = vec![0u8];
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(&(records as u32).to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend(std::iter::repeat_n([0u8, 0], records).flatten());
            Decoder::default().decode(&with_body(DATA, &body))
        };
        let over = at_most(MAX_FRAME_RECORDS + 1).expect_err("refused").to_string();
        assert!(over.contains("32769 records announced, more than the 32768 a frame holds"), "{over}");
        let Ok(Some((Frame::Message { message: Message::Data { batch, .. }, .. }, _))) = at_most(MAX_FRAME_RECORDS)
        else {
            panic!("a frame of {MAX_FRAME_RECORDS} empty records is read");
        };
        assert_eq!(batch.len(), MAX_FRAME_RECORDS);
        // One record: parts, then lengths in varints, over two bytes of data.
        let record = |table: &[u8]| {
            let mut body = vec![0u8];
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(&1u32.to_le_bytes());
            body.extend_from_slice(&2u32.to_le_bytes());
            body.extend_from_slice(b"ab");
            body.extend_from_slice(table);
            err(with_body(DATA, &body))
        };
        assert!(record(&[HAS_KEY, 1, 5]).contains("pass the 2 bytes of data"));
        assert!(record(&[0, 1]).contains("1 bytes of data no record refers to"));
        assert!(record(&[8, 2]).contains("unknown record parts 0x08"));
        assert!(record(&[0, 0xff, 0xff, 0xff, 0xff, 0x1f]).contains("a value length passes 32 bits"));
        assert!(record(&[0, 0x80, 0x80, 0x80, 0x80, 0x80, 0]).contains("a value length passes 32 bits"));
        assert!(record(&[HAS_TIME, 2, 0xff]).contains("ends inside an event time"));
        assert!(
            record(&[HAS_TIME, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02])
                .contains("an event time passes 64 bits")
        );
        assert!(record(&[0, 2, 0]).contains("1 bytes left over"));
        assert!(err(with_body(DATA, &[0x80])).contains("unknown flags"));
    }
}
