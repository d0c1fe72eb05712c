//! A tenant who means harm, against a real `eddy serve` in another process: specs made to
//! blow up the parser, artifacts of the wrong world, restart storms, requests that trickle or
//! lie about their size, links planted in the files area, and a tenant storing without end.
//! Each test is named after what the server does about it, and each failed on the server as
//! it was before it learnt to (the closing note of issue 22 says how).

#![allow(clippy::unwrap_used, reason = "test code: a failed setup step should fail the test loudly")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    Server, client, counts_job, expect, job, output_lines, peak_rss_bytes, post, raw_exchange, set_quotas, submit,
    tenant, upload, wait_job,
};
use serde_json::{Value, json};

/// The server's log so far.
fn log(server: &Server) -> String {
    server.log()
}

fn failures(j: &Value) -> Vec<String> {
    j["failures"].as_array().into_iter().flatten().map(|f| f["message"].as_str().unwrap_or("").to_owned()).collect()
}

fn ended(j: &Value) -> bool {
    ["finished", "failed", "canceled", "stopped"].contains(&j["status"].as_str().unwrap_or(""))
}

/// A spec of the shape: a valid pipeline whose step's `config` holds an anchored list
/// of `zeros` zeros and a list of `aliases` aliases to it (about 950 KB at the sizes).
fn alias_bomb(zeros: usize, aliases: usize) -> String {
    let list = vec!["0"; zeros].join(",");
    let refs = vec!["*z"; aliases].join(",");
    format!(
        "name: bomb\nsources: [{{type: generator, name: g, events: 10}}]\nsteps:\n  - name: count\n    wasm: count@1\n    \
         config: {{a: &z [{list}], b: [{refs}]}}\nsink: {{type: blackhole}}\n"
    )
}

#[test]
fn a_spec_that_would_expand_is_refused_before_any_value_is_built_and_the_server_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "mallory");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    // The attack: 250 000 zeros, 150 000 aliases to them (37.5 billion values, expanded).
    let bomb = alias_bomb(250_000, 150_000);
    assert!(bomb.len() > 900_000 && bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let refused = expect(submit(&server, &token, &bomb), 422);
    let detail = refused["detail"].as_str().unwrap();
    assert!(detail.contains("anchor") && detail.contains("line 6"), "names the anchor and where: {detail}");
    // The second shape: a config of 440 000 nulls (`~`, 880 KB). Refused by the node
    // count before anything is built...
    let json_spec = |config: String| {
        format!(
            "{{\"name\": \"big\", \"sources\": [{{\"type\": \"generator\", \"name\": \"g\"}}], \"steps\": [{{\"name\": \
             \"count\", \"wasm\": \"count@1\", \"config\": [{config}]}}], \"sink\": {{\"type\": \"blackhole\"}}}}"
        )
    };
    let post_json = |body: String| {
        let r = client().post(server.url("/v1/jobs")).bearer_auth(&token).header("content-type", "application/json");
        expect(r.body(body).send().unwrap(), 422)
    };
    let nulls = format!(
        "name: nulls\nsources: [{{type: generator, name: g}}]\nsteps:\n  - {{name: count, wasm: count@1, config: [{}]}}\n\
         sink: {{type: blackhole}}\n",
        vec!["~"; 440_000].join(",")
    );
    let refused = expect(submit(&server, &token, &nulls), 422);
    assert!(refused["detail"].as_str().unwrap().contains("100000 nodes"), "{refused}");
    // ...and fewer, larger values by the config's own limit, named with it.
    let refused = post_json(json_spec(vec!["\"xxxxxxxxxx\""; 40_000].join(",")));
    assert_eq!(refused["field"], "steps[0].config", "{refused}");
    assert!(refused["detail"].as_str().unwrap().contains("262144"), "names the limit: {refused}");
    // Names go into metric labels: a quote or a newline in one is refused.
    let forged = counts_job(10).replace("name: counts", "name: \"a\\\"}\\nx\"");
    assert_eq!(expect(submit(&server, &token, &forged), 422)["field"], "name");
    // Nothing of it was built: the server grew by far less than one expansion would take.
    let peak = peak_rss_bytes(server.child.id());
    assert!(peak < 512 << 20, "the server peaked at {} MiB", peak >> 20);
    let id = expect(submit(&server, &token, &counts_job(10)), 201)["id"].as_str().unwrap().to_owned();
    wait_job(&server, &token, &id, "finished", ended);
}

