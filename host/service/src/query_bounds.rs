//! Bounds every query naming a job's step and a key checks (`/state`, `/replay`): one
//! definition, so the two read endpoints refuse the same way.

use crate::problem::{ApiError, ApiResult};

/// Longest step or state name a query may give.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest key a query may give.
pub const MAX_KEY_BYTES: usize = 4_096;

/// A field longer than `limit` bytes.
pub fn too_long(field: &str, limit: usize) -> ApiError {
    ApiError::unprocessable(format!("`{field}` is longer than {limit} bytes")).at(field.to_owned())
}

/// `step` is named and short, `key` short; `what` says what the step is for.
pub fn step_and_key(step: &str, key: Option<&str>, what: &str) -> ApiResult<()> {
    if step.is_empty() {
        return Err(ApiError::unprocessable(format!("`step` is empty: name {what}")).at("step"));
    }
    if step.len() > MAX_NAME_BYTES {
        return Err(too_long("step", MAX_NAME_BYTES));
    }
    if key.is_some_and(|k| k.len() > MAX_KEY_BYTES) {
        return Err(too_long("key", MAX_KEY_BYTES));
    }
    Ok(())
}

/// `value` (or `default` when absent), refused outside `1..=max`.
pub fn count<T>(field: &str, value: Option<T>, default: T, max: T) -> ApiResult<T>
where
    T: Copy + PartialOrd + From<u8> + std::fmt::Display,
{
    let value = value.unwrap_or(default);
    if value < T::from(1) || value > max {
        return Err(ApiError::unprocessable(format!("`{field}` must be 1 to {max}")).at(field.to_owned()));
    }
    Ok(value)
}
