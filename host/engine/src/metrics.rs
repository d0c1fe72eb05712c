//! Live job metrics: each subtask thread updates its own atomics; readers (the progress line,
//! tests, the final summary) take snapshots without stopping anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eddy_core::WATERMARK_MIN;

/// Counters of one subtask.
#[derive(Debug)]
pub struct SubtaskMetrics {
    /// Task id in the plan.
    pub task: usize,
    /// Subtask index.
    pub index: u32,
    /// Records read (sources) or received on the main stream.
    pub records_in: AtomicU64,
    /// Records leaving the chain (main and side outputs).
    pub records_out: AtomicU64,
    /// The subtask's current watermark.
    pub watermark: AtomicI64,
    /// Time spent waiting for credit on output channels (backpressure), in ns.
    pub blocked_ns: Arc<AtomicU64>,
    /// Records too late for their windows.
    pub late_records: AtomicU64,
    /// Linear memory the chain's Wasm instances hold (updated on the processing-time tick).
    pub wasm_memory_bytes: AtomicU64,
    /// CPU time the subtask's thread has used, ns (updated on the processing-time tick and
    /// when it ends): what one step costs, apart from the rest of the job.
    pub cpu_ns: AtomicU64,
}

impl SubtaskMetrics {
    /// Zeroed counters.
    pub fn new(task: usize, index: u32) -> Self {
        Self {
            task,
            index,
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            watermark: AtomicI64::new(WATERMARK_MIN),
            blocked_ns: Arc::new(AtomicU64::new(0)),
            late_records: AtomicU64::new(0),
            wasm_memory_bytes: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
        }
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Totals of one task at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskSnapshot {
    /// The chain's label.
    pub label: String,
    /// Summed over subtasks.
    pub records_in: u64,
    /// Summed over subtasks.
    pub records_out: u64,
    /// Minimum over subtasks (`i64::MAX` when none of the task's subtasks runs in this part).
    pub watermark: i64,
    /// Summed over subtasks.
    pub blocked_ns: u64,
    /// Summed over subtasks.
    pub late_records: u64,
    /// Summed over subtasks.
    pub wasm_memory_bytes: u64,
    /// CPU time of the subtasks' threads, ns, summed (absent from older workers: 0).
    #[serde(default)]
    pub cpu_ns: u64,
    /// Each subtask's own counters, by index (a part of a spread job holds those it runs).
    #[serde(default)]
    pub subtasks: Vec<SubtaskSnapshot>,
}

/// One subtask's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubtaskSnapshot {
    /// Subtask index.
    pub index: u32,
    /// Records read (sources) or received.
    pub records_in: u64,
    /// Records leaving the chain.
    pub records_out: u64,
    /// Its watermark.
    pub watermark: i64,
    /// Time spent waiting for credit, ns.
    pub blocked_ns: u64,
    /// Records too late for their windows.
    pub late_records: u64,
    /// Linear memory of its Wasm instances.
    pub wasm_memory_bytes: u64,
    /// CPU time of its thread, ns.
    pub cpu_ns: u64,
}

/// Most subtasks a task's snapshot lists: the most a task can have (its key groups).
pub const MAX_SUBTASKS_LISTED: usize = 32_768;

/// The whole job (or one part of a spread job) at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MetricsSnapshot {
    /// Since the job started.
    pub elapsed: Duration,
    /// Per task, in plan order.
    pub tasks: Vec<TaskSnapshot>,
    /// Records read by all sources.
    pub source_records: u64,
    /// Records that reached the sink.
    pub sink_records: u64,
}

impl MetricsSnapshot {
    /// Adds another part's snapshot of the same plan: counters sum, watermarks take the
    /// minimum, and the elapsed time stays this one's.
    pub fn absorb(&mut self, part: &MetricsSnapshot) {
        // Another process's numbers: extra tasks are ignored and sums saturate, so a broken
        // or lying part skews the view at worst, never the coordinator.
        for (t, p) in self.tasks.iter_mut().zip(&part.tasks) {
            t.records_in = t.records_in.saturating_add(p.records_in);
            t.records_out = t.records_out.saturating_add(p.records_out);
            t.watermark = t.watermark.min(p.watermark);
            t.blocked_ns = t.blocked_ns.saturating_add(p.blocked_ns);
            t.late_records = t.late_records.saturating_add(p.late_records);
            t.wasm_memory_bytes = t.wasm_memory_bytes.saturating_add(p.wasm_memory_bytes);
            t.cpu_ns = t.cpu_ns.saturating_add(p.cpu_ns);
            // Each subtask runs in one part: a second report of an index, or more subtasks
            // than a task can have, is a broken or lying part's and is ignored.
            let room = MAX_SUBTASKS_LISTED.saturating_sub(t.subtasks.len());
            t.subtasks.extend(p.subtasks.iter().take(room).cloned());
            // Stable: of two reports of one index the first absorbed stays.
            t.subtasks.sort_by_key(|s| s.index);
            t.subtasks.dedup_by_key(|s| s.index);
        }
        self.source_records = self.source_records.saturating_add(part.source_records);
        self.sink_records = self.sink_records.saturating_add(part.sink_records);
    }

