//! The shape check a spec's text passes before any value is built from it.
//!
//! `serde_norway` loads a whole document into events and replays an anchor's events at each
//! alias, so a small text with aliases of aliases becomes millions of values (a 950 KB spec
//! with 150 000 aliases of a 250 000-element list grew a server past 3 GiB), and its
//! repetition limit counts alias look-ups, not what they expand to. Deep nesting costs the
//! parser time faster than linearly. So the text is first walked event by event with the
//! parser `serde_norway` itself uses (libyaml, as `unsafe-libyaml-norway`), which keeps only a
//! stack as deep as the limit, and refused at the first event past a limit:
//!
//! - any anchor (`&a`), alias (`*a`) or merge key (`<<`): no spec needs them, and without them
//!   every node is written out in the text, so counting nodes counts what will be built;
//! - nesting (block or flow) deeper than [`Limits::nesting`];
//! - more than [`Limits::nodes`] nodes (scalars, sequences and mappings).
//!
//! Because both walks use the same parser on the same bytes, they agree on every event, so a
//! text that passes here cannot hold an alias for the deserializer to expand. A syntax error
//! is left to the deserializer, which meets it at the same event and names it as it always has.
//! Tags are left alone: they do not multiply anything.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use eddy_core::limits::{MAX_SPEC_BYTES, MAX_SPEC_NESTING, MAX_SPEC_NODES};
use unsafe_libyaml_norway as libyaml_unsafe;

use crate::SpecError;

/// What a spec's text may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Bytes of text.
    pub bytes: usize,
    /// Sequences and mappings open at once.
    pub nesting: usize,
    /// Scalars, sequences and mappings in all.
    pub nodes: usize,
}

impl Limits {
    /// The limits of a pipeline spec (`eddy_core::limits`).
    pub const SPEC: Limits = Limits { bytes: MAX_SPEC_BYTES, nesting: MAX_SPEC_NESTING, nodes: MAX_SPEC_NODES };
}

/// Refuses `text` at the first anchor, alias, merge key, or node past a limit, naming its
/// line and column; accepts anything else, syntax errors included (see the module docs).
pub(crate) fn check(text: &str, limits: &Limits) -> Result<(), SpecError> {
    if text.len() > limits.bytes {
        return Err(SpecError::TooLarge { bytes: text.len(), limit: limits.bytes });
    }
    let mut events = EventParser::new(text)
        .ok_or_else(|| SpecError::Parse("the YAML parser could not be initialized (out of memory?)".into()))?;
    let mut shape = Shape::new(*limits);
    while let Some(event) = events.next() {
        shape.see(&event.kind).map_err(|problem| SpecError::Refused {
            line: event.line + 1,
            column: event.column + 1,
            problem,
        })?;
    }
    Ok(())
}

/// One parser event, as much of it as the check needs, copied out of libyaml's so that one is
/// freed at once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EventKind {
    /// `*name`.
    Alias {
        name: String,
    },
    /// A scalar; `merge` when it is a plain `<<` (a merge key, if it is a key).
    Scalar {
        anchor: Option<String>,
        merge: bool,
    },
    SequenceStart {
        anchor: Option<String>,
    },
    MappingStart {
        anchor: Option<String>,
    },
    /// The end of the innermost open sequence or mapping.
    End,
    /// Stream and document boundaries.
    Other,
}

/// An open sequence or mapping; a mapping knows whether its next node is a key.
#[derive(Debug, Clone, Copy)]
enum Open {
    Sequence,
    Mapping { key_next: bool },
}

/// The check's state over the events of a text: no I/O, so it is tested on events directly.
#[derive(Debug)]
struct Shape {
    limits: Limits,
    /// Never longer than `limits.nesting`: the check refuses before it would grow past it.
    open: Vec<Open>,
    nodes: usize,
}

impl Shape {
    fn new(limits: Limits) -> Self {
        Self { limits, open: Vec::with_capacity(limits.nesting.min(1024)), nodes: 0 }
    }

