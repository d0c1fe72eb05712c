//! The part of a JSON text a JSON pointer names, as the JSON text `serde_json` would write for
//! it, found without building the document: each level is scanned once, the named member or
//! element borrowed as raw text and everything else skipped (still checked to be JSON).
//!
//! A `key_by: /field` pointer reads one field of every record; building a `serde_json::Value`
//! of the whole record for it (a map, a string per key) was most of the router's cost on JSON
//! records. The result is byte for byte what `Value::pointer` and `serde_json::to_vec` give:
//! raw text that is already in that form (an integer, a string without escapes, `true`,
//! `false`, `null`) is returned as it is, anything else is parsed and written again.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// The JSON text at `pointer` in `text` (`Ok(None)`: nothing there); an error if `text` is
/// not one JSON value.
pub fn pointer_json(text: &[u8], pointer: &str) -> Result<Option<Vec<u8>>, serde_json::Error> {
    let whole: &RawValue = serde_json::from_slice(text)?;
    if pointer.is_empty() {
        return canonical(whole).map(Some);
    }
    let Some(path) = pointer.strip_prefix('/') else { return Ok(None) };
    let mut at = whole;
    for token in path.split('/') {
        // Unescaped only where needed: this runs per record on a `key_by` pointer.
        let token = match token.contains('~') {
            true => Cow::Owned(token.replace("~1", "/").replace("~0", "~")),
            false => Cow::Borrowed(token),
        };
        let mut de = serde_json::Deserializer::from_str(at.get());
        match (Member { token: &token }).deserialize(&mut de)? {
            Some(inner) => at = inner,
            None => return Ok(None),
        }
    }
    canonical(at).map(Some)
}

/// `raw` as `serde_json::to_vec` writes the value it holds.
fn canonical(raw: &RawValue) -> Result<Vec<u8>, serde_json::Error> {
    let text = raw.get();
    if is_canonical(text) {
        return Ok(text.as_bytes().to_vec());
    }
    serde_json::to_vec(&serde_json::from_str::<serde_json::Value>(text)?)
}

/// Whether `serde_json` writes the value of `text` as `text` itself.
fn is_canonical(text: &str) -> bool {
    match text.as_bytes() {
        b"true" | b"false" | b"null" => true,
        [b'"', inner @ .., b'"'] => !inner.contains(&b'\\'),
        [b'-', b'1'..=b'9', ..] => text.parse::<i64>().is_ok() && text[1..].bytes().all(|b| b.is_ascii_digit()),
        [b'0'] => true,
        [b'1'..=b'9', ..] => text.parse::<u64>().is_ok() && text.bytes().all(|b| b.is_ascii_digit()),
        _ => false,
    }
}

/// One step of a pointer: the member named `token` of an object (its last, as
/// `serde_json::Value` keeps the last of duplicate names), or the element at index `token` of
/// an array; `None` for anything else.
struct Member<'t> {
    token: &'t str,
}