    /// Lowest watermark of any task that has one (where event time stands in the job).
    pub fn watermark(&self) -> Option<i64> {
        self.tasks.iter().map(|t| t.watermark).filter(|w| *w > WATERMARK_MIN && *w < i64::MAX).min()
    }

    /// Late records over all window steps.
    pub fn late_records(&self) -> u64 {
        self.tasks.iter().map(|t| t.late_records).sum()
    }

    /// The share of the interval since `earlier` the most blocked task spent waiting for
    /// credit (0.0-1.0): near 1 means a downstream task is the bottleneck.
    pub fn backpressure_since(&self, earlier: &MetricsSnapshot, subtasks_per_task: &[u32]) -> f64 {
        self.task_backpressure_since(earlier, subtasks_per_task).into_iter().fold(0.0, f64::max)
    }

    /// Per task, the share of the interval since `earlier` its subtasks spent waiting for
    /// credit on average (0.0-1.0).
    pub fn task_backpressure_since(&self, earlier: &MetricsSnapshot, subtasks_per_task: &[u32]) -> Vec<f64> {
        let interval = self.elapsed.saturating_sub(earlier.elapsed).as_nanos() as f64;
        self.tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if interval <= 0.0 {
                    return 0.0;
                }
                let before = earlier.tasks.get(i).map_or(0, |e| e.blocked_ns);
                let subtasks = f64::from(subtasks_per_task.get(i).copied().unwrap_or(1).max(1));
                (t.blocked_ns.saturating_sub(before) as f64 / subtasks / interval).min(1.0)
            })
            .collect()
    }
}

/// All subtasks of a job.
#[derive(Debug)]
pub struct JobMetrics {
    started: Instant,
    labels: Vec<String>,
    source_tasks: Vec<usize>,
    sink_task: usize,
    /// Every subtask's counters.
    pub subtasks: Vec<Arc<SubtaskMetrics>>,
}

impl JobMetrics {
    /// Metrics for tasks labelled `labels`; `source_tasks` and `sink_task` say which count as
    /// the job's input and output.
    pub fn new(labels: Vec<String>, source_tasks: Vec<usize>, sink_task: usize) -> Self {
        Self { started: Instant::now(), labels, source_tasks, sink_task, subtasks: Vec::new() }
    }

    /// Registers a subtask.
    pub fn register(&mut self, task: usize, index: u32) -> Arc<SubtaskMetrics> {
        let m = Arc::new(SubtaskMetrics::new(task, index));
        self.subtasks.push(m.clone());
        m
    }

    /// Reads every counter now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let mut tasks: Vec<TaskSnapshot> = self
            .labels
            .iter()
            .map(|l| TaskSnapshot { label: l.clone(), watermark: i64::MAX, ..TaskSnapshot::default() })
            .collect();
        for s in &self.subtasks {
            let Some(t) = tasks.get_mut(s.task) else { continue };
            t.records_in += s.records_in.load(Ordering::Relaxed);
            t.records_out += s.records_out.load(Ordering::Relaxed);
            t.watermark = t.watermark.min(s.watermark.load(Ordering::Relaxed));
            t.blocked_ns += s.blocked_ns.load(Ordering::Relaxed);
            t.late_records += s.late_records.load(Ordering::Relaxed);
            t.wasm_memory_bytes += s.wasm_memory_bytes.load(Ordering::Relaxed);
            t.cpu_ns += s.cpu_ns.load(Ordering::Relaxed);
            t.subtasks.push(SubtaskSnapshot {
                index: s.index,
                records_in: s.records_in.load(Ordering::Relaxed),
                records_out: s.records_out.load(Ordering::Relaxed),
                watermark: s.watermark.load(Ordering::Relaxed),
                blocked_ns: s.blocked_ns.load(Ordering::Relaxed),
                late_records: s.late_records.load(Ordering::Relaxed),
                wasm_memory_bytes: s.wasm_memory_bytes.load(Ordering::Relaxed),
                cpu_ns: s.cpu_ns.load(Ordering::Relaxed),
            });
        }
        for t in &mut tasks {
            t.subtasks.sort_by_key(|s| s.index);
        }
        let source_records = self.source_tasks.iter().filter_map(|&i| tasks.get(i)).map(|t| t.records_in).sum();
        let sink_records = tasks.get(self.sink_task).map_or(0, |t| t.records_out);
        MetricsSnapshot { elapsed: self.started.elapsed(), tasks, source_records, sink_records }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(records_in: u64, watermark: i64) -> TaskSnapshot {
        TaskSnapshot { label: "t".into(), records_in, records_out: records_in, watermark, ..TaskSnapshot::default() }
    }

