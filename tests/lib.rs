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

/// A local S3-compatible service (moto, installed by `deploy/setup.sh`), stopped on drop.
#[derive(Debug)]
pub struct S3Service {
    process: std::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl Drop for S3Service {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl S3Service {
    /// Starts moto on a free port and waits until it listens.
    pub fn start() -> S3Service {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr").port();
        let process = std::process::Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start moto_server ({e}): run deploy/setup.sh (pip install 'moto[server]')")
            });
        let service = S3Service { process, endpoint: format!("http://127.0.0.1:{port}") };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "moto_server did not start listening on port {port}");
            std::thread::sleep(std::time::Duration::from_millis(50));
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
        use std::io::{Read, Write};
        let host = self.endpoint.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(host).expect("connect");
        write!(stream, "{line} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .expect("request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("response");
        assert!(response.starts_with(&format!("HTTP/1.1 {status}")), "{what}: {response}");
        response
    }
}