#[test]
fn an_artifact_of_the_wrong_world_is_refused_at_submit_and_upgrade_naming_the_step_and_both_worlds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    expect(upload(&server, &token, eddy_guest_artifacts::NEXMARK_COUNT, Some(("agg", "1"))), 201);
    // A keyed operator in a window step.
    let windowed = "name: w\nsources: [{type: generator, name: g, events: 10}]\nsteps:\n  - {name: win, wasm: count@1, \
                    key_by: key, window: {type: tumbling, size_ms: 1000}}\nsink: {type: blackhole}\n";
    let refused = expect(submit(&server, &token, windowed), 422);
    assert_eq!(refused["field"], "steps[0].wasm");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("`win`") && detail.contains("window-aggregate") && detail.contains("keyed-operator"),
        "{detail}"
    );
    // An aggregate in a keyed step.
    let keyed = counts_job(10).replace("wasm: count@1", "wasm: agg@1");
    let refused = expect(submit(&server, &token, &keyed), 422);
    assert!(refused["detail"].as_str().unwrap().contains("`count`"), "{refused}");
    // An upgrade of a running job to the wrong world: refused, and the job runs on untouched.
    let id = expect(submit(&server, &token, &counts_job(1_000_000)), 201)["id"].as_str().unwrap().to_owned();
    wait_job(&server, &token, &id, "running", |j| j["status"] == "running");
    let upgrade = post(&server, &token, &format!("/v1/jobs/{id}/upgrade"), json!({"step": "count", "wasm": "agg@1"}));
    let refused = expect(upgrade, 422);
    assert_eq!(refused["field"], "wasm", "{refused}");
    let j = job(&server, &token, &id);
    assert_eq!((j["status"].as_str(), j["generation"].as_u64()), (Some("running"), Some(0)), "{j}");
    assert!(j["savepoints"].as_array().unwrap().is_empty(), "no savepoint was taken for it: {j}");
    expect(client().post(server.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(&token).send().unwrap(), 202);
}

#[test]
fn a_restart_storm_is_bounded_and_a_job_whose_every_attempt_fails_fast_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "mallory");
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    let failing = |restart: &str| {
        format!(
            "name: storm\nsources: [{{type: generator, name: g, events: 100, rate_per_sec: 100}}]\nsteps:\n  - {{name: \
             h, wasm: hostile@1, config: {{mode: error}}}}\nrestart: {restart}\nsink: {{type: blackhole}}\n"
        )
    };
    // The strategy: 4 294 967 295 attempts, no delay.
    let refused =
        expect(submit(&server, &token, &failing("{strategy: fixed_delay, attempts: 4294967295, delay_ms: 0}")), 422);
    assert_eq!(refused["field"], "restart.attempts", "{refused}");
    let refused = expect(submit(&server, &token, &failing("{strategy: fixed_delay, attempts: 3, delay_ms: 0}")), 422);
    assert_eq!(refused["field"], "restart.delay_ms", "{refused}");
    // Within the bounds, a job failing at once every time is stopped after five such attempts,
    // however many its strategy has left, with a status that says so.
    let storm = failing("{strategy: fixed_delay, attempts: 100, delay_ms: 500}");
    let id = expect(submit(&server, &token, &storm), 201)["id"].as_str().unwrap().to_owned();
    let done = wait_job(&server, &token, &id, "stopped", ended);
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["restarts"], 4, "{done}");
    let last = failures(&done).pop().unwrap();
    assert!(last.contains("last 5 attempts each failed within 10 s"), "{last}");
    // The pauses grew: 0.5, 1, 2 and 4 s between the five failures.
    let at: Vec<i64> = done["failures"].as_array().unwrap().iter().map(|f| f["at_ms"].as_i64().unwrap()).collect();
    let gaps: Vec<i64> = at.windows(2).take(4).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] > g[0]) && gaps[3] >= 4_000, "pauses between attempts: {gaps:?} ms");
}

