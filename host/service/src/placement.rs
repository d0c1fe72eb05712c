//! Where a tenant's job reads and writes: a submitted spec is rewritten so that every path in
//! it lies inside the tenant's own area under the data directory, and its steps run uploaded
//! artifacts, never files of the server's host.
//!
//! ```text
//! DIR/tenants/<tenant>/files/                 file sources read here (relative paths only)
//! DIR/tenants/<tenant>/jobs/<job>/output/     the sink (print, file and files become files here)
//! DIR/tenants/<tenant>/jobs/<job>/checkpoints/<generation>/
//!                                             the job's checkpoints (always on, so a
//!                                             restarted server resumes the job); a new
//!                                             generation starts at each restart from a savepoint
//! DIR/tenants/<tenant>/jobs/<job>/savepoints/<n>/ its savepoints
//! DIR/tenants/<tenant>/jobs/<job>/state/      RocksDB and checkpoint staging
//! ```
//!
//! With `--checkpoint-store`, a job's checkpoints, output and savepoints live there instead,
//! under `tenants/<tenant>/jobs/<job>/`, where every worker reaches them ([`job_store`]); and a
//! copy of every tenant file, under `tenants/<tenant>/files/`, which file sources that do not
//! follow their file read ([`files_store`]).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use eddy_connectors::OutputDir;
use eddy_plan::{CheckpointSpec, PipelineSpec, SinkSpec, SourceSpec};

use crate::AppState;
use crate::artifacts::{resolve, wasm_path};
use crate::model::{JobRecord, World};
use crate::problem::ApiError;

pub use eddy_plan::StoreLocation;

/// Parses `--checkpoint-store`: `s3://bucket/prefix` (endpoint, region and `allow_http` from
/// `AWS_ENDPOINT_URL`, `AWS_REGION` and `AWS_ALLOW_HTTP`; keys from the usual AWS variables)
/// or a directory every worker mounts.
pub fn parse_store(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<StoreLocation, String> {
    let Some(rest) = text.strip_prefix("s3://") else {
        if text.contains("://") {
            return Err(format!("`{text}`: give s3://bucket/prefix or a directory"));
        }
        return Ok(StoreLocation::Dir(PathBuf::from(text)));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("`{text}` names no bucket: give s3://bucket/prefix"));
    }
    Ok(StoreLocation::S3(eddy_plan::S3Spec {
        bucket: bucket.to_owned(),
        prefix: prefix.trim_matches('/').to_owned(),
        endpoint: env("AWS_ENDPOINT_URL"),
        region: env("AWS_REGION").unwrap_or_else(|| "us-east-1".into()),
        allow_http: env("AWS_ALLOW_HTTP").is_some_and(|v| v == "true"),
    }))
}

/// `job`'s place in a checkpoint store: `tenants/<tenant>/jobs/<job>`.
fn in_store(store: &StoreLocation, tenant: &str, job: &str) -> StoreLocation {
    store.join(&format!("tenants/{tenant}/jobs/{job}"))
}

/// Where `job` keeps what every process running it must reach: its checkpoints
/// (`checkpoints/<generation>`), its files sink's output (`output`) and its savepoints
/// (`savepoints/<name>`). In `--checkpoint-store` when given, else in the job's directory,
/// which only processes on this machine reach.
pub fn job_store(state: &AppState, tenant: &str, job: &str) -> StoreLocation {
    match &state.config.checkpoint_store {
        Some(store) => in_store(store, tenant, job),
        None => StoreLocation::Dir(job_dir(state, tenant, job)),
    }
}

/// Where the job's current generation checkpoints and journals.
pub fn job_checkpoints(state: &AppState, job: &JobRecord) -> StoreLocation {
    job_store(state, &job.tenant, &job.id).join(&format!("checkpoints/{}", job.generation))
}

/// How often a job whose spec sets no `checkpoints` is checkpointed.
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 5_000;

/// A job's directory.
pub fn job_dir(state: &AppState, tenant: &str, job: &str) -> PathBuf {
    state.data_dir.join("tenants").join(tenant).join("jobs").join(job)
}

/// The tenant's files area, which file sources read.
pub fn files_dir(state: &AppState, tenant: &str) -> PathBuf {
    state.data_dir.join("tenants").join(tenant).join("files")
}

