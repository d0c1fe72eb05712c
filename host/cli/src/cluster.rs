//! `eddy cluster init|cert`, `eddy coordinator` and `eddy worker`: the cluster's processes.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use eddy_cluster::executor::Executor;
use eddy_cluster::protocol::CoordinatorMessage;
use eddy_cluster::worker::{Mailbox, Registration, SessionEnd, session};
use eddy_cluster::{ControlConfig, ControlPlane};
use eddy_service::ClusterRole;
use eddy_transport::quic::{ClusterCa, NODE_VALIDITY, NodeIdentity, QuicNode, Tuning};

/// The name a coordinator's certificate always carries, besides `localhost`, so workers that
/// dial it by IP address can check it.
pub const COORDINATOR_NAME: &str = "coordinator";

/// `eddy cluster init --out DIR`.
pub fn init(out: &Path) -> Result<()> {
    if out.join("ca.key").exists() {
        bail!("{} already holds a CA (ca.key): remove it first, or issue certificates from it", out.display());
    }
    let ca = ClusterCa::generate()?;
    ca.save(out)?;
    println!("wrote the cluster CA: {0}/ca.pem (give to every node) and {0}/ca.key (keep it private)", out.display());
    println!("next: eddy cluster cert --ca {} --name <node> --out <dir>, once per node", out.display());
    Ok(())
}

/// `eddy cluster cert --ca DIR --name NAME [--alias NAME]... --out DIR2 [--days N]`.
pub fn cert(ca: &Path, name: &str, aliases: &[String], out: &Path, days: u64) -> Result<()> {
    let ca = ClusterCa::load(ca).with_context(|| format!("reading the CA in {}", ca.display()))?;
    ca.issue_with_aliases(name, aliases, Duration::from_secs(days.saturating_mul(86_400)))?.save(out)?;
    println!("wrote {0}/cert.pem, {0}/key.pem and {0}/ca.pem for node `{name}`, valid {days} days", out.display());
    println!("start the node with --tls {}; before it expires, issue a new one and restart the node", out.display());
    Ok(())
}

/// How long before its expiry a certificate is renewed: the coordinator's own at its start,
/// an enrolled worker's (with a join token) at its start.
const RENEW_BEFORE: Duration = Duration::from_secs(10 * 86_400);

