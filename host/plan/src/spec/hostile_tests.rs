//! Specs a hostile tenant could send: refused by `parse` (the text's shape) or by `validate`
//! (names, sizes, counts), each naming where and what to do instead. The expected positions,
//! counts and sizes are worked out from the texts built here, not asked of the code.

use eddy_core::limits::{
    MAX_NAME_BYTES, MAX_SOURCES, MAX_SPEC_NESTING, MAX_SPEC_NODES, MAX_STEP_CONFIG_BYTES, MAX_STEPS, MAX_VALUE_BYTES,
};
use proptest::prelude::*;
use serde_json::Value;

use super::*;

/// A valid spec whose one step has `config: <config>` on line 6 (column 13 onwards).
fn with_config(config: &str) -> String {
    format!(
        "name: wc\nsources: [{{type: file, name: in, path: in.txt}}]\nsteps:\n  - name: a\n    wasm: a.wasm\n    \
         config: {config}\nsink: {{type: print}}\n"
    )
}

/// The levels a step's `config` value starts at: the spec's mapping, `steps`, the step.
const CONFIG_LEVEL: usize = 3;

/// `(line, column, problem)` of the text's refusal by `parse`.
fn refused(text: &str) -> (u64, u64, String) {
    match PipelineSpec::parse(text) {
        Err(SpecError::Refused { line, column, problem }) => (line, column, problem),
        Err(other) => panic!("refused, but not for its shape: {other}"),
        Ok(_) => panic!("accepted: {}", &text[..text.len().min(300)]),
    }
}

/// `(field, problem)` of the spec's refusal by `validate` (after `parse` accepted it).
fn invalid_field(text: &str) -> (String, String) {
    match PipelineSpec::from_yaml(text) {
        Err(SpecError::Invalid { field, problem }) => (field, problem),
        Err(other) => panic!("refused, but not by a field: {other}"),
        Ok(_) => panic!("accepted: {}", &text[..text.len().min(300)]),
    }
}

/// Oracle: YAML nodes of a value (every mapping key a scalar node).
fn nodes(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(nodes).sum::<usize>(),
        Value::Object(map) => 1 + map.values().map(|v| 1 + nodes(v)).sum::<usize>(),
        _ => 1,
    }
}

/// `[item, item, ...]`, `n` of them.
fn flow_list(item: &str, n: usize) -> String {
    format!("[{}]", vec![item; n].join(", "))
}

#[test]
fn an_alias_bomb_is_refused_at_its_anchor_though_serde_alone_builds_a_million_nodes() {
    let text = with_config(&format!("{{zeros: &a {}, copies: {}}}", flow_list("0", 1_000), flow_list("*a", 1_000)));
    assert!(text.len() < 10_000, "a small text");
    // The threat is real: without the check, the deserializer expands every alias.
    let expanded: Value = serde_norway::from_str(&text).expect("serde_norway reads the bomb");
    assert!(nodes(&expanded["steps"][0]["config"]) > 1_000_000);
    let (line, column, problem) = refused(&text);
    assert_eq!((line, column), (6, 21), "`&a` after `    config: {{zeros: `: {problem}");
    assert!(problem.contains("anchor `&a`") && problem.contains("aliases"), "{problem}");
    assert!(problem.contains("write the value out"), "{problem}");
}

#[test]
fn the_reported_attack_scaled_down_is_refused_at_its_anchor() {
    // The attack's shape at 1/100: an anchored list of zeros as steps[0].config, and a
    // second list of aliases to it as steps[1].config.
    let text = format!(
        "name: wc\nsources: [{{type: file, name: in, path: in.txt}}]\nsteps:\n  - name: a\n    wasm: a.wasm\n    \
         config: &zeros {}\n  - name: b\n    wasm: b.wasm\n    config: {}\nsink: {{type: print}}\n",
        flow_list("0", 2_500),
        flow_list("*zeros", 1_500)
    );
    let (line, column, problem) = refused(&text);
    assert_eq!((line, column), (6, 13), "{problem}");
    assert!(problem.contains("anchor `&zeros`"), "{problem}");
}

#[test]
fn an_anchor_alone_is_refused() {
    let (line, column, problem) = refused(&with_config("&settings {window: 10}"));
    assert_eq!((line, column), (6, 13), "{problem}");
    assert!(problem.contains("anchor `&settings`") && problem.contains("write the value out"), "{problem}");
}

#[test]
fn a_merge_key_is_refused_though_it_needs_no_alias() {
    let (line, column, problem) = refused(&with_config("{<<: {window: 10}, size: 3}"));
    assert_eq!((line, column), (6, 14), "{problem}");
    assert!(problem.contains("merge key `<<`") && problem.contains("write the keys out"), "{problem}");
    let (line, column, _) = refused(&with_config("\n      <<: {window: 10}\n      size: 3"));
    assert_eq!((line, column), (7, 7));
}

