//! Byte formats of checkpoint files: every file is sealed (magic, length, CRC-32) so a torn or
//! corrupted file is detected on restore, never half-read; state entries are length-prefixed.
//! Part of the checkpoint format: change only with a version bump.

use eddy_state::FrozenEntries;

use super::CheckpointError;

const MAGIC: &[u8; 8] = b"EDDYCKP1";
const HEADER: usize = 8 + 8 + 4;

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

/// State entries as `count (u64) | (key len (u32) | key | value len (u32) | value)*`.
pub fn encode_entries(entries: &dyn FrozenEntries) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + entries.len() * 64);
    out.extend_from_slice(&(entries.len() as u64).to_be_bytes());
    entries.for_each(&mut |k, v| {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v);
    });
    out
}

/// Reads [`encode_entries`]'s output, calling `visit` per entry.
pub fn decode_entries(
    mut bytes: &[u8],
    what: &str,
    visit: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<u64, CheckpointError> {
    let corrupt = |problem: &str| CheckpointError::Corrupt { file: what.to_owned(), problem: problem.to_owned() };
    let take = |n: usize, bytes: &mut &[u8]| -> Result<Vec<u8>, CheckpointError> {
        if bytes.len() < n {
            return Err(corrupt("entries end early"));
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head.to_vec())
    };
    let count = u64::from_be_bytes(take(8, &mut bytes)?.try_into().unwrap_or_default());
    for _ in 0..count {
        let klen = u32::from_be_bytes(take(4, &mut bytes)?.try_into().unwrap_or_default()) as usize;
        if bytes.len() < klen {
            return Err(corrupt("a key runs past the end"));
        }
        let (key, rest) = bytes.split_at(klen);
        bytes = rest;
        let vlen = u32::from_be_bytes(take(4, &mut bytes)?.try_into().unwrap_or_default()) as usize;
        if bytes.len() < vlen {
            return Err(corrupt("a value runs past the end"));
        }
        let (value, rest) = bytes.split_at(vlen);
        bytes = rest;
        visit(key, value);
    }
    if !bytes.is_empty() {
        return Err(corrupt("bytes after the last entry"));
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
            let sealed = seal(&encode_entries(&entries));
            let mut back = Vec::new();
            decode_entries(unseal(&sealed, "f").expect("intact"), "f", &mut |k, v| back.push((k.to_vec(), v.to_vec())))
                .expect("decodes");
            prop_assert_eq!(&back, &entries);

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
