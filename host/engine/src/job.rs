//! A running job on the embedded default: the plan's subtasks as threads in this process,
//! connected by local credit-based channels, with heap state.
//!
//! [`Job::start`] loads every component first (so a bad `.wasm` fails before any thread
//! starts), wires gates and routers, and starts one thread per subtask. The first subtask to
//! fail cancels the job: every channel closes, every thread ends, and [`Job::wait`] reports
//! that first failure with its task and subtask.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eddy_core::{BoundedOutOfOrderness, HeapTimerService, WATERMARK_MIN, WatermarkTracker};
use eddy_runtime::{CallError, Component, LoadError, Runtime, RuntimeError, Subtask, World};
use eddy_state::{HeapStateBackend, StateBackend, TtlBackend, TtlClock};

use crate::channel::{ChannelConfig, ChannelSender, InputGate, LocalGateShared, local_gate};
use crate::connectors::{SourceError, open_source};
use crate::metrics::{JobMetrics, MetricsSnapshot, SubtaskMetrics};
use crate::operator::StreamOperator;
use crate::plan::{Node, Partitioning, PhysicalPlan};
use crate::router::OutputRouter;
use crate::sink::{Blackhole, JsonLinesSink, PrintSink, Sink};
use crate::spec::{PipelineSpec, SinkSpec, StepSpec};
use crate::task::{Ended, Head, SubtaskRunner, Tail, TaskError, now_ms};
use crate::wasm_operator::WasmOperator;
use crate::window_operator::{LateData, WindowConfig, WindowOperator};

/// Why a job could not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A step's component could not be loaded.
    #[error("step `{step}`: {error}")]
    Load {
        /// The step.
        step: String,
        /// Why.
        error: LoadError,
    },
    /// A step's component is the wrong kind for how the step uses it.
    #[error("step `{step}`: {problem}")]
    WrongKind {
        /// The step.
        step: String,
        /// What it is and what the step needs.
        problem: String,
    },
    /// An instance could not be created.
    #[error(transparent)]
    Instantiate(#[from] RuntimeError),
    /// A step's `open` rejected its config or failed.
    #[error("step `{step}` failed to open: {error}")]
    Open {
        /// The step.
        step: String,
        /// Why.
        error: Box<CallError>,
    },
    /// A source could not be opened.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The sink could not be opened.
    #[error("opening sink {path}: {error}")]
    Sink {
        /// The sink's file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// A subtask failed while running.
    #[error("task `{task}` subtask {subtask}: {error}")]
    Task {
        /// The chain's label.
        task: String,
        /// The subtask.
        subtask: u32,
        /// What failed.
        error: Box<TaskError>,
    },
    /// The job could not be wired or started (a bug in Eddy or an exhausted machine).
    #[error("task {task} subtask {subtask}: {message}")]
    Internal {
        /// The task.
        task: usize,
        /// The subtask.
        subtask: u32,
        /// What went wrong.
        message: String,
    },
    /// A subtask thread panicked (a bug in Eddy, not in an operator: guests cannot panic the host).
    #[error("task `{task}` subtask {subtask} panicked: {message}")]
    Panicked {
        /// The chain's label.
        task: String,
        /// The subtask.
        subtask: u32,
        /// The panic message.
        message: String,
    },
}

/// Knobs of the local execution (defaults suit a laptop and CI).
pub struct JobOptions {
    /// Channel capacity (credits) and sender queue.
    pub channel: ChannelConfig,
    /// A channel buffer ships once it holds this many bytes.
    pub buffer_bytes: usize,
    /// Period of processing-time timers, idleness checks and buffer timeouts.
    pub tick: Duration,
    /// Overrides the spec's sink (tests, embedding applications).
    pub sink: Option<Box<dyn Sink>>,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self { channel: ChannelConfig::default(), buffer_bytes: 32 * 1024, tick: Duration::from_millis(10), sink: None }
    }
}

impl std::fmt::Debug for JobOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobOptions")
            .field("channel", &self.channel)
            .field("buffer_bytes", &self.buffer_bytes)
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

/// What a finished job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// Final metrics.
    pub metrics: MetricsSnapshot,
    /// Whether it ran to the end of its input (false: cancelled).
    pub finished: bool,
}

/// Shared by every subtask thread: the first failure cancels the job.
struct Control {
    cancel: Arc<AtomicBool>,
    gates: Mutex<Vec<Arc<LocalGateShared>>>,
}