/// How long until `identity` expires (zero if it has), or an error if it cannot be read.
fn time_left(identity: &NodeIdentity) -> Result<Duration> {
    let expires = identity.expires_at()?;
    Ok(expires.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}

/// Flags of `eddy coordinator`.
#[derive(Debug)]
pub struct CoordinatorArgs {
    /// REST (TCP) and control plane (UDP) address.
    pub listen: String,
    /// Where the coordinator keeps everything.
    pub data_dir: PathBuf,
    /// A node directory (`ca.pem`, `cert.pem`, `key.pem`); none: run a CA in the data dir.
    pub tls: Option<PathBuf>,
    /// A worker silent this long is dead.
    pub heartbeat_timeout: Duration,
    /// Where checkpoints of jobs on workers go (a shared directory or `s3://bucket/prefix`).
    pub checkpoint_store: Option<String>,
    /// Slots of an embedded worker (0: jobs run on workers only).
    pub slots: u32,
    /// What the service takes and keeps.
    pub service: crate::serve::ServiceFlags,
}

/// The coordinator's identity: the given one, or one issued by its own CA in `data_dir/tls`.
fn coordinator_identity(tls: Option<&Path>, data_dir: &Path) -> Result<(NodeIdentity, Option<Arc<ClusterCa>>)> {
    if let Some(dir) = tls {
        let identity = NodeIdentity::load(dir, None).with_context(|| format!("reading --tls {}", dir.display()))?;
        return Ok((identity, None));
    }
    let dir = data_dir.join("tls");
    let ca = ClusterCa::load_or_create(&dir).with_context(|| format!("the coordinator's CA in {}", dir.display()))?;
    // Kept across restarts: the endpoints' stateless-reset key derives from its private key, so
    // a restarted coordinator ends its workers' stale connections at once.
    let own = dir.join(COORDINATOR_NAME);
    let fresh = NodeIdentity::load(&own, Some(COORDINATOR_NAME))
        .ok()
        .filter(|identity| time_left(identity).is_ok_and(|left| left > RENEW_BEFORE));
    let identity = match fresh {
        Some(identity) => identity,
        None => {
            let identity = ca.issue_with_aliases(COORDINATOR_NAME, &["localhost".to_owned()], NODE_VALIDITY)?;
            identity.save(&own)?;
            tracing::info!(dir = %own.display(), "issued the coordinator's certificate (new, or about to expire)");
            identity
        }
    };
    tracing::warn!(
        ca = %dir.display(),
        "no --tls: this coordinator runs its own CA and enrolls workers on this machine only; across machines use `eddy cluster init` and --tls"
    );
    Ok((identity, Some(Arc::new(ca))))
}

/// `eddy coordinator`: the service with its control plane on the same host and port.
pub fn coordinator(args: CoordinatorArgs) -> Result<()> {
    let runtime = crate::serve::runtime(crate::serve::SERVER_IO_THREADS)?;
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let (identity, enrollment) = coordinator_identity(args.tls.as_deref(), &args.data_dir)?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&args.listen))
        .with_context(|| format!("cannot listen on {}: is another server using it?", args.listen))?;
    let addr = listener.local_addr()?;
    // The control plane and the job masters' data plane get threads of their own: a flood of
    // HTTP requests must not starve heartbeats (a worker would be declared dead for it).
    let cluster_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("eddy-cluster")
        .build()
        .context("starting the cluster's runtime")?;
    let control = ControlPlane::start(
        &identity,
        addr,
        ControlConfig::with_timeout(args.heartbeat_timeout),
        cluster_runtime.handle(),
    )
    .with_context(|| format!("starting the control plane on udp/{addr}"))?;
    eprintln!(
        "eddy coordinator on {addr}: REST at http://{addr}/v1 (tcp), workers register at udp/{addr} as `{}`; heartbeat timeout {} ms",
        identity.name,
        args.heartbeat_timeout.as_millis()
    );
    let checkpoint_store = match &args.checkpoint_store {
        Some(text) => {
            let store = eddy_service::placement::parse_store(text, |name| std::env::var(name).ok())
                .map_err(|e| anyhow::anyhow!("--checkpoint-store {e}"))?;
            eprintln!("jobs' checkpoints, savepoints and files output, and tenants' files, go to {text}");
            Some(store)
        }
        None => {
            eprintln!(
                "jobs' checkpoints go to {} (give --checkpoint-store when workers run on other machines)",
                args.data_dir.display()
            );
            None
        }
    };
    // The job masters' node: it dials the workers' checkpoint streams, from the listen host.
    let node =
        QuicNode::bind(&identity, SocketAddr::new(addr.ip(), 0), Tuning::default(), cluster_runtime.handle().clone())
            .context("binding the coordinator's data plane")?;
    let mut config = eddy_service::ServiceConfig::new(args.data_dir.clone());
    config.slots = args.slots;
    args.service.apply(&mut config, addr)?;
    config.cluster = Some(ClusterRole { control, enrollment, node });
    config.checkpoint_store = checkpoint_store;
    let served = crate::serve::run(&runtime, listener, config);
    drop(cluster_runtime);
    served
}

/// Flags of `eddy worker`.
#[derive(Debug)]
pub struct WorkerArgs {
    /// The coordinator's `host:port`.
    pub coordinator: String,
    /// This worker's name.
    pub name: String,
    /// Slots offered.
    pub slots: u32,
    /// Where the worker keeps its state.
    pub data_dir: PathBuf,
    /// A node directory; none: enroll with a coordinator on this machine.
    pub tls: Option<PathBuf>,
    /// The admin's join token, to enroll (or renew an enrolled certificate).
    pub join_token: Option<String>,
    /// The data plane's UDP address.
    pub data_listen: String,
    /// The host, or `host:port`, other workers dial.
    pub advertise: Option<String>,
}

/// `--advertise` as (host, port): a `host:port` (or `[v6]:port`) names both, anything else
/// (a name, an IPv4 or a bare IPv6 address) only the host, at the data plane's own port.
fn advertised(advertise: &str, data_port: u16) -> (String, u16) {
    let split =
        advertise.rsplit_once(':').filter(|(host, _)| !host.is_empty() && (!host.contains(':') || host.ends_with(']')));
    match split.and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?))) {
        Some((host, port)) => (host.trim_matches(['[', ']']).to_owned(), port),
        None => (advertise.to_owned(), data_port),
    }
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("cannot resolve `{addr}`: give HOST:PORT"))?
        .next()
        .with_context(|| format!("`{addr}` resolves to no address"))
}

