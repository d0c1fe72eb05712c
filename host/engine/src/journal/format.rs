//! How a journal segment is laid out on disk: a sequence of frames, each
//! `len (u32 LE) | crc32 of the payload (u32 LE) | payload`, the payload a tag byte and its body.
//!
//! A frame is checked as a whole before anything in it is used, so a segment cut short by a
//! killed process ends at its last whole frame ([`Decoded::Torn`]) and a damaged byte anywhere
//! else is an error naming the offset, never a record read wrong.

use eddy_core::RecordBatch;
use eddy_plan::JournalCompression;

use super::JournalHeader;

/// The largest frame a reader accepts: a batch is bounded by the engine's batch sizes long
/// before this; a length above it is damage, not data.
pub const MAX_FRAME_BYTES: usize = 256 << 20;

const TAG_HEADER: u8 = 0;
/// A batch as it is (`debug.journal_compression: none`).
const TAG_BATCH: u8 = 1;
const TAG_WATERMARK: u8 = 2;
const TAG_PROCESSING_TIME: u8 = 3;
const TAG_BARRIER: u8 = 4;
const TAG_FINISH: u8 = 5;
/// A batch whose body is LZ4-compressed (`raw length u32 | block`, `journal_compression:
/// lz4`): journals of row data shrink three- to fivefold, for the CPU LZ4 takes.
const TAG_BATCH_LZ4: u8 = 6;

const HAS_KEY: u8 = 1;
const HAS_TIMESTAMP: u8 = 2;

/// One thing a subtask's operator saw, in the order it saw them.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// First in every segment: what ran and where the segment starts.
    Header(Box<JournalHeader>),
    /// A batch of input records, and the input channel it came over (for the first operator
    /// of a chain behind an exchange).
    Batch {
        /// The channel, if the batch came over one.
        channel: Option<u32>,
        /// The records.
        batch: RecordBatch,
    },
    /// The input watermark advanced.
    Watermark(i64),
    /// A processing-time tick.
    ProcessingTime(i64),
    /// The subtask snapshotted checkpoint `id` here: the segment ends, the next one starts
    /// after that checkpoint.
    Barrier(u64),
    /// End of a bounded input: the operator was told to finish.
    Finish,
}

/// Appends `frame` to `out`, sealed.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    match frame {
        // A header is plain data; serializing it cannot fail.
        Frame::Header(header) => sealed(out, TAG_HEADER, |out| serde_json::to_writer(out, header).unwrap_or_default()),
        Frame::Batch { channel, batch } => encode_batch(batch, *channel, JournalCompression::Lz4, out, &mut Vec::new()),
        Frame::Watermark(w) => sealed(out, TAG_WATERMARK, |out| out.extend_from_slice(&w.to_le_bytes())),
        Frame::ProcessingTime(t) => sealed(out, TAG_PROCESSING_TIME, |out| out.extend_from_slice(&t.to_le_bytes())),
        Frame::Barrier(id) => sealed(out, TAG_BARRIER, |out| out.extend_from_slice(&id.to_le_bytes())),
        Frame::Finish => sealed(out, TAG_FINISH, |_| {}),
    }
}

/// Appends a batch frame to `out` from a borrowed batch, compressed as `compression` says;
/// `scratch` holds the uncompressed body meanwhile (kept by the caller, so the hot path
/// allocates nothing).
pub fn encode_batch(
    batch: &RecordBatch,
    channel: Option<u32>,
    compression: JournalCompression,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) {
    // The channel plus one, 0 for none.
    let channel = channel.map_or(0, |c| c.saturating_add(1)).to_le_bytes();
    if compression == JournalCompression::None {
        return sealed(out, TAG_BATCH, |out| {
            out.extend_from_slice(&channel);
            batch_body(batch, out);
        });
    }
    scratch.clear();
    scratch.extend_from_slice(&channel);
    batch_body(batch, scratch);
    let raw = &scratch[..];
    sealed(out, TAG_BATCH_LZ4, |out| {
        out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        let start = out.len();
        out.resize(start + lz4_flex::block::get_maximum_output_size(raw.len()), 0);
        let written = lz4_flex::block::compress_into(raw, &mut out[start..]).unwrap_or(0);
        out.truncate(start + written);
    });
}

