//! `GET /metrics`: Prometheus metrics of the jobs a token may see (the admin's: all; a
//! tenant's: its own), per tenant, job and task, read from the live views at each scrape.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::AppState;
use crate::auth::Caller;
use crate::model::{JobRecord, Principal, now_ms};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::store::Table;
use crate::supervisor::LiveView;

/// What one scrape reports of one job.
#[derive(Debug)]
struct JobSample {
    record: JobRecord,
    live: Option<LiveView>,
}

/// The samples of one scrape, encoded as metric families.
#[derive(Debug)]
struct Jobs {
    jobs: Vec<JobSample>,
    now_ms: i64,
}

type Labels = Vec<(&'static str, String)>;

fn job_labels(r: &JobRecord) -> Labels {
    vec![("tenant", r.tenant.clone()), ("job", r.id.clone()), ("name", r.name.clone())]
}

/// Encodes one metric family from (labels, value) samples.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Jobs {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let status = self.jobs.iter().map(|j| {
            let mut labels = job_labels(&j.record);
            labels.push(("status", j.record.status.name().to_owned()));
            (labels, ConstGauge::new(1i64))
        });
        family(&mut encoder, "eddy_job_info", "A job and its status (always 1).", MetricType::Gauge, status)?;
        let restarts =
            self.jobs.iter().map(|j| (job_labels(&j.record), ConstCounter::new(u64::from(j.record.restarts))));
        family(&mut encoder, "eddy_job_restarts", "Restarts after failures.", MetricType::Counter, restarts)?;
        let live: Vec<(&JobRecord, &LiveView)> =
            self.jobs.iter().filter_map(|j| j.live.as_ref().map(|l| (&j.record, l))).collect();
        let last_checkpoint = |f: fn(&crate::supervisor::CheckpointView) -> f64| {
            live.iter().filter_map(move |(r, l)| l.checkpoints.last().map(|c| (job_labels(r), ConstGauge::new(f(c)))))
        };
        family(
            &mut encoder,
            "eddy_job_last_checkpoint_duration_seconds",
            "Trigger to completion of the newest checkpoint.",
            MetricType::Gauge,
            last_checkpoint(|c| c.duration_ms / 1000.0),
        )?;
        family(
            &mut encoder,
            "eddy_job_last_checkpoint_size_bytes",
            "Bytes the newest checkpoint references.",
            MetricType::Gauge,
            last_checkpoint(|c| c.full_bytes as f64),
        )?;
        let tasks = || {
            live.iter().flat_map(|(r, l)| {
                l.tasks.iter().enumerate().map(move |(i, t)| {
                    let mut labels = job_labels(r);
                    labels.push(("task", i.to_string()));
                    labels.push(("operator", t.label.clone()));
                    (labels, t)
                })
            })
        };
        let counter =
            |f: fn(&crate::supervisor::TaskView) -> u64| tasks().map(move |(l, t)| (l, ConstCounter::new(f(t))));
        family(
            &mut encoder,
            "eddy_task_records_in",
            "Records into a task.",
            MetricType::Counter,
            counter(|t| t.records_in),
        )?;
        family(
            &mut encoder,
            "eddy_task_records_out",
            "Records out of a task.",
            MetricType::Counter,
            counter(|t| t.records_out),
        )?;
        family(
            &mut encoder,
            "eddy_task_late_records",
            "Records too late for their windows.",
            MetricType::Counter,
            counter(|t| t.late_records),
        )?;
        let memory = tasks().map(|(l, t)| (l, ConstGauge::new(t.wasm_memory_bytes as f64)));
        family(
            &mut encoder,
            "eddy_task_wasm_memory_bytes",
            "Linear memory the task's Wasm instances hold, over its subtasks.",
            MetricType::Gauge,
            memory,
        )?;
        family(
            &mut encoder,
            "eddy_task_cpu_seconds",
            "CPU time the task's subtask threads have used.",
            MetricType::Counter,
            tasks().map(|(l, t)| (l, ConstCounter::new(t.cpu_seconds))),
        )?;
        let backpressure = tasks().map(|(l, t)| (l, ConstGauge::new(t.backpressure)));
        family(
            &mut encoder,
            "eddy_task_backpressure_ratio",
            "Share of the last interval the task waited for credit downstream.",
            MetricType::Gauge,
            backpressure,
        )?;
        let now = self.now_ms;
        let lag = tasks().filter_map(|(l, t)| t.watermark.map(|w| (l, ConstGauge::new((now - w) as f64 / 1000.0))));
        family(
            &mut encoder,
            "eddy_task_watermark_lag_seconds",
            "Wall-clock time minus the task's watermark.",
            MetricType::Gauge,
            lag,
        )?;
        Ok(())
    }
}

/// Prometheus metrics (OpenMetrics text) of the jobs the token may see.
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, content_type = "application/openmetrics-text", body = String), (status = 401, body = Problem)),
    security(("bearer" = [])))]
pub async fn metrics(State(state): State<Arc<AppState>>, caller: Caller) -> ApiResult<impl IntoResponse> {
    // The admin sees every tenant's jobs, a tenant only its own (a range of its keys).
    let prefix = match &caller.principal {
        Principal::Admin => String::new(),
        Principal::Tenant { tenant } => format!("{tenant}/"),
    };
    let records: Vec<JobRecord> = state.store.list(Table::Jobs, &prefix)?;
    let jobs = records
        .into_iter()
        .map(|record| {
            let live = state.supervisor.live(&record.key()).and_then(|l| l.view());
            JobSample { record, live }
        })
        .collect();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Jobs { jobs, now_ms: now_ms() }));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text))
}
