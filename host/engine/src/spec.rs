//! The pipeline spec: what a user writes. Unknown fields are errors, so a typo never silently
//! does nothing; every validation error names the field.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A pipeline: source -> steps -> sink.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Shown in logs and summaries.
    pub name: String,
    /// Number of key groups (the upper bound of any future parallelism).
    #[serde(default = "default_max_parallelism")]
    pub max_parallelism: u32,
    /// Where records come from.
    pub source: SourceSpec,
    /// Operators applied in order.
    pub steps: Vec<StepSpec>,
    /// Where the last step's records go.
    pub sink: SinkSpec,
    /// Records per batch handed to a step.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
}

fn default_max_parallelism() -> u32 {
    128
}

fn default_batch_size() -> usize {
    256
}

/// A source.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// A file, read once (a bounded input).
    File {
        /// Path, relative to the spec file.
        path: PathBuf,
        /// How lines become records.
        #[serde(default)]
        format: SourceFormat,
    },
}

/// How a file's lines become records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// Each line is a text value (encoded as a JSON string).
    #[default]
    Lines,
    /// Each line is a JSON value.
    JsonLines,
}

/// One operator step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// Unique within the pipeline; names the operator in errors and logs.
    pub name: String,
    /// The component, relative to the spec file.
    pub wasm: PathBuf,
    /// Handed to the operator's `open` as JSON.
    #[serde(default)]
    pub config: serde_json::Value,
}

/// A sink.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SinkSpec {
    /// Prints `key => value` lines to stdout.
    Print,
    /// Writes JSON lines `{"key": .., "value": .., "timestamp": ..}` to a file.
    File {
        /// Path, relative to the spec file.
        path: PathBuf,
    },
    /// Discards records (for benchmarks).
    Blackhole,
}

/// Why a spec was rejected.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read pipeline spec {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// YAML syntax or a field of the wrong shape (the message names it and its line).
    #[error("pipeline spec: {0}")]
    Parse(String),
    /// A field with a value that cannot work.
    #[error("pipeline spec field `{field}`: {problem}")]
    Invalid {
        /// Path of the field, e.g. `steps[1].name`.
        field: String,
        /// What is wrong and what would be right.
        problem: String,
    },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> SpecError {
    SpecError::Invalid { field: field.into(), problem: problem.into() }
}

impl PipelineSpec {
    /// Parses and validates YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        let spec: PipelineSpec = serde_norway::from_str(text).map_err(|e| SpecError::Parse(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Reads a spec file; relative paths in it are resolved against its directory.
    pub fn from_file(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SpecError::Read { path: path.display().to_string(), source })?;
        let mut spec = Self::from_yaml(&text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        spec.resolve_paths(base);
        Ok(spec)
    }

    fn resolve_paths(&mut self, base: &Path) {
        let SourceSpec::File { path, .. } = &mut self.source;
        *path = base.join(&*path);
        for step in &mut self.steps {
            step.wasm = base.join(&step.wasm);
        }
        if let SinkSpec::File { path } = &mut self.sink {
            *path = base.join(&*path);
        }
    }

    fn validate(&self) -> Result<(), SpecError> {
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        if !(1..=eddy_core::MAX_PARALLELISM_LIMIT).contains(&self.max_parallelism) {
            return Err(invalid(
                "max_parallelism",
                format!("{} is outside 1..={}", self.max_parallelism, eddy_core::MAX_PARALLELISM_LIMIT),
            ));
        }
        if !(1..=65_536).contains(&self.batch_size) {
            return Err(invalid("batch_size", format!("{} is outside 1..=65536", self.batch_size)));
        }
        if self.steps.is_empty() {
            return Err(invalid("steps", "needs at least one operator step"));
        }
        for (i, step) in self.steps.iter().enumerate() {
            if step.name.trim().is_empty() {
                return Err(invalid(format!("steps[{i}].name"), "must not be empty"));
            }
            if self.steps[..i].iter().any(|s| s.name == step.name) {
                return Err(invalid(format!("steps[{i}].name"), format!("`{}` is used by an earlier step", step.name)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str =
        "name: wc\nsource: {type: file, path: in.txt}\nsteps:\n  - {name: a, wasm: a.wasm}\nsink: {type: print}\n";

    #[test]
    fn defaults_apply() {
        let spec = PipelineSpec::from_yaml(OK).unwrap();
        assert_eq!(spec.max_parallelism, 128);
        assert_eq!(spec.batch_size, 256);
        assert_eq!(spec.source, SourceSpec::File { path: "in.txt".into(), format: SourceFormat::Lines });
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (OK.replace("name: wc", "name: ''"), "`name`"),
            (OK.replace("steps:", "max_parallelism: 0\nsteps:"), "max_parallelism"),
            (
                OK.replace("{name: a, wasm: a.wasm}", "{name: a, wasm: a.wasm}\n  - {name: a, wasm: b.wasm}"),
                "steps[1].name",
            ),
            (OK.replace("wasm: a.wasm", "wasm: a.wasm, confg: 1"), "confg"),
            (OK.replace("type: print", "type: kafka"), "kafka"),
            (OK.replace("sink: {type: print}\n", ""), "sink"),
        ];
        for (yaml, needle) in cases {
            let err = PipelineSpec::from_yaml(&yaml).unwrap_err().to_string();
            assert!(err.contains(needle), "error for {needle}: {err}");
        }
    }

    #[test]
    fn paths_resolve_against_the_spec_directory() {
        let mut spec = PipelineSpec::from_yaml(OK).unwrap();
        spec.resolve_paths(Path::new("/pipelines"));
        assert_eq!(spec.steps[0].wasm, PathBuf::from("/pipelines/a.wasm"));
    }
}