#[test]
fn a_hundred_thousand_open_brackets_are_refused_as_too_deep_at_the_first_past_the_limit() {
    let (line, column, problem) = refused(&"[".repeat(100_000));
    assert_eq!((line, column), (1, MAX_SPEC_NESTING as u64 + 1), "{problem}");
    assert!(problem.contains(&format!("deeper than {MAX_SPEC_NESTING}")), "{problem}");
    // In a step's config, the spec's own levels count: config starts at column 13.
    let (line, column, _) = refused(&with_config(&"[".repeat(100_000)));
    assert_eq!((line, column), (6, 12 + (MAX_SPEC_NESTING - CONFIG_LEVEL) as u64 + 1));
}

/// A config of `levels` block mappings, each the only value of the one before: `k:` lines, on
/// line 7 onwards, indented 6, 8, 10, ...
fn nested_block_config(levels: usize) -> String {
    let mut config = String::new();
    for level in 0..levels {
        let last = if level + 1 == levels { " 1" } else { "" };
        config.push_str(&format!("\n{}k:{last}", " ".repeat(6 + 2 * level)));
    }
    with_config(&config)
}

#[test]
fn block_nesting_past_the_limit_is_refused_and_at_the_limit_accepted() {
    let at_limit = MAX_SPEC_NESTING - CONFIG_LEVEL;
    PipelineSpec::from_yaml(&nested_block_config(at_limit)).expect("nested exactly to the limit");
    let (line, column, problem) = refused(&nested_block_config(at_limit + 1));
    // Mapping m (1-based) starts at its key, on line 6 + m, column 7 + 2 (m - 1).
    let m = (at_limit + 1) as u64;
    assert_eq!((line, column), (6 + m, 7 + 2 * (m - 1)), "{problem}");
    assert!(problem.contains(&format!("deeper than {MAX_SPEC_NESTING}")), "{problem}");
}

#[test]
fn json_goes_through_the_same_check() {
    let mut spec: Value = serde_norway::from_str(&with_config("1")).expect("yaml");
    let mut deep = Value::from(1);
    for _ in 0..MAX_SPEC_NESTING - CONFIG_LEVEL + 1 {
        deep = Value::Array(vec![deep]);
    }
    spec["steps"][0]["config"] = deep.clone();
    let (_, _, problem) = refused(&serde_json::to_string(&spec).expect("json"));
    assert!(problem.contains("deeper than"), "{problem}");
    spec["steps"][0]["config"] = deep[0].clone();
    PipelineSpec::from_yaml(&serde_json::to_string(&spec).expect("json")).expect("one level less is accepted");
}

#[test]
fn more_nodes_than_the_limit_are_refused_and_the_limit_accepted() {
    // Nodes of the spec with an empty list as its config, the list included; each item adds one.
    let base = nodes(&serde_norway::from_str(&with_config("[]")).expect("yaml"));
    let items = MAX_SPEC_NODES - base;
    PipelineSpec::from_yaml(&with_config(&flow_list("0", items))).expect("exactly the limit");
    let (line, column, problem) = refused(&with_config(&flow_list("0", items + 1)));
    // One node past the limit in all, so the refused node is the spec's last: `print`, in
    // `sink: {type: print}` on line 7.
    assert_eq!((line, column), (7, 14), "{problem}");
    assert!(problem.contains(&format!("more than {MAX_SPEC_NODES} nodes")), "{problem}");
}

#[test]
fn a_config_larger_than_the_limit_as_json_is_refused_naming_the_step_and_both_sizes() {
    // As JSON a string of plain letters is its letters and two quotes.
    let text = |letters: usize| with_config(&format!("\"{}\"", "x".repeat(letters)));
    PipelineSpec::from_yaml(&text(MAX_STEP_CONFIG_BYTES - 2)).expect("exactly the limit");
    let (field, problem) = invalid_field(&text(MAX_STEP_CONFIG_BYTES - 1));
    assert_eq!(field, "steps[0].config");
    let (size, limit) = (MAX_STEP_CONFIG_BYTES + 1, MAX_STEP_CONFIG_BYTES);
    assert!(problem.contains(&format!("{size} bytes as JSON, above the limit of {limit}")), "{problem}");
    // Escapes count as JSON writes them: 2 bytes of `\n` per newline.
    let newlines = with_config(&format!("\"{}\"", "\\n".repeat(MAX_STEP_CONFIG_BYTES / 2)));
    assert_eq!(invalid_field(&newlines).0, "steps[0].config");
}

/// The spec with `name` (written as a JSON string, which YAML reads as written) in `place`,
/// and the field an error must name.
fn named(place: &str, name: &str) -> (String, &'static str) {
    let q = serde_json::to_string(name).expect("json string");
    let source = |s: &str| OK_SPEC.replace("{type: file, name: in, path: in.txt}", s);
    match place {
        "pipeline" => (OK_SPEC.replace("name: wc", &format!("name: {q}")), "name"),
        "step" => (OK_SPEC.replace("{name: a,", &format!("{{name: {q},")), "steps[0].name"),
        "file source" => (source(&format!("{{type: file, name: {q}, path: in.txt}}")), "sources[0].name"),
        "generator" => (source(&format!("{{type: generator, name: {q}}}")), "sources[0].name"),
        "nexmark" => (source(&format!("{{type: nexmark, name: {q}}}")), "sources[0].name"),
        "late output" => (
            OK_SPEC.replace(
                "{name: a, wasm: a.wasm}",
                &format!(
                    "{{name: a, wasm: a.wasm, key_by: key, window: {{type: tumbling, size_ms: 10, late_output: {q}}}}}"
                ),
            ),
            "steps[0].window.late_output",
        ),
        other => panic!("no place {other}"),
    }
}

