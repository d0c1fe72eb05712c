//! Byte formats of checkpoint files: every file is sealed (magic, length, CRC-32) so a torn or
//! corrupted file is detected on restore, never half-read; state entries are length-prefixed.
//! Part of the checkpoint format: change only with a version bump.

use eddy_state::FrozenEntries;

use super::CheckpointError;

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
    fn errors_name_the_file() {
        let err = unseal(b"garbage", "chk-3/t1-s0/count.state").expect_err("corrupt");
        assert!(err.to_string().contains("chk-3/t1-s0/count.state"), "{err}");
    }
}
