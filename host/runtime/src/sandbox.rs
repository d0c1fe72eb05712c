//! The part of an instance's store every world shares: WASI (deny by default; the wall clock frozen at
//! the epoch, the monotonic clock virtual, randomness a fixed sequence unless granted), the memory
//! limiter, the guest's stderr, and the guest's last error message.

use rand::SeedableRng;
use rand::rngs::StdRng;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::log;
use crate::config::{SandboxLimits, WasiGrants};
use crate::error::{HostTrap, Violation};
use crate::guest_log::GuestLog;

/// The seed of every instance's virtual `wasi:random` (see `WasiGrants::random`).
const VIRTUAL_RANDOM_SEED: u64 = 0xEDD1;

/// Bytes of guest stderr kept for error reports.
const STDERR_CAPACITY: usize = 64 << 10;
/// Longest guest message attached to an error.
const GUEST_MESSAGE_MAX: usize = 4 << 10;

/// Caps the sum of all linear memories of one component instance (a Python component has
/// several), trapping with a [`Violation`] instead of letting `memory.grow` fail silently.
#[derive(Debug)]
pub(crate) struct MemoryCap {
    cap: usize,
    used: usize,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let after = self.used - current.min(self.used) + desired;
        if after > self.cap {
            return Err(wasmtime::Error::new(HostTrap::from(Violation::Limit {
                what: "linear memory bytes",
                limit: self.cap,
                actual: after,
            })));
        }
        self.used = after;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        const MAX_TABLE_ELEMENTS: usize = 1 << 20;
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// The wall clock an ungranted guest sees: the Unix epoch, always. Event time comes from
/// records and processing time from the timer imports, so a guest never needs it.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// The monotonic clock an ungranted guest sees: virtual, starting at one second and moving
/// one microsecond per read. Runtimes refuse a monotonic clock that reads zero or stands still
/// (Go's throws "nanotime returning zero" at start), yet the readings depend only on how many
/// reads came before, so two instances fed the same input see the same times.
#[derive(Default)]
struct VirtualMonotonicClock {
    reads: std::sync::atomic::AtomicU64,
}

impl VirtualMonotonicClock {
    const START_NS: u64 = 1_000_000_000;
    const STEP_NS: u64 = 1_000;
}

impl HostMonotonicClock for VirtualMonotonicClock {
    fn resolution(&self) -> u64 {
        Self::STEP_NS
    }
    fn now(&self) -> u64 {
        let reads = self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self::START_NS.saturating_add(reads.saturating_mul(Self::STEP_NS))
    }
}

/// Store data shared by both worlds.
pub(crate) struct Sandbox {
    pub(crate) operator: String,
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryCap,
    stderr: MemoryOutputPipe,
    last_error_log: Option<String>,
    pub(crate) log: GuestLog,
    /// Ids of the schemas this instance declared, first [`MAX_NOTED_SCHEMAS`]: recorded with
    /// its state so a snapshot's rows can be read by field name in another process.
    schemas: Vec<u32>,
}

/// Most schema ids an instance's snapshots record (a guest may declare more; rows of the rest
/// read positionally from a snapshot).
pub const MAX_NOTED_SCHEMAS: usize = 256;
/// Most bytes of names those schemas may hold together.
pub const MAX_NOTED_SCHEMA_BYTES: usize = 64 << 10;

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("operator", &self.operator)
            .field("memory", &self.memory)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    pub(crate) fn new(operator: &str, grants: &WasiGrants, limits: &SandboxLimits) -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stderr(stderr.clone()).envs(&grants.env);
        if !grants.clocks {
            wasi.wall_clock(FrozenClock).monotonic_clock(VirtualMonotonicClock::default());
        }
        if !grants.random {
            // Virtual randomness: every instance draws the same sequence, so a guest stays a
            // function of its input (its twin in another language, a replay, a restart all see
            // what it saw). Not secret: a guest has nothing to keep secret from its host.
            wasi.secure_random(StdRng::seed_from_u64(VIRTUAL_RANDOM_SEED))
                .insecure_random(StdRng::seed_from_u64(VIRTUAL_RANDOM_SEED))
                .insecure_random_seed(u128::from(VIRTUAL_RANDOM_SEED));
        }
        for (host, guest) in &grants.read_only_dirs {
            // A directory that cannot be opened is simply not mounted; the guest sees ENOENT.
            if let Err(e) = wasi.preopened_dir(host, guest, wasmtime_wasi::FsPerms::ReadOnly) {
                tracing::warn!(operator, dir = %host.display(), error = %e, "cannot grant directory");
            }
        }
        if grants.network {
            wasi.inherit_network().allow_tcp(true).allow_udp(true).allow_ip_name_lookup(true);
        }
        Self {
            operator: operator.to_owned(),
            wasi: wasi.build(),
            table: ResourceTable::new(),
            memory: MemoryCap { cap: limits.memory_bytes, used: 0 },
            stderr,
            last_error_log: None,
            log: GuestLog::new(limits.log_lines_per_second, limits.log_burst_lines, limits.max_log_message_bytes),
            schemas: Vec::new(),
        }
    }

    /// Notes that the guest declared schema `id`.
    pub(crate) fn note_schema(&mut self, id: u32) {
        if self.schemas.len() < MAX_NOTED_SCHEMAS && !self.schemas.contains(&id) {
            self.schemas.push(id);
        }
    }

    /// The schemas the guest declared, as the registry holds them, up to
    /// [`MAX_NOTED_SCHEMA_BYTES`] of names (a schema may name 4 096 fields).
    pub(crate) fn declared_schemas(&self) -> Vec<eddy_wire::schema::Schema> {
        use eddy_wire::schema::Schemas;
        let mut bytes = 0;
        let mut out = Vec::new();
        for schema in self.schemas.iter().filter_map(|id| crate::schemas::schemas().get(*id)) {
            bytes += schema.name.len() + schema.fields.iter().map(String::len).sum::<usize>();
            if bytes > MAX_NOTED_SCHEMA_BYTES {
                break;
            }
            out.push((*schema).clone());
        }
        out
    }

    /// Linear memory the instance holds now (all memories).
    pub(crate) fn memory_used(&self) -> usize {
        self.memory.used
    }

    /// Forgets the error log of earlier calls (cheap: runs once per call).
    pub(crate) fn begin_call(&mut self) {
        self.last_error_log = None;
    }

    /// Reports dropped log lines, if a report is due.
    pub(crate) fn end_call(&mut self) {
        self.log.report_drops(&self.operator);
    }
}

