//! A failure taken apart for people: the host's cause chain, outermost first (which task and
//! subtask, which operator and call, what the sandbox saw), and the guest's own last words
//! (its panic message or stderr tail) apart from them. The service keeps it beside the whole
//! message; a worker sends it to the coordinator, and decoding it keeps it within
//! [`FailureDetail::bounded`]'s bounds as it reads (a message of a million empty causes costs
//! sixteen strings, not a million), since it comes from another process.

use std::collections::VecDeque;
use std::error::Error;
use std::fmt;

use eddy_runtime::CallError;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::{OperatorError, TaskError};

/// Causes kept per failure.
pub const MAX_CAUSES: usize = 16;

/// Bytes kept per cause and of the guest's message.
pub const MAX_CAUSE_BYTES: usize = 4096;

/// Bytes kept of a whole failure message another process sent: as much as its causes.
pub const MAX_MESSAGE_BYTES: usize = MAX_CAUSES * MAX_CAUSE_BYTES;

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureDetail {
    /// What failed where, outermost first; each names only what the one after it does not.
    #[serde(default, deserialize_with = "bounded_causes")]
    pub causes: Vec<String>,
    /// What the guest said before it failed, if it said anything.
    #[serde(default, deserialize_with = "clipped_message")]
    pub guest_message: Option<String>,
}

impl FailureDetail {
    /// Walks `error`'s sources. A layer's own part is its message less its source's (the
    /// engine's messages end with their cause's); an operator's failed call is split into the
    /// call and what happened in it, and its guest message is kept apart.
    pub fn of(error: &(dyn Error + 'static)) -> Self {
        let mut detail = FailureDetail::default();
        let mut next = Some(error);
        while let Some(layer) = next {
            if let Some(call) = failed_call(layer) {
                detail.causes.push(format!("operator `{}` failed in {}", call.operator, call.call));
                detail.causes.push(call.kind.to_string());
                detail.guest_message = call.guest_message.clone();
                break;
            }
            let text = layer.to_string();
            next = layer.source();
            let own = match next.map(|source| source.to_string()) {
                Some(source) => text.strip_suffix(&source).map_or(text.as_str(), |t| t.trim_end_matches([':', ' '])),
                None => &text,
            };
            if !own.is_empty() {
                detail.causes.push(own.to_owned());
            }
        }
        detail.bounded()
    }

    /// At most [`MAX_CAUSES`] causes (the outermost and the innermost ones kept) of at most
    /// [`MAX_CAUSE_BYTES`] each, and a guest message of at most that.
    pub fn bounded(self) -> Self {
        let mut causes = CauseBound::default();
        for cause in self.causes {
            causes.push(cause);
        }
        FailureDetail { causes: causes.finish(), guest_message: self.guest_message.map(clipped) }
    }

    /// A whole failure message from another process, cut to [`MAX_MESSAGE_BYTES`].
    pub fn bounded_message(message: String) -> String {
        clipped_to(message, MAX_MESSAGE_BYTES)
    }
}

/// Causes kept as they come: the first half of [`MAX_CAUSES`], the newest of the rest, and how
/// many fell out between them.
#[derive(Default)]
struct CauseBound {
    outer: Vec<String>,
    inner: VecDeque<String>,
    dropped: usize,
}

impl CauseBound {
    const OUTER: usize = MAX_CAUSES / 2;

    fn push(&mut self, cause: String) {
        let cause = clipped(cause);
        if self.outer.len() < Self::OUTER {
            return self.outer.push(cause);
        }
        self.inner.push_back(cause);
        if self.inner.len() > MAX_CAUSES - Self::OUTER {
            self.inner.pop_front();
            self.dropped += 1;
        }
    }

    /// At most [`MAX_CAUSES`]: past it, a marker for those left out stands between the halves.
    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.inner.pop_front();
            self.outer.push(format!("({} more causes)", self.dropped + 1));
        }
        self.outer.extend(self.inner);
        self.outer
    }
}

fn bounded_causes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct Causes;
    impl<'de> Visitor<'de> for Causes {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of causes")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut causes = CauseBound::default();
            while let Some(cause) = seq.next_element::<String>()? {
                causes.push(cause);
            }
            Ok(causes.finish())
        }
    }
    deserializer.deserialize_seq(Causes)
}

fn clipped_message<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.map(clipped))
}

/// The operator call that failed, if `error` is (or wraps only) one.
fn failed_call<'e>(error: &'e (dyn Error + 'static)) -> Option<&'e CallError> {
    let from_operator = |e: &'e OperatorError| match e {
        OperatorError::Call(call) => Some(call),
        _ => None,
    };
    let from_task = |e: &'e TaskError| match e {
        TaskError::Operator(op) => from_operator(op),
        _ => None,
    };
    error
        .downcast_ref::<CallError>()
        .or_else(|| error.downcast_ref::<Box<CallError>>().map(|b| &**b))
        .or_else(|| error.downcast_ref::<OperatorError>().and_then(from_operator))
        .or_else(|| error.downcast_ref::<TaskError>().and_then(from_task))
        .or_else(|| error.downcast_ref::<Box<TaskError>>().and_then(|b| from_task(b)))
}

