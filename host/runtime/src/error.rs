//! Errors at the sandbox boundary. Three levels, kept apart on purpose: a load error (the
//! `.wasm` is unusable), an operator error (the guest reported a failure it understands), and
//! a trap (the guest misbehaved or hit a limit). Each says whose fault it was.

use std::fmt;

use eddy_state::StateError;

/// Why a `.wasm` was rejected. The message names what is wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Too big to accept.
    #[error("component is {actual} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// Size of the upload.
        actual: usize,
        /// Configured maximum.
        limit: usize,
    },
    /// Not WebAssembly at all.
    #[error(
        "not a WebAssembly binary (it does not start with the \\0asm magic); upload the .wasm built for wasm32-wasip2"
    )]
    NotWasm,
    /// A core module where a component is needed.
    #[error(
        "this is a core WebAssembly module, not a component; build for the wasm32-wasip2 target \
         (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    /// A component that implements neither Eddy world.
    #[error(
        "component does not implement an Eddy world: it exports [{exports}] but neither \
         `{operator}` nor `{aggregate}`; build it against wit/dataflow.wit",
        operator = crate::validate::OPERATOR_EXPORT,
        aggregate = crate::validate::AGGREGATE_EXPORT
    )]
    WrongWorld {
        /// What it exports instead.
        exports: String,
    },
    /// An Eddy export that lacks functions.
    #[error("export `{interface}` lacks function(s) {missing}; rebuild against the current wit/dataflow.wit")]
    MissingExports {
        /// The interface.
        interface: String,
        /// The missing functions.
        missing: String,
    },
    /// Imports Eddy does not provide.
    #[error("component imports `{import}`, which Eddy does not provide to operators: {reason}")]
    UnsupportedImport {
        /// The import.
        import: String,
        /// Detail from the linker.
        reason: String,
    },
    /// The bytes are a component but do not validate or compile.
    #[error("component failed to compile: {0}")]
    Invalid(String),
    /// The artifact cache could not be used (the load still fails only if compiling fails too).
    #[error("artifact cache at {path}: {reason}")]
    Cache {
        /// The cache file.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

/// Why a guest call was stopped by the host: a limit or a contract violation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A size or count limit.
    #[error("{what} of {actual} exceeds the limit of {limit}")]
    Limit {
        /// What was too big (for example "linear memory bytes").
        what: &'static str,
        /// The limit.
        limit: usize,
        /// What the guest asked for.
        actual: usize,
    },
    /// A key handle that names no record of the current call.
    #[error("key handle {handle} names no record of the current call ({records} records)")]
    BadKeyHandle {
        /// The handle.
        handle: u32,
        /// Records in the call.
        records: usize,
    },
    /// Keyed state or timers used without a key: on a record that has none (`record`), or
    /// in a call that handles no record or timer (`open`, `close`).
    #[error("{}", no_key_message(.call, *.record))]
    NoKey {
        /// The export being called.
        call: &'static str,
        /// The record without a key, if that is what the handle named.
        record: Option<u32>,
    },
    /// A span of a guest's table whose bytes lie outside the buffer it came with.
    #[error("{what} {index} points outside the buffer it came with")]
    BadSpan {
        /// What the table holds ("emitted record", "value write").
        what: &'static str,
        /// Row of the table.
        index: usize,
    },
    /// A packed table that is not a whole number of rows.
    #[error("{0}")]
    MalformedTable(eddy_wire::TableError),
    /// An undeclared id or a conflicting declaration.
    #[error("{0}")]
    BadDeclaration(String),
    /// A write that would take the subtask's state past its configured bytes or entries.
    #[error("{0}")]
    StateLimit(eddy_state::StateLimitExceeded),
    /// JSON text given to a `json-batch` import that is not what the import takes.
    #[error("{what} is not what json-batch takes: {reason}")]
    MalformedJson {
        /// What the text was for ("emitted records", "value writes").
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An import called during an export it does not serve.
    #[error("{import} serves only {serves}, not {call}")]
    WrongCall {
        /// The import.
        import: &'static str,
        /// The export it serves.
        serves: &'static str,
        /// The export being called.
        call: &'static str,
    },
    /// A batched call that answered a different number of items than it was given.
    #[error("returned {actual} results for {expected} inputs")]
    ResultCount {
        /// Inputs the host passed.
        expected: usize,
        /// Results the guest returned.
        actual: usize,
    },
}

/// Two different mistakes, two different fixes: only a record without a key means the
/// stream is not keyed.
fn no_key_message(call: &str, record: Option<u32>) -> String {
    match record {
        Some(record) => {
            format!("record {record} has no key, but keyed state and timers need one: add key_by before this step")
        }
        None => format!(
            "keyed state or timers used in {call}, which handles no record or timer whose key they could \
             use: use them in process or on-timer (declare states in open)"
        ),
    }
}

/// What happened inside a call that did not return normally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallErrorKind {
    /// The guest returned `operator-error` on purpose.
    Operator {
        /// Its kind, as the WIT names it.
        kind: GuestErrorKind,
        /// Its message.
        message: String,
    },
    /// The call ran past `call_timeout_ms`.
    Timeout {
        /// The configured timeout.
        timeout_ms: u64,
    },
    /// The fuel budget ran out.
    OutOfFuel,
    /// The wasm stack overflowed (unbounded recursion).
    StackOverflow,
    /// The host stopped the guest for breaking a limit or the contract.
    Violation(Violation),
    /// The guest trapped (a panic, an unreachable, an out-of-bounds access).
    Trap {
        /// The trap, as wasmtime describes it.
        trap: String,
    },
    /// The state backend failed.
    State(String),
    /// The instance was poisoned by an earlier trap and must be recreated.
    Poisoned,
    /// A fault in Eddy itself.
    Internal(String),
}

