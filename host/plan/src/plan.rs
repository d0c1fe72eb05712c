//! Planning: the logical pipeline (sources -> steps -> sink) becomes a physical plan of tasks.
//!
//! Consecutive nodes are chained into one task (called one after another in one thread, no
//! channel) when the edge between them is forward: no `key_by` and equal parallelism, and the
//! downstream node has that single input. Every other edge is an exchange: `hash` at a
//! `key_by` (records go to the subtask owning their key group), `rebalance` where parallelism
//! changes without a key. The sink runs at the parallelism of the last step (or source), so it
//! chains into that task, where it can ([`SinkSpec::follows_input_parallelism`]: the files
//! and blackhole sinks), and at parallelism 1 where one writer must get it all (a terminal, one
//! file, one upsert table, or a sink handed to the job as one instance).

use std::fmt;

use eddy_core::KeyGroupRange;

use crate::spec::{KeyBy, PipelineSpec, SinkSpec};

/// A node of the logical graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// `sources[i]`.
    Source(usize),
    /// `steps[i]`.
    Step(usize),
    /// The sink.
    Sink,
}

/// How records cross an edge between tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioning {
    /// Subtask `i` feeds subtask `i` (equal parallelism).
    Forward,
    /// By key group of the key `KeyBy` extracts.
    Hash(KeyBy),
    /// Round robin over the downstream subtasks.
    Rebalance,
}

impl fmt::Display for Partitioning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partitioning::Forward => write!(f, "forward"),
            Partitioning::Hash(KeyBy::Key) => write!(f, "hash(key)"),
            Partitioning::Hash(KeyBy::Value) => write!(f, "hash(value)"),
            Partitioning::Hash(KeyBy::Field(p)) => write!(f, "hash({p})"),
            Partitioning::Rebalance => write!(f, "rebalance"),
        }
    }
}

/// A task: a chain of nodes run by `parallelism` subtasks, each one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPlan {
    /// Position in [`PhysicalPlan::tasks`].
    pub id: usize,
    /// The chained nodes, upstream first.
    pub nodes: Vec<Node>,
    /// Number of subtasks.
    pub parallelism: u32,
    /// Whether a step of the chain sits behind a `hash` exchange (its subtasks own key groups).
    pub keyed: bool,
    /// The two-phase window step (`two_phase`) whose first phase ends this chain: what leaves
    /// it is folded into partial accumulators, routed by the key they carry.
    pub first_phase: Option<usize>,
}

impl TaskPlan {
    /// The source this task starts with, if any.
    pub fn source(&self) -> Option<usize> {
        match self.nodes.first() {
            Some(Node::Source(i)) => Some(*i),
            _ => None,
        }
    }

    /// The steps of the chain, in order.
    pub fn steps(&self) -> impl Iterator<Item = usize> + '_ {
        self.nodes.iter().filter_map(|n| if let Node::Step(i) = n { Some(*i) } else { None })
    }

    /// Whether the chain ends in the sink.
    pub fn has_sink(&self) -> bool {
        self.nodes.last() == Some(&Node::Sink)
    }
}

/// An exchange between two tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgePlan {
    /// Upstream task.
    pub from: usize,
    /// Downstream task.
    pub to: usize,
    /// How records are distributed.
    pub partitioning: Partitioning,
}

impl EdgePlan {
    /// Channels this edge opens: one per (upstream, downstream) subtask pair it connects.
    pub fn channels(&self, plan: &PhysicalPlan) -> u32 {
        let (up, down) = (plan.tasks[self.from].parallelism, plan.tasks[self.to].parallelism);
        if self.partitioning == Partitioning::Forward { down } else { up * down }
    }
}

/// Tasks and the exchanges between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalPlan {
    /// The pipeline's name.
    pub name: String,
    /// Key groups.
    pub max_parallelism: u32,
    /// Tasks in topological order (sources first).
    pub tasks: Vec<TaskPlan>,
    /// Exchanges; every task has at most one outgoing edge.
    pub edges: Vec<EdgePlan>,
    labels: Vec<(Node, String)>,
}

