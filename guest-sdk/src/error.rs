//! The error an operator returns on purpose. Panics are not errors: they trap, and the host
//! reports them with the panic message.

use std::fmt;

use crate::bindings::types::{ErrorKind as WitErrorKind, OperatorError};

/// What went wrong, in the terms of the WIT contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The step configuration is unusable; retrying will not help.
    BadConfig,
    /// A record (or a state value) could not be decoded.
    BadRecord,
    /// Any other failure the operator chose to report.
    Failed,
}

/// An operator failure, returned from `open`, `process`, `on_timer` or `close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// The configuration is unusable.
    pub fn bad_config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadConfig, message)
    }

    /// A record could not be interpreted.
    pub fn bad_record(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRecord, message)
    }

    /// Any other failure.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Failed, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message shown to the user.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn into_wit(self) -> OperatorError {
        let kind = match self.kind {
            ErrorKind::BadConfig => WitErrorKind::BadConfig,
            ErrorKind::BadRecord => WitErrorKind::BadRecord,
            ErrorKind::Failed => WitErrorKind::Failed,
        };
        OperatorError { kind, message: self.message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

/// Decoding failures are bad records: the bytes did not have the shape the operator expects.
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Self::bad_record(e.to_string())
    }
}