impl Drop for Sandbox {
    /// The instance is gone (its job ended or restarts): the drops since the last report are
    /// told now, or never.
    fn drop(&mut self) {
        self.log.report_last_drops(&self.operator);
    }
}

impl Sandbox {
    /// The guest's own account of a failure: its last error log in this call (the SDKs log
    /// panics there), else the tail of what it wrote to stderr (Python tracebacks land there).
    pub(crate) fn guest_message(&self) -> Option<String> {
        if let Some(msg) = &self.last_error_log {
            return Some(msg.clone());
        }
        let all = self.stderr.contents();
        let text = String::from_utf8_lossy(&all);
        let text = text.trim();
        (!text.is_empty()).then(|| tail(text, GUEST_MESSAGE_MAX))
    }
}

fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// Gives the shared imports access to the sandbox part of any store data.
pub(crate) trait HasSandbox {
    fn sandbox(&mut self) -> &mut Sandbox;
}

/// A guest's log line, already cut to its limit: it joins the host's log tagged with the
/// operator if `written` (the rate limit let it through); an error-level line is kept as the
/// guest's last words for error reports either way (the SDKs log panics there).
pub(crate) fn guest_log(sandbox: &mut Sandbox, level: log::Level, message: String, written: bool) {
    if !written {
        if matches!(level, log::Level::Error) {
            sandbox.last_error_log = Some(message);
        }
        return;
    }
    let operator = sandbox.operator.as_str();
    match level {
        log::Level::Trace => tracing::trace!(operator, "{message}"),
        log::Level::Debug => tracing::debug!(operator, "{message}"),
        log::Level::Info => tracing::info!(operator, "{message}"),
        log::Level::Warn => tracing::warn!(operator, "{message}"),
        log::Level::Error => {
            tracing::error!(operator, "{message}");
            sandbox.last_error_log = Some(message);
        }
    }
}
