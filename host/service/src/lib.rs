//! Eddy as a hosted, multi-tenant service: `eddy serve` keeps tenants, their tokens, uploaded
//! operator components and jobs in an embedded store under one data directory, runs the jobs
//! on an embedded worker, and answers a versioned REST API (`/v1`, JSON, errors as
//! `application/problem+json`, the OpenAPI document at `/v1/openapi.json`).
//!
//! ```text
//! DIR/eddy.redb          tenants, token hashes, artifacts, jobs (redb: ACID, synced commits)
//! DIR/admin.token        the admin token, written once at the first start (mode 0600)
//! DIR/server.running     present while a server runs: found at a start, the last one crashed
//! DIR/artifacts/         uploaded components by digest, and the runtime's compiled cache
//! DIR/tenants/<id>/      each tenant's files (`/v1/files`), jobs, output, checkpoints and state
//! ```
//!
//! # Example
//!
//! A server on an ephemeral port, asked for its OpenAPI document:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use eddy_service::{Service, ServiceConfig};
//!
//! let dir = tempfile::tempdir()?;
//! let (service, admin_token) = Service::open(ServiceConfig::new(dir.path().to_path_buf()))?;
//! assert!(admin_token.is_some(), "a new data directory gets an admin token");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(service.serve(listener, std::future::pending()));
//! let mut stream = tokio::net::TcpStream::connect(addr).await?;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! stream.write_all(b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
//! let mut answer = String::new();
//! stream.read_to_string(&mut answer).await?;
//! assert!(answer.starts_with("HTTP/1.1 200"));
//! assert!(answer.contains("/v1/jobs"));
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use eddy_runtime::{Runtime, RuntimeConfig};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub mod artifacts;
pub mod auth;
pub mod connections;
pub mod egress;
pub mod enrollment;
pub mod files;
pub mod http;
pub mod janitor;
pub mod job_replay;
pub mod job_state;
pub mod jobs;
pub mod metrics;
pub mod model;
pub mod placement;
pub mod problem;
pub mod query_bounds;
pub mod quotas;
pub mod restarts;
pub mod secret;
mod spread;
pub mod store;
pub mod supervisor;
pub mod tenants;
pub mod timeline;
pub mod ui;
pub mod upload;
pub mod workers;

use model::Principal;
use store::Store;
use supervisor::Supervisor;

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where everything lives.
    pub data_dir: PathBuf,
    /// Slots of the embedded worker (a slot runs one subtask of each task of a job).
    pub slots: u32,
    /// Largest artifact accepted.
    pub max_artifact_bytes: u64,
    /// Largest data file accepted.
    pub max_file_bytes: u64,
    /// Quotas of tenants the admin set none for.
    pub default_quotas: quotas::Quotas,
    /// The cluster this service coordinates (`eddy coordinator`); none for `eddy serve`.
    pub cluster: Option<ClusterRole>,
    /// Where jobs' checkpoints go when not in the data directory: a store every worker
    /// reaches (see [`placement::job_store`]).
    pub checkpoint_store: Option<placement::StoreLocation>,
    /// The memory all running jobs together may make the server hold (their
    /// [`quotas::Demand`]s); `None`: three quarters of the machine's (or its cgroup's) memory.
    pub memory_budget_bytes: Option<u64>,
    /// How often [`janitor`] measures stores, enforces `checkpoint_bytes` and expires jobs.
    pub housekeeping_interval: std::time::Duration,
    /// How long an ended job's record, output, checkpoints and savepoints are kept.
    pub ended_job_retention: std::time::Duration,
    /// Limits of the HTTP server (timeouts, connections).
    pub http: http::HttpLimits,
    /// What tenants' connectors may reach (`--egress-allow`).
    pub egress: egress::EgressPolicy,
}

/// What a coordinating service holds of its cluster.
#[derive(Debug, Clone)]
pub struct ClusterRole {
    /// Workers registering and beating.
    pub control: eddy_cluster::ControlPlane,
    /// The CA that enrolls workers on this machine, when the coordinator runs its own.
    pub enrollment: Option<Arc<eddy_transport::quic::ClusterCa>>,
    /// The coordinator's node on the data plane: as each job's master it dials the workers'
    /// checkpoint streams.
    pub node: eddy_transport::quic::QuicNode,
}

impl ServiceConfig {
    /// Defaults: 4 slots, artifacts up to 64 MiB (a Python guest is ~18 MB), files up to 1 GiB.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            slots: 4,
            max_artifact_bytes: 64 << 20,
            max_file_bytes: 1 << 30,
            default_quotas: quotas::Quotas::default(),
            cluster: None,
            checkpoint_store: None,
            memory_budget_bytes: None,
            housekeeping_interval: std::time::Duration::from_secs(30),
            ended_job_retention: std::time::Duration::from_secs(7 * 24 * 3600),
            http: http::HttpLimits::default(),
            egress: egress::EgressPolicy::open(),
        }
    }
}