#[test]
fn a_spinning_operators_restart_waits_until_its_tenant_has_paid_for_the_cpu_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (id, token) = tenant(&server, "mallory");
    // A fifth of a core; each call may run 5 s (the sandbox's default) before it traps.
    set_quotas(&server, &id, json!({"cpu_millicores": 200}));
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    let spin = "name: spin\nsources: [{type: generator, name: g, events: 100, rate_per_sec: 100}]\nsteps:\n  - {name: \
                h, wasm: hostile@1, config: {mode: loop}}\nrestart: {strategy: fixed_delay, attempts: 1, delay_ms: \
                500}\nsink: {type: blackhole}\n";
    let job_id = expect(submit(&server, &token, spin), 201)["id"].as_str().unwrap().to_owned();
    let failed_once = wait_job(&server, &token, &job_id, "failed once", |j| !failures(j).is_empty());
    let since = Instant::now();
    assert_eq!(failed_once["status"], "restarting", "{failed_once}");
    // 5 s of a core spent at a fifth of a core's share is 3.5 s in debt (after 1 s earned and
    // 0.5 s saved), paid off in 17.5 s; on a loaded machine the spin got less CPU and the debt
    // is smaller. Either way the restart waits for it, not just the strategy's 0.5 s.
    let restarted = wait_job(&server, &token, &job_id, "restarted", |j| j["status"] != "restarting");
    let waited = since.elapsed();
    assert!(waited >= Duration::from_millis(1_500), "restarted after {waited:?}: {restarted}");
    expect(client().post(server.url(&format!("/v1/jobs/{job_id}/cancel"))).bearer_auth(&token).send().unwrap(), 202);
}