impl PhysicalPlan {
    /// Plans `spec` (already validated).
    pub fn new(spec: &PipelineSpec) -> Self {
        Self::plan(spec, spec.sink.follows_input_parallelism())
    }

    /// Plans `spec` with its sink at parallelism 1 whatever its kind (a job given one sink
    /// instance).
    pub fn with_sink_at_one(spec: &PipelineSpec) -> Self {
        Self::plan(spec, false)
    }

    fn plan(spec: &PipelineSpec, parallel_sink: bool) -> Self {
        let mut labels: Vec<(Node, String)> = Vec::new();
        for (i, s) in spec.sources.iter().enumerate() {
            labels.push((Node::Source(i), format!("source:{}", s.name())));
        }
        for (i, s) in spec.steps.iter().enumerate() {
            let kind = if s.window.is_some() { "window:" } else { "" };
            labels.push((Node::Step(i), format!("{kind}{}", s.name)));
        }
        let sink = match spec.sink {
            SinkSpec::Print => "sink:print",
            SinkSpec::File { .. } => "sink:file",
            SinkSpec::Blackhole => "sink:blackhole",
            SinkSpec::Files { .. } => "sink:files",
            SinkSpec::Upsert { .. } => "sink:upsert",
            SinkSpec::Kafka(_) => "sink:kafka",
            SinkSpec::Postgres(_) => "sink:postgres",
        };
        labels.push((Node::Sink, sink.to_string()));

        let mut tasks: Vec<TaskPlan> = Vec::new();
        let mut edges = Vec::new();
        let new_task = |tasks: &mut Vec<TaskPlan>, node: Node, parallelism: u32, keyed: bool| {
            let id = tasks.len();
            tasks.push(TaskPlan { id, nodes: vec![node], parallelism, keyed, first_phase: None });
            id
        };
        // Tasks that feed the next node; several only in front of the first step (one per source).
        let mut upstream: Vec<usize> = (0..spec.sources.len())
            .map(|i| new_task(&mut tasks, Node::Source(i), spec.sources[i].parallelism(), false))
            .collect();
        let downstream_nodes = (0..spec.steps.len()).map(Node::Step).chain([Node::Sink]);
        for node in downstream_nodes {
            let (parallelism, key_by) = match node {
                Node::Step(i) => (spec.step_parallelism(i), spec.steps[i].key_by.clone()),
                // Several upstream tasks (sources straight into the sink) gather into one.
                _ => match upstream[..] {
                    [single] if parallel_sink => (tasks[single].parallelism, None),
                    _ => (1, None),
                },
            };
            let two_phase = matches!(node, Node::Step(i) if spec.steps[i].two_phase());
            let partitioning = |up: u32| match &key_by {
                // The first phase keys its partials with what `key_by` selects.
                Some(_) if two_phase => Partitioning::Hash(KeyBy::Key),
                Some(k) => Partitioning::Hash(k.clone()),
                None if up == parallelism => Partitioning::Forward,
                None => Partitioning::Rebalance,
            };
            if let [single] = upstream[..]
                && partitioning(tasks[single].parallelism) == Partitioning::Forward
            {
                tasks[single].nodes.push(node);
                continue;
            }
            let id = new_task(&mut tasks, node, parallelism, key_by.is_some());
            for from in upstream {
                if let (true, Node::Step(i)) = (two_phase, node) {
                    tasks[from].first_phase = Some(i);
                }
                edges.push(EdgePlan { from, to: id, partitioning: partitioning(tasks[from].parallelism) });
            }
            upstream = vec![id];
        }
        Self { name: spec.name.clone(), max_parallelism: spec.max_parallelism, tasks, edges, labels }
    }

    /// A node's display label (`source:name`, `step`, `window:step`, `sink:kind`).
    pub fn label(&self, node: Node) -> &str {
        self.labels.iter().find(|(n, _)| *n == node).map_or("?", |(_, l)| l.as_str())
    }