    /// Takes the next event; the problem, and what to do instead, if it is refused.
    fn see(&mut self, event: &EventKind) -> Result<(), String> {
        let (anchor, merge, opens) = match event {
            EventKind::Alias { name } => {
                return Err(format!(
                    "alias `*{name}`: a spec may not use aliases (each one is a copy of its anchor's value, so a \
                     short text can stand for an unbounded one); write the value out where it is used"
                ));
            }
            EventKind::Scalar { anchor, merge } => (anchor, *merge, None),
            EventKind::SequenceStart { anchor } => (anchor, false, Some(Open::Sequence)),
            EventKind::MappingStart { anchor } => (anchor, false, Some(Open::Mapping { key_next: true })),
            EventKind::End => {
                self.open.pop();
                return Ok(());
            }
            EventKind::Other => return Ok(()),
        };
        if let Some(name) = anchor {
            return Err(format!(
                "anchor `&{name}`: a spec may not use anchors or aliases; drop the anchor and write the value out \
                 wherever it is used"
            ));
        }
        self.nodes += 1;
        if self.nodes > self.limits.nodes {
            return Err(format!(
                "more than {} nodes (scalars, lists and mappings; the limit of a spec): a step's `config` holds \
                 settings, not data; read bulk data from a source",
                self.limits.nodes
            ));
        }
        let is_key = match self.open.last_mut() {
            Some(Open::Mapping { key_next }) => std::mem::replace(key_next, !*key_next),
            Some(Open::Sequence) | None => false,
        };
        if merge && is_key {
            return Err("merge key `<<`: a spec may not merge mappings into each other; write the keys out".into());
        }
        if let Some(open) = opens {
            if self.open.len() >= self.limits.nesting {
                return Err(format!(
                    "nested deeper than {} lists and mappings (the limit of a spec); flatten the value",
                    self.limits.nesting
                ));
            }
            self.open.push(open);
        }
        Ok(())
    }
}

/// A parser event: what it is and where it starts (0-based, as libyaml counts).
#[derive(Debug)]
struct Event {
    kind: EventKind,
    line: u64,
    column: u64,
}

/// libyaml's event parser over a string, behind a safe API. Every call into libyaml is in
/// this type; each event is copied out and freed before [`EventParser::next`] returns, and the
/// parser is freed on drop, so no path leaks either.
struct EventParser<'input> {
    /// Boxed because libyaml's string reader points back at the parser (`read_handler_data`):
    /// it must not move once its input is set. Initialized (by `yaml_parser_initialize`)
    /// from `new` on; only ever handed to libyaml by pointer.
    sys: Box<MaybeUninit<libyaml_unsafe::yaml_parser_t>>,
    /// libyaml reads the input through a raw pointer for as long as the parser lives.
    input: PhantomData<&'input [u8]>,
    /// Past the end of the stream or a syntax error, where libyaml returns only empty events.
    done: bool,
}

impl std::fmt::Debug for EventParser<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventParser").field("done", &self.done).finish_non_exhaustive()
    }
}

impl<'input> EventParser<'input> {
    /// A parser of `text` (UTF-8, as `serde_norway` reads a `&str`), or `None` if libyaml
    /// could not set one up.
    fn new(text: &'input str) -> Option<Self> {
        let mut sys = Box::new(MaybeUninit::<libyaml_unsafe::yaml_parser_t>::uninit());
        let parser = sys.as_mut_ptr();
        // SAFETY: `parser` points at writable memory for a `yaml_parser_t`, which
        // `yaml_parser_initialize` zeroes and sets up before anything reads it.
        if unsafe { libyaml_unsafe::yaml_parser_initialize(parser) }.fail {
            // Only allocation can fail, and this translation aborts on that instead; were it to
            // fail, its partial buffers would leak, never be freed twice.
            return None;
        }
        // SAFETY: the parser is initialized and has no input yet (both functions assert so);
        // the input outlives the parser (`'input`), and the parser, boxed, never moves.
        unsafe {
            libyaml_unsafe::yaml_parser_set_encoding(parser, libyaml_unsafe::YAML_UTF8_ENCODING);
            libyaml_unsafe::yaml_parser_set_input_string(parser, text.as_ptr(), text.len() as u64);
        }
        Some(Self { sys, input: PhantomData, done: false })
    }