/// The name the coordinator's certificate must carry: the host of `--coordinator` when it is a
/// DNS name, else [`COORDINATOR_NAME`].
fn coordinator_name(coordinator: &str) -> String {
    let host = coordinator.rsplit_once(':').map_or(coordinator, |(h, _)| h).trim_matches(['[', ']']);
    if host.parse::<std::net::IpAddr>().is_ok() { COORDINATOR_NAME.to_owned() } else { host.to_owned() }
}

/// The worker's identity: `--tls`, one saved by an earlier enrollment (renewed with the join
/// token when it is about to expire), or a new enrollment with the join token.
fn worker_identity(args: &WorkerArgs) -> Result<NodeIdentity> {
    if let Some(dir) = &args.tls {
        let identity =
            NodeIdentity::load(dir, Some(&args.name)).with_context(|| format!("reading --tls {}", dir.display()))?;
        let left = time_left(&identity)?;
        if left.is_zero() {
            bail!("the certificate in {} has expired: issue a new one with `eddy cluster cert`", dir.display());
        }
        if left < RENEW_BEFORE {
            eprintln!(
                "warning: the certificate in {} expires in {} days: issue a new one",
                dir.display(),
                left.as_secs() / 86_400
            );
        }
        return Ok(identity);
    }
    let dir = args.data_dir.join("tls");
    if let Ok(identity) = NodeIdentity::load(&dir, Some(&args.name)) {
        let left = time_left(&identity)?;
        match (&args.join_token, left < RENEW_BEFORE) {
            (_, false) => return Ok(identity),
            (None, _) if !left.is_zero() => {
                eprintln!(
                    "warning: this worker's certificate expires in {} days: renew it by starting the worker with a join \
                     token issued for it (`eddy cluster join-token --name {}`)",
                    left.as_secs() / 86_400,
                    args.name
                );
                return Ok(identity);
            }
            (None, _) => bail!(
                "this worker's certificate has expired: renew it with a join token issued for it (`eddy cluster \
                 join-token --name {}`, then --join-token)",
                args.name
            ),
            (Some(_), true) => eprintln!("renewing this worker's certificate, which expires soon"),
        }
    }
    let Some(token) = &args.join_token else {
        bail!(
            "no --tls given and no certificate in {}: enroll with a join token from the admin (`eddy cluster \
             join-token`, then --join-token or EDDY_JOIN_TOKEN), or give --tls",
            dir.display()
        );
    };
    let url = format!("http://{}/v1/cluster/enroll", args.coordinator);
    let response = reqwest::blocking::Client::new()
        .post(&url)
        .bearer_auth(token)
        .json(&serde_json::json!({ "name": args.name }))
        .send()
        .with_context(|| format!("no --tls given, and enrolling at {url} failed: is the coordinator running?"))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.text().unwrap_or_default();
        let detail = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|p| p["detail"].as_str().map(str::to_owned))
            .unwrap_or(body);
        bail!("the coordinator refused to enroll `{}` ({status}): {detail}", args.name);
    }
    let credentials: eddy_service::enrollment::Credentials = response.json().context("reading the enrollment")?;
    let identity = NodeIdentity {
        name: args.name.clone(),
        ca_pem: credentials.ca_pem,
        cert_pem: credentials.cert_pem,
        key_pem: credentials.key_pem,
    };
    identity.save(&dir)?;
    let days = time_left(&identity)?.as_secs() / 86_400;
    eprintln!("enrolled with the coordinator's CA; certificate saved in {}, valid {days} days", dir.display());
    Ok(identity)
}

/// The worker's runtime for operators: artifacts compiled once per worker, cached by digest.
fn operator_runtime(data_dir: &Path) -> Result<eddy_runtime::Runtime> {
    Ok(eddy_runtime::Runtime::new(eddy_runtime::RuntimeConfig {
        cache_dir: Some(data_dir.join("artifacts").join("compiled")),
        host_key_path: Some(data_dir.join("host.key")),
        max_component_bytes: MAX_ARTIFACT_BYTES as usize,
        ..eddy_runtime::RuntimeConfig::default()
    })?)
}

/// The largest artifact a worker fetches (the coordinator's default upload limit).
const MAX_ARTIFACT_BYTES: u64 = 64 << 20;

/// A worker's async runtime (its QUIC endpoints, the links' pumps, its control session) has
/// one thread, not the server's two: the work on it is short (a datagram, a frame, a credit),
/// and two threads passed the wake-ups of every exchanged buffer between themselves. q5 across
/// two worker processes (`cargo bench -p eddy-cli --bench cluster_shuffle`) used 6-11% less CPU
/// per event with one. Parts run on threads of their own, never here.
const WORKER_IO_THREADS: usize = 1;