#[test]
fn requests_that_trickle_or_lie_about_their_size_are_cut_off_before_they_cost_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (tenant_id, token) = tenant(&server, "mallory");
    let started = Instant::now();
    // Headers trickled a byte at a time: each connection is closed after the header timeout.
    let trickling: Vec<std::thread::JoinHandle<Duration>> = (0..30)
        .map(|_| {
            let addr = server.base.trim_start_matches("http://").to_owned();
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut stream = std::net::TcpStream::connect(addr).unwrap();
                stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
                let start = Instant::now();
                for byte in b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nX-Slow: ".iter().cycle() {
                    if stream.write_all(&[*byte]).is_err() {
                        break;
                    }
                    let mut buf = [0u8; 64];
                    match stream.read(&mut buf) {
                        Ok(_) => break,
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => break,
                    }
                    assert!(start.elapsed() < Duration::from_secs(60), "a trickling connection stayed open");
                }
                start.elapsed()
            })
        })
        .collect();
    // A body sent at a byte a second is cut off once it falls behind 16 KiB/s after 10 s.
    let slow_body = std::thread::spawn({
        let (addr, token) = (server.base.trim_start_matches("http://").to_owned(), token.clone());
        move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            let head = format!(
                "PUT /v1/files/slow.txt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: \
                 100000\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).unwrap();
            stream.set_read_timeout(Some(Duration::from_millis(900))).unwrap();
            let mut answer = Vec::new();
            for _ in 0..60 {
                if stream.write_all(b"x").is_err() {
                    break;
                }
                let mut buf = [0u8; 4096];
                match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                    Err(_) => {}
                }
                if !answer.is_empty() {
                    break;
                }
            }
            String::from_utf8_lossy(&answer).into_owned()
        }
    });
    // A declared 2 GB spec is refused at once, without waiting for a byte of it.
    let huge = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: \
         application/yaml\r\nContent-Length: 2000000000\r\n\r\n"
    );
    let answer = raw_exchange(&server, huge.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A bad file name is refused before the body: a NUL, a 5 000-character name, a dot file.
    for name in ["%00", &"a".repeat(5_000), ".hidden", "a%2Fb"] {
        let put = format!(
            "PUT /v1/files/{name} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: \
             100000000\r\n\r\n"
        );
        let answer = raw_exchange(&server, put.as_bytes(), Duration::from_secs(5));
        assert!(answer.starts_with("HTTP/1.1 422"), "{}: {answer}", &name[..name.len().min(20)]);
    }
    // The role is checked before the body is read or validated.
    let quotas = client().put(server.url(&format!("/v1/tenants/{tenant_id}/quotas"))).bearer_auth(&token);
    expect(quotas.header("content-type", "application/json").body("{").send().unwrap(), 403);
    let by_admin = client().post(server.url("/v1/jobs")).bearer_auth(server.admin());
    expect(by_admin.header("content-type", "application/yaml").body("[[[").send().unwrap(), 403);

    let cut_off = slow_body.join().unwrap();
    assert!(cut_off.starts_with("HTTP/1.1 400") && cut_off.contains("slower than"), "{cut_off}");
    for t in trickling {
        let open = t.join().unwrap();
        assert!(open < Duration::from_secs(30), "a trickling connection was open {open:?}");
    }
    println!("slow clients cut off within {:?}", started.elapsed());

    // A failure shows the tenant paths of its own area, never the server's.
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let missing = "name: missing\nsources: [{type: file, name: f, path: missing.txt}]\nsteps:\n  - {name: count, \
                   wasm: count@1, key_by: value}\nrestart: {strategy: none}\nsink: {type: blackhole}\n";
    let id = expect(submit(&server, &token, missing), 201)["id"].as_str().unwrap().to_owned();
    let failed = wait_job(&server, &token, &id, "failed", ended);
    let message = failures(&failed).join("\n");
    assert!(message.contains("files/missing.txt"), "{message}");
    let data = server.dir.canonicalize().unwrap();
    assert!(!message.contains(data.to_str().unwrap()), "a server path shown to a tenant: {message}");

    // Wrong tokens: answered 401, then 429 once a source keeps sending them, with one summary
    // in the log; a valid token from the same source is still answered.
    let statuses: Vec<u16> = (0..30)
        .map(|i| {
            client().get(server.url("/v1/jobs")).bearer_auth(format!("eddy_guess{i}")).send().unwrap().status().as_u16()
        })
        .collect();
    let first = statuses.iter().position(|s| *s == 429).expect("throttled at last");
    assert!(first >= 15 && statuses[..first].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[first..].iter().all(|s| *s == 429), "{statuses:?}");
    expect(client().get(server.url("/v1/jobs")).bearer_auth(&token).send().unwrap(), 200);
    let summaries = log(&server).matches("requests with wrong tokens").count();
    assert!((1..=2).contains(&summaries), "{summaries} summary lines for 30 wrong tokens");
    assert!(!log(&server).contains(&server.admin()), "the admin token is in the server's log");
}

/// The `loaded component` lines of the server's log for `digest`, by outcome.
fn loads(server: &Server, digest: &str) -> (usize, usize) {
    let log = log(server);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("loaded component") && l.contains(digest)).collect();
    (
        lines.iter().filter(|l| l.contains("outcome=Compiled")).count(),
        lines.iter().filter(|l| l.contains("outcome=Hit")).count(),
    )
}

#[test]
fn an_upload_takes_the_same_path_whatever_other_tenants_uploaded() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, a) = tenant(&server, "alice");
    let (_, b) = tenant(&server, "bob");
    let art = expect(upload(&server, &a, eddy_guest_artifacts::RUNNING_COUNT, None), 201);
    let digest = art["digest"].as_str().unwrap().to_owned();
    assert_eq!(loads(&server, &digest), (1, 0));
    // B's upload of the same bytes is validated and compiled as if nobody had them (before, it
    // was a cache hit, in a fraction of the time: the timing told B that someone had them).
    expect(upload(&server, &b, eddy_guest_artifacts::RUNNING_COUNT, None), 201);
    assert_eq!(loads(&server, &digest), (2, 0), "B's upload took another path than a first upload");
    // A's own second upload may use what A uploaded.
    expect(upload(&server, &a, eddy_guest_artifacts::RUNNING_COUNT, None), 200);
    assert_eq!(loads(&server, &digest), (2, 1));
}