    /// The next event, or `None` at the end of the stream or at a syntax error (then libyaml's
    /// state holds the error, which is not read here: see the module docs).
    fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let mut raw = MaybeUninit::<libyaml_unsafe::yaml_event_t>::uninit();
        // SAFETY: the parser was initialized in `new` and has not moved. `yaml_parser_parse`
        // zeroes `*raw` before anything else, so it is initialized afterwards whatever the
        // result (all zero is the empty `YAML_NO_EVENT`), and owns libyaml allocations only
        // when parsing succeeded. `copy_out` reads it by its type and copies, and
        // `yaml_event_delete` frees what it owns (nothing, for an empty one) and zeroes it.
        let (parsed, event) = unsafe {
            let parsed = !libyaml_unsafe::yaml_parser_parse(self.sys.as_mut_ptr(), raw.as_mut_ptr()).fail;
            let event = if parsed { copy_out(&*raw.as_ptr()) } else { None };
            libyaml_unsafe::yaml_event_delete(raw.as_mut_ptr());
            (parsed, event)
        };
        // Past the stream's end libyaml returns empty events, and after an error nothing new.
        if !parsed || event.is_none() {
            self.done = true;
        }
        event
    }
}

impl Drop for EventParser<'_> {
    fn drop(&mut self) {
        // SAFETY: initialized in `new` (an `EventParser` exists only then), not yet deleted;
        // `yaml_parser_delete` frees its buffers, queued tokens and stacks.
        unsafe { libyaml_unsafe::yaml_parser_delete(self.sys.as_mut_ptr()) }
    }
}

/// The check's view of an event; `None` for the empty event libyaml returns past the end.
///
/// # Safety
/// `event` must be an event `yaml_parser_parse` filled in, not yet deleted.
unsafe fn copy_out(event: &libyaml_unsafe::yaml_event_t) -> Option<Event> {
    // SAFETY (each union read below): the union field read is the one `type_` says is set,
    // and its pointers are null or point at libyaml's NUL-terminated copies.
    let kind = match event.type_ {
        libyaml_unsafe::YAML_NO_EVENT => return None,
        libyaml_unsafe::YAML_ALIAS_EVENT => {
            EventKind::Alias { name: unsafe { anchor(event.data.alias.anchor) }.unwrap_or_default() }
        }
        libyaml_unsafe::YAML_SCALAR_EVENT => {
            let scalar = unsafe { event.data.scalar };
            let merge = scalar.style == libyaml_unsafe::YAML_PLAIN_SCALAR_STYLE
                && scalar.length == 2
                // SAFETY: `value` holds `length` bytes.
                && unsafe { std::slice::from_raw_parts(scalar.value, 2) } == b"<<";
            EventKind::Scalar { anchor: unsafe { anchor(scalar.anchor) }, merge }
        }
        libyaml_unsafe::YAML_SEQUENCE_START_EVENT => {
            EventKind::SequenceStart { anchor: unsafe { anchor(event.data.sequence_start.anchor) } }
        }
        libyaml_unsafe::YAML_MAPPING_START_EVENT => {
            EventKind::MappingStart { anchor: unsafe { anchor(event.data.mapping_start.anchor) } }
        }
        libyaml_unsafe::YAML_SEQUENCE_END_EVENT | libyaml_unsafe::YAML_MAPPING_END_EVENT => EventKind::End,
        _ => EventKind::Other,
    };
    Some(Event { kind, line: event.start_mark.line, column: event.start_mark.column })
}

