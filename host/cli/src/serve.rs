//! `eddy serve`: the hosted service on this machine, with an embedded worker.

use std::path::PathBuf;

use anyhow::{Context, Result};
use eddy_service::{Service, ServiceConfig};

/// What `eddy serve` and `eddy coordinator` take and keep.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceFlags {
    /// Largest artifact accepted, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_artifact_bytes: u64,
    /// The memory all running jobs together may make the server hold (instances, heap state,
    /// RocksDB caches); default: three quarters of the machine's or the cgroup's memory.
    #[arg(long, env = "EDDY_MEMORY_BUDGET_BYTES")]
    pub memory_budget_bytes: Option<u64>,
    /// How often stores are measured for the `checkpoint_bytes` quota and ended jobs expire.
    #[arg(long, default_value_t = 30_000)]
    pub housekeeping_ms: u64,
    /// How long an ended job's record, output, checkpoints and savepoints are kept.
    #[arg(long, default_value_t = 7 * 24)]
    pub retention_hours: u64,
    /// What tenants' Kafka and PostgreSQL connectors may reach: host names, IP addresses and
    /// CIDR blocks, each with or without `:port` (`10.0.0.0/8,kafka.internal:9092,*:5432`);
    /// default: everything but this server's own port.
    #[arg(long, value_name = "LIST")]
    pub egress_allow: Option<String>,
}

impl ServiceFlags {
    /// Sets these in `config` for a server listening on `listening`.
    pub fn apply(&self, config: &mut ServiceConfig, listening: std::net::SocketAddr) -> Result<()> {
        let policy = match &self.egress_allow {
            Some(list) => eddy_service::egress::EgressPolicy::parse(list).map_err(anyhow::Error::msg)?,
            None => {
                eprintln!(
                    "egress: tenants' Kafka and PostgreSQL connectors may reach any host this server reaches \
                     (give --egress-allow to restrict them)"
                );
                eddy_service::egress::EgressPolicy::open()
            }
        };
        if let Some(list) = &self.egress_allow {
            eprintln!("egress: tenants' connectors may reach {list} only");
        }
        config.egress = policy.serving_at(listening);
        config.max_artifact_bytes = self.max_artifact_bytes;
        config.memory_budget_bytes = self.memory_budget_bytes;
        config.housekeeping_interval = std::time::Duration::from_millis(self.housekeeping_ms.max(100));
        config.ended_job_retention = std::time::Duration::from_secs(self.retention_hours.saturating_mul(3600));
        Ok(())
    }
}

/// Runs the server until SIGINT or SIGTERM; running jobs stop and resume at the next start.
pub fn serve(listen: &str, data_dir: PathBuf, slots: u32, flags: &ServiceFlags) -> Result<()> {
    let runtime = runtime(SERVER_IO_THREADS)?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .with_context(|| format!("cannot listen on {listen}: is another server using it?"))?;
    let mut config = ServiceConfig::new(data_dir);
    config.slots = slots;
    flags.apply(&mut config, listener.local_addr()?)?;
    run(&runtime, listener, config)
}

/// Threads of a server's or coordinator's I/O runtime: two, so that its HTTP side keeps a
/// thread while the other is busy.
pub const SERVER_IO_THREADS: usize = 2;

/// The runtime of the service's and the coordinator's network I/O, with `threads` threads.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    io_runtime(threads).build().context("starting the async runtime")
}

/// A worker's runtime, with `threads` threads: they carry the data plane (QUIC, frames,
/// credits), so they run under `SCHED_BATCH` as the task threads do (`eddy_core::batch_thread`)
/// and a datagram's wake-up no longer preempts a task mid-batch. q5 across two worker processes
/// (`cargo bench -p eddy-cli --bench cluster_shuffle`, 7 rounds, twice each): 1.29-1.30 →
/// 1.41 M events per CPU-second. A server's and a coordinator's runtime answer requests and
/// keep the default policy.
pub fn data_plane_runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    io_runtime(threads).on_thread_start(eddy_core::batch_thread::enter).build().context("starting the async runtime")
}

fn io_runtime(threads: usize) -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(threads).enable_all().thread_name("eddy-io");
    builder
}

/// Opens the service in `config.data_dir` and serves on `listener` until SIGINT or SIGTERM.
pub fn run(runtime: &tokio::runtime::Runtime, listener: tokio::net::TcpListener, config: ServiceConfig) -> Result<()> {
    let (data_dir, slots) = (config.data_dir.clone(), config.slots);
    let (service, admin_token) = Service::open(config).with_context(|| format!("opening {}", data_dir.display()))?;
    // Not printed: standard error ends up in logs, which others read.
    if admin_token.is_some() {
        eprintln!("created the admin token in {} (mode 0600): keep it secret", data_dir.join("admin.token").display());
    }
    let addr = listener.local_addr()?;
    eprintln!(
        "eddy serving on http://{addr} (data in {}, {slots} slots, {} MiB of memory for jobs); API at /v1, OpenAPI \
         at /v1/openapi.json",
        data_dir.display(),
        service.state().supervisor.memory_budget() >> 20
    );
    runtime.block_on(service.serve(listener, stop_signal())).context("serving")?;
    eprintln!("stopped; running jobs resume at the next start");
    Ok(())
}

pub async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; stop the server with Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
