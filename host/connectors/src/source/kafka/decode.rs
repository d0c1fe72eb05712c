//! How a Kafka record's value becomes a record value and an event time.

use eddy_plan::{KafkaFormat, KafkaSourceSpec};

use crate::source::timestamp_of;

/// Writes the record value of `payload` into `out` (replacing it) and returns its event time:
/// the field `spec.timestamp` names, else the Kafka timestamp. A problem names what is wrong.
pub(super) fn decode(
    spec: &KafkaSourceSpec,
    payload: Option<&[u8]>,
    kafka_time: Option<i64>,
    out: &mut Vec<u8>,
) -> Result<Option<i64>, String> {
    out.clear();
    let payload = payload.unwrap_or_default();
    match spec.format {
        KafkaFormat::Raw => out.extend_from_slice(payload),
        KafkaFormat::Lines => {
            let text = std::str::from_utf8(payload).map_err(|e| format!("the value is not UTF-8 text: {e}"))?;
            serde_json::to_writer(&mut *out, text).map_err(|e| e.to_string())?;
        }
        KafkaFormat::Json => {
            let value: serde_json::Value =
                serde_json::from_slice(payload).map_err(|e| format!("the value is not JSON: {e}"))?;
            serde_json::to_writer(&mut *out, &value).map_err(|e| e.to_string())?;
            if let Some(pointer) = &spec.timestamp {
                return timestamp_of(value.pointer(pointer), pointer).map(Some);
            }
        }
    }
    Ok(kafka_time)
}

/// The side-output value of a record that could not be decoded.
pub(super) fn rejected(topic: &str, partition: i32, offset: i64, problem: &str, payload: Option<&[u8]>) -> Vec<u8> {
    let value = serde_json::json!({
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "error": problem,
        "value": String::from_utf8_lossy(payload.unwrap_or_default()),
    });
    serde_json::to_vec(&value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(format: &str, timestamp: Option<&str>) -> KafkaSourceSpec {
        let ts = timestamp.map(|t| format!(", timestamp: {t}")).unwrap_or_default();
        let text = format!(
            "name: k\nsources: [{{type: kafka, name: s, brokers: b:1, topics: [t], format: {format}{ts}}}]\n\
             steps: [{{name: a, wasm: a.wasm}}]\nsink: {{type: print}}"
        );
        match eddy_plan::PipelineSpec::from_yaml(&text).unwrap().sources.remove(0) {
            eddy_plan::SourceSpec::Kafka(k) => k,
            _ => unreachable!("a kafka source"),
        }
    }

    #[test]
    fn each_format_makes_its_value_and_its_event_time() {
        let mut out = Vec::new();
        let json = spec("json", Some("/ts"));
        assert_eq!(decode(&json, Some(br#"{ "ts": 17, "a": [1, 2] }"#), Some(5), &mut out), Ok(Some(17)));
        assert_eq!(out, br#"{"a":[1,2],"ts":17}"#);
        let json = spec("json", None);
        assert_eq!(decode(&json, Some(b"3"), Some(5), &mut out), Ok(Some(5)), "the Kafka timestamp");
        assert_eq!(out, b"3");
        assert_eq!(decode(&spec("lines", None), Some("a \"b\"".as_bytes()), None, &mut out), Ok(None));
        assert_eq!(out, br#""a \"b\"""#);
        assert_eq!(decode(&spec("raw", None), Some(&[0xff, 0]), Some(1), &mut out), Ok(Some(1)));
        assert_eq!(out, [0xff, 0]);
    }

    #[test]
    fn what_cannot_be_decoded_says_why() {
        let mut out = Vec::new();
        let err = decode(&spec("json", None), Some(b"{oops"), None, &mut out).unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
        let err = decode(&spec("json", Some("/ts")), Some(br#"{"ts": "x"}"#), None, &mut out).unwrap_err();
        assert!(err.contains("`/ts`"), "{err}");
        let err = decode(&spec("lines", None), Some(&[0xff]), None, &mut out).unwrap_err();
        assert!(err.contains("UTF-8"), "{err}");
        let side: serde_json::Value = serde_json::from_slice(&rejected("t", 2, 9, "bad", Some(&[b'x', 0xff]))).unwrap();
        assert_eq!(
            side,
            serde_json::json!({"topic": "t", "partition": 2, "offset": 9, "error": "bad", "value": "x\u{fffd}"})
        );
    }
}
