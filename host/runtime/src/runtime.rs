//! The [`Runtime`]: one wasmtime engine per worker, its linkers, the artifact cache and the
//! epoch ticker; and [`Component`], a validated, compiled operator ready to instantiate.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eddy_core::{KeyGroupRange, TimerService};
use eddy_state::StateBackend;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ProfilingStrategy, Store};

use crate::bindings::aggregate_world::WindowAggregatePre;
use crate::bindings::operator_world::KeyedOperatorPre;
use crate::bindings::{json_batch, schemas, state, timers, types};
use crate::cache::{ArtifactCache, CacheOutcome, digest_of};
use crate::call::{CallPolicy, classify};
use crate::config::{InstanceAllocation, RuntimeConfig, SandboxLimits, WasiGrants};
use crate::cpu::CpuShare;
use crate::error::{LoadError, RuntimeError};
use crate::instance::{AggregateHost, AggregateInstance, OperatorInstance};
use crate::keyed::{Keyed, OperatorHost};
use crate::sandbox::Sandbox;
use crate::validate::{self, World};
use crate::{guest_log, output_import};

/// Advances the engine's epoch so that a call past its deadline traps.
#[derive(Debug)]
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine, tick: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })
            .ok();
        Self { stop, thread }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Which subtask an operator instance serves: decides the key groups it may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subtask {
    /// Index among the operator's subtasks.
    pub index: u32,
    /// The operator's parallelism.
    pub parallelism: u32,
    /// Number of key groups (fixed for the life of the job's state).
    pub max_parallelism: u32,
}

impl Subtask {
    /// The only subtask of a parallelism-1 operator.
    pub fn single(max_parallelism: u32) -> Self {
        Self { index: 0, parallelism: 1, max_parallelism }
    }

    /// The key groups this subtask owns.
    pub fn key_groups(&self) -> KeyGroupRange {
        KeyGroupRange::for_subtask(self.max_parallelism, self.parallelism, self.index)
    }
}

/// Compiles, caches and instantiates operator components in a sandbox.
pub struct Runtime {
    engine: Engine,
    operator_linker: Linker<OperatorHost>,
    aggregate_linker: Linker<AggregateHost>,
    cache: Option<ArtifactCache>,
    config: RuntimeConfig,
    _ticker: EpochTicker,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("config", &self.config).finish_non_exhaustive()
    }
}

fn engine_config(config: &RuntimeConfig) -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true)
        // Async component-model machinery makes every crossing 2-4x dearer (FACTS.md).
        .concurrency_support(false)
        .epoch_interruption(true)
        .consume_fuel(config.limits.fuel_per_call.is_some())
        .max_wasm_stack(config.limits.max_stack_bytes);
    // `perf record` can name guest functions only from a map file the engine writes.
    if std::env::var_os("EDDY_WASM_PERFMAP").is_some() {
        c.profiler(ProfilingStrategy::PerfMap);
    }
    if let InstanceAllocation::Pooling { max_instances } = config.allocation {
        let mut pool = PoolingAllocationConfig::new();
        // A Python component holds ~40 core instances and several memories; leave headroom.
        pool.total_component_instances(max_instances)
            .max_core_instances_per_component(64)
            .max_memories_per_component(16)
            .max_tables_per_component(64)
            .total_core_instances(max_instances.saturating_mul(8))
            .total_memories(max_instances.saturating_mul(2))
            .total_tables(max_instances.saturating_mul(8))
            .max_memory_size(config.limits.memory_bytes);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    c
}