    /// The chain's label: its nodes joined by `->`, and the first phase of a two-phase window
    /// ending it (`first-phase:step`).
    pub fn task_label(&self, task: usize) -> String {
        let t = &self.tasks[task];
        let first_phase =
            t.first_phase.map(|i| format!("first-phase:{}", self.label(Node::Step(i)).trim_start_matches("window:")));
        t.nodes.iter().map(|n| self.label(*n).to_string()).chain(first_phase).collect::<Vec<_>>().join(" -> ")
    }

    /// The edges into `task`.
    pub fn inputs(&self, task: usize) -> impl Iterator<Item = &EdgePlan> + '_ {
        self.edges.iter().filter(move |e| e.to == task)
    }

    /// The edge out of `task`, if it does not end in the sink.
    pub fn output(&self, task: usize) -> Option<&EdgePlan> {
        self.edges.iter().find(|e| e.from == task)
    }

    /// Total number of subtasks (threads).
    pub fn subtasks(&self) -> u32 {
        self.tasks.iter().map(|t| t.parallelism).sum()
    }
}

impl fmt::Display for PhysicalPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "pipeline `{}`: {} task(s), {} subtask(s), max_parallelism {}",
            self.name,
            self.tasks.len(),
            self.subtasks(),
            self.max_parallelism
        )?;
        writeln!(f, "tasks (chains):")?;
        for t in &self.tasks {
            writeln!(f, "  task {}  {}  parallelism {}", t.id, self.task_label(t.id), t.parallelism)?;
            if t.keyed {
                for i in 0..t.parallelism {
                    let r = KeyGroupRange::for_subtask(self.max_parallelism, t.parallelism, i);
                    writeln!(f, "    subtask {i}: key groups {}..={}", r.start, r.end)?;
                }
            }
        }
        writeln!(f, "edges:")?;
        if self.edges.is_empty() {
            writeln!(f, "  (none: the whole pipeline is one chain)")?;
        }
        for e in &self.edges {
            let (up, down) = (self.tasks[e.from].parallelism, self.tasks[e.to].parallelism);
            writeln!(
                f,
                "  task {} -> task {}  {}  {up} -> {down} subtask(s), {} channel(s)",
                e.from,
                e.to,
                e.partitioning,
                e.channels(self)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(steps: &str, sources: &str) -> PhysicalPlan {
        let yaml = format!("name: t\nsources: {sources}\nsteps:\n{steps}sink: {{type: print}}\n");
        PhysicalPlan::new(&PipelineSpec::from_yaml(&yaml).unwrap())
    }

    const ONE_FILE: &str = "[{type: file, name: in, path: x}]";

    /// A keyed count at parallelism 2 into `sink`.
    fn counted_into(sink: &str) -> PipelineSpec {
        let yaml = format!(
            "name: t\nsources: {ONE_FILE}\nsteps:\n  - {{name: count, wasm: b, key_by: key, parallelism: 2}}\nsink: {sink}\n"
        );
        PipelineSpec::from_yaml(&yaml).unwrap()
    }

    #[test]
    fn a_files_or_blackhole_sink_runs_at_its_inputs_parallelism_and_the_others_gather() {
        for sink in ["{type: files, dir: out}", "{type: blackhole}"] {
            let p = PhysicalPlan::new(&counted_into(sink));
            assert_eq!(p.tasks.len(), 2, "{sink}");
            assert!(p.tasks[1].has_sink() && p.tasks[1].parallelism == 2, "{sink}: chained into count");
            // Handed one sink instance, the job gathers into it.
            let p = PhysicalPlan::with_sink_at_one(&counted_into(sink));
            assert_eq!((p.tasks.len(), p.tasks[2].parallelism), (3, 1), "{sink}");
        }
        for sink in ["{type: print}", "{type: file, path: out.jsonl}", "{type: upsert, dir: table}"] {
            let p = PhysicalPlan::new(&counted_into(sink));
            assert_eq!((p.tasks.len(), p.tasks[2].parallelism), (3, 1), "{sink}");
            assert_eq!(p.edges[1].partitioning, Partitioning::Rebalance, "{sink}");
        }
    }

    #[test]
    fn forward_edges_chain_and_key_by_exchanges() {
        let p = plan("  - {name: split, wasm: a}\n  - {name: count, wasm: b, key_by: key}\n", ONE_FILE);
        assert_eq!(p.tasks.len(), 2);
        assert_eq!(p.task_label(0), "source:in -> split");
        assert_eq!(p.task_label(1), "count -> sink:print");
        assert_eq!(p.edges, vec![EdgePlan { from: 0, to: 1, partitioning: Partitioning::Hash(KeyBy::Key) }]);
        assert!(p.tasks[1].keyed);
    }

    #[test]
    fn parallelism_changes_rebalance_and_the_sink_gathers() {
        let p = plan(
            "  - {name: split, wasm: a, parallelism: 2}\n  - {name: map, wasm: b, parallelism: 2}\n  - {name: count, wasm: c, parallelism: 4, key_by: /w}\n",
            ONE_FILE,
        );
        let labels: Vec<String> = (0..p.tasks.len()).map(|t| p.task_label(t)).collect();
        assert_eq!(labels, ["source:in", "split -> map", "count", "sink:print"]);
        let parts: Vec<String> = p.edges.iter().map(|e| e.partitioning.to_string()).collect();
        assert_eq!(parts, ["rebalance", "hash(/w)", "rebalance"]);
        assert_eq!(p.edges[1].channels(&p), 8);
        assert_eq!(p.subtasks(), 1 + 2 + 4 + 1);
        let text = p.to_string();
        assert!(text.contains("subtask 3: key groups 96..=127"), "{text}");
    }

    /// Each chain in front of a two-phase window ends in its first phase, named in the label,
    /// and sends partials keyed by what the window's `key_by` selected.
    #[test]
    fn chains_in_front_of_a_two_phase_window_end_in_its_first_phase() {
        let sources = "[{type: file, name: a, path: x}, {type: generator, name: g, parallelism: 2}]";
        let window = "window: {type: tumbling, size_ms: 10, two_phase: true, drop_late: true}";
        let p = plan(&format!("  - {{name: w, wasm: a, key_by: /user, parallelism: 2, {window}}}\n"), sources);
        let labels: Vec<String> = (0..p.tasks.len()).map(|t| p.task_label(t)).collect();
        assert_eq!(labels, ["source:a -> first-phase:w", "source:g -> first-phase:w", "window:w", "sink:print"]);
        let parts: Vec<String> = p.edges.iter().map(|e| e.partitioning.to_string()).collect();
        assert_eq!(parts, ["hash(key)", "hash(key)", "rebalance"]);
        assert_eq!(p.tasks.iter().map(|t| t.first_phase).collect::<Vec<_>>(), [Some(0), Some(0), None, None]);
        // One phase: the window keys by the field itself.
        let p = plan("  - {name: w, wasm: a, key_by: /user, window: {type: tumbling, size_ms: 10}}\n", ONE_FILE);
        assert_eq!((p.task_label(0), p.edges[0].partitioning.to_string()), ("source:in".into(), "hash(/user)".into()));
    }

    #[test]
    fn several_sources_meet_at_the_first_step() {
        let sources = "[{type: file, name: a, path: x}, {type: generator, name: g, parallelism: 2}]";
        let p = plan("  - {name: s, wasm: a, parallelism: 2}\n", sources);
        assert_eq!(p.tasks.len(), 4);
        let ins: Vec<(usize, String)> = p.inputs(2).map(|e| (e.from, e.partitioning.to_string())).collect();
        assert_eq!(ins, [(0, "rebalance".to_string()), (1, "forward".to_string())]);
        assert_eq!(p.output(2).map(|e| e.to), Some(3));
        assert_eq!(p.output(3), None);
    }
}
