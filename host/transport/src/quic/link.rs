//! The headers that open every stream. A data stream names the input channel of the subtask
//! it feeds ([`LinkId`]); a side stream (control traffic beside the data) names itself
//! ([`side_header`]). A receiver looks either up among what it registered and refuses a stream
//! for anything else (a stale attempt of a restarted job, a hostile peer).

/// One logical channel between two subtasks of a job attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LinkId {
    /// The job.
    pub job: String,
    /// The job's attempt (restart count): a stream of an earlier attempt is refused.
    pub attempt: u64,
    /// The receiving task.
    pub task: u32,
    /// The receiving subtask.
    pub subtask: u32,
    /// The input channel of that subtask's gate.
    pub channel: u32,
}

/// The version is in the magic: a frame or header format change bumps it, so a peer of another
/// version is refused at its first stream instead of misread.
const MAGIC: &[u8; 4] = b"EDL2";
/// Job ids are short identifiers; a longer one in a header is refused.
pub const MAX_JOB_ID_BYTES: usize = 256;
const FIXED: usize = 4 + 2 + 8 + 4 * 3;

impl LinkId {
    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let job = &self.job.as_bytes()[..self.job.len().min(MAX_JOB_ID_BYTES)];
        let mut out = Vec::with_capacity(FIXED + job.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(job.len() as u16).to_le_bytes());
        out.extend_from_slice(job);
        out.extend_from_slice(&self.attempt.to_le_bytes());
        for v in [self.task, self.subtask, self.channel] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Reads a header from the start of `buf`: the link and the bytes it took, `Ok(None)` if
    /// more bytes are needed, or why this is no header.
    pub fn decode(buf: &[u8]) -> Result<Option<(LinkId, usize)>, String> {
        if buf.len() < 6 {
            return Ok(None);
        }
        if &buf[..4] != MAGIC {
            return Err("the stream does not start with a link header of this version (`EDL2`; is the peer another Eddy version?)".into());
        }
        let job_len = usize::from(u16::from_le_bytes([buf[4], buf[5]]));
        if job_len > MAX_JOB_ID_BYTES {
            return Err(format!("a job id of {job_len} bytes (at most {MAX_JOB_ID_BYTES})"));
        }
        let total = FIXED + job_len;
        let Some(rest) = buf.get(6..total) else { return Ok(None) };
        let (job, rest) = rest.split_at(job_len);
        let job = std::str::from_utf8(job).map_err(|_| "the job id is not UTF-8".to_owned())?.to_owned();
        let u32_at = |i: usize| u32::from_le_bytes([rest[8 + i], rest[9 + i], rest[10 + i], rest[11 + i]]);
        let mut attempt = [0; 8];
        attempt.copy_from_slice(&rest[..8]);
        let link = LinkId {
            job,
            attempt: u64::from_le_bytes(attempt),
            task: u32_at(0),
            subtask: u32_at(4),
            channel: u32_at(8),
        };
        Ok(Some((link, total)))
    }
}

/// The first bytes of a side stream (a data stream starts with [`LinkId`]'s `EDL2`).
pub const SIDE_MAGIC: &[u8; 4] = b"EDS1";
/// Side stream names are short; a longer one is refused.
pub const MAX_SIDE_NAME_BYTES: usize = 256;

/// The header of side stream `name` (cut to [`MAX_SIDE_NAME_BYTES`]).
pub fn side_header(name: &str) -> Vec<u8> {
    let name = &name.as_bytes()[..name.len().min(MAX_SIDE_NAME_BYTES)];
    let mut header = SIDE_MAGIC.to_vec();
    header.extend_from_slice(&(name.len() as u16).to_le_bytes());
    header.extend_from_slice(name);
    header
}

/// Reads a side stream's header from the start of `buf`: the name and the bytes it took,
/// `Ok(None)` if more bytes are needed, or why this is no side stream header.
pub fn decode_side_header(buf: &[u8]) -> Result<Option<(String, usize)>, String> {
    if buf.len() < 6 {
        return Ok(None);
    }
    if &buf[..4] != SIDE_MAGIC {
        return Err("the stream does not start with a side stream header".into());
    }
    let len = usize::from(u16::from_le_bytes([buf[4], buf[5]]));
    if len > MAX_SIDE_NAME_BYTES {
        return Err(format!("a side stream name of {len} bytes (at most {MAX_SIDE_NAME_BYTES})"));
    }
    Ok(buf.get(6..6 + len).map(|name| (String::from_utf8_lossy(name).into_owned(), 6 + len)))
}

