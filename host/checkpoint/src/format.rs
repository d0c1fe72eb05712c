//! Byte formats of checkpoint files: every file is sealed (magic, length, CRC-32) so a torn or
//! corrupted file is detected on restore, never half-read; state entries are length-prefixed.
//! Part of the checkpoint format: change only with a version bump.

use eddy_state::FrozenEntries;

use crate::CheckpointError;

const MAGIC: &[u8; 8] = b"EDDYCKP1";
const HEADER: usize = 8 + 8 + 4;

/// Size of a sealed file with an empty payload.
pub const EMPTY_FILE_BYTES: u64 = HEADER as u64;

/// `payload` with its header: magic, payload length (u64 BE), CRC-32 of the payload (u32 BE).
pub fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a sealed file, if it is whole and intact; `what` names the file in errors.
pub fn unseal<'a>(bytes: &'a [u8], what: &str) -> Result<&'a [u8], CheckpointError> {
    let corrupt = |problem: String| CheckpointError::Corrupt { file: what.to_owned(), problem };
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(corrupt("not an Eddy checkpoint file (bad header)".into()));
    }
    let len = u64::from_be_bytes(bytes[8..16].try_into().unwrap_or_default());
    let crc = u32::from_be_bytes(bytes[16..20].try_into().unwrap_or_default());
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != len {
        return Err(corrupt(format!("{} payload bytes, header says {len} (truncated?)", payload.len())));
    }
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("checksum mismatch".into()));
    }
    Ok(payload)
}

/// Appends one state entry: `key len (u32) | key | value len (u32) | value`. A state file is a
/// sealed run of entries in ascending key order.
pub fn encode_entry(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value);
}

/// Appends one pending timer as a state-file entry: the key is the timer's key, the value
/// `event time (u8: 1 or 0) | timestamp (i64) | key group (u16)`, big-endian.
pub fn encode_timer(out: &mut Vec<u8>, timer: &super::metadata::TimerState) {
    let mut value = [0u8; 11];
    value[0] = u8::from(timer.event_time);
    value[1..9].copy_from_slice(&timer.timestamp.to_be_bytes());
    value[9..].copy_from_slice(&timer.key_group.to_be_bytes());
    encode_entry(out, &timer.key, &value);
}

/// The timer of an entry [`encode_timer`] wrote, or why the entry is none.
pub fn decode_timer(key: &[u8], value: &[u8]) -> Result<super::metadata::TimerState, String> {
    let value: &[u8; 11] = value.try_into().map_err(|_| format!("a timer entry of {} bytes, not 11", value.len()))?;
    let event_time = match value[0] {
        0 => false,
        1 => true,
        other => return Err(format!("a timer's time domain is {other}, not 0 or 1")),
    };
    let mut timestamp = [0u8; 8];
    timestamp.copy_from_slice(&value[1..9]);
    Ok(super::metadata::TimerState {
        event_time,
        timestamp: i64::from_be_bytes(timestamp),
        key_group: u16::from_be_bytes([value[9], value[10]]),
        key: key.to_vec(),
    })
}

/// Splits `entries` into payloads of about `max_bytes` (at least one entry each, so at least
/// one payload even when empty) and hands each to `emit` as it fills, so a large state is
/// never encoded into memory at once.
pub fn encode_chunks(
    entries: &dyn FrozenEntries,
    max_bytes: usize,
    emit: &mut dyn FnMut(Vec<u8>) -> Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    let mut chunk = Vec::new();
    let mut failed = None;
    entries.for_each(&mut |k, v| {
        if failed.is_some() {
            return;
        }
        encode_entry(&mut chunk, k, v);
        if chunk.len() >= max_bytes {
            failed = emit(std::mem::take(&mut chunk)).err();
        }
    });
    match failed {
        Some(e) => Err(e),
        None => emit(chunk),
    }
}

/// Reads the entries of a state file's payload, calling `visit` per entry; returns how many.
pub fn decode_entries(
    mut bytes: &[u8],
    what: &str,
    visit: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<u64, CheckpointError> {
    let corrupt = |problem: &str| CheckpointError::Corrupt { file: what.to_owned(), problem: problem.to_owned() };
    let take = |bytes: &mut &[u8]| -> Result<usize, CheckpointError> {
        let Some((len, rest)) = bytes.split_first_chunk::<4>() else { return Err(corrupt("an entry ends early")) };
        let len = u32::from_be_bytes(*len) as usize;
        *bytes = rest;
        if bytes.len() < len {
            return Err(corrupt("an entry runs past the end"));
        }
        Ok(len)
    };
    let mut count = 0;
    while !bytes.is_empty() {
        let klen = take(&mut bytes)?;
        let (key, rest) = bytes.split_at(klen);
        bytes = rest;
        let vlen = take(&mut bytes)?;
        let (value, rest) = bytes.split_at(vlen);
        bytes = rest;
        visit(key, value);
        count += 1;
    }
    Ok(count)
}

/// Records in flight at an unaligned checkpoint: a buffer a task received (or will receive)
/// on one input channel after its snapshot and before that channel's barrier.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlightBatch {
    /// The input channel it came on (arrival order across channels is the file's order).
    pub channel: u32,
    /// Side output name (side records bypass the operators), `None` for the main stream.
    pub side: Option<String>,
    /// The records.
    pub batch: eddy_core::RecordBatch,
}

