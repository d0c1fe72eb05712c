//! `eddy` as a client of `eddy serve`: the server and token come from `--server`/`--token`,
//! `EDDY_SERVER`/`EDDY_TOKEN`, or the file `eddy login` writes.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::blocking::{Body, Client, RequestBuilder, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where the server is and who the caller is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Login {
    /// The server's base URL.
    pub server: String,
    /// A bearer token.
    pub token: String,
}

/// The file `eddy login` writes: `$EDDY_CONFIG`, else `~/.config/eddy/login.json`.
pub fn login_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("EDDY_CONFIG") {
        return Ok(PathBuf::from(path));
    }
    let home =
        std::env::var_os("HOME").ok_or_else(|| anyhow!("no HOME: set EDDY_CONFIG to where the login file goes"))?;
    Ok(PathBuf::from(home).join(".config").join("eddy").join("login.json"))
}

impl Login {
    /// From the flags (themselves defaulting to `EDDY_SERVER`/`EDDY_TOKEN`), else the login file.
    pub fn resolve(server: Option<String>, token: Option<String>) -> Result<Login> {
        let saved = || -> Result<Option<Login>> {
            let path = login_path()?;
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    Ok(Some(serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
            }
        };
        match (server, token) {
            (Some(server), Some(token)) => Ok(Login { server, token }),
            (server, token) => {
                let saved = saved()?.ok_or_else(|| {
                    anyhow!("no server given: pass --server URL --token TOKEN (or EDDY_SERVER, EDDY_TOKEN), or run `eddy login` first")
                })?;
                Ok(Login { server: server.unwrap_or(saved.server), token: token.unwrap_or(saved.token) })
            }
        }
    }

    /// Saves the login for later commands (readable by the owner only).
    pub fn save(&self) -> Result<PathBuf> {
        let path = login_path()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path).with_context(|| format!("writing {}", path.display()))?;
        serde_json::to_writer_pretty(file, self)?;
        Ok(path)
    }
}

/// A connection to the server.
pub struct Api {
    login: Login,
    http: Client,
}

