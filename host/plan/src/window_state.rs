//! How a window operator keeps its windows in keyed state. Part of the snapshot format (change
//! it only with a checkpoint format bump): the engine writes it, and `eddy state` reads
//! checkpoints with it.
//!
//! Per key, under the state ids of these names:
//! - [`ACC_STATE`], namespace = the window ([`encode_window`], 16 bytes): one flag byte
//!   ([`FIRED`] once the window has fired, else [`NOT_FIRED`]) followed by the aggregate's
//!   accumulator bytes;
//! - [`SESSIONS_STATE`] (session windows only), empty namespace: the key's open sessions as a
//!   list (`eddy_state::encode_list`) of encoded windows.

use crate::window::Window;

/// State name of the per-(key, window) accumulators.
pub const ACC_STATE: &str = "window-acc";
/// State name of the per-key session sets.
pub const SESSIONS_STATE: &str = "window-sessions";

/// Flag byte of an accumulator whose window has not fired yet.
pub const NOT_FIRED: u8 = 0;
/// Flag byte of an accumulator whose window has fired (and is kept for allowed lateness).
pub const FIRED: u8 = 1;

/// The 16-byte state namespace of a window: start and end as big-endian i64 with the sign bit
/// flipped, so byte order is (start, end) order, negative times included, and a scan of one
/// key's accumulators visits its windows in time order.
pub fn encode_window(window: &Window) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&((window.start as u64) ^ (1 << 63)).to_be_bytes());
    out[8..].copy_from_slice(&((window.end as u64) ^ (1 << 63)).to_be_bytes());
    out
}

/// Reads what [`encode_window`] wrote; the error says what is wrong with the bytes.
pub fn decode_window(bytes: &[u8]) -> Result<Window, String> {
    let Ok(bytes) = <[u8; 16]>::try_from(bytes) else {
        return Err(format!("a window is 16 bytes, got {}", bytes.len()));
    };
    let both = u128::from_be_bytes(bytes);
    let start = (((both >> 64) as u64) ^ (1 << 63)) as i64;
    let end = ((both as u64) ^ (1 << 63)) as i64;
    if start >= end {
        return Err(format!("window [{start}, {end}) is empty"));
    }
    Ok(Window { start, end })
}

/// An accumulator entry taken apart: whether its window fired, and the aggregate's bytes.
pub fn split_accumulator(value: &[u8]) -> Result<(bool, &[u8]), String> {
    match value.split_first() {
        Some((&flag @ (NOT_FIRED | FIRED), acc)) => Ok((flag == FIRED, acc)),
        Some((flag, _)) => Err(format!("window accumulator flag byte {flag} is neither 0 nor 1")),
        None => Err("an empty window accumulator entry (no flag byte)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_encode_in_time_order_and_round_trip() {
        // Literal bytes of the definition: sign bit flipped, big-endian.
        let w = Window { start: -1, end: 1 };
        assert_eq!(encode_window(&w), [0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1]);
        let windows = [
            Window { start: i64::MIN, end: i64::MIN + 1 },
            Window { start: -10, end: 0 },
            Window { start: -10, end: 5 },
            Window { start: 0, end: 10 },
            Window { start: i64::MAX - 1, end: i64::MAX },
        ];
        for pair in windows.windows(2) {
            assert!(encode_window(&pair[0]) < encode_window(&pair[1]), "{pair:?}");
        }
        for w in windows {
            assert_eq!(decode_window(&encode_window(&w)), Ok(w));
        }
        assert!(decode_window(&[0; 15]).expect_err("short").contains("16 bytes"));
        assert!(decode_window(&encode_window(&Window { start: 5, end: 5 })).expect_err("empty").contains("empty"));
        assert_eq!(split_accumulator(b"\x01{}"), Ok((true, &b"{}"[..])));
        assert_eq!(split_accumulator(b"\x00"), Ok((false, &b""[..])));
        assert!(split_accumulator(b"\x02x").is_err());
        assert!(split_accumulator(b"").is_err());
    }
}