#[test]
fn every_example_pipeline_runs_on_a_server_with_default_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let config = dir.path().join("login.json");
    let eddy = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_eddy")).args(args).env("EDDY_CONFIG", &config).output().unwrap()
    };
    let created = eddy(&["tenants", "create", "acme", "--server", &server.base, "--token", &server.admin()]);
    let token = String::from_utf8_lossy(&created.stdout).trim().to_owned();
    assert!(eddy(&["login", "--server", &server.base, "--token", &token]).status.success());
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut pipelines: Vec<std::path::PathBuf> = Vec::new();
    for entry in walk(&examples) {
        // It names a broker and a database at fixed addresses that this test does not run; the
        // service runs such jobs through connections in connections.rs.
        let external = entry.components().any(|c| c.as_os_str() == "kafka-to-postgres");
        if entry.extension().is_some_and(|e| e == "yaml") && !external {
            pipelines.push(entry);
        }
    }
    pipelines.sort();
    assert!(pipelines.len() >= 10, "{pipelines:?}");
    for pipeline in &pipelines {
        let submitted = eddy(&["submit", pipeline.to_str().unwrap()]);
        let out = String::from_utf8_lossy(&submitted.stdout).into_owned();
        let err = String::from_utf8_lossy(&submitted.stderr).into_owned();
        assert!(submitted.status.success(), "{}: refused on default quotas: {err}", pipeline.display());
        let id = out.lines().next().unwrap().trim().to_owned();
        // One at a time: each is cancelled (or has ended) before the next.
        let _ = client().post(server.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(&token).send();
        wait_job(&server, &token, &id, "ended", ended);
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn a_link_planted_in_a_tenants_files_area_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (tenant_id, token) = tenant(&server, "mallory");
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("echo", "1"))), 201);
    let put = client().put(server.url("/v1/files/real.txt")).bearer_auth(&token).body("tenant line\n");
    expect(put.send().unwrap(), 201);
    // What a shared volume could hold: a link to a host file the API never lets one create.
    let secret = dir.path().join("host-secret");
    std::fs::write(&secret, "the host's secret\n").unwrap();
    let area = server.dir.join("tenants").join(&tenant_id).join("files");
    std::os::unix::fs::symlink(&secret, area.join("leak.txt")).unwrap();
    let listed = expect(client().get(server.url("/v1/files")).bearer_auth(&token).send().unwrap(), 200);
    assert_eq!(listed.as_array().unwrap().len(), 1, "a link is no file of the tenant's: {listed}");
    let reading = |file: &str| {
        format!(
            "name: read\nsources: [{{type: file, name: f, path: {file}}}]\nsteps:\n  - {{name: e, wasm: echo@1, \
             config: {{mode: echo}}}}\nrestart: {{strategy: none}}\nsink: {{type: files, dir: out}}\n"
        )
    };
    let id = expect(submit(&server, &token, &reading("leak.txt")), 201)["id"].as_str().unwrap().to_owned();
    let failed = wait_job(&server, &token, &id, "failed", ended);
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failures(&failed).join("\n").contains("symbolic link"), "{failed}");
    let output = client().get(server.url(&format!("/v1/jobs/{id}/output"))).bearer_auth(&token).send().unwrap();
    assert!(!output.text().unwrap().contains("secret"), "the host's file reached the tenant");
    let id = expect(submit(&server, &token, &reading("real.txt")), 201)["id"].as_str().unwrap().to_owned();
    assert_eq!(wait_job(&server, &token, &id, "finished", ended)["status"], "finished");
    let lines = output_lines(&server, &token, &id);
    assert_eq!(lines.iter().map(|l| l["value"].clone()).collect::<Vec<_>>(), [json!("tenant line")], "{lines:?}");
}