/// An anchor's name, cut to 64 bytes for messages (libyaml allows only `[0-9A-Za-z_-]` in it,
/// so it cannot carry a quote or a newline into one).
///
/// # Safety
/// `name` must be null or point at a NUL-terminated string.
unsafe fn anchor(name: *const u8) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated, per the contract.
    let bytes = unsafe { std::ffi::CStr::from_ptr(name.cast()) }.to_bytes();
    Some(String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    const ROOMY: Limits = Limits { bytes: usize::MAX, nesting: usize::MAX, nodes: usize::MAX };

    /// The refusal of `text` under `limits`: (line, column, problem).
    fn refusal(text: &str, limits: &Limits) -> (u64, u64, String) {
        match check(text, limits) {
            Err(SpecError::Refused { line, column, problem }) => (line, column, problem),
            other => panic!("{:?} was not refused: {other:?}", &text[..text.len().min(200)]),
        }
    }

    /// Oracle: nesting depth of a value, computed from the value, not from its text.
    fn depth(v: &Value) -> usize {
        match v {
            Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// Oracle: nodes of a value as YAML has them (every mapping key is a scalar node too).
    fn nodes(v: &Value) -> usize {
        match v {
            Value::Array(items) => 1 + items.iter().map(nodes).sum::<usize>(),
            Value::Object(map) => 1 + map.values().map(|v| 1 + nodes(v)).sum::<usize>(),
            _ => 1,
        }
    }

    #[test]
    fn anchors_aliases_and_merge_keys_are_refused_where_they_stand() {
        let cases = [
            ("a: &x 1\nb: 2\n", (1, 4), "anchor `&x`"),
            ("a: [1, &list [2]]\n", (1, 8), "anchor `&list`"),
            ("a: &m {b: 1}\n", (1, 4), "anchor `&m`"),
            // The anchor is met first, so it is what is named; an alias alone (undefined) too.
            ("a: &x 1\nb: *x\n", (1, 4), "anchor `&x`"),
            ("a: 1\nb: [2, *undefined]\n", (2, 8), "alias `*undefined`"),
            ("a: {<<: {b: 1}, c: 2}\n", (1, 5), "merge key `<<`"),
            ("a:\n  <<: {b: 1}\n", (2, 3), "merge key `<<`"),
            // A later document is scanned as well.
            ("a: 1\n---\nb: *x\n", (3, 4), "alias `*x`"),
        ];
        for (text, (line, column), needle) in cases {
            let (l, c, problem) = refusal(text, &ROOMY);
            assert_eq!((l, c), (line, column), "{text:?}: {problem}");
            assert!(problem.contains(needle) && problem.contains("write"), "{text:?}: {problem}");
        }
        // Quoted, or as a value, `<<` is a string like any other.
        for text in ["a: {'<<': 1}\n", "a: {\"<<\": 1}\n", "a: <<\n", "a: [<<]\n", "a: {b: <<}\n"] {
            assert!(check(text, &ROOMY).is_ok(), "{text:?}");
        }
    }

    #[test]
    fn the_first_problem_in_the_text_is_the_one_reported() {
        // A syntax error before any refusal is left to the deserializer, which names it.
        assert!(check("a: [1, 2\nb: *x\n", &ROOMY).is_ok());
        let err = serde_norway::from_str::<Value>("a: [1, 2\nb: *x\n").unwrap_err().to_string();
        assert!(err.contains("line"), "{err}");
        // A refusal before a syntax error is reported as the refusal.
        assert_eq!(refusal("a: *x\nb: [1,\n", &ROOMY).0, 1);
    }

    #[test]
    fn nesting_is_refused_at_the_first_level_past_the_limit() {
        let limits = Limits { nesting: 3, ..ROOMY };
        assert!(check("[[[1]]]", &limits).is_ok());
        assert!(check("a: {b: [1]}", &limits).is_ok());
        assert!(check("a:\n  b:\n    - 1\n", &limits).is_ok());
        assert_eq!(refusal("[[[[1]]]]", &limits).1, 4);
        let (line, column, problem) = refusal("a:\n  b:\n    c:\n      d: 1\n", &limits);
        assert_eq!((line, column), (4, 7), "{problem}");
        assert!(problem.contains("deeper than 3"), "{problem}");
        // Block sequences in a line nest too.
        assert_eq!(refusal("- - - - x\n", &limits).1, 7);
    }

    #[test]
    fn a_hundred_thousand_open_brackets_are_refused_at_the_first_past_the_limit() {
        // Unclosed, so libyaml would meet a syntax error at the end: the scan stops long before.
        let text = "[".repeat(100_000);
        let (line, column, problem) = refusal(&text, &Limits::SPEC);
        assert_eq!((line, column), (1, MAX_SPEC_NESTING as u64 + 1), "{problem}");
        let text = "{\"a\": ".repeat(100_000);
        assert_eq!(refusal(&text, &Limits::SPEC).1, 6 * MAX_SPEC_NESTING as u64 + 1);
    }

    #[test]
    fn nodes_are_refused_at_the_first_past_the_limit() {
        let limits = Limits { nodes: 6, ..ROOMY };
        assert!(check("a: [1, 2, 3]", &limits).is_ok(), "mapping, key, sequence, 3 items");
        let (line, column, problem) = refusal("a: [1, 2, 3, 4]", &limits);
        assert_eq!((line, column), (1, 14), "{problem}");
        assert!(problem.contains("more than 6 nodes"), "{problem}");
        // An empty document is a node (null) too, so a stream of them is bounded.
        assert!(check(&"---\n".repeat(6), &limits).is_ok());
        assert!(refusal(&"---\n".repeat(7), &limits).2.contains("nodes"));
    }

    #[test]
    fn text_longer_than_the_limit_is_refused_before_it_is_parsed() {
        let limits = Limits { bytes: 10, ..ROOMY };
        assert!(check("a: 1234567", &limits).is_ok());
        match check("a: 12345678", &limits) {
            Err(SpecError::TooLarge { bytes: 11, limit: 10 }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shape_counts_keys_and_values_of_a_mapping_in_turn() {
        let mut shape = Shape::new(ROOMY);
        let scalar = |merge| EventKind::Scalar { anchor: None, merge };
        shape.see(&EventKind::MappingStart { anchor: None }).unwrap();
        shape.see(&scalar(false)).unwrap(); // key
        shape.see(&scalar(true)).unwrap(); // value `<<`: fine
        shape.see(&EventKind::SequenceStart { anchor: None }).unwrap(); // key: a sequence
        shape.see(&scalar(true)).unwrap(); // in a sequence: fine
        shape.see(&EventKind::End).unwrap();
        shape.see(&scalar(false)).unwrap(); // value of the sequence key
        assert!(shape.see(&scalar(true)).unwrap_err().contains("merge key")); // key again
        assert_eq!(shape.nodes, 7);
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(Value::from),
            "[a-z][a-z ]{0,6}[a-z]".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 48, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Against an oracle counted on the value itself: the check accepts the value's text,
        /// as JSON and as block YAML, exactly when its depth and node count are within the
        /// limits; and the deserializer reads what the check accepted back as the same value.
        #[test]
        fn accepts_exactly_the_values_within_the_limits(v in value(), nesting in 0usize..8, nodes_limit in 0usize..64) {
            let limits = Limits { nesting, nodes: nodes_limit, ..ROOMY };
            let within = depth(&v) <= nesting && nodes(&v) <= nodes_limit;
            for text in [serde_json::to_string(&v).unwrap(), serde_norway::to_string(&v).unwrap()] {
                let result = check(&text, &limits);
                prop_assert_eq!(result.is_ok(), within, "{}: {:?} (depth {}, nodes {})", text, result, depth(&v), nodes(&v));
                if within {
                    prop_assert_eq!(&serde_norway::from_str::<Value>(&text).unwrap(), &v);
                }
            }
        }

        /// Token soup, valid YAML or not: the check never panics, and whatever it accepts and
        /// the deserializer reads is within the limits as counted on the value read (so an
        /// alias could not have multiplied it).
        #[test]
        fn what_is_accepted_is_read_within_the_limits(
            tokens in prop::collection::vec(prop::sample::select(vec![
                "a", "b", "0", "&a ", "&b ", "*a", "*b", "[", "]", "{", "}", ", ", ": ", "\n", "- ", "  ",
                "<<: ", "'x'", "? ", "---\n", "#c\n",
            ]), 0..48),
            nesting in 0usize..6,
            nodes_limit in 0usize..24,
        ) {
            let text = tokens.concat();
            let limits = Limits { nesting, nodes: nodes_limit, ..ROOMY };
            if check(&text, &limits).is_ok() && let Ok(v) = serde_norway::from_str::<Value>(&text) {
                // A text with no document at all (no node to count) reads as one null.
                let nodes_read = if v.is_null() { 0 } else { nodes(&v) };
                prop_assert!(depth(&v) <= nesting && nodes_read <= nodes_limit,
                    "{:?} read as {} (depth {}, nodes {})", text, v, depth(&v), nodes(&v));
            }
        }
    }
}