/// `eddy worker`: registers, beats, runs the parts deployed to it, and registers again
/// whenever the coordinator restarts.
pub fn worker(args: WorkerArgs) -> Result<()> {
    eddy_transport::quic::check_label(&args.name)
        .with_context(|| format!("--name {}: a worker's name is one lowercase DNS label", args.name))?;
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let identity = worker_identity(&args)?;
    let runtime = crate::serve::data_plane_runtime(WORKER_IO_THREADS)?;
    let data_listen = resolve(&args.data_listen)?;
    let node = QuicNode::bind(&identity, data_listen, Tuning::default(), runtime.handle().clone())?;
    let data_addr = node.local_addr()?;
    let coordinator = resolve(&args.coordinator)?;
    let coordinator_name = coordinator_name(&args.coordinator);
    let endpoint =
        eddy_transport::quic::endpoint(&identity, "0.0.0.0:0".parse()?, &Tuning::control(), runtime.handle())?;
    let (report, mut outbox) = tokio::sync::mpsc::unbounded_channel();
    let fetch: eddy_cluster::executor::Fetcher = {
        let (endpoint, handle, name) = (endpoint.clone(), runtime.handle().clone(), coordinator_name.clone());
        Box::new(move |digest: &str| {
            handle.block_on(eddy_cluster::worker::fetch(&endpoint, coordinator, &name, digest, MAX_ARTIFACT_BYTES))
        })
    };
    let executor = Executor::new(node.clone(), operator_runtime(&args.data_dir)?, args.data_dir.clone(), fetch, report);
    let (advertise, data_port) = match &args.advertise {
        Some(a) => {
            let (host, port) = advertised(a, data_addr.port());
            (Some(host), port)
        }
        None => (None, data_addr.port()),
    };
    let me = Registration { name: args.name.clone(), slots: args.slots, advertise, data_port };
    eprintln!("eddy worker `{}`: {} slots, data plane on udp/{data_addr}", args.name, args.slots);
    let control = runtime.block_on(async {
        let announce = |incarnation: u64| {
            eprintln!("registered with the coordinator at {} (incarnation {incarnation})", args.coordinator);
        };
        let order = |order: CoordinatorMessage| match order {
            CoordinatorMessage::Deploy(d) => {
                eprintln!("running job {} attempt {} (tenant {})", d.job, d.attempt, d.tenant);
                executor.deploy(*d);
            }
            CoordinatorMessage::Cancel { job, attempt } => executor.cancel(&job, attempt),
            CoordinatorMessage::PrepareSwap { job, attempt, step, digest } => {
                eprintln!("preparing a live swap of step `{step}` of job {job} to {digest}");
                executor.prepare_swap(&job, attempt, step, digest);
            }
            _ => {}
        };
        let mut backoff = Duration::from_millis(200);
        loop {
            let mailbox = Mailbox { on_registered: &announce, on_order: &order, outbox: &mut outbox };
            let end = tokio::select! {
                end = session(&endpoint, coordinator, &coordinator_name, &me, mailbox) => end,
                () = crate::serve::stop_signal() => return Ok::<(), anyhow::Error>(()),
            };
            match end {
                SessionEnd::Refused(reason) => bail!("the coordinator refused this worker: {reason}"),
                SessionEnd::Lost(reason) => {
                    eprintln!("lost the coordinator ({reason}); registering again in {} ms", backoff.as_millis());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    });
    executor.stop_all();
    node.close();
    control?;
    eprintln!("worker `{}` stopped", args.name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::advertised;

    #[test]
    fn advertise_names_a_host_and_maybe_a_port() {
        let cases = [
            ("10.0.0.5", ("10.0.0.5", 7000)),
            ("worker-a.example", ("worker-a.example", 7000)),
            ("10.0.0.5:9000", ("10.0.0.5", 9000)),
            ("relay.example:9001", ("relay.example", 9001)),
            ("[fd00::5]:9000", ("fd00::5", 9000)),
            ("fd00::5", ("fd00::5", 7000)),
            ("host:notaport", ("host:notaport", 7000)),
        ];
        for (given, (host, port)) in cases {
            assert_eq!(advertised(given, 7000), (host.to_owned(), port), "{given}");
        }
    }
}
