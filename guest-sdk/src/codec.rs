//! How typed keys, values and state are turned into bytes: JSON, so that operators written in
//! different languages read each other's records.

use serde::{Deserialize, Serialize};

use crate::Result;

/// Encodes a value as the bytes Eddy stores and ships.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(value)?)
}

/// Appends the encoding of `value` to `buf`.
pub(crate) fn encode_into<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) -> Result<()> {
    serde_json::to_writer(buf, value)?;
    Ok(())
}

/// Decodes bytes produced by [`encode`] (or by any other SDK).
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    Ok(serde_json::from_slice(bytes)?)
}