const OK_SPEC: &str = "name: wc\nsources: [{type: file, name: in, path: in.txt}]\nsteps:\n  - {name: a, wasm: a.wasm}\nsink: {type: print}\n";
const PLACES: [&str; 6] = ["pipeline", "step", "file source", "generator", "nexmark", "late output"];

#[test]
fn names_are_identifiers_in_every_place_a_spec_gives_one() {
    let long = "n".repeat(MAX_NAME_BYTES + 1);
    let bad = [
        "word count",
        "a\"b",
        "it's",
        "a\nb",
        "a{b}",
        "",
        long.as_str(),
        ".hidden",
        "..",
        "-x",
        "a/b",
        "sum@1",
        "caf\u{e9}",
        "tab\t",
    ];
    let longest = "n".repeat(MAX_NAME_BYTES);
    let good = ["wordcount", "nexmark-q5", "count_1.v2", "a", "9lives", "late", longest.as_str()];
    for place in PLACES {
        for name in bad {
            let (text, field) = named(place, name);
            let (got, problem) = invalid_field(&text);
            assert_eq!(got, field, "{place} {name:?}: {problem}");
            assert!(problem.contains("ASCII letters, digits, `_`, `-` and `.`"), "{place} {name:?}: {problem}");
            assert!(!problem.contains('\n'), "the message carries no newline: {problem:?}");
        }
        for name in good {
            let (text, _) = named(place, name);
            PipelineSpec::from_yaml(&text).unwrap_or_else(|e| panic!("{place} {name:?}: {e}"));
        }
    }
}

/// Oracle for a name, written from the rule as a list of bytes rather than as character
/// classes: 1 to 64 of these, the first among the letters and digits.
fn is_name(name: &str) -> bool {
    const ALNUM: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let allowed = |c: char| ALNUM.contains(c) || "_-.".contains(c);
    (1..=64).contains(&name.len()) && name.starts_with(|c| ALNUM.contains(c)) && name.chars().all(allowed)
}

proptest! {
    #[test]
    fn a_name_is_accepted_exactly_when_the_rule_allows_it(name in "[A-Za-z0-9_.\\- \"'{}/\n\u{e9}]{0,3}[a-z0-9_.\\-]{0,66}") {
        let checked = check_name("name", &name);
        prop_assert_eq!(checked.is_ok(), is_name(&name), "{:?}: {:?}", name, checked);
    }
}

#[test]
fn more_sources_or_steps_than_the_limits_are_refused() {
    let sources = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("{{type: file, name: in{i}, path: in.txt}}")).collect();
        OK_SPEC.replace("[{type: file, name: in, path: in.txt}]", &format!("[{}]", list.join(", ")))
    };
    PipelineSpec::from_yaml(&sources(MAX_SOURCES)).expect("as many sources as the limit");
    let (field, problem) = invalid_field(&sources(MAX_SOURCES + 1));
    assert_eq!(field, "sources");
    assert!(problem.contains(&format!("{} sources, above the limit of {MAX_SOURCES}", MAX_SOURCES + 1)), "{problem}");

    let steps = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("  - {{name: s{i}, wasm: a.wasm}}\n")).collect();
        OK_SPEC.replace("  - {name: a, wasm: a.wasm}\n", &list.concat())
    };
    PipelineSpec::from_yaml(&steps(MAX_STEPS)).expect("as many steps as the limit");
    let (field, problem) = invalid_field(&steps(MAX_STEPS + 1));
    assert_eq!(field, "steps");
    assert!(problem.contains(&format!("{} steps, above the limit of {MAX_STEPS}", MAX_STEPS + 1)), "{problem}");
}

#[test]
fn a_file_sources_line_limit_is_at_most_the_largest_value() {
    let with = |bytes: usize| OK_SPEC.replace("path: in.txt}", &format!("path: in.txt, max_line_bytes: {bytes}}}"));
    PipelineSpec::from_yaml(&with(MAX_VALUE_BYTES)).expect("the largest value");
    PipelineSpec::from_yaml(&with(1)).expect("one byte");
    for bytes in [MAX_VALUE_BYTES + 1, 0, usize::MAX] {
        let (field, problem) = invalid_field(&with(bytes));
        assert_eq!(field, "sources[0].max_line_bytes", "{bytes}");
        assert!(problem.contains(&format!("{bytes} is outside 1..={MAX_VALUE_BYTES}")), "{problem}");
    }
}