/// The `error-kind` of an `operator-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestErrorKind {
    /// Unusable configuration.
    BadConfig,
    /// An uninterpretable record.
    BadRecord,
    /// Anything else.
    Failed,
}

/// Whose fault a failure is, which decides what the user is told and whether a restart helps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The user's operator: fix the operator or its configuration.
    UserOperator,
    /// Storage or another system outside Eddy: a restart may help.
    External,
    /// A bug in Eddy.
    Internal,
}

/// A failed call into an operator: which operator, which call, what happened, and the guest's
/// own last words (panic message or stderr tail) when it left any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The operator's name in the pipeline.
    pub operator: String,
    /// The export called (`process`, `on-timer`, ...).
    pub call: &'static str,
    /// What happened.
    pub kind: CallErrorKind,
    /// What the guest said before failing (panic message, stderr), if anything.
    pub guest_message: Option<String>,
}

impl CallError {
    /// Whose fault the failure is.
    pub fn fault(&self) -> Fault {
        match self.kind {
            CallErrorKind::State(_) => Fault::External,
            CallErrorKind::Internal(_) => Fault::Internal,
            _ => Fault::UserOperator,
        }
    }

    /// Whether restarting from the last checkpoint can help (deterministic failures recur).
    pub fn retryable(&self) -> bool {
        matches!(self.kind, CallErrorKind::State(_) | CallErrorKind::Timeout { .. } | CallErrorKind::Poisoned)
    }
}

impl fmt::Display for CallErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallErrorKind::Operator { kind, message } => write!(f, "{kind:?}: {message}"),
            CallErrorKind::Timeout { timeout_ms } => {
                write!(f, "call ran longer than {timeout_ms} ms and was interrupted")
            }
            CallErrorKind::OutOfFuel => write!(f, "ran out of fuel"),
            CallErrorKind::StackOverflow => write!(f, "wasm stack overflow (unbounded recursion?)"),
            CallErrorKind::Violation(v) => write!(f, "stopped by the sandbox: {v}"),
            CallErrorKind::Trap { trap } => write!(f, "trapped: {trap}"),
            CallErrorKind::State(e) => write!(f, "state backend failed: {e}"),
            CallErrorKind::Poisoned => write!(f, "instance unusable after an earlier trap; recreate it"),
            CallErrorKind::Internal(e) => write!(f, "internal error: {e}"),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "operator `{}` failed in {}: {}", self.operator, self.call, self.kind)?;
        if let Some(msg) = &self.guest_message {
            write!(f, "; guest said: {msg}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CallError {}

/// Host-side failures raised inside imports; they become traps and are mapped back to a
/// [`CallErrorKind`] when the call returns.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostTrap {
    #[error(transparent)]
    Violation(#[from] Violation),
    #[error(transparent)]
    State(#[from] StateError),
}

/// Failure to set up the runtime or an instance.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The engine configuration was rejected.
    #[error("cannot create the wasm engine: {0}")]
    Engine(String),
    /// Creating an instance failed (out of pooled slots, memory cap below the initial memory...).
    #[error("cannot instantiate operator `{operator}`: {reason}")]
    Instantiate {
        /// The operator.
        operator: String,
        /// Why.
        reason: String,
    },
}