/// `text` cut to [`MAX_CAUSE_BYTES`] at a character boundary, the cut marked.
fn clipped(text: String) -> String {
    clipped_to(text, MAX_CAUSE_BYTES)
}

fn clipped_to(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use eddy_runtime::CallErrorKind;

    use super::*;
    use crate::RunError;

    fn trap(guest_message: Option<&str>) -> CallError {
        CallError {
            operator: "count".into(),
            call: "process",
            kind: CallErrorKind::Trap { trap: "wasm trap: wasm `unreachable` instruction executed".into() },
            guest_message: guest_message.map(str::to_owned),
        }
    }

    /// A guest's panic inside a subtask: the chain written out by hand from the definition.
    #[test]
    fn a_guest_trap_in_a_subtask_reads_as_task_call_and_trap_with_the_guest_apart() {
        let error = RunError::Task {
            task: "count -> sink".into(),
            subtask: 1,
            error: Box::new(TaskError::Operator(OperatorError::Call(trap(Some("panicked at src/lib.rs:9: boom"))))),
        };
        let expected = FailureDetail {
            causes: vec![
                "task `count -> sink` subtask 1".into(),
                "operator `count` failed in process".into(),
                "trapped: wasm trap: wasm `unreachable` instruction executed".into(),
            ],
            guest_message: Some("panicked at src/lib.rs:9: boom".into()),
        };
        assert_eq!(FailureDetail::of(&error), expected);
        let open = RunError::Open { step: "count".into(), error: Box::new(trap(None)) };
        let causes = FailureDetail::of(&open).causes;
        assert_eq!(causes[0], "step `count` failed to open");
        assert_eq!(causes[1], "operator `count` failed in process");
    }

    /// A host failure without a guest: each layer of an I/O error's chain, no guest message.
    #[test]
    fn a_sink_failure_reads_as_task_sink_and_the_io_error() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device");
        let error = RunError::Task { task: "sink".into(), subtask: 0, error: Box::new(TaskError::Sink(io)) };
        let expected = FailureDetail {
            causes: vec![
                "task `sink` subtask 0".into(),
                "writing to the sink".into(),
                "no space left on device".into(),
            ],
            guest_message: None,
        };
        assert_eq!(FailureDetail::of(&error), expected);
    }

    /// What another process sends is cut to size: the outermost and innermost causes stay.
    #[test]
    fn a_long_chain_and_long_messages_are_cut_to_the_bounds() {
        let detail = FailureDetail {
            causes: (0..40).map(|i| format!("cause {i}")).collect(),
            guest_message: Some("é".repeat(MAX_CAUSE_BYTES)),
        }
        .bounded();
        assert_eq!(detail.causes.len(), MAX_CAUSES);
        assert_eq!(detail.causes[0], "cause 0");
        assert_eq!(detail.causes[MAX_CAUSES / 2], format!("({} more causes)", 40 - MAX_CAUSES + 1));
        assert_eq!(detail.causes.last().map(String::as_str), Some("cause 39"));
        let message = detail.guest_message.expect("kept");
        assert!(message.len() <= MAX_CAUSE_BYTES && message.ends_with('…'), "{} bytes", message.len());
        let exactly = FailureDetail { causes: (0..MAX_CAUSES).map(|i| i.to_string()).collect(), guest_message: None };
        assert_eq!(exactly.clone().bounded(), exactly, "a chain within the bounds is kept whole");
    }

    /// Another process's detail is bounded while it is decoded: the same as bounding it
    /// afterwards, and a million causes in a message end up as sixteen.
    #[test]
    fn a_detail_is_bounded_while_it_is_decoded() {
        let long = FailureDetail {
            causes: (0..40).map(|i| format!("cause {i}")).collect(),
            guest_message: Some("x".repeat(3 * MAX_CAUSE_BYTES)),
        };
        let wire = serde_json::to_string(&long).expect("encode");
        let decoded: FailureDetail = serde_json::from_str(&wire).expect("decode");
        assert_eq!(decoded, long.bounded());
        let million = format!("{{\"causes\": [{}\"last\"], \"guest_message\": null}}", "\"\",".repeat(1_000_000));
        let decoded: FailureDetail = serde_json::from_str(&million).expect("decode");
        assert_eq!(decoded.causes.len(), MAX_CAUSES);
        assert_eq!(decoded.causes[MAX_CAUSES / 2], format!("({} more causes)", 1_000_001 - MAX_CAUSES + 1));
        assert_eq!(decoded.causes.last().map(String::as_str), Some("last"));
        let absent: FailureDetail = serde_json::from_str("{}").expect("an older worker's empty detail");
        assert_eq!(absent, FailureDetail::default());
        let message = FailureDetail::bounded_message("é".repeat(MAX_MESSAGE_BYTES));
        assert!(message.len() <= MAX_MESSAGE_BYTES && message.ends_with('…'), "{} bytes", message.len());
    }
}
