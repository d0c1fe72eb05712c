//! The worker's side of a deployment: it runs the subtasks of a job attempt the coordinator
//! assigned to this worker as one part of a spread job, and reports how the part ends.
//!
//! Per deployment, on a thread of its own: the part's end of the checkpoint protocol is
//! registered first (the coordinator, which runs the job master, dials it at once), an older
//! attempt of the same job is stopped and waited for (it holds the RocksDB directories), the
//! artifacts are fetched by digest unless this worker holds them already (each checked
//! against its sha256; the runtime then compiles each digest once per worker), and the part
//! runs until it ends or the coordinator cancels it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use eddy_engine::{CheckpointRole, FailureDetail, Job, JobOptions};
use eddy_runtime::{Component, CpuShare, Runtime};
use eddy_transport::quic::QuicNode;
use tokio::sync::mpsc::UnboundedSender;

use crate::checkpoint_link::part_link;
use crate::placement::QuicPlacement;
use crate::protocol::{Deployment, PartState, WorkerMessage};

/// CPU time a tenant may save up and spend at once beyond its share (as on the coordinator).
const CPU_BURST: Duration = Duration::from_millis(500);

/// How often a running part sends its metrics to the coordinator.
const METRICS_EVERY: Duration = Duration::from_secs(1);

/// How a part's failure reads when it stopped because an input from another worker broke
/// (that worker died or restarted): the cluster's doing, not the job's.
pub const INPUT_BROKE: &str = "an input from another worker broke";

/// Fetches an artifact's verified bytes by digest. Blocking.
pub type Fetcher = Box<dyn Fn(&str) -> Result<Vec<u8>, String> + Send + Sync>;

/// Runs the parts deployed to this worker. Cheap to clone.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

struct Inner {
    node: QuicNode,
    runtime: Runtime,
    dir: PathBuf,
    fetch: Fetcher,
    report: UnboundedSender<WorkerMessage>,
    parts: Mutex<HashMap<String, Running>>,
    shares: Mutex<HashMap<(String, u32), Arc<CpuShare>>>,
}

/// A part that runs (or is being started).
struct Running {
    attempt: u64,
    cancel: Arc<AtomicBool>,
    /// New code for a live swap, compiled, for the part to prepare.
    swaps: Sender<NewCode>,
    thread: JoinHandle<()>,
}