impl Runtime {
    /// Creates the engine, the linkers and the epoch ticker.
    pub fn new(config: RuntimeConfig) -> Result<Self, RuntimeError> {
        let engine = Engine::new(&engine_config(&config)).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        let link_err = |e: wasmtime::Error| RuntimeError::Engine(format!("linking host imports: {e:#}"));
        // Every import through its generated bindings except `log`, which reads its message
        // in place (see `guest_log`), and `output`, which copies emitted batches as slices
        // (see `output_import`).
        let mut operator_linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut operator_linker).map_err(link_err)?;
        types::add_to_linker::<_, HasSelf<_>>(&mut operator_linker, |h| h).map_err(link_err)?;
        schemas::add_to_linker::<_, HasSelf<_>>(&mut operator_linker, |h| h).map_err(link_err)?;
        state::add_to_linker::<_, HasSelf<_>>(&mut operator_linker, |h| h).map_err(link_err)?;
        timers::add_to_linker::<_, HasSelf<_>>(&mut operator_linker, |h| h).map_err(link_err)?;
        output_import::add_to_linker(&mut operator_linker).map_err(link_err)?;
        json_batch::add_to_linker::<_, HasSelf<_>>(&mut operator_linker, |h| h).map_err(link_err)?;
        guest_log::add_to_linker(&mut operator_linker).map_err(link_err)?;
        let mut aggregate_linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut aggregate_linker).map_err(link_err)?;
        types::add_to_linker::<_, HasSelf<_>>(&mut aggregate_linker, |h| h).map_err(link_err)?;
        schemas::add_to_linker::<_, HasSelf<_>>(&mut aggregate_linker, |h| h).map_err(link_err)?;
        guest_log::add_to_linker(&mut aggregate_linker).map_err(link_err)?;
        let ticker = EpochTicker::start(engine.clone(), Duration::from_millis(config.epoch_tick_ms.max(1)));
        Ok(Self {
            cache: config.cache_dir.clone().map(|dir| ArtifactCache::new(dir, config.host_key_path.clone())),
            engine,
            operator_linker,
            aggregate_linker,
            config,
            _ticker: ticker,
        })
    }

    /// The configuration the runtime was built with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Reads and loads a `.wasm` file.
    pub fn load_file(&self, name: &str, path: &Path) -> Result<Component, LoadError> {
        let wasm =
            std::fs::read(path).map_err(|source| LoadError::Read { path: path.display().to_string(), source })?;
        self.load(name, &wasm)
    }

    /// Validates and compiles a component (or maps its cached artifact), naming it `name` in
    /// errors and logs.
    pub fn load(&self, name: &str, wasm: &[u8]) -> Result<Component, LoadError> {
        self.load_with(name, wasm, true)
    }

    /// Validates and compiles a component without looking in the cache (the result is still
    /// written there): how long it takes does not tell whether anyone loaded these bytes
    /// before. A multi-tenant service loads an upload this way, so that one tenant's upload
    /// time cannot reveal what another tenant uploaded.
    pub fn load_fresh(&self, name: &str, wasm: &[u8]) -> Result<Component, LoadError> {
        self.load_with(name, wasm, false)
    }

    fn load_with(&self, name: &str, wasm: &[u8], reuse: bool) -> Result<Component, LoadError> {
        if wasm.len() > self.config.max_component_bytes {
            return Err(LoadError::TooLarge { actual: wasm.len(), limit: self.config.max_component_bytes });
        }
        validate::check_header(wasm)?;
        let started = Instant::now();
        let digest = digest_of(wasm);
        let (component, outcome) = match &self.cache {
            Some(cache) => cache.load_or_compile(&self.engine, &digest, wasm, reuse)?,
            None => (
                wasmtime::component::Component::new(&self.engine, wasm)
                    .map_err(|e| LoadError::Invalid(format!("{e:#}")))?,
                CacheOutcome::Uncached,
            ),
        };
        let world = validate::world_of(&self.engine, &component)?;
        let unsupported =
            |e: wasmtime::Error| LoadError::UnsupportedImport { import: first_line(&e), reason: format!("{e:#}") };
        let pre = match world {
            World::KeyedOperator => {
                let pre = self.operator_linker.instantiate_pre(&component).map_err(unsupported)?;
                Pre::Operator {
                    pre: KeyedOperatorPre::new(pre).map_err(|e| LoadError::Invalid(format!("{e:#}")))?,
                    reads_json_batch: validate::reads_json_batch(&self.engine, &component),
                }
            }
            World::WindowAggregate => {
                let pre = self.aggregate_linker.instantiate_pre(&component).map_err(unsupported)?;
                Pre::Aggregate(WindowAggregatePre::new(pre).map_err(|e| LoadError::Invalid(format!("{e:#}")))?)
            }
        };
        let load_time = started.elapsed();
        tracing::info!(operator = name, %digest, ?world, ?outcome, ?load_time, "loaded component");
        Ok(Component {
            name: name.to_owned(),
            digest,
            world,
            outcome,
            load_time,
            pre,
            engine: self.engine.clone(),
            epoch_tick_ms: self.config.epoch_tick_ms,
            limits: self.config.limits.clone(),
            grants: WasiGrants::default(),
            cpu: None,
        })
    }
}