impl Api {
    /// A client for `login`.
    pub fn new(login: Login) -> Result<Self> {
        let http = Client::builder().timeout(Duration::from_secs(600)).build()?;
        Ok(Self { login: Login { server: login.server.trim_end_matches('/').to_string(), ..login }, http })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.login.server)
    }

    fn send(&self, request: RequestBuilder) -> Result<Response> {
        let response = request
            .bearer_auth(&self.login.token)
            .send()
            .with_context(|| format!("cannot reach {}: is `eddy serve` running there?", self.login.server))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().unwrap_or_default();
        // The server answers problem details: show the detail and the field it names.
        match serde_json::from_str::<Value>(&text) {
            Ok(p) if p["detail"].is_string() => {
                let field = p["field"].as_str().map(|f| format!(" (field `{f}`)")).unwrap_or_default();
                bail!("{status}: {}{field}", p["detail"].as_str().unwrap_or_default())
            }
            _ => bail!("{status}: {text}"),
        }
    }

    /// GET returning JSON.
    pub fn get(&self, path: &str) -> Result<Value> {
        Ok(self.send(self.http.get(self.url(path)))?.json()?)
    }

    /// GET with a query string (encoded here), returning JSON.
    pub fn get_query(&self, path: &str, query: &[(&str, String)]) -> Result<Value> {
        Ok(self.send(self.http.get(self.url(path)).query(query))?.json()?)
    }

    /// POST of JSON returning JSON.
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        Ok(self.send(self.http.post(self.url(path)).json(body))?.json()?)
    }

    /// POST without a body, ignoring the (empty) answer.
    pub fn post_empty(&self, path: &str) -> Result<()> {
        self.send(self.http.post(self.url(path)))?;
        Ok(())
    }

    /// DELETE, ignoring the (empty) answer.
    pub fn delete(&self, path: &str) -> Result<()> {
        self.send(self.http.delete(self.url(path)))?;
        Ok(())
    }

    /// Streams a file as the body of `method path`, with a progress bar; returns the JSON answer.
    fn send_file(&self, method: reqwest::Method, path: &str, file: &Path, after: &str) -> Result<Value> {
        let size = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
        let opened = std::fs::File::open(file).with_context(|| format!("reading {}", file.display()))?;
        let bar = ProgressBar::new(size).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(format!("uploading {}", file.display()));
        let reader = Progress { inner: opened, bar: bar.clone(), after: after.to_string() };
        let answer = self.send(self.http.request(method, self.url(path)).body(Body::sized(reader, size)));
        bar.finish_and_clear();
        Ok(answer?.json()?)
    }

    /// Uploads a component; returns the artifact.
    /// Uploads a component; the server compiles it in the background while this shows how
    /// long it has been compiling (a Python component takes seconds). Returns the artifact.
    pub fn upload(&self, wasm: &Path, label: Option<(&str, &str)>) -> Result<Value> {
        let mut path = "/v1/artifacts?wait=false".to_string();
        if let Some((name, version)) = label {
            path.push_str(&format!("&name={name}&version={version}"));
        }
        let answer = self.send_file(reqwest::Method::POST, &path, wasm, "validating")?;
        // An artifact the tenant holds already comes back at once, without a compile status.
        if answer.get("status").is_none() {
            return Ok(answer);
        }
        let digest = text(&answer["digest"]);
        let spinner = ProgressBar::new_spinner();
        loop {
            let status: Value =
                self.send(self.http.get(self.url(&format!("/v1/artifacts/compiles/{digest}"))))?.json()?;
            let seconds = status["elapsed_ms"].as_f64().unwrap_or(0.0) / 1e3;
            match status["status"].as_str() {
                Some("ready") => {
                    spinner.finish_and_clear();
                    eprintln!("compiled in {seconds:.1} s");
                    return Ok(status["artifact"].clone());
                }
                Some("failed") => {
                    spinner.finish_and_clear();
                    bail!("{} did not compile: {}", wasm.display(), text(&status["error"]));
                }
                _ => {
                    spinner.set_message(format!("compiling {digest} ... {seconds:.1} s"));
                    spinner.tick();
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
    }

    /// Uploads a data file into the tenant's files area under `name`.
    pub fn put_file(&self, name: &str, file: &Path) -> Result<Value> {
        self.send_file(reqwest::Method::PUT, &format!("/v1/files/{name}"), file, "storing")
    }

    /// Submits a pipeline (YAML); returns the answer.
    pub fn submit(&self, yaml: String) -> Result<Value> {
        let request = self.http.post(self.url("/v1/jobs")).header("content-type", "application/yaml").body(yaml);
        Ok(self.send(request)?.json()?)
    }

    /// The committed output as text.
    pub fn output(&self, job: &str) -> Result<String> {
        Ok(self.send(self.http.get(self.url(&format!("/v1/jobs/{job}/output"))))?.text()?)
    }
}

/// Counts bytes read into a progress bar; once all are read, says what the server does next.
struct Progress {
    inner: std::fs::File,
    bar: ProgressBar,
    after: String,
}

impl Read for Progress {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        if n == 0 {
            self.bar.set_message(format!("{}…", self.after));
        }
        Ok(n)
    }
}

/// A step's `wasm:` that names a local file rather than an uploaded artifact.
fn local_wasm(reference: &str, base: &Path) -> Option<PathBuf> {
    if reference.starts_with("sha256:") {
        return None;
    }
    let path = base.join(reference);
    path.is_file().then_some(path)
}

/// `eddy submit`: uploads the local `.wasm` files and data files the spec names, rewrites the
/// spec to name what was uploaded, and submits it. Returns the job's id.
pub fn submit(api: &Api, pipeline: &Path) -> Result<String> {
    let text = std::fs::read_to_string(pipeline).with_context(|| format!("reading {}", pipeline.display()))?;
    let mut spec: serde_norway::Value =
        serde_norway::from_str(&text).with_context(|| format!("{} is not YAML", pipeline.display()))?;
    let base = pipeline.parent().unwrap_or(Path::new("."));
    if let Some(steps) = spec.get_mut("steps").and_then(|s| s.as_sequence_mut()) {
        for (i, step) in steps.iter_mut().enumerate() {
            let Some(reference) = step.get("wasm").and_then(|w| w.as_str()).map(str::to_owned) else { continue };
            let Some(file) = local_wasm(&reference, base) else {
                // `name@version` names an artifact on the server; a path that is not here is a
                // mistake to report now, not a puzzle for the server.
                let artifact =
                    reference.starts_with("sha256:") || (reference.contains('@') && !reference.contains('/'));
                if !artifact {
                    bail!(
                        "steps[{i}].wasm: `{reference}` is no file here ({} does not exist) and names no \
                         uploaded artifact (`sha256:<hex>` or `name@version`); build it, or fix the path",
                        base.join(&reference).display()
                    );
                }
                continue;
            };
            let artifact = api.upload(&file, None)?;
            let digest = artifact["digest"].as_str().ok_or_else(|| anyhow!("the server answered no digest"))?;
            eprintln!("uploaded {} as {digest}", file.display());
            step["wasm"] = serde_norway::Value::String(digest.to_string());
        }
    }
    if let Some(sources) = spec.get_mut("sources").and_then(|s| s.as_sequence_mut()) {
        for source in sources {
            if source.get("type").and_then(|t| t.as_str()) != Some("file") {
                continue;
            }
            let Some(path) = source.get("path").and_then(|p| p.as_str()).map(str::to_owned) else { continue };
            let local = base.join(&path);
            let name = local
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| anyhow!("source path `{path}` names no file"))?
                .to_string();
            if local.is_file() {
                api.put_file(&name, &local)?;
                eprintln!("uploaded {} to your files as {name}", local.display());
                source["path"] = serde_norway::Value::String(name);
            }
        }
    }
    let yaml = serde_norway::to_string(&spec)?;
    let answer = api.submit(yaml)?;
    answer["id"].as_str().map(str::to_owned).ok_or_else(|| anyhow!("the server answered no job id: {answer}"))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Prints a job: status, failures, and the live tasks.
pub fn print_job(job: &Value) {
    println!(
        "job {}  {}  status {}  restarts {}",
        text(&job["id"]),
        text(&job["name"]),
        text(&job["status"]),
        job["restarts"]
    );
    let live = &job["live"];
    if live.is_object() {
        println!(
            "  {:.1}s  in {}  out {}{}",
            live["elapsed_ms"].as_f64().unwrap_or(0.0) / 1000.0,
            live["source_records"],
            live["sink_records"],
            live["restored_from"].as_u64().map(|c| format!("  restored from checkpoint {c}")).unwrap_or_default()
        );
        for (i, t) in live["tasks"].as_array().into_iter().flatten().enumerate() {
            println!(
                "  task {i} x{}  {}: in {} ({:.0}/s)  out {} ({:.0}/s)  watermark {}  backpressure {:.0}%",
                t["parallelism"],
                text(&t["label"]),
                t["records_in"],
                t["records_in_per_sec"].as_f64().unwrap_or(0.0),
                t["records_out"],
                t["records_out_per_sec"].as_f64().unwrap_or(0.0),
                text(&t["watermark"]),
                100.0 * t["backpressure"].as_f64().unwrap_or(0.0),
            );
        }
        if let Some(c) = live["checkpoints"].as_array().and_then(|c| c.last()) {
            println!(
                "  last checkpoint {} ({} bytes, {:.0} ms)",
                c["id"],
                c["full_bytes"],
                c["duration_ms"].as_f64().unwrap_or(0.0)
            );
        }
    }
    for f in job["failures"].as_array().into_iter().flatten() {
        println!("  failure: {}", text(&f["message"]));
    }
}

/// Whether a job's status means it will not run again.
pub fn is_terminal(job: &Value) -> bool {
    matches!(job["status"].as_str(), Some("finished" | "failed" | "canceled" | "stopped" | "held"))
}

/// `eddy login`: checks the server and token, then saves them.
pub fn login(server: Option<String>, token: Option<String>) -> Result<()> {
    let (Some(server), Some(token)) = (server, token) else {
        bail!("`eddy login` needs --server URL and --token TOKEN (or EDDY_SERVER and EDDY_TOKEN)");
    };
    let login = Login { server, token };
    let me = Api::new(login.clone())?.get("/v1/whoami")?;
    let path = login.save()?;
    match me["kind"].as_str() {
        Some("tenant") => {
            eprintln!("logged in to {} as tenant {} ({})", login.server, text(&me["name"]), text(&me["tenant"]))
        }
        _ => eprintln!("logged in to {} as the admin", login.server),
    }
    eprintln!("saved to {}", path.display());
    Ok(())
}

/// `eddy upload`.
pub fn upload_cmd(login: Login, wasm: &Path, name: Option<String>, version: Option<String>) -> Result<()> {
    let api = Api::new(login)?;
    let label = name.as_deref().zip(version.as_deref());
    let artifact = api.upload(wasm, label)?;
    println!("{}", text(&artifact["digest"]));
    eprintln!(
        "{} bytes, {}{}",
        artifact["size"],
        text(&artifact["world"]),
        match label {
            Some((n, v)) => format!(", named {n}@{v}"),
            None => String::new(),
        }
    );
    Ok(())
}

/// `eddy submit`.
pub fn submit_cmd(login: Login, pipeline: &Path, watch: bool) -> Result<()> {
    let api = Api::new(login)?;
    let id = submit(&api, pipeline)?;
    println!("{id}");
    if watch {
        return follow(&api, &id);
    }
    eprintln!("submitted; follow it with `eddy job {id} --watch`");
    Ok(())
}

/// Prints the job every second until it ends.
fn follow(api: &Api, id: &str) -> Result<()> {
    loop {
        let job = api.get(&format!("/v1/jobs/{id}"))?;
        print_job(&job);
        if is_terminal(&job) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `eddy jobs`.
pub fn jobs_cmd(login: Login) -> Result<()> {
    let jobs = Api::new(login)?.get("/v1/jobs")?;
    println!("{:<20} {:<10} {:<24} name", "id", "status", "submitted (ms)");
    for j in jobs.as_array().into_iter().flatten() {
        println!("{:<20} {:<10} {:<24} {}", text(&j["id"]), text(&j["status"]), j["created_ms"], text(&j["name"]));
    }
    Ok(())
}

/// `eddy job`.
pub fn job_cmd(login: Login, id: &str, watch: bool) -> Result<()> {
    let api = Api::new(login)?;
    if watch {
        return follow(&api, id);
    }
    print_job(&api.get(&format!("/v1/jobs/{id}"))?);
    Ok(())
}

/// `eddy cancel`.
pub fn cancel_cmd(login: Login, id: &str) -> Result<()> {
    Api::new(login)?.post_empty(&format!("/v1/jobs/{id}/cancel"))?;
    eprintln!("cancel requested for {id}; `eddy job {id}` shows when it stopped");
    Ok(())
}

/// `eddy delete`.
pub fn delete_cmd(login: Login, id: &str) -> Result<()> {
    Api::new(login)?.delete(&format!("/v1/jobs/{id}"))?;
    eprintln!("deleted job {id} with its output, checkpoints and savepoints");
    Ok(())
}

/// `eddy resume`.
pub fn resume_cmd(login: Login, id: &str) -> Result<()> {
    Api::new(login)?.post_empty(&format!("/v1/jobs/{id}/resume"))?;
    eprintln!("job {id} resumes; `eddy job {id} --watch` follows it");
    Ok(())
}

/// `eddy cluster join-token`.
pub fn join_token_cmd(login: Login, name: Option<String>, uses: u32, ttl_s: u64) -> Result<()> {
    let body = serde_json::json!({ "name": name, "uses": uses, "ttl_s": ttl_s });
    let t = Api::new(login)?.post_json("/v1/cluster/join-tokens", &body)?;
    println!("{}", text(&t["token"]));
    let whom = name.map_or("any new worker name".to_owned(), |n| format!("worker `{n}`"));
    eprintln!(
        "join token {} for {whom}, {uses} enrollment(s), for {ttl_s} s (shown once): start the worker with \
         --join-token or EDDY_JOIN_TOKEN",
        text(&t["id"])
    );
    Ok(())
}

/// `eddy savepoint ID`, `eddy stop`, `eddy rescale`: one control request, answered with the
/// savepoint it took.
pub fn control_cmd(login: Login, id: &str, action: &str, body: Value) -> Result<()> {
    let savepoint = Api::new(login)?.post_json(&format!("/v1/jobs/{id}/{action}"), &body)?;
    println!("{}", text(&savepoint["path"]));
    eprintln!("{action}: savepoint of checkpoint {} taken for {id}", savepoint["id"]);
    Ok(())
}

/// `eddy upgrade`: a local `.wasm` is uploaded first; `--live` swaps it in at a checkpoint.
pub fn upgrade_cmd(login: Login, id: &str, step: &str, wasm: &str, live: bool) -> Result<()> {
    let api = Api::new(login.clone())?;
    let reference = match local_wasm(wasm, Path::new(".")) {
        Some(file) => {
            let artifact = api.upload(&file, None)?;
            artifact["digest"].as_str().ok_or_else(|| anyhow!("the server answered no digest"))?.to_string()
        }
        None => wasm.to_string(),
    };
    if !live {
        return control_cmd(login, id, "upgrade", serde_json::json!({ "step": step, "wasm": reference }));
    }
    eprintln!("upgrade: swapping step `{step}` of {id} to {reference} at the next checkpoint…");
    let body = serde_json::json!({ "step": step, "wasm": reference, "mode": "live" });
    let swapped = api.post_json(&format!("/v1/jobs/{id}/upgrade"), &body)?;
    println!("{}", swapped["checkpoint"]);
    eprintln!(
        "upgrade: step `{step}` runs {} from checkpoint {} on (subtasks swapped: {}, the longest in {:.2} ms; {:.0} ms in all)",
        text(&swapped["artifact"]),
        swapped["checkpoint"],
        swapped["subtasks"],
        swapped["longest_swap_ms"].as_f64().unwrap_or(0.0),
        swapped["total_ms"].as_f64().unwrap_or(0.0),
    );
    Ok(())
}

/// `eddy output`.
pub fn output_cmd(login: Login, id: &str) -> Result<()> {
    print!("{}", Api::new(login)?.output(id)?);
    Ok(())
}

/// What `eddy tenants` does.
#[derive(Debug)]
pub enum TenantCmd {
    /// Create one by name.
    Create(String),
    /// List them.
    List,
    /// Issue a token for the tenant id.
    Token(String),
    /// Revoke (tenant id, token id).
    Revoke(String, String),
}

/// `eddy tenants`.
pub fn tenants_cmd(login: Login, cmd: TenantCmd) -> Result<()> {
    let api = Api::new(login)?;
    match cmd {
        TenantCmd::Create(name) => {
            let t = api.post_json("/v1/tenants", &serde_json::json!({ "name": name }))?;
            println!("{}", text(&t["token"]));
            eprintln!("tenant {} ({}) created; its token (shown once) is above", text(&t["name"]), text(&t["id"]));
        }
        TenantCmd::List => {
            for t in api.get("/v1/tenants")?.as_array().into_iter().flatten() {
                println!("{:<20} {}", text(&t["id"]), text(&t["name"]));
            }
        }
        TenantCmd::Token(tenant) => {
            let t = api.post_json(&format!("/v1/tenants/{tenant}/tokens"), &Value::Null)?;
            println!("{}", text(&t["token"]));
            eprintln!("token {} issued for {tenant} (shown once)", text(&t["token_id"]));
        }
        TenantCmd::Revoke(tenant, token_id) => {
            api.delete(&format!("/v1/tenants/{tenant}/tokens/{token_id}"))?;
            eprintln!("token {token_id} of {tenant} revoked");
        }
    }
    Ok(())
}