/// Three quarters of the memory this process may use: the cgroup's limit when it has one,
/// else the machine's.
pub fn default_memory_budget() -> u64 {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().and_then(|t| t.trim().parse::<u64>().ok());
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
    });
    let total = match (cgroup, machine) {
        (Some(c), Some(m)) => c.min(m),
        (c, m) => c.or(m).unwrap_or(8 << 30),
    };
    total / 4 * 3
}

/// Runs work that takes CPU (parsing and placing a spec, validating and compiling a
/// component) off the async threads, at most one such job per core at a time: a crowd of them
/// queues for a permit instead of taking every core from the requests that cost nothing.
pub async fn heavy<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce() -> problem::ApiResult<T> + Send + 'static,
) -> problem::ApiResult<T> {
    let _permit = state.heavy.acquire().await.map_err(problem::ApiError::internal)?;
    blocking(f).await
}

/// Runs blocking work (the store, admission) off the async threads, so a slow request holds up
/// no other.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> problem::ApiResult<T> + Send + 'static,
) -> problem::ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(problem::ApiError::internal)?
}

/// What every request handler shares.
pub struct AppState {
    /// The configuration.
    pub config: ServiceConfig,
    /// The data directory (absolute).
    pub data_dir: PathBuf,
    /// The records.
    pub store: Store,
    /// Compiles and instantiates components (compiled artifacts cached by digest).
    pub runtime: Runtime,
    /// The running jobs.
    pub supervisor: Supervisor,
    /// Wrong tokens per source.
    pub throttle: std::sync::Mutex<auth::FailureThrottle>,
    /// Permits for work that takes CPU ([`heavy`]): one per core.
    pub heavy: tokio::sync::Semaphore,
    /// Uploads compiling in the background, and those that failed there.
    pub compiles: artifacts::Compiles,
}

impl AppState {
    /// Whether jobs run on the cluster's workers (a coordinator without slots of its own).
    pub fn supervisor_runs_on_workers(&self) -> bool {
        self.config.cluster.is_some() && self.config.slots == 0
    }

    /// The throttle of wrong tokens.
    pub fn throttle(&self) -> std::sync::MutexGuard<'_, auth::FailureThrottle> {
        self.throttle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("data_dir", &self.data_dir).finish_non_exhaustive()
    }
}

/// The service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory is not usable.
    #[error("data directory {dir}: {error}")]
    DataDir {
        /// The directory.
        dir: String,
        /// Why.
        error: std::io::Error,
    },
    /// The store did not open.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The runtime did not start.
    #[error("runtime: {0}")]
    Runtime(String),
    /// Something else failed.
    #[error("{0}")]
    Other(String),
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Eddy", description = "Stream processing with sandboxed WebAssembly operators, as a service."),
    modifiers(&BearerAuth),
    components(schemas(problem::Problem))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The routes and the OpenAPI document, built from the same handler list, so no route can be
/// missing from the document.
pub fn api() -> (Router<Arc<AppState>>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(tenants::whoami))
        .routes(routes!(tenants::create_tenant, tenants::list_tenants))
        .routes(routes!(tenants::issue_token))
        .routes(routes!(tenants::revoke_token))
        .routes(routes!(quotas::set))
        .routes(routes!(quotas::show))
        .routes(routes!(artifacts::upload, artifacts::list))
        .routes(routes!(connections::list))
        .routes(routes!(connections::put, connections::show, connections::delete))
        .routes(routes!(artifacts::show, artifacts::delete))
        .routes(routes!(artifacts::compile_status))
        .routes(routes!(artifacts::list_compiles))
        .routes(routes!(jobs::submit, jobs::list))
        .routes(routes!(jobs::show, jobs::delete))
        .routes(routes!(jobs::cancel))
        .routes(routes!(jobs::resume))
        .routes(routes!(jobs::output))
        .routes(routes!(jobs::savepoint))
        .routes(routes!(jobs::delete_savepoint))
        .routes(routes!(jobs::stop))
        .routes(routes!(jobs::rescale))
        .routes(routes!(jobs::upgrade))
        .routes(routes!(job_state::read))
        .routes(routes!(job_replay::read))
        .routes(routes!(metrics::metrics))
        .routes(routes!(files::list))
        .routes(routes!(files::put, files::delete))
        .routes(routes!(workers::list))
        .routes(routes!(enrollment::enroll))
        .routes(routes!(enrollment::issue_join_token))
        .split_for_parts()
}

/// The file that marks a data directory a server runs on (see [`Service::open`]).
const RUNNING_MARKER: &str = "server.running";