impl Control {
    fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        let gates = self.gates.lock().map(|g| g.clone()).unwrap_or_default();
        for gate in gates {
            gate.close();
        }
    }
}

/// (task, subtask, thread).
type SubtaskThread = (usize, u32, JoinHandle<Result<Ended, TaskError>>);

/// A started job.
pub struct Job {
    plan: PhysicalPlan,
    metrics: Arc<JobMetrics>,
    control: Arc<Control>,
    threads: Vec<SubtaskThread>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("plan", &self.plan.name).field("threads", &self.threads.len()).finish()
    }
}

fn open_spec_sink(spec: &SinkSpec) -> Result<Box<dyn Sink>, RunError> {
    Ok(match spec {
        SinkSpec::Print => Box::new(PrintSink(std::io::stdout())),
        SinkSpec::Blackhole => Box::new(Blackhole),
        SinkSpec::File { path } => {
            let file = File::create(path)
                .map_err(|source| RunError::Sink { path: path.display().to_string(), error: source })?;
            Box::new(JsonLinesSink(BufWriter::new(file)))
        }
    })
}

fn load_step(runtime: &Runtime, step: &StepSpec) -> Result<Component, RunError> {
    let component = runtime
        .load_file(&step.name, Path::new(&step.wasm))
        .map_err(|source| RunError::Load { step: step.name.clone(), error: source })?;
    let wrong = |problem: &str| Err(RunError::WrongKind { step: step.name.clone(), problem: problem.into() });
    match (component.world(), step.window.is_some()) {
        (World::KeyedOperator, true) => {
            wrong("has a `window`, so `wasm` must be a window aggregate, but it is a keyed operator")
        }
        (World::WindowAggregate, false) => {
            wrong("`wasm` is a window aggregate; add a `window` to the step (or use a keyed operator)")
        }
        _ => Ok(component),
    }
}

/// Everything needed to build one subtask's operators.
struct StepContext<'a> {
    spec: &'a PipelineSpec,
    components: &'a [Component],
    ttl_clock: &'a TtlClock,
}

impl StepContext<'_> {
    fn operator(&self, step: usize, subtask: Subtask) -> Result<Box<dyn StreamOperator>, RunError> {
        let s = &self.spec.steps[step];
        let component = &self.components[step];
        let heap: Box<dyn StateBackend> = Box::new(HeapStateBackend::default());
        if let Some(window) = &s.window {
            let kind = window.kind().map_err(|(_, problem)| RunError::WrongKind { step: s.name.clone(), problem })?;
            let mut aggregate = component.instantiate_aggregate()?;
            aggregate
                .open(&s.config.to_string())
                .map_err(|source| RunError::Open { step: s.name.clone(), error: Box::new(source) })?;
            let config = WindowConfig {
                kind,
                allowed_lateness_ms: window.allowed_lateness_ms,
                late_data: if window.drop_late {
                    LateData::Drop
                } else {
                    LateData::SideOutput(window.late_output.clone())
                },
                max_parallelism: self.spec.max_parallelism,
            };
            return Ok(Box::new(WindowOperator::new(s.name.clone(), config, aggregate, heap)));
        }
        let backend = match s.state_ttl_ms {
            Some(ttl) => Box::new(TtlBackend::new(heap, ttl, self.ttl_clock.clone())),
            None => heap,
        };
        let timers = Box::new(HeapTimerService::starting_at(now_ms()));
        let mut instance = component.instantiate_operator(subtask, backend, timers)?;
        instance
            .open(&s.config.to_string())
            .map_err(|source| RunError::Open { step: s.name.clone(), error: Box::new(source) })?;
        Ok(Box::new(WasmOperator::new(s.name.clone(), instance, s.state_ttl_ms.is_some())))
    }
}