fn batch_body(batch: &RecordBatch, out: &mut Vec<u8>) {
    out.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    for r in batch.iter() {
        let key = if r.key.is_some() { HAS_KEY } else { 0 };
        out.push(key | if r.timestamp.is_some() { HAS_TIMESTAMP } else { 0 });
        if let Some(t) = r.timestamp {
            out.extend_from_slice(&t.to_le_bytes());
        }
        if let Some(k) = r.key {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
        }
        out.extend_from_slice(&(r.value.len() as u32).to_le_bytes());
        out.extend_from_slice(r.value);
    }
}

/// Writes a frame with tag `tag` whose body `body` appends, then fills in its length and
/// checksum.
fn sealed(out: &mut Vec<u8>, tag: u8, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    out.push(tag);
    body(out);
    let payload_len = out.len() - start - 8;
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// What the bytes at an offset hold.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// A whole frame and the offset after it.
    Frame(Frame, usize),
    /// No bytes left.
    End,
    /// The last frame was cut short (the writer was killed mid-write): nothing after it.
    Torn,
}

/// Reads the frame at `offset` of `bytes`. A frame whose checksum fails is damage, except when
/// it runs to the very end (a torn last write).
pub fn decode(bytes: &[u8], offset: usize) -> Result<Decoded, String> {
    let rest = &bytes[offset.min(bytes.len())..];
    if rest.is_empty() {
        return Ok(Decoded::End);
    }
    if rest.len() < 8 {
        return Ok(Decoded::Torn);
    }
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    if len > MAX_FRAME_BYTES {
        return Err(format!(
            "the frame at byte {offset} claims {len} bytes, above the {MAX_FRAME_BYTES} a frame may hold"
        ));
    }
    let Some(payload) = rest.get(8..8 + len) else { return Ok(Decoded::Torn) };
    if crc32fast::hash(payload) != crc {
        return if 8 + len == rest.len() {
            Ok(Decoded::Torn)
        } else {
            Err(format!("the frame at byte {offset} fails its checksum"))
        };
    }
    let frame = parse(payload).map_err(|problem| format!("the frame at byte {offset}: {problem}"))?;
    Ok(Decoded::Frame(frame, offset + 8 + len))
}

fn parse(payload: &[u8]) -> Result<Frame, String> {
    let (&tag, body) = payload.split_first().ok_or("it is empty")?;
    let mut r = Cursor(body);
    let frame = match tag {
        TAG_HEADER => Frame::Header(Box::new(
            serde_json::from_slice(body).map_err(|e| format!("its header does not parse: {e}"))?,
        )),
        TAG_BATCH => return parse_batch(body),
        TAG_BATCH_LZ4 => {
            let raw_len = r.u32()? as usize;
            if raw_len > MAX_FRAME_BYTES {
                return Err(format!("its batch claims {raw_len} bytes uncompressed, above {MAX_FRAME_BYTES}"));
            }
            let mut raw = vec![0; raw_len];
            match lz4_flex::block::decompress_into(r.0, &mut raw) {
                Ok(n) if n == raw_len => return parse_batch(&raw),
                Ok(n) => return Err(format!("its batch decompresses to {n} bytes, not the {raw_len} it claims")),
                Err(e) => return Err(format!("its batch does not decompress: {e}")),
            }
        }
        TAG_WATERMARK => Frame::Watermark(r.i64()?),
        TAG_PROCESSING_TIME => Frame::ProcessingTime(r.i64()?),
        TAG_BARRIER => Frame::Barrier(r.u64()?),
        TAG_FINISH => Frame::Finish,
        other => return Err(format!("unknown tag {other}")),
    };
    Ok(frame)
}

fn parse_batch(body: &[u8]) -> Result<Frame, String> {
    let mut r = Cursor(body);
    let channel = r.u32()?.checked_sub(1);
    let count = r.u32()? as usize;
    let mut batch = RecordBatch::with_capacity(count.min(65_536), body.len());
    for _ in 0..count {
        let flags = r.u8()?;
        let timestamp = if flags & HAS_TIMESTAMP != 0 { Some(r.i64()?) } else { None };
        let key = if flags & HAS_KEY != 0 { Some(r.bytes()?) } else { None };
        let value = r.bytes()?;
        batch.push(key, value, timestamp);
    }
    if !r.0.is_empty() {
        return Err(format!("{} bytes follow its last record", r.0.len()));
    }
    Ok(Frame::Batch { channel, batch })
}