#[test]
fn ended_jobs_are_deleted_and_everything_a_tenant_stores_has_a_quota() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (tenant_id, token) = tenant(&server, "acme");
    set_quotas(&server, &tenant_id, json!({"job_records": 2, "files": 1, "file_bytes": 100, "savepoints": 1}));
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);

    // Files: one, of at most 100 bytes; a replacement counts its own size only; deletable.
    let put = |name: &str, body: &str| {
        client().put(server.url(&format!("/v1/files/{name}"))).bearer_auth(&token).body(body.to_owned()).send().unwrap()
    };
    expect(put("a.txt", &"x".repeat(60)), 201);
    assert_eq!(expect(put("b.txt", "y"), 403)["field"], "quotas.files");
    assert_eq!(expect(put("a.txt", &"x".repeat(101)), 403)["field"], "quotas.file_bytes");
    expect(put("a.txt", &"x".repeat(90)), 201);
    expect(client().delete(server.url("/v1/files/a.txt")).bearer_auth(&token).send().unwrap(), 204);
    expect(put("b.txt", "y"), 201);

    // Job records: two kept, ended ones included, until one is deleted.
    let first = expect(submit(&server, &token, &counts_job(20)), 201)["id"].as_str().unwrap().to_owned();
    wait_job(&server, &token, &first, "finished", ended);
    let running = expect(submit(&server, &token, &counts_job(100_000_000)), 201)["id"].as_str().unwrap().to_owned();
    assert_eq!(expect(submit(&server, &token, &counts_job(20)), 403)["field"], "quotas.job_records");
    let busy =
        expect(client().delete(server.url(&format!("/v1/jobs/{running}"))).bearer_auth(&token).send().unwrap(), 409);
    assert!(busy["detail"].as_str().unwrap().contains("cancel"), "{busy}");
    let job_dir = server.dir.join("tenants").join(&tenant_id).join("jobs").join(&first);
    assert!(job_dir.exists());
    expect(client().delete(server.url(&format!("/v1/jobs/{first}"))).bearer_auth(&token).send().unwrap(), 204);
    assert!(!job_dir.exists(), "the ended job's output and checkpoints went with it");
    expect(client().get(server.url(&format!("/v1/jobs/{first}"))).bearer_auth(&token).send().unwrap(), 404);

    // Savepoints: one kept; another once it is deleted.
    wait_job(&server, &token, &running, "checkpointed", |j| {
        j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty())
    });
    let taken = expect(post(&server, &token, &format!("/v1/jobs/{running}/savepoints"), json!({})), 201);
    let again = expect(post(&server, &token, &format!("/v1/jobs/{running}/savepoints"), json!({})), 403);
    assert_eq!(again["field"], "quotas.savepoints");
    let name = taken["path"].as_str().unwrap().trim_start_matches("savepoints/").to_owned();
    let savepoint_dir = job_dir.with_file_name(&running).join("savepoints").join(&name);
    assert!(savepoint_dir.exists());
    let delete = client().delete(server.url(&format!("/v1/jobs/{running}/savepoints/{name}"))).bearer_auth(&token);
    expect(delete.send().unwrap(), 204);
    assert!(!savepoint_dir.exists(), "the savepoint's files went");

    // A rescale restarts the job in a new generation; once that one checkpointed, the old
    // generation's checkpoints are collected.
    let checkpoints = job_dir.with_file_name(&running).join("checkpoints");
    assert!(checkpoints.join("0").exists());
    expect(post(&server, &token, &format!("/v1/jobs/{running}/rescale"), json!({"parallelism": 2})), 200);
    let newer = |j: &Value| j["generation"] == 1 && j["live"]["checkpoints"].as_array().is_some_and(|c| !c.is_empty());
    wait_job(&server, &token, &running, "checkpointed in its new generation", newer);
    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpoints.join("0").exists() {
        assert!(Instant::now() < deadline, "generation 0 was never collected");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(checkpoints.join("1").exists());
    expect(client().post(server.url(&format!("/v1/jobs/{running}/cancel"))).bearer_auth(&token).send().unwrap(), 202);
}

#[test]
fn the_checkpoint_quota_counts_what_the_store_holds_and_stops_a_running_job_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--housekeeping-ms", "300"]);
    let (tenant_id, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let id = expect(submit(&server, &token, &counts_job(100_000_000)), 201)["id"].as_str().unwrap().to_owned();
    wait_job(&server, &token, &id, "checkpointed", |j| {
        j["live"]["checkpoints"].as_array().is_some_and(|c| c.len() >= 2)
    });
    // The job runs on within its quota; lowered below what its checkpoints take, it stops.
    set_quotas(&server, &tenant_id, json!({"checkpoint_bytes": 1000}));
    let failed = wait_job(&server, &token, &id, "stopped by its quota", ended);
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failures(&failed).pop().unwrap();
    assert!(message.contains("quota `checkpoint_bytes` exceeded"), "{message}");
    // And nothing new starts while the tenant is past it.
    let refused = expect(submit(&server, &token, &counts_job(10)), 403);
    assert_eq!(refused["field"], "quotas.checkpoint_bytes", "{refused}");
    let usage = expect(client().get(server.url("/v1/quotas")).bearer_auth(&token).send().unwrap(), 200);
    assert!(usage["usage"]["checkpoint_bytes"].as_u64().unwrap() > 1000, "{usage}");
}