/// Removes what uploads cut off by a crash left: the artifacts' `.incoming/` and each
/// tenant's `files/.upload-*`.
fn clear_cut_off_uploads(data_dir: &std::path::Path) {
    let remove_where = |dir: &std::path::Path, keep: &dyn Fn(&str) -> bool| {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if !keep(&entry.file_name().to_string_lossy()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    };
    remove_where(&data_dir.join("artifacts").join(".incoming"), &|_| false);
    for tenant in std::fs::read_dir(data_dir.join("tenants")).into_iter().flatten().flatten() {
        remove_where(&tenant.path().join("files"), &|name| !name.starts_with(crate::upload::PREFIX));
    }
}

/// A running service.
#[derive(Debug, Clone)]
pub struct Service {
    state: Arc<AppState>,
}

fn create_dir(dir: &std::path::Path) -> Result<(), StartError> {
    std::fs::create_dir_all(dir).map_err(|error| StartError::DataDir { dir: dir.display().to_string(), error })
}

/// Writes the admin token once, readable by the owner only.
fn write_admin_token(path: &std::path::Path, token: &str) -> Result<(), StartError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    let io = |error| StartError::DataDir { dir: path.display().to_string(), error };
    let mut file = options.open(path).map_err(io)?;
    file.write_all(format!("{token}\n").as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)
}

impl Service {
    /// Opens the data directory (creating it and the admin token at the first start) and
    /// resumes the jobs that were running. Returns the admin token when it was just created.
    pub fn open(config: ServiceConfig) -> Result<(Self, Option<String>), StartError> {
        create_dir(&config.data_dir)?;
        let data_dir = std::fs::canonicalize(&config.data_dir)
            .map_err(|error| StartError::DataDir { dir: config.data_dir.display().to_string(), error })?;
        create_dir(&data_dir.join("artifacts").join(".incoming"))?;
        clear_cut_off_uploads(&data_dir);
        let store = Store::open(&data_dir.join("eddy.redb"))?;
        let runtime = Runtime::new(RuntimeConfig {
            cache_dir: Some(data_dir.join("artifacts").join("compiled")),
            host_key_path: Some(data_dir.join("host.key")),
            max_component_bytes: usize::try_from(config.max_artifact_bytes).unwrap_or(usize::MAX),
            ..RuntimeConfig::default()
        })
        .map_err(|e| StartError::Runtime(e.to_string()))?;
        // A coordinator without slots of its own runs every job on its workers.
        let workers = config.cluster.as_ref().filter(|_| config.slots == 0).map(|c| c.control.clone());
        if let Some(control) = &workers {
            let dir = data_dir.clone();
            control.serve_artifacts(Box::new(move |digest: &str| Some(artifacts::wasm_file(&dir, digest))));
        }
        let budget = config.memory_budget_bytes.unwrap_or_else(default_memory_budget);
        let supervisor = Supervisor::new(config.slots, workers, budget);
        let throttle = std::sync::Mutex::default();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let heavy = tokio::sync::Semaphore::new(cores);
        let state = Arc::new(AppState {
            config,
            data_dir: data_dir.clone(),
            store,
            runtime,
            supervisor,
            throttle,
            heavy,
            compiles: artifacts::Compiles::default(),
        });
        let admin_path = data_dir.join("admin.token");
        let admin_token = if admin_path.exists() {
            None
        } else {
            let token = state
                .store
                .write(|txn| tenants::issue(txn, Principal::Admin))
                .map_err(|e| StartError::Other(e.detail))?
                .1;
            write_admin_token(&admin_path, &token)?;
            Some(token)
        };
        // Present at a start: the previous server did not stop cleanly.
        let marker = data_dir.join(RUNNING_MARKER);
        let crashed = marker.exists();
        std::fs::write(&marker, b"")
            .map_err(|error| StartError::DataDir { dir: marker.display().to_string(), error })?;
        let (resumed, held) = state.supervisor.resume_all(&state, crashed).map_err(|e| StartError::Other(e.detail))?;
        if resumed > 0 || held > 0 {
            tracing::info!(resumed, held, crashed, "resumed the jobs that were running");
        }
        janitor::run(state.clone(), state.config.housekeeping_interval);
        Ok((Self { state }, admin_token))
    }

    /// The shared state (for tests and embedding).
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// The HTTP application (without the server loop's limits: see [`Service::serve`]).
    pub fn router(&self) -> Router {
        let (routes, doc) = api();
        let doc = Arc::new(doc);
        routes
            .route("/v1/openapi.json", get(move || async move { axum::Json(doc.as_ref().clone()) }))
            .merge(ui::routes())
            .with_state(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` resolves, then stops the jobs (they resume at the
    /// next start).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let result = http::serve(listener, self.router(), self.state.config.http, shutdown).await;
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            state.supervisor.shutdown(&state);
            // A clean stop: the next start resumes its jobs without counting a crash.
            let _ = std::fs::remove_file(state.data_dir.join(RUNNING_MARKER));
        })
        .await;
        result
    }
}
