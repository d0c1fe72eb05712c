//! Tokens and ids: random where guessing must not pay, hashed where a leak of the store must
//! not hand out access.
//!
//! A token carries 256 random bits, so a plain sha256 of it (no salt, no stretching) is enough
//! to store: there is no dictionary to try. Ids carry 64 random bits: they are not secrets
//! (another tenant's id answers 404 anyway), only unguessable enough not to enumerate.

use sha2::{Digest, Sha256};

/// What every token starts with, so a leaked one is recognisable in logs and scanners.
pub const TOKEN_PREFIX: &str = "eddy_";

/// The system's randomness failed: nothing safe can be issued.
#[derive(Debug, thiserror::Error)]
#[error("no randomness for a new secret: {0}")]
pub struct NoRandomness(String);

fn random_hex<const N: usize>() -> Result<String, NoRandomness> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| NoRandomness(e.to_string()))?;
    Ok(hex(&bytes))
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new bearer token: the prefix and 256 random bits in hex.
pub fn new_token() -> Result<String, NoRandomness> {
    Ok(format!("{TOKEN_PREFIX}{}", random_hex::<32>()?))
}

/// A new id: `prefix` and 64 random bits in hex.
pub fn new_id(prefix: &str) -> Result<String, NoRandomness> {
    Ok(format!("{prefix}{}", random_hex::<8>()?))
}

/// How a token is stored and looked up.
pub fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_distinct_and_carry_256_bits() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert!(a[TOKEN_PREFIX.len()..].bytes().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn the_stored_hash_is_sha256() {
        // sha256("abc"), from FIPS 180-2, appendix B.1.
        assert_eq!(token_hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
