//! Typed configuration of the runtime and of each sandbox, with units and sizing advice.

use std::path::PathBuf;

/// Limits every operator instance runs under. Exceeding one traps the call with
/// [`crate::Violation`]; the host and other instances are unaffected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Linear memory of one instance, all its memories together. Rust operators need a few
    /// MiB; a Python operator starts near 30 MiB.
    pub memory_bytes: usize,
    /// Wall time one call (`process`, `on-timer`, ...) may run before it traps. Measured in
    /// epoch ticks, so the real bound is this plus up to one tick.
    pub call_timeout_ms: u64,
    /// Optional instruction budget per call (deterministic, unlike the timeout); costs 3-7%.
    pub fuel_per_call: Option<u64>,
    /// Wasm stack of one call; deep recursion traps with a stack overflow beyond it.
    pub max_stack_bytes: usize,
    /// Largest key or map key a guest may pass to state.
    pub max_key_bytes: usize,
    /// Largest value (or whole list) a guest may store or emit.
    pub max_value_bytes: usize,
    /// Bytes a guest may emit during one call.
    pub max_output_bytes_per_call: usize,
    /// Bytes one `list-get`, `list-replace` or `map-entries` may carry: the items plus 8
    /// bytes per `list<u8>` (the pointer and length each takes in guest memory). Bounds what
    /// the host materializes for one call however large a list or map grows; a guest needing
    /// more keeps its items under several keys or states.
    pub max_state_read_bytes: usize,
    /// States plus side outputs one instance may declare.
    pub max_declarations: usize,
    /// Timers one instance may hold registered (both domains). The heap timer service spends
    /// ~100 bytes plus the key's bytes per timer, so 1 M timers with short keys hold ~130 MB.
    pub max_timers: usize,
    /// Timers one key may hold registered (both domains).
    pub max_timers_per_key: usize,
    /// Timers handed to one `on-timer` call; more that come due at once go in several calls
    /// (each also holds at most 1 MiB of keys), so a burst cannot overflow guest memory.
    pub max_timers_per_call: usize,
    /// Longest log message kept; longer ones are cut before they leave guest memory.
    pub max_log_message_bytes: usize,
    /// Log lines one instance may write per second on average; lines beyond the rate and
    /// the burst are dropped and counted, and the count is logged at most every 10 s.
    pub log_lines_per_second: u32,
    /// Log lines one instance may write at once before the rate applies.
    pub log_burst_lines: u32,
}

impl SandboxLimits {
    /// These limits with an instance's memory held to at most `bytes` (a tenant's quota).
    pub fn with_memory_at_most(mut self, bytes: u64) -> Self {
        self.memory_bytes = usize::try_from(bytes).unwrap_or(usize::MAX).min(self.memory_bytes);
        self
    }
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            call_timeout_ms: 5_000,
            fuel_per_call: None,
            max_stack_bytes: 512 << 10,
            max_key_bytes: 64 << 10,
            max_value_bytes: 16 << 20,
            max_output_bytes_per_call: 64 << 20,
            max_state_read_bytes: 16 << 20,
            max_declarations: 1_024,
            max_timers: 1_000_000,
            max_timers_per_key: 10_000,
            max_timers_per_call: 1_024,
            max_log_message_bytes: 4 << 10,
            log_lines_per_second: 100,
            log_burst_lines: 1_000,
        }
    }
}

/// WASI access a pipeline grants an operator. The default grants nothing: no files, no
/// network, no environment, the wall clock frozen at the epoch and a virtual monotonic clock that moves
/// only per read (time comes from the timer imports).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WasiGrants {
    /// Environment variables the guest sees.
    pub env: Vec<(String, String)>,
    /// Real wall and monotonic clocks instead of frozen and virtual ones.
    pub clocks: bool,
    /// Host directories mounted read-only, as (host path, guest path).
    pub read_only_dirs: Vec<(PathBuf, String)>,
    /// Outgoing TCP/UDP and name lookups to any address.
    pub network: bool,
    /// Real randomness (`wasi:random`) instead of a fixed, deterministic sequence.
    pub random: bool,
}

/// How instances get their memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceAllocation {
    /// mmap per instance: no up-front reservation; instantiation costs tens of microseconds.
    OnDemand,
    /// Pre-reserved slots (wasmtime's pooling allocator): instantiation in microseconds, at
    /// the cost of reserving address space for `max_instances` instances at start-up.
    Pooling {
        /// Component instances alive at once (operator subtasks on this worker).
        max_instances: u32,
    },
}

/// Configuration of a [`crate::Runtime`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Where precompiled artifacts are cached by digest; `None` compiles in memory each load.
    /// Created mode 0700.
    pub cache_dir: Option<PathBuf>,
    /// The per-host secret that authenticates cache entries (32 random bytes, mode 0600,
    /// created on first use). It must not lie inside `cache_dir`: whoever can write there
    /// could then plant both an artifact and the key that vouches for it. Default:
    /// [`default_host_key_path`]. Used only when `cache_dir` is set.
    pub host_key_path: Option<PathBuf>,
    /// Largest `.wasm` accepted.
    pub max_component_bytes: usize,
    /// Default limits for instances.
    pub limits: SandboxLimits,
    /// Interval of the epoch ticker that enforces `call_timeout_ms`.
    pub epoch_tick_ms: u64,
    /// Instance memory strategy.
    pub allocation: InstanceAllocation,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            cache_dir: None,
            host_key_path: default_host_key_path(),
            max_component_bytes: 128 << 20,
            limits: SandboxLimits::default(),
            epoch_tick_ms: 10,
            allocation: InstanceAllocation::Pooling { max_instances: 128 },
        }
    }
}

/// Where the host key lives unless configured: `$EDDY_HOME/host.key`, else
/// `$HOME/.eddy/host.key`; `None` when neither variable is set. Per user, not per project,
/// so a cloned repository or a shared volume that carries a cache directory never carries
/// the key that vouches for its entries.
pub fn default_host_key_path() -> Option<PathBuf> {
    let non_empty = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    non_empty("EDDY_HOME").or_else(|| non_empty("HOME").map(|home| home.join(".eddy"))).map(|dir| dir.join("host.key"))
}