    #[test]
    fn parts_add_up_and_a_task_without_subtasks_in_a_part_does_not_hold_back_the_watermark() {
        // The master runs no subtask: every task's watermark is `i64::MAX` there.
        let mut master = MetricsSnapshot { tasks: vec![task(0, i64::MAX), task(0, i64::MAX)], ..Default::default() };
        let a = MetricsSnapshot {
            tasks: vec![task(10, 500), task(3, i64::MAX)],
            source_records: 10,
            sink_records: 3,
            ..Default::default()
        };
        let b = MetricsSnapshot {
            tasks: vec![task(7, 400), task(5, 350)],
            source_records: 7,
            sink_records: 5,
            ..Default::default()
        };
        master.absorb(&a);
        master.absorb(&b);
        assert_eq!(master.tasks.iter().map(|t| (t.records_in, t.watermark)).collect::<Vec<_>>(), [(17, 400), (8, 350)]);
        assert_eq!((master.source_records, master.sink_records), (17, 8));
        assert_eq!(master.watermark(), Some(350));
        let idle = MetricsSnapshot { tasks: vec![task(0, i64::MAX)], ..Default::default() };
        assert_eq!(idle.watermark(), None, "no subtask, no watermark");
    }

    #[test]
    fn a_lying_part_skews_the_sums_at_worst() {
        let honest = TaskSnapshot { cpu_ns: 5, ..task(3, 100) };
        let mut master = MetricsSnapshot { tasks: vec![honest], ..Default::default() };
        // Counters at their maximum and a task the plan does not have.
        let lying = TaskSnapshot {
            cpu_ns: u64::MAX,
            blocked_ns: u64::MAX,
            wasm_memory_bytes: u64::MAX,
            late_records: u64::MAX,
            ..task(u64::MAX, i64::MIN)
        };
        let part =
            MetricsSnapshot { tasks: vec![lying.clone(), lying], source_records: u64::MAX, ..Default::default() };
        master.absorb(&part);
        assert_eq!(master.tasks.len(), 1, "an extra task is ignored");

        let t = &master.tasks[0];
        assert_eq!(
            (t.records_in, t.cpu_ns, t.blocked_ns, t.wasm_memory_bytes),
            (u64::MAX, u64::MAX, u64::MAX, u64::MAX)
        );
        assert_eq!(master.source_records, u64::MAX, "sums saturate");
    }

    #[test]
    fn a_subtask_reported_twice_counts_once_and_the_list_stays_bounded() {
        // Subtasks: a second report of an index is ignored, and the list stays bounded.
        let sub = |index: u32, records_in: u64| SubtaskSnapshot { index, records_in, ..SubtaskSnapshot::default() };
        let mut counted = MetricsSnapshot { tasks: vec![task(0, i64::MAX)], ..Default::default() };
        let a = MetricsSnapshot {
            tasks: vec![TaskSnapshot { subtasks: vec![sub(1, 10)], ..task(10, 5) }],
            ..Default::default()
        };
        let b = MetricsSnapshot {
            tasks: vec![TaskSnapshot { subtasks: vec![sub(0, 7), sub(1, 999)], ..task(7, 5) }],
            ..Default::default()
        };
        counted.absorb(&a);
        counted.absorb(&b);
        assert_eq!(counted.tasks[0].subtasks, [sub(0, 7), sub(1, 10)]);
        let flood: Vec<SubtaskSnapshot> = (0..MAX_SUBTASKS_LISTED as u32 + 10).map(|i| sub(i, 1)).collect();
        counted.absorb(&MetricsSnapshot {
            tasks: vec![TaskSnapshot { subtasks: flood, ..task(0, 5) }],
            ..Default::default()
        });
        assert!(counted.tasks[0].subtasks.len() <= MAX_SUBTASKS_LISTED, "bounded");
    }
}