/// The copy of the tenant's files area in `--checkpoint-store`, which a file source on any
/// worker reads (`tenants/<tenant>/files`); none without a store.
pub fn files_store(state: &AppState, tenant: &str) -> Option<StoreLocation> {
    state.config.checkpoint_store.as_ref().map(|store| store.join(&format!("tenants/{tenant}/files")))
}

/// Where the job's sink writes.
pub fn output_dir(state: &AppState, tenant: &str, job: &str) -> PathBuf {
    job_dir(state, tenant, job).join("output")
}

/// A relative path with no `..`, `/` or prefix: one that cannot leave the directory it is
/// joined to.
pub fn confined(field: &str, path: &Path) -> Result<(), ApiError> {
    let escapes = path.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes || path.as_os_str().is_empty() {
        return Err(ApiError::unprocessable(format!(
            "`{}`: give a path relative to your files area, without `..`",
            path.display()
        ))
        .at(field));
    }
    Ok(())
}

/// Where a job's files sink writes: beside its checkpoints, so every worker writes it and the
/// job master recovers it.
fn files_location(state: &AppState, tenant: &str, job: &str) -> (Option<PathBuf>, Option<eddy_plan::S3Spec>) {
    job_store(state, tenant, job).join("output").into_fields()
}

/// A job's files sink output, to read its committed files (blocking: a bucket's client
/// drives its own runtime, so open and drop it off the async threads).
pub fn job_files_output(state: &AppState, tenant: &str, job: &str) -> Result<Arc<dyn OutputDir>, String> {
    let (dir, s3) = files_location(state, tenant, job);
    let spec = SinkSpec::Files { dir, s3 };
    match eddy_engine::files_output(&spec) {
        Ok(Some(out)) => Ok(out),
        Ok(None) => Err("not a files sink".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A spec error as a 422 naming the field (paths shown as the tenant sees them).
fn refused(state: &AppState, tenant: &str, e: eddy_plan::SpecError) -> ApiError {
    let field = match &e {
        eddy_plan::SpecError::Invalid { field, .. } => Some(field.clone()),
        _ => None,
    };
    let error = ApiError::unprocessable(redact(state, tenant, &e.to_string()));
    match field {
        Some(f) => error.at(f),
        None => error,
    }
}

/// State one subtask of one step may hold when its spec sets no limit, in this service: the
/// engine's own defaults (1 GiB on the heap, 64 GiB in RocksDB) would make a two-step RocksDB
/// job ask 128 GiB, more than a tenant's whole default quota, so no example would run.
pub const SERVICE_HEAP_STATE_BYTES: u64 = 128 << 20;
/// What one subtask's input journal may fill in the job's checkpoint store (`debug.journal_max_mb`
/// is capped at it): a tenant's journals are bounded by this times its subtasks.
pub const SERVICE_JOURNAL_MAX_MB: u64 = 64;
/// See [`SERVICE_HEAP_STATE_BYTES`].
pub const SERVICE_ROCKSDB_STATE_BYTES: u64 = 4 << 30;

/// Refuses a step whose artifact implements the other world: a window step runs an aggregate
/// (`window-aggregate`), any other a keyed operator. Checked at submit, rescale and upgrade,
/// so the job does not fail at run time for it.
pub fn check_world(step: &eddy_plan::StepSpec, index: usize, reference: &str, world: World) -> Result<(), ApiError> {
    let needed = if step.window.is_some() { World::WindowAggregate } else { World::KeyedOperator };
    if world == needed {
        return Ok(());
    }
    let what = if step.window.is_some() { "a window step" } else { "a step without `window`" };
    Err(ApiError::unprocessable(format!(
        "step `{}` is {what} and runs a `{}` component, but `{reference}` is a `{}` component: upload one of \
         the right world, or {} the step's `window`",
        step.name,
        needed.name(),
        world.name(),
        if step.window.is_some() { "drop" } else { "add" }
    ))
    .at(format!("steps[{index}].wasm")))
}

/// Each subtask's input journal (kept beside the job's checkpoints, in a directory or a bucket)
/// is capped at [`SERVICE_JOURNAL_MAX_MB`] whatever the spec asks.
fn bound_journals(spec: &mut PipelineSpec) {
    let cap = |mb: Option<u64>| Some(mb.unwrap_or(SERVICE_JOURNAL_MAX_MB).min(SERVICE_JOURNAL_MAX_MB));
    spec.debug.journal_max_mb = cap(spec.debug.journal_max_mb);
    for step in spec.steps.iter_mut().filter(|s| s.debug.journal_max_mb.is_some()) {
        step.debug.journal_max_mb = cap(step.debug.journal_max_mb);
    }
}

/// The spec as the job runs it, and the digests of its steps' artifacts in step order: the
/// submitted `text` with the record's overrides, its paths in the tenant's area and its
/// checkpoints in the directory of the record's generation. Blocking (it reads the store):
/// call it off the async threads.
pub fn place(state: &AppState, record: &JobRecord, text: &str) -> Result<(PipelineSpec, Vec<String>), ApiError> {
    let (tenant, job) = (record.tenant.as_str(), record.id.as_str());
    // JSON is YAML too, so one parser reads both; it refuses anchors, aliases and deep
    // nesting before it builds anything.
    let mut spec = PipelineSpec::parse(text).map_err(|e| refused(state, tenant, e))?;
    if let Some(p) = record.overrides.parallelism {
        spec.parallelism = p;
        for step in &mut spec.steps {
            step.parallelism = Some(p);
        }
    }
    crate::restarts::check_strategy(&spec.restart)
        .map_err(|(field, problem)| ApiError::unprocessable(format!("`{field}`: {problem}")).at(field))?;
    let mut digests = Vec::with_capacity(spec.steps.len());
    for (i, step) in spec.steps.iter_mut().enumerate() {
        let field = format!("steps[{i}].wasm");
        let reference = match record.overrides.artifacts.get(&step.name) {
            Some(digest) => digest.clone(),
            None => step.wasm.to_str().unwrap_or_default().to_string(),
        };
        let artifact = resolve(state, tenant, &reference)?.ok_or_else(|| {
            ApiError::unprocessable(format!(
                "`{reference}` is not one of your artifacts: upload it (POST /v1/artifacts) and name it here by \
                 `sha256:<hex>` or `name@version`"
            ))
            .at(field)
        })?;
        check_world(step, i, &reference, artifact.world)?;
        step.wasm = wasm_path(state, &artifact.digest);
        digests.push(artifact.digest);
    }
    let (files, shared) = (files_dir(state, tenant), files_store(state, tenant));
    for (i, source) in spec.sources.iter_mut().enumerate() {
        if let SourceSpec::File { path, follow, s3, beneath, .. } = source {
            confined(&format!("sources[{i}].path"), path)?;
            if s3.is_some() {
                return Err(ApiError::unprocessable(
                    "the service reads file sources from your files area (PUT /v1/files/{name}): drop `s3`",
                )
                .at(format!("sources[{i}].s3")));
            }
            // A followed file grows on this machine only; any other is read where every
            // worker reaches it. A local file is opened without following links, which a
            // shared volume could place in the area.
            let area = match (&shared, *follow) {
                (Some(StoreLocation::S3(bucket)), false) => {
                    *s3 = Some(bucket.clone());
                    None
                }
                (Some(StoreLocation::Dir(dir)), false) => Some(dir.clone()),
                _ => Some(files.clone()),
            };
            *beneath = area.clone();
            if let Some(area) = area {
                *path = area.join(&*path);
            }
        }
    }
    let dir = job_dir(state, tenant, job);
    spec.sink = match &spec.sink {
        // The tenant reads JSON lines through the API whichever of these it asked for; the
        // exactly-once files sink writes them where every worker reaches.
        SinkSpec::Print | SinkSpec::File { .. } | SinkSpec::Files { .. } => {
            let (dir, s3) = files_location(state, tenant, job);
            SinkSpec::Files { dir, s3 }
        }
        SinkSpec::Upsert { .. } => SinkSpec::Upsert { dir: output_dir(state, tenant, job).join("table") },
        SinkSpec::Blackhole => SinkSpec::Blackhole,
        // Checked and given their connections after validation (their secrets would not pass).
        external @ (SinkSpec::Kafka(_) | SinkSpec::Postgres(_)) => external.clone(),
    };
    spec.state.dir = Some(dir.join("state"));
    if spec.state.max_bytes_per_subtask.is_none() {
        spec.state.max_bytes_per_subtask = Some(match spec.state.backend {
            eddy_plan::StateBackendKind::Heap => SERVICE_HEAP_STATE_BYTES,
            eddy_plan::StateBackendKind::Rocksdb => SERVICE_ROCKSDB_STATE_BYTES,
        });
    }
    let checkpoints = match spec.checkpoints.take() {
        Some(c) if c.s3.is_some() => {
            return Err(ApiError::unprocessable(
                "the service keeps each job's checkpoints itself: drop `checkpoints.s3` (and `dir`)",
            )
            .at("checkpoints.s3"));
        }
        Some(c) => c,
        None => CheckpointSpec::in_dir(PathBuf::new(), DEFAULT_CHECKPOINT_INTERVAL_MS),
    };
    let (dir, s3) = job_checkpoints(state, record).into_fields();
    bound_journals(&mut spec);
    spec.checkpoints = Some(CheckpointSpec { dir, s3, ..checkpoints });
    spec.validate().map_err(|e| refused(state, tenant, e))?;
    crate::connections::resolve_connectors(state, tenant, &mut spec)?;
    Ok((spec, digests))
}

/// `text` as a tenant may see it: the server's paths of the tenant's own area are shown
/// relative to it (`files/in.txt`, `jobs/j_1/output`), every other server path is hidden.
/// Engine errors name the files they failed on, and those are the server's business.
pub fn redact(state: &AppState, tenant: &str, text: &str) -> String {
    let area = state.data_dir.join("tenants").join(tenant);
    let mut out = text.replace(&format!("{}/", area.display()), "").replace(&area.display().to_string(), ".");
    out = out.replace(&state.data_dir.display().to_string(), "<server>");
    if let Some(store) = &state.config.checkpoint_store {
        let mine = store.join(&format!("tenants/{tenant}")).to_string();
        out = out.replace(&format!("{mine}/"), "").replace(&store.to_string(), "<store>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_journal_is_capped_whatever_its_spec_asks() {
        let yaml = |debug: &str| {
            format!(
                "name: p\n{debug}sources: [{{type: generator, name: g}}]\nsteps:\n  - {{name: a, wasm: a.wasm, debug: \
                 {{journal: true, journal_max_mb: 18446744073709551615}}}}\n  - {{name: b, wasm: b.wasm}}\nsink: \
                 {{type: print}}\n"
            )
        };
        for debug in ["", "debug: {journal_max_mb: 9999999}\n"] {
            let mut spec = PipelineSpec::parse(&yaml(debug)).expect("parses");
            bound_journals(&mut spec);
            let cap = SERVICE_JOURNAL_MAX_MB << 20;
            assert_eq!((spec.journal_max_bytes(0), spec.journal_max_bytes(1)), (cap, cap), "{debug}");
        }
        let mut plain = PipelineSpec::parse(&yaml("").replace("journal: true, ", "")).expect("parses");
        bound_journals(&mut plain);
        assert!(!plain.journals(0) && !plain.journals(1), "capping asks for no journal");
    }

    #[test]
    fn a_checkpoint_store_is_a_bucket_or_a_directory_and_each_job_gets_its_own_place() {
        let env = |name: &str| match name {
            "AWS_ENDPOINT_URL" => Some("http://127.0.0.1:5000".to_owned()),
            "AWS_ALLOW_HTTP" => Some("true".to_owned()),
            _ => None,
        };
        let checkpoints = |store: &StoreLocation| in_store(store, "t1", "j1").join("checkpoints/2");
        let s3 = parse_store("s3://eddy/prod/", env).expect("valid");
        let StoreLocation::S3(bucket) = checkpoints(&s3) else { panic!("a bucket") };
        assert_eq!(
            (bucket.bucket.as_str(), bucket.prefix.as_str(), bucket.endpoint.as_deref(), bucket.allow_http),
            ("eddy", "prod/tenants/t1/jobs/j1/checkpoints/2", Some("http://127.0.0.1:5000"), true)
        );
        assert_eq!(bucket.region, "us-east-1");
        let bare = parse_store("s3://eddy", |_| None).expect("valid");
        assert_eq!(checkpoints(&bare).to_string(), "s3://eddy/tenants/t1/jobs/j1/checkpoints/2");
        let shared = parse_store("/mnt/eddy", |_| None).expect("valid");
        assert_eq!(
            checkpoints(&shared),
            StoreLocation::Dir(PathBuf::from("/mnt/eddy/tenants/t1/jobs/j1/checkpoints/2"))
        );
        for bad in ["s3:///x", "gs://bucket/x"] {
            assert!(parse_store(bad, |_| None).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_that_could_leave_the_area_are_refused() {
        for bad in ["../x", "/etc/passwd", "a/../../b", ""] {
            assert!(confined("sources[0].path", Path::new(bad)).is_err(), "{bad}");
        }
        for good in ["in.txt", "a/b.jsonl", "./c"] {
            assert!(confined("sources[0].path", Path::new(good)).is_ok(), "{good}");
        }
    }
}

#[cfg(test)]
mod confinement_properties {
    use std::path::Path;

    use proptest::prelude::*;

    use super::confined;

    /// The oracle, written apart from `confined`: resolves `path` segment by segment against a
    /// base directory, by text alone. `None` if it is absolute or climbs above the base;
    /// otherwise how deep below the base it ends.
    fn depth_below_base(path: &str) -> Option<usize> {
        if path.starts_with('/') {
            return None;
        }
        let mut depth = 0usize;
        for segment in path.split('/') {
            match segment {
                "" | "." => {}
                ".." => depth = depth.checked_sub(1)?,
                _ => depth += 1,
            }
        }
        Some(depth)
    }

    /// Paths made of the segments that matter (`..`, `.`, empty, names with dots), sometimes
    /// absolute, sometimes with a trailing slash.
    fn path() -> impl Strategy<Value = String> {
        let segment =
            prop::sample::select(vec!["..", ".", "", "a", "b.txt", "...", "..a", "a..", ".hidden", "~", "\\..", "c:"]);
        (any::<bool>(), prop::collection::vec(segment, 0..7), any::<bool>()).prop_map(
            |(absolute, segments, trailing)| {
                let mut path = segments.join("/");
                if absolute {
                    path.insert(0, '/');
                }
                if trailing {
                    path.push('/');
                }
                path
            },
        )
    }

    proptest! {
        // A fixed seed: the same cases every run.
        #![proptest_config(ProptestConfig {
            cases: 2_000,
            failure_persistence: None,
            rng_seed: proptest::test_runner::RngSeed::Fixed(7),
            ..ProptestConfig::default()
        })]

        /// Nothing accepted leaves the base: the oracle resolves it inside, and it does not go
        /// through `..` at all (not even down and up again).
        #[test]
        fn an_accepted_path_stays_inside(path in prop_oneof![path(), "[./a\\\\]{0,12}", any::<String>()]) {
            if confined("sources[0].path", Path::new(&path)).is_ok() {
                prop_assert!(depth_below_base(&path).is_some(), "`{}` climbs out", path);
                prop_assert!(!path.split('/').any(|s| s == ".."), "`{}` goes through ..", path);
                prop_assert!(!path.is_empty());
            }
        }

        /// Plain relative paths (names joined by `/`) are never refused.
        #[test]
        fn a_plain_relative_path_is_accepted(names in prop::collection::vec("[a-zA-Z0-9_-][a-zA-Z0-9_.-]{0,8}", 1..5)) {
            let path = names.join("/");
            prop_assume!(names.iter().all(|n| n != "." && n != ".."));
            prop_assert_eq!(depth_below_base(&path), Some(names.len()));
            prop_assert!(confined("sources[0].path", Path::new(&path)).is_ok(), "`{}` refused", path);
        }

        /// A refusal names the field it was given.
        #[test]
        fn a_refusal_names_the_field(path in path()) {
            if let Err(e) = confined("sources[3].path", Path::new(&path)) {
                prop_assert_eq!(e.field.as_deref(), Some("sources[3].path"));
                prop_assert_eq!(e.status.as_u16(), 422);
            }
        }
    }
}