impl Job {
    /// Plans `spec`, loads its components and starts every subtask.
    pub fn start(spec: &PipelineSpec, runtime: &Runtime, mut options: JobOptions) -> Result<Job, RunError> {
        let plan = PhysicalPlan::new(spec);
        let components = spec.steps.iter().map(|s| load_step(runtime, s)).collect::<Result<Vec<_>, _>>()?;
        let sink_task = plan.tasks.iter().position(|t| t.has_sink()).unwrap_or(plan.tasks.len() - 1);
        let source_tasks = plan.tasks.iter().filter(|t| t.source().is_some()).map(|t| t.id).collect();
        let labels = (0..plan.tasks.len()).map(|t| plan.task_label(t)).collect();
        let mut metrics = JobMetrics::new(labels, source_tasks, sink_task);
        let subtask_metrics: Vec<Vec<Arc<SubtaskMetrics>>> =
            plan.tasks.iter().map(|t| (0..t.parallelism).map(|i| metrics.register(t.id, i)).collect()).collect();
        let metrics = Arc::new(metrics);
        let control = Arc::new(Control { cancel: Arc::new(AtomicBool::new(false)), gates: Mutex::new(Vec::new()) });

        // Wire the exchanges: one gate per downstream subtask; `senders[task][subtask]` lists
        // the upstream subtask's senders in downstream-subtask order.
        let mut gates: Vec<Vec<Option<Box<dyn InputGate>>>> =
            plan.tasks.iter().map(|t| (0..t.parallelism).map(|_| None).collect()).collect();
        let mut senders: Vec<Vec<Vec<Box<dyn ChannelSender>>>> =
            plan.tasks.iter().map(|t| (0..t.parallelism).map(|_| Vec::new()).collect()).collect();
        for task in &plan.tasks {
            let inputs: Vec<_> = plan.inputs(task.id).cloned().collect();
            if inputs.is_empty() {
                continue;
            }
            for down in 0..task.parallelism {
                // (upstream task, upstream subtask) of each channel of this gate, in order.
                let feeders: Vec<(usize, u32)> = inputs
                    .iter()
                    .flat_map(|e| {
                        let up = plan.tasks[e.from].parallelism;
                        let forward = e.partitioning == Partitioning::Forward;
                        (0..up).filter(move |u| !forward || *u == down).map(move |u| (e.from, u))
                    })
                    .collect();
                let blocked = feeders.iter().map(|&(t, u)| subtask_metrics[t][u as usize].blocked_ns.clone()).collect();
                let (shared, gate, channel_senders) = local_gate(feeders.len(), options.channel, blocked);
                control.gates.lock().map_err(|_| poisoned())?.push(shared);
                gates[task.id][down as usize] = Some(Box::new(gate));
                for (&(t, u), sender) in feeders.iter().zip(channel_senders) {
                    senders[t][u as usize].push(Box::new(sender));
                }
            }
        }

        let ttl_clock = TtlClock::new(now_ms());
        let steps = StepContext { spec, components: &components, ttl_clock: &ttl_clock };
        let mut sink = Some(match options.sink.take() {
            Some(sink) => sink,
            None => open_spec_sink(&spec.sink)?,
        });
        let mut runners = Vec::new();
        for task in &plan.tasks {
            let first_step_keyed = task.keyed;
            for index in 0..task.parallelism {
                let operators = task
                    .steps()
                    .enumerate()
                    .map(|(pos, step)| {
                        // Only the step right behind a hash exchange sees just its key groups;
                        // steps chained after it may re-key freely, so they accept any key.
                        let subtask = if pos == 0 && first_step_keyed {
                            Subtask { index, parallelism: task.parallelism, max_parallelism: spec.max_parallelism }
                        } else {
                            Subtask::single(spec.max_parallelism)
                        };
                        steps.operator(step, subtask)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let head = match task.source() {
                    Some(source) => Head::Source {
                        source: open_source(&spec.sources[source], index, task.parallelism, None)?,
                        watermarks: BoundedOutOfOrderness::new(spec.watermarks.out_of_orderness_ms),
                        batch_size: spec.batch_size,
                        buffer: eddy_core::RecordBatch::with_capacity(spec.batch_size, spec.batch_size * 64),
                    },
                    None => {
                        let Some(gate) = gates[task.id][index as usize].take() else {
                            return Err(internal(task.id, index, "a task without source has no input gate"));
                        };
                        let channels = gate.channels();
                        Head::Input {
                            gate,
                            tracker: WatermarkTracker::new(channels, spec.watermarks.idleness_ms, now_ms()),
                            ended: vec![false; channels],
                        }
                    }
                };
                let tail = match plan.output(task.id) {
                    Some(edge) => {
                        let next_step = plan.tasks[edge.to].nodes.first().map_or("sink".to_string(), |n| match n {
                            Node::Step(i) => spec.steps[*i].name.clone(),
                            _ => plan.label(*n).to_string(),
                        });
                        Tail::Exchange(OutputRouter::new(
                            edge.partitioning.clone(),
                            std::mem::take(&mut senders[task.id][index as usize]),
                            spec.max_parallelism,
                            options.buffer_bytes,
                            spec.buffer_timeout_ms,
                            next_step,
                        ))
                    }
                    None => match sink.take() {
                        Some(sink) => Tail::Sink(sink),
                        None => return Err(internal(task.id, index, "the sink runs at parallelism 1")),
                    },
                };
                runners.push((
                    task.id,
                    index,
                    SubtaskRunner {
                        head,
                        operators,
                        tail,
                        metrics: subtask_metrics[task.id][index as usize].clone(),
                        cancel: control.cancel.clone(),
                        ttl_clock: ttl_clock.clone(),
                        tick: options.tick,
                        watermark: WATERMARK_MIN,
                    },
                ));
            }
        }

        let mut threads = Vec::new();
        for (task, index, runner) in runners {
            let thread_control = control.clone();
            let name = format!("eddy-t{task}-{index}");
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let result = runner.run();
                if result.is_err() {
                    thread_control.cancel();
                }
                result
            });
            match spawned {
                Ok(handle) => threads.push((task, index, handle)),
                Err(e) => {
                    control.cancel();
                    return Err(internal(task, index, &format!("cannot start a thread: {e}")));
                }
            }
        }
        tracing::info!(job = %spec.name, tasks = plan.tasks.len(), subtasks = plan.subtasks(), "job started");
        Ok(Job { plan, metrics, control, threads })
    }