#[test]
fn a_jobs_output_is_streamed_to_the_client_not_read_into_memory() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("echo", "1"))), 201);
    // 48 MiB of 1 KiB lines, one part file of the job's output.
    let line = format!("{}\n", "y".repeat(1023));
    let body: String = line.repeat(48 * 1024);
    expect(client().put(server.url("/v1/files/big.txt")).bearer_auth(&token).body(body).send().unwrap(), 201);
    let spec = "name: big\nbatch_size: 4096\nsources: [{type: file, name: f, path: big.txt}]\nsteps:\n  - {name: e, \
                wasm: echo@1, config: {mode: echo}}\nrestart: {strategy: none}\nsink: {type: files, dir: out}\n";
    let id = expect(submit(&server, &token, spec), 201)["id"].as_str().unwrap().to_owned();
    assert_eq!(wait_job(&server, &token, &id, "finished", ended)["status"], "finished");
    let before = peak_rss_bytes(server.child.id());
    let mut response = client().get(server.url(&format!("/v1/jobs/{id}/output"))).bearer_auth(&token).send().unwrap();
    let (mut lines, mut chunk) = (0usize, vec![0u8; 1 << 16]);
    loop {
        let n = std::io::Read::read(&mut response, &mut chunk).unwrap();
        if n == 0 {
            break;
        }
        lines += chunk[..n].iter().filter(|b| **b == b'\n').count();
        // A slow reader: the server must wait, not buffer.
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(lines, 48 * 1024);
    let grew = peak_rss_bytes(server.child.id()).saturating_sub(before);
    assert!(grew < 16 << 20, "the server grew {} MiB sending a 48 MiB output", grew >> 20);
}

#[test]
fn a_job_that_finished_just_before_the_server_died_is_finished_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let (tenant_id, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let id = expect(submit(&server, &token, &counts_job(50)), 201)["id"].as_str().unwrap().to_owned();
    assert_eq!(wait_job(&server, &token, &id, "finished", ended)["status"], "finished");
    let port = server.port();
    server.kill_9();
    // As if the kill had come after the final checkpoint but before the status was written.
    {
        let store = eddy_service::store::Store::open(&data.join("eddy.redb")).unwrap();
        let key = format!("{tenant_id}/{id}");
        store
            .write(|txn| -> Result<(), eddy_service::store::StoreError> {
                let mut record: Value = txn.get(eddy_service::store::Table::Jobs, &key)?.unwrap();
                record["status"] = json!("running");
                txn.put(eddy_service::store::Table::Jobs, &key, &record)
            })
            .unwrap();
    }
    let server = Server::start_on("serve", port, &data, &[]).unwrap();
    let done = wait_job(&server, &token, &id, "ended", ended);
    assert_eq!((done["status"].as_str(), done["restarts"].as_u64()), (Some("finished"), Some(0)), "{done}");
    assert_eq!(output_lines(&server, &token, &id).len(), 50, "its output stands, once");
}