/// A step and the compiled code a live swap takes it to.
struct NewCode {
    step: String,
    digest: String,
    component: Component,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").field("dir", &self.inner.dir).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Executor {
    /// An executor running parts on `node`'s data plane and `runtime`, keeping artifacts and
    /// state under `dir`, fetching with `fetch` and reporting part states to `report`.
    pub fn new(
        node: QuicNode,
        runtime: Runtime,
        dir: PathBuf,
        fetch: Fetcher,
        report: UnboundedSender<WorkerMessage>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                node,
                runtime,
                dir,
                fetch,
                report,
                parts: Mutex::default(),
                shares: Mutex::default(),
            }),
        }
    }

    /// Starts `deployment`'s part, stopping an older attempt of its job first.
    pub fn deploy(&self, deployment: Deployment) {
        let job = deployment.job.clone();
        let attempt = deployment.attempt;
        let mut parts = lock(&self.inner.parts);
        // Forget parts of other jobs that ended; this job's last part is stopped below.
        parts.retain(|j, r| *j == job || !r.thread.is_finished());
        if parts.get(&job).is_some_and(|r| r.attempt >= attempt) {
            return tracing::warn!(job, attempt, "ignoring a deployment older than the attempt that runs");
        }
        let previous = parts.remove(&job);
        if let Some(p) = &previous {
            p.cancel.store(true, Ordering::SeqCst);
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let (swaps, new_code) = std::sync::mpsc::channel();
        let key = job.clone();
        let inner = self.inner.clone();
        let flag = cancel.clone();
        let span = tracing::info_span!("part", tenant = %deployment.tenant, job = %job, attempt);
        let thread = std::thread::Builder::new().name(format!("part-{job}")).spawn(move || {
            let _span = span.entered();
            // The checkpoint stream first: the job master dials it as soon as it deployed.
            let link = deployment
                .spec
                .checkpoints
                .is_some()
                .then(|| part_link(&inner.node, &deployment.job, deployment.attempt, &deployment.master));
            if let Some(previous) = previous {
                let _ = previous.thread.join();
            }
            let state = match inner.run(deployment, link, &flag, &new_code) {
                Ok(state) => state,
                Err((reason, detail)) => PartState::Failed { reason, detail },
            };
            tracing::info!(state = ?state, "part ended");
            let _ = inner.report.send(WorkerMessage::Part { job: job.clone(), attempt, state });
        });
        match thread {
            Ok(thread) => {
                parts.insert(key, Running { attempt, cancel, swaps, thread });
            }
            Err(e) => {
                let reason = format!("cannot start a thread: {e}");
                let _ = self.inner.report.send(WorkerMessage::Part {
                    job: key,
                    attempt,
                    state: PartState::Failed { reason, detail: FailureDetail::default() },
                });
            }
        }
    }

    /// Makes artifact `digest` ready to take over `step` in `job`'s `attempt` here (a live
    /// swap): fetched and compiled on a thread of its own (a part goes on meanwhile), then
    /// handed to the part, which opens it once and answers the coordinator.
    pub fn prepare_swap(&self, job: &str, attempt: u64, step: String, digest: String) {
        let swaps = lock(&self.inner.parts).get(job).filter(|r| r.attempt == attempt).map(|r| r.swaps.clone());
        let inner = self.inner.clone();
        let job = job.to_owned();
        let Some(swaps) = swaps else {
            return inner.swap_prepared(job, attempt, step, digest, Some("no such part runs on this worker".into()));
        };
        let prepare = move || {
            let loaded = inner
                .artifact(&digest)
                .and_then(|path| inner.runtime.load_file(&step, &path).map_err(|e| format!("artifact {digest}: {e}")));
            match loaded {
                Ok(component) => {
                    let code = NewCode { step: step.clone(), digest: digest.clone(), component };
                    if swaps.send(code).is_err() {
                        inner.swap_prepared(job, attempt, step, digest, Some("the part ended".into()));
                    }
                }
                Err(problem) => inner.swap_prepared(job, attempt, step, digest, Some(problem)),
            }
        };
        if let Err(e) = std::thread::Builder::new().name("prepare-swap".into()).spawn(prepare) {
            tracing::warn!(error = %e, "cannot start a thread to prepare a live swap");
        }
    }

    /// Cancels `job`'s `attempt` if it runs here.
    pub fn cancel(&self, job: &str, attempt: u64) {
        if let Some(r) = lock(&self.inner.parts).get(job).filter(|r| r.attempt == attempt) {
            r.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// Cancels every part and waits for them to stop.
    pub fn stop_all(&self) {
        let parts: Vec<Running> = lock(&self.inner.parts).drain().map(|(_, r)| r).collect();
        for r in &parts {
            r.cancel.store(true, Ordering::SeqCst);
        }
        for r in parts {
            let _ = r.thread.join();
        }
    }
}

impl Inner {
    /// Runs one part to its end; `Err`: it failed, for this reason.
    fn run(
        &self,
        mut d: Deployment,
        link: Option<eddy_engine::PartLink>,
        cancel: &AtomicBool,
        new_code: &Receiver<NewCode>,
    ) -> Result<PartState, (String, FailureDetail)> {
        let plain = |reason: String| (reason, FailureDetail::default());
        let failed = |e: eddy_engine::RunError| (e.to_string(), FailureDetail::of(&e));
        for (step, digest) in d.spec.steps.iter_mut().zip(&d.artifacts) {
            step.wasm = self.artifact(digest).map_err(plain)?;
        }
        // RocksDB and checkpoint staging live on this worker, whatever the coordinator's paths.
        d.spec.state.dir = Some(self.dir.join("jobs").join(&d.job).join("state"));
        let addrs = d
            .addrs
            .iter()
            .map(|(name, addr)| {
                let parsed: SocketAddr =
                    addr.parse().map_err(|e| format!("worker `{name}`'s address `{addr}` does not parse: {e}"))?;
                Ok((name.clone(), parsed))
            })
            .collect::<Result<HashMap<_, _>, String>>()
            .map_err(plain)?;
        let placement = QuicPlacement::new(self.node.clone(), d.job.clone(), d.attempt, d.assignment.clone(), addrs);
        let options = JobOptions {
            placement: Some(Arc::new(placement)),
            checkpoint_role: link.map(CheckpointRole::Part),
            cpu_share: d.cpu_millicores.map(|m| self.share(&d.tenant, m)),
            sandbox_limits: d
                .instance_memory_bytes
                .map(|m| self.runtime.config().limits.clone().with_memory_at_most(m)),
            restore_from: d.restore_from.clone(),
            ..JobOptions::default()
        };
        let job = Job::start(&d.spec, &self.runtime, options).map_err(failed)?;
        let _ =
            self.report.send(WorkerMessage::Part { job: d.job.clone(), attempt: d.attempt, state: PartState::Running });
        let mut reported = std::time::Instant::now();
        while !job.is_done() {
            if cancel.load(Ordering::SeqCst) {
                job.cancel();
                let _ = job.wait();
                return Ok(PartState::Canceled);
            }
            while let Ok(code) = new_code.try_recv() {
                let problem = job.prepare_swap(&code.step, code.component).err().map(|e| e.to_string());
                self.swap_prepared(d.job.clone(), d.attempt, code.step, code.digest, problem);
            }
            if reported.elapsed() >= METRICS_EVERY {
                reported = std::time::Instant::now();
                let metrics = job.metrics();
                let _ = self.report.send(WorkerMessage::Metrics { job: d.job.clone(), attempt: d.attempt, metrics });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match job.wait() {
            Ok(summary) if summary.finished => Ok(PartState::Finished),
            Ok(_) if cancel.load(Ordering::SeqCst) => Ok(PartState::Canceled),
            // Only a broken input stops a part early without its cancel.
            Ok(_) => Err(plain(format!("{INPUT_BROKE}: the part stopped before its inputs ended"))),
            Err(e) => Err(failed(e)),
        }
    }

    /// Tells the coordinator whether new code for `step` is ready in `job`'s `attempt`.
    fn swap_prepared(&self, job: String, attempt: u64, step: String, digest: String, problem: Option<String>) {
        if let Some(problem) = &problem {
            tracing::warn!(job, step, digest, problem, "live swap not prepared");
        }
        let _ = self.report.send(WorkerMessage::SwapPrepared { job, attempt, step, digest, problem });
    }

    /// The local file of artifact `digest`, fetched and checked unless already here.
    fn artifact(&self, digest: &str) -> Result<PathBuf, String> {
        if !crate::protocol::is_digest(digest) {
            return Err(format!("`{digest}` is no artifact digest"));
        }
        let dir = self.dir.join("artifacts");
        let path = dir.join(format!("{}.wasm", digest.replace(':', "-")));
        if path.exists() {
            return Ok(path);
        }
        let bytes = (self.fetch)(digest).map_err(|e| format!("fetching artifact {digest}: {e}"))?;
        write_atomically(&dir, &path, &bytes).map_err(|e| format!("saving artifact {digest}: {e}"))?;
        tracing::info!(digest, bytes = bytes.len(), "fetched an artifact");
        Ok(path)
    }

    fn share(&self, tenant: &str, millicores: u32) -> Arc<CpuShare> {
        lock(&self.shares)
            .entry((tenant.to_owned(), millicores))
            .or_insert_with(|| Arc::new(CpuShare::new(f64::from(millicores) / 1000.0, CPU_BURST)))
            .clone()
    }
}

/// Writes `bytes` to `path` through a temporary file in `dir`, so a crash leaves no half file.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(tmp.path(), bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