impl<'de> DeserializeSeed<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(matches) = map.next_key_seed(KeyIs(self.token))? {
            if matches {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // As `serde_json::Value::pointer`: digits only, no leading zero.
        let wanted = match self.token.as_bytes() {
            [b'0'] => Some(0),
            [b'1'..=b'9', ..] if self.token.bytes().all(|b| b.is_ascii_digit()) => self.token.parse::<usize>().ok(),
            _ => None,
        };
        let (mut found, mut index) = (None, 0usize);
        loop {
            if Some(index) == wanted {
                match seq.next_element::<&'de RawValue>()? {
                    Some(element) => found = Some(element),
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            index += 1;
        }
        Ok(found)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Reads an object key and says whether it is `.0`, without allocating for one that needs no
/// unescaping.
struct KeyIs<'t>(&'t str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    /// The definition: parse it all, follow the pointer, write what is there.
    fn by_value(text: &[u8], pointer: &str) -> Result<Option<Vec<u8>>, String> {
        let value: Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        Ok(value.pointer(pointer).map(|v| serde_json::to_vec(v).expect("a value writes")))
    }

    #[test]
    fn literal_cases() {
        let doc = br#" {"a": {"b/c": [10, {"~x": -0}, "s\u0041", 1.50, 18446744073709551616]}, "a": {"b/c": [1, 2]}, "n": null} "#;
        // Duplicate "a": the last one counts, as in serde_json::Value.
        let cases: [(&str, Option<&str>); 9] = [
            ("/a/b~1c/0", Some("1")),
            ("/a/b~1c/1", Some("2")),
            ("/a/b~1c/01", None),
            ("/a/b~1c/2", None),
            ("/n", Some("null")),
            ("/n/x", None),
            ("/missing", None),
            ("", Some(r#"{"a":{"b/c":[1,2]},"n":null}"#)),
            ("no-slash", None),
        ];
        for (pointer, expected) in cases {
            let got = pointer_json(doc, pointer).unwrap().map(|v| String::from_utf8(v).unwrap());
            assert_eq!(got.as_deref(), expected, "{pointer}");
        }
        let first = br#"{"a": {"b/c": [10, {"~x": -0}, "s\u0041", 1.50, 18446744073709551616]}}"#;
        let cases: [(&str, &str); 4] = [
            ("/a/b~1c/1/~0x", "-0.0"),
            ("/a/b~1c/2", r#""sA""#),
            ("/a/b~1c/3", "1.5"),
            ("/a/b~1c/4", "1.8446744073709552e+19"),
        ];
        for (pointer, expected) in cases {
            assert_eq!(pointer_json(first, pointer).unwrap(), Some(expected.as_bytes().to_vec()), "{pointer}");
        }
        assert!(pointer_json(br#"{"a": 1} x"#, "/a").is_err(), "trailing text is not one JSON value");
        assert!(pointer_json(br#"{"a": 1, "b": [}"#, "/a").is_err(), "a broken member after the one asked");
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[a-c/~\"\\\\é\u{1}]{0,4}".prop_map(Value::String),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec(("[ab/~]{0,2}", inner), 0..4)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// JSON text of `value` as other writers may produce it: with spaces, a key escaped where
    /// no escape was needed, or each member of the top object repeated after a decoy.
    fn text_of(value: &Value, spaced: bool, duplicate: bool) -> String {
        let pretty = if spaced { serde_json::to_string_pretty(value) } else { serde_json::to_string(value) };
        let text = pretty.expect("a value writes");
        match (duplicate, value) {
            (true, Value::Object(m)) if !m.is_empty() => {
                // Every member twice, the first time as 0: only the last may count.
                let decoys: String = m.keys().map(|k| format!("{}: 0, ", Value::String(k.clone()))).collect();
                format!("{{{decoys}{}", &text[1..])
            }
            _ => text.replace("\"a\"", "\"\\u0061\""),
        }
    }

    proptest! {
        /// The scan equals the definition on any document and pointer.
        #[test]
        fn equals_parsing_the_whole_document(
            value in value(),
            spaced in any::<bool>(),
            duplicate in any::<bool>(),
            pointer in proptest::collection::vec(prop_oneof![
                // Names as the keys are drawn, escaped as a pointer spells them; indexes.
                "[ab/~]{0,2}".prop_map(|k| k.replace('~', "~0").replace('/', "~1")),
                prop_oneof![Just("0"), Just("1"), Just("01")].prop_map(str::to_owned),
            ], 0..4),
        ) {
            let text = text_of(&value, spaced, duplicate);
            let pointer: String = pointer.iter().map(|t| format!("/{t}")).collect();
            let expected = by_value(text.as_bytes(), &pointer);
            let got = pointer_json(text.as_bytes(), &pointer).map_err(|e| e.to_string());
            prop_assert_eq!(got.is_ok(), expected.is_ok(), "{} at {}", text, pointer);
            if let (Ok(got), Ok(expected)) = (got, expected) {
                prop_assert_eq!(got, expected, "{} at {}", text, pointer);
            }
        }

        /// Numbers as other writers spell them come out as serde_json writes them.
        #[test]
        fn numbers_come_out_canonical(text in "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?") {
            let doc = format!("{{\"n\": {text}}}");
            prop_assert_eq!(pointer_json(doc.as_bytes(), "/n").map_err(|e| e.to_string()), by_value(doc.as_bytes(), "/n"));
        }
    }
}