#[test]
fn a_job_the_server_died_under_twice_in_a_row_is_held_for_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &[]);
    let (_, token) = tenant(&server, "acme");
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let id = expect(submit(&server, &token, &counts_job(100_000_000)), 201)["id"].as_str().unwrap().to_owned();
    let port = server.port();
    for kill in 1..=2 {
        wait_job(&server, &token, &id, "running", |j| j["status"] == "running");
        server.kill_9();
        server = Server::start_on("serve", port, &data, &[]).unwrap();
        let j = job(&server, &token, &id);
        let expected = if kill == 1 { "running" } else { "held" };
        let status = wait_job(&server, &token, &id, expected, |j| j["status"] == expected || j["status"] == "held");
        assert_eq!(status["status"], expected, "after kill {kill}: {j}");
    }
    let held = job(&server, &token, &id);
    assert!(failures(&held).pop().unwrap().contains("resume it"), "{held}");
    // A clean stop in between would not have counted: the owner resumes it, and it runs.
    expect(client().post(server.url(&format!("/v1/jobs/{id}/resume"))).bearer_auth(&token).send().unwrap(), 202);
    wait_job(&server, &token, &id, "running again", |j| j["status"] == "running");
    server.terminate();
    let server = Server::start_on("serve", port, &data, &[]).unwrap();
    wait_job(&server, &token, &id, "resumed after a clean stop", |j| j["status"] == "running");
    expect(client().post(server.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(&token).send().unwrap(), 202);
}

#[test]
fn a_rescale_is_held_to_the_state_quota_like_a_submission() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let (tenant_id, token) = tenant(&server, "acme");
    // One RocksDB subtask takes 4 GiB of the quota by default: one fits in 6 GiB, two do not.
    set_quotas(&server, &tenant_id, json!({"state_bytes": 6u64 << 30}));
    expect(upload(&server, &token, eddy_guest_artifacts::RUNNING_COUNT, Some(("count", "1"))), 201);
    let spec = counts_job(100_000_000).replace("checkpoints:", "state: {backend: rocksdb}\ncheckpoints:");
    let id = expect(submit(&server, &token, &spec), 201)["id"].as_str().unwrap().to_owned();
    wait_job(&server, &token, &id, "running", |j| j["status"] == "running");
    let refused = expect(post(&server, &token, &format!("/v1/jobs/{id}/rescale"), json!({"parallelism": 2})), 403);
    assert_eq!(refused["field"], "quotas.state_bytes", "{refused}");
    assert_eq!(job(&server, &token, &id)["generation"], 0, "no savepoint, no restart");
    expect(client().post(server.url(&format!("/v1/jobs/{id}/cancel"))).bearer_auth(&token).send().unwrap(), 202);
}

#[test]
fn heap_state_is_charged_as_memory_and_the_server_keeps_to_its_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget: u64 = 1_000_000_000;
    let server = Server::start(&dir.path().join("data"), &["--memory-budget-bytes", &budget.to_string()]);
    let (_, token) = tenant(&server, "mallory");
    expect(upload(&server, &token, eddy_guest_artifacts::HOSTILE, Some(("hostile", "1"))), 201);
    let flood = |parallelism: u32, limit: &str| {
        format!(
            "name: flood\nparallelism: {parallelism}\nsources: [{{type: generator, name: g, events: 1000, keys: 10, \
             key_field: user, rate_per_sec: 100}}]\nsteps:\n  - {{name: h, wasm: hostile@1, key_by: /user, config: \
             {{mode: state-flood}}{limit}}}\nrestart: {{strategy: none}}\nsink: {{type: blackhole}}\n"
        )
    };
    // Two subtasks of 128 MiB of heap state each (the service's default), with the memory that
    // can stand for and their instances' caps, are more than the server's budget: refused.
    let refused = expect(submit(&server, &token, &flood(2, "")), 409);
    assert_eq!(refused["field"], "server.memory_budget_bytes", "{refused}");
    // One of 64 MiB (reached within a call's deadline) fits, floods its state to the limit and
    // fails there, and the server's memory stays within its budget (before, a heap limit's
    // count stood for 2.4 times as much memory).
    let id = expect(submit(&server, &token, &flood(1, ", state_max_bytes: 67108864")), 201)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = wait_job(&server, &token, &id, "failed at its state limit", ended);
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failures(&failed).join("\n");
    assert!(message.contains("67108864"), "fails at its state limit: {message}");
    let peak = peak_rss_bytes(server.child.id());
    assert!(peak < budget, "the server peaked at {} MiB, past its budget of {} MiB", peak >> 20, budget >> 20);
    println!("the server peaked at {} MiB for a job holding 64 MiB of heap state", peak >> 20);
}