const NONE: u32 = u32::MAX;

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The payload of an in-flight file: per batch `channel (u32) | side (u32 len or NONE, bytes)
/// | records (u32)`, then per record `flags (u8: 1 key, 2 timestamp) | key | value |
/// timestamp (i64)`, lengths as u32 BE.
pub fn encode_in_flight(batches: &[InFlightBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in batches {
        out.extend_from_slice(&b.channel.to_be_bytes());
        match &b.side {
            Some(side) => put_bytes(&mut out, side.as_bytes()),
            None => out.extend_from_slice(&NONE.to_be_bytes()),
        }
        out.extend_from_slice(&(b.batch.len() as u32).to_be_bytes());
        for r in b.batch.iter() {
            out.push(u8::from(r.key.is_some()) | (u8::from(r.timestamp.is_some()) << 1));
            if let Some(key) = r.key {
                put_bytes(&mut out, key);
            }
            put_bytes(&mut out, r.value);
            if let Some(t) = r.timestamp {
                out.extend_from_slice(&t.to_be_bytes());
            }
        }
    }
    out
}

/// Reads an in-flight file's payload.
pub fn decode_in_flight(mut bytes: &[u8], what: &str) -> Result<Vec<InFlightBatch>, CheckpointError> {
    let corrupt = |problem: &str| CheckpointError::Corrupt { file: what.to_owned(), problem: problem.to_owned() };
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if bytes.len() < n {
            return None;
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Some(head)
    }
    fn u32_of(bytes: &mut &[u8]) -> Option<u32> {
        take(bytes, 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn sized<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
        let n = u32_of(bytes)? as usize;
        take(bytes, n)
    }
    let ends = || corrupt("an in-flight batch ends early");
    let mut batches = Vec::new();
    while !bytes.is_empty() {
        let channel = u32_of(&mut bytes).ok_or_else(ends)?;
        let side = match u32_of(&mut bytes).ok_or_else(ends)? {
            NONE => None,
            n => {
                let name = take(&mut bytes, n as usize).ok_or_else(ends)?;
                Some(String::from_utf8(name.to_vec()).map_err(|_| corrupt("a side output name is not UTF-8"))?)
            }
        };
        let count = u32_of(&mut bytes).ok_or_else(ends)?;
        let mut batch = eddy_core::RecordBatch::default();
        for _ in 0..count {
            let flags = take(&mut bytes, 1).ok_or_else(ends)?[0];
            let key = if flags & 1 != 0 { Some(sized(&mut bytes).ok_or_else(ends)?) } else { None };
            let value = sized(&mut bytes).ok_or_else(ends)?;
            let timestamp = if flags & 2 != 0 {
                let t = take(&mut bytes, 8).ok_or_else(ends)?;
                Some(i64::from_be_bytes(t.try_into().unwrap_or_default()))
            } else {
                None
            };
            batch.try_push(key, value, timestamp).map_err(|e| corrupt(&e.to_string()))?;
        }
        batches.push(InFlightBatch { channel, side, batch });
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn entries_round_trip_and_any_damage_is_detected(
            entries in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..20), proptest::collection::vec(any::<u8>(), 0..40)),
                0..20,
            ),
            flip in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut sealed_chunks = Vec::new();
            encode_chunks(&entries, 64, &mut |payload| {
                sealed_chunks.push(seal(&payload));
                Ok(())
            })
            .expect("encodes");
            prop_assert!(!sealed_chunks.is_empty());
            let mut back = Vec::new();
            for sealed in &sealed_chunks {
                decode_entries(unseal(sealed, "f").expect("intact"), "f", &mut |k, v| back.push((k.to_vec(), v.to_vec())))
                    .expect("decodes");
            }
            prop_assert_eq!(&back, &entries);
            let sealed = sealed_chunks[0].clone();

            let mut flipped = sealed.clone();
            let i = flip.index(flipped.len());
            flipped[i] ^= 0x5a;
            prop_assert!(unseal(&flipped, "f").is_err(), "a flipped byte at {} is caught", i);

            let truncated = &sealed[..cut.index(sealed.len())];
            prop_assert!(unseal(truncated, "f").is_err(), "a file cut at {} is caught", truncated.len());
        }
    }

    #[test]
    fn in_flight_batches_round_trip() {
        let mut a = eddy_core::RecordBatch::default();
        a.push(Some(b"user-1"), b"{\"v\":1}", Some(42));
        a.push(None, b"", None);
        let mut b = eddy_core::RecordBatch::default();
        b.push(None, b"late", Some(-7));
        let batches = vec![
            InFlightBatch { channel: 1, side: None, batch: a },
            InFlightBatch { channel: 0, side: Some("late".into()), batch: b },
        ];
        let payload = encode_in_flight(&batches);
        assert_eq!(decode_in_flight(&payload, "f").expect("decodes"), batches);
        assert!(decode_in_flight(&payload[..payload.len() - 1], "f").is_err(), "a cut file is caught");
        assert!(decode_in_flight(&[], "f").expect("empty").is_empty());
    }

    #[test]
    fn errors_name_the_file() {
        let err = unseal(b"garbage", "chk-3/t1-s0/count.state").expect_err("corrupt");
        assert!(err.to_string().contains("chk-3/t1-s0/count.state"), "{err}");
    }
}