fn first_line(e: &wasmtime::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

enum Pre {
    Operator { pre: KeyedOperatorPre<OperatorHost>, reads_json_batch: bool },
    Aggregate(WindowAggregatePre<AggregateHost>),
}

/// A validated, compiled component, ready to instantiate once per subtask.
pub struct Component {
    name: String,
    digest: String,
    world: World,
    outcome: CacheOutcome,
    load_time: Duration,
    pre: Pre,
    engine: Engine,
    epoch_tick_ms: u64,
    limits: SandboxLimits,
    grants: WasiGrants,
    cpu: Option<Arc<CpuShare>>,
}

impl std::fmt::Debug for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Component")
            .field("name", &self.name)
            .field("digest", &self.digest)
            .field("world", &self.world)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl Component {
    /// Whether the operator reads its batches as JSON through `json-batch` (the Python and
    /// JavaScript SDKs do): the host then keeps a copy of each batch's bytes for its calls,
    /// where other operators get the input batch's bytes lent.
    pub fn reads_json_batch(&self) -> bool {
        matches!(self.pre, Pre::Operator { reads_json_batch: true, .. })
    }

    /// The operator's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hex sha256 of the `.wasm`.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The Eddy world it implements.
    pub fn world(&self) -> World {
        self.world
    }

    /// Whether it was compiled or came from the artifact cache.
    pub fn cache_outcome(&self) -> &CacheOutcome {
        &self.outcome
    }

    /// Time spent validating and compiling (or mapping the cached artifact).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// Replaces the sandbox limits of instances created from now on.
    pub fn with_limits(mut self, limits: SandboxLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Charges the calls of instances created from now on to `share` (a tenant's, say), which
    /// makes them wait whenever the group used more than its share of the CPU.
    pub fn with_cpu_share(mut self, share: Arc<CpuShare>) -> Self {
        self.cpu = Some(share);
        self
    }

    /// Grants WASI access to instances created from now on.
    pub fn with_grants(mut self, grants: WasiGrants) -> Self {
        self.grants = grants;
        self
    }

    /// This component in `other`'s sandbox (limits, grants, CPU share): new code swapped into
    /// a running step gets exactly the sandbox the step's old code had.
    pub fn in_sandbox_of(mut self, other: &Component) -> Self {
        self.limits = other.limits.clone();
        self.grants = other.grants.clone();
        self.cpu = other.cpu.clone();
        self
    }

    fn policy(&self) -> CallPolicy {
        CallPolicy::new(self.limits.clone(), self.epoch_tick_ms, self.cpu.clone())
    }

    fn new_store<T>(&self, data: T) -> Store<T> {
        let mut store = Store::new(&self.engine, data);
        // Start functions run during instantiation: they need a deadline too.
        store.set_epoch_deadline(self.policy().deadline_ticks);
        if let Some(fuel) = self.limits.fuel_per_call {
            let _ = store.set_fuel(fuel);
        }
        store
    }

    fn instantiate_err(&self, e: &wasmtime::Error) -> RuntimeError {
        let kind = classify(e, &self.limits);
        RuntimeError::Instantiate { operator: self.name.clone(), reason: format!("{kind:?}: {e:#}") }
    }

    /// A keyed-operator instance for `subtask`, with its state backend and timer service.
    pub fn instantiate_operator(
        &self,
        subtask: Subtask,
        backend: Box<dyn StateBackend>,
        timers: Box<dyn TimerService>,
    ) -> Result<OperatorInstance, RuntimeError> {
        let Pre::Operator { pre, reads_json_batch } = &self.pre else {
            return Err(RuntimeError::Instantiate {
                operator: self.name.clone(),
                reason: "it is a window aggregate, not an operator; use it as a window's aggregate".into(),
            });
        };
        let mut keyed = Keyed::new(self.limits.clone(), backend, timers, subtask.key_groups(), subtask.max_parallelism);
        keyed.reads_json_batch = *reads_json_batch;
        let host = OperatorHost { sandbox: Sandbox::new(&self.name, &self.grants, &self.limits), keyed };
        let mut store = self.new_store(host);
        store.limiter(|h| &mut h.sandbox.memory);
        let bindings = pre.instantiate(&mut store).map_err(|e| self.instantiate_err(&e))?;
        Ok(OperatorInstance { store, bindings, policy: self.policy() })
    }

    /// A window-aggregate instance.
    pub fn instantiate_aggregate(&self) -> Result<AggregateInstance, RuntimeError> {
        let Pre::Aggregate(pre) = &self.pre else {
            return Err(RuntimeError::Instantiate {
                operator: self.name.clone(),
                reason: "it is an operator, not a window aggregate; use it as a pipeline step".into(),
            });
        };
        let host = AggregateHost { sandbox: Sandbox::new(&self.name, &self.grants, &self.limits) };
        let mut store = self.new_store(host);
        store.limiter(|h| &mut h.sandbox.memory);
        let bindings = pre.instantiate(&mut store).map_err(|e| self.instantiate_err(&e))?;
        Ok(AggregateInstance { store, bindings, policy: self.policy() })
    }
}