    /// The physical plan being run.
    pub fn plan(&self) -> &PhysicalPlan {
        &self.plan
    }

    /// Current metrics.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Subtasks per task, in plan order (for per-subtask averages such as backpressure).
    pub fn parallelisms(&self) -> Vec<u32> {
        self.plan.tasks.iter().map(|t| t.parallelism).collect()
    }

    /// Whether every subtask has ended.
    pub fn is_done(&self) -> bool {
        self.threads.iter().all(|(_, _, h)| h.is_finished())
    }

    /// Stops every subtask without flushing windows (bounded inputs end by themselves).
    pub fn cancel(&self) {
        self.control.cancel();
    }

    /// Waits for every subtask; the first failure (not the cancellations it caused) is the error.
    pub fn wait(self) -> Result<RunSummary, RunError> {
        let mut first_error: Option<RunError> = None;
        let mut finished = true;
        for (task, subtask, handle) in self.threads {
            let label = self.plan.task_label(task);
            let outcome = match handle.join() {
                Ok(Ok(Ended::Finished)) => None,
                Ok(Ok(Ended::Cancelled)) => {
                    finished = false;
                    None
                }
                Ok(Err(source)) => Some(RunError::Task { task: label, subtask, error: Box::new(source) }),
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Some(RunError::Panicked { task: label, subtask, message })
                }
            };
            if let Some(e) = outcome {
                finished = false;
                // A closed channel is the echo of another subtask's failure, not the cause.
                if first_error.is_none() || (!is_disconnect(&e) && first_error.as_ref().is_some_and(is_disconnect)) {
                    first_error = Some(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(RunSummary { metrics: self.metrics.snapshot(), finished }),
        }
    }

    /// Starts `spec` and runs it to the end, calling `progress` about every `every`.
    pub fn run(
        spec: &PipelineSpec,
        runtime: &Runtime,
        options: JobOptions,
        every: Duration,
        mut progress: impl FnMut(&Job, &MetricsSnapshot),
    ) -> Result<RunSummary, RunError> {
        let job = Job::start(spec, runtime, options)?;
        let mut last = Instant::now();
        while !job.is_done() {
            std::thread::sleep(Duration::from_millis(20));
            if last.elapsed() >= every {
                last = Instant::now();
                progress(&job, &job.metrics());
            }
        }
        job.wait()
    }
}

fn is_disconnect(e: &RunError) -> bool {
    matches!(e, RunError::Task { error, .. } if matches!(**error, TaskError::Route(crate::router::RouteError::Disconnected(_))))
}

fn poisoned() -> RunError {
    internal(0, 0, "job control lock poisoned")
}

fn internal(task: usize, subtask: u32, message: &str) -> RunError {
    RunError::Internal { task, subtask, message: message.to_string() }
}