/// Reads fixed-width fields off the front of a slice, failing (not panicking) when short.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("it ends inside a record".into());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn i64(&mut self) -> Result<i64, String> {
        Ok(self.u64()? as i64)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame> {
        let mut batch = RecordBatch::with_capacity(3, 64);
        batch.push(Some(b"\"a\""), b"1", Some(7));
        batch.push(None, b"two", None);
        batch.push(Some(b""), b"", Some(-3));
        let other = RecordBatch::with_capacity(0, 0);
        vec![
            Frame::Batch { channel: Some(1), batch },
            Frame::Batch { channel: None, batch: other },
            Frame::Watermark(5),
            Frame::ProcessingTime(1_000),
            Frame::Barrier(3),
            Frame::Finish,
        ]
    }

    fn encoded(frames: &[Frame]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            encode(f, &mut out);
        }
        out
    }

    fn decoded(bytes: &[u8]) -> Result<(Vec<Frame>, bool), String> {
        let (mut out, mut at) = (Vec::new(), 0);
        loop {
            match decode(bytes, at)? {
                Decoded::Frame(f, next) => {
                    out.push(f);
                    at = next;
                }
                Decoded::End => return Ok((out, false)),
                Decoded::Torn => return Ok((out, true)),
            }
        }
    }

    #[test]
    fn frames_read_back_as_written() {
        let frames = frames();
        assert_eq!(decoded(&encoded(&frames)).unwrap(), (frames, false));
    }

    #[test]
    fn batches_stored_as_they_are_read_back_too_and_take_more_bytes() {
        let frames = frames();
        let mut raw = Vec::new();
        let mut lz4 = Vec::new();
        let mut big = RecordBatch::with_capacity(100, 4_000);
        for i in 0..100 {
            big.push(Some(b"\"auction\""), format!("{{\"bid\": {i}, \"price\": 100}}").as_bytes(), Some(i));
        }
        for f in frames.iter().chain([&Frame::Batch { channel: Some(0), batch: big.clone() }]) {
            match f {
                Frame::Batch { channel, batch } => {
                    encode_batch(batch, *channel, JournalCompression::None, &mut raw, &mut Vec::new());
                    encode_batch(batch, *channel, JournalCompression::Lz4, &mut lz4, &mut Vec::new());
                }
                other => {
                    encode(other, &mut raw);
                    encode(other, &mut lz4);
                }
            }
        }
        let mut all = frames;
        all.push(Frame::Batch { channel: Some(0), batch: big });
        assert_eq!(decoded(&raw).unwrap(), (all.clone(), false));
        assert_eq!(decoded(&lz4).unwrap(), (all, false));
        assert!(raw.len() > 2 * lz4.len(), "repetitive rows compress: {} raw, {} lz4", raw.len(), lz4.len());
    }

    #[test]
    fn a_segment_cut_anywhere_reads_up_to_its_last_whole_frame() {
        let frames = frames();
        let bytes = encoded(&frames);
        let mut ends = vec![0];
        for f in &frames {
            ends.push(ends.last().unwrap() + encoded(std::slice::from_ref(f)).len());
        }
        for cut in 0..bytes.len() {
            let (read, torn) = decoded(&bytes[..cut]).unwrap();
            let whole = ends.iter().filter(|&&e| e <= cut).count() - 1;
            assert_eq!(read, frames[..whole], "cut at {cut}");
            assert_eq!(torn, !ends.contains(&cut), "cut at {cut}");
        }
    }

    #[test]
    fn a_flipped_byte_inside_is_an_error_naming_the_frame() {
        let bytes = encoded(&frames());
        for at in 0..bytes.len() - 20 {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            // Either the damage is caught, or it cut the segment (a length grown past the end).
            match decoded(&damaged) {
                Err(e) => assert!(e.contains("the frame at byte"), "{e}"),
                Ok((read, torn)) => assert!(torn && read.len() < 6, "flip at {at} read {read:?}"),
            }
        }
    }

    #[test]
    fn a_sealed_frame_whose_batch_lies_is_refused_not_trusted() {
        // Checksums recomputed over each lie, as a hand-edited file would have them.
        let lies: [(u32, &[u8], &str); 3] = [
            (u32::MAX, b"", "above"),
            (64, &[0xF0, 1, 2, 3], "does not decompress"),
            (3, &[0x30, b'a', b'b', b'c'], "ends inside a record"),
        ];
        for (claimed, block, problem) in lies {
            let mut bytes = Vec::new();
            sealed(&mut bytes, TAG_BATCH_LZ4, |out| {
                out.extend_from_slice(&claimed.to_le_bytes());
                out.extend_from_slice(block);
            });
            let e = decode(&bytes, 0).expect_err("refused");
            assert!(e.contains("the frame at byte 0") && e.contains(problem), "{e}");
        }
    }
}