const _: () = assert!(FIXED + MAX_JOB_ID_BYTES <= eddy_core::limits::MAX_STREAM_HEADER_BYTES);
const _: () = assert!(6 + MAX_SIDE_NAME_BYTES <= eddy_core::limits::MAX_STREAM_HEADER_BYTES);

/// What a stream opens with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// A data stream for this channel.
    Link(LinkId),
    /// A side stream of this name.
    Side(String),
}

impl Header {
    /// Reads the header at the start of `buf`: `Ok(Some)` once it is whole, `Ok(None)` if
    /// more bytes are needed, or why this is no header.
    pub fn decode(buf: &[u8]) -> Result<Option<Header>, String> {
        if buf.len() < 4 {
            return Ok(None);
        }
        if buf.starts_with(SIDE_MAGIC) {
            return Ok(decode_side_header(buf)?.map(|(name, _)| Header::Side(name)));
        }
        Ok(LinkId::decode(buf)?.map(|(link, _)| Header::Link(link)))
    }

    /// How many bytes the header at the start of `buf` takes, as far as `buf` tells: a reader
    /// that reads no more than this never reads past a header, so what a peer sends after it
    /// stays in QUIC's flow control until the stream is claimed. Never more than
    /// [`eddy_core::limits::MAX_STREAM_HEADER_BYTES`], and more than `buf.len()` until
    /// [`Header::decode`] answers.
    pub fn wanted(buf: &[u8]) -> usize {
        if buf.len() < 6 {
            return 6;
        }
        let len = usize::from(u16::from_le_bytes([buf[4], buf[5]]));
        // A length past its limit is refused by `decode` with what is there.
        let total = if buf.starts_with(SIDE_MAGIC) {
            6 + len.min(MAX_SIDE_NAME_BYTES)
        } else {
            FIXED + len.min(MAX_JOB_ID_BYTES)
        };
        total.max(6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn headers_round_trip_and_prefixes_wait(job in "[a-z0-9-]{0,40}", attempt: u64, task: u32, subtask: u32, channel: u32) {
            let link = LinkId { job, attempt, task, subtask, channel };
            let wire = link.encode();
            prop_assert_eq!(LinkId::decode(&wire), Ok(Some((link, wire.len()))));
            for cut in 0..wire.len() {
                prop_assert_eq!(LinkId::decode(&wire[..cut]), Ok(None));
            }
        }

        #[test]
        fn hostile_headers_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = LinkId::decode(&bytes);
        }
    }

    #[test]
    fn side_headers_round_trip_wait_for_their_name_and_refuse_a_huge_one() {
        let wire = side_header("checkpoints/job-1/7");
        assert_eq!(decode_side_header(&wire), Ok(Some(("checkpoints/job-1/7".to_owned(), wire.len()))));
        for cut in 0..wire.len() {
            assert_eq!(decode_side_header(&wire[..cut]), Ok(None));
        }
        let mut huge = SIDE_MAGIC.to_vec();
        huge.extend_from_slice(&u16::MAX.to_le_bytes());
        assert!(decode_side_header(&huge).expect_err("too long").contains("65535 bytes"));
    }

    proptest! {
        /// Read `wanted` bytes at a time, a header is whole exactly when its last byte is in,
        /// and nothing past it is ever asked for.
        #[test]
        fn a_header_is_read_to_its_end_and_no_further(job in "[a-z0-9-]{0,300}", side in proptest::bool::ANY) {
            let mut wire = if side { side_header(&job) } else {
                LinkId { job: job.clone(), attempt: 1, task: 2, subtask: 3, channel: 4 }.encode()
            };
            let header_len = wire.len();
            wire.extend_from_slice(b"what follows the header");
            let mut read = 0;
            let header = loop {
                if let Some(h) = Header::decode(&wire[..read]).expect("a valid header") {
                    break h;
                }
                let wanted = Header::wanted(&wire[..read]);
                prop_assert!(wanted > read && wanted <= eddy_core::limits::MAX_STREAM_HEADER_BYTES);
                read = wanted;
            };
            prop_assert_eq!(read, header_len);
            prop_assert_eq!(matches!(header, Header::Side(_)), side);
        }
    }

    #[test]
    fn a_wrong_magic_or_a_huge_job_id_is_refused() {
        assert!(LinkId::decode(b"GET / HTTP/1.1").expect_err("not a header").contains("link header"));
        let mut wire = MAGIC.to_vec();
        wire.extend_from_slice(&u16::MAX.to_le_bytes());
        assert!(LinkId::decode(&wire).expect_err("too long").contains("65535 bytes"));
    }
}
