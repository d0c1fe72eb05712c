//! `eddy serve`: the hosted service on this machine, with an embedded worker.

use std::path::PathBuf;

use anyhow::{Context, Result};
use eddy_service::{Service, ServiceConfig};

/// Runs the server until SIGINT or SIGTERM; running jobs stop and resume at the next start.
pub fn serve(listen: &str, data_dir: PathBuf, slots: u32, max_artifact_bytes: u64) -> Result<()> {
    let runtime = runtime()?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .with_context(|| format!("cannot listen on {listen}: is another server using it?"))?;
    let mut config = ServiceConfig::new(data_dir);
    config.slots = slots;
    config.max_artifact_bytes = max_artifact_bytes;
    run(&runtime, listener, config)
}

/// The runtime of the service's and the cluster's network I/O.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("eddy-io")
        .build()
        .context("starting the async runtime")
}

/// Opens the service in `config.data_dir` and serves on `listener` until SIGINT or SIGTERM.
pub fn run(runtime: &tokio::runtime::Runtime, listener: tokio::net::TcpListener, config: ServiceConfig) -> Result<()> {
    let (data_dir, slots) = (config.data_dir.clone(), config.slots);
    let (service, admin_token) = Service::open(config).with_context(|| format!("opening {}", data_dir.display()))?;
    if let Some(token) = admin_token {
        eprintln!("created the admin token (shown once; also in {}):", data_dir.join("admin.token").display());
        eprintln!("  {token}");
    }
    let addr = listener.local_addr()?;
    eprintln!(
        "eddy serving on http://{addr} (data in {}, {slots} slots); API at /v1, OpenAPI at /v1/openapi.json",
        data_dir.display()
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
