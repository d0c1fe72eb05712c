//! The `json-batch` import: the call's keys, values and prefetched state as JSON arrays, and
//! value-state writes and output taken as JSON arrays.
//!
//! Interpreters parse or write one JSON array natively (`json.loads`, `JSON.parse`) many times
//! faster than they read a packed table a field at a time, so Python and JavaScript SDKs move a
//! whole batch across in one text each way. Every element the host splices into an array is
//! checked to be one JSON value first: a key such as `1],[2` would otherwise shift every
//! element after it onto another record. What cannot be said exactly answers `none`, and the
//! SDK reads those values the slow way, which also reports the bad record.

use eddy_wire::json::row_to_exact_json;
use eddy_wire::row::is_row;
use eddy_wire::{Row, Span, Table};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{ImportResult, OperatorHost, limit, trap, undeclared_output};
use crate::bindings::json_batch;
use crate::error::Violation;
use crate::keyed::{EMITTED_ROW_BYTES, Keyed};

/// Largest text a view answers; past it the SDK reads the batch the slow way. Rows rendered
/// with their field names can be far larger than the batch they came in.
const MAX_VIEW_BYTES: usize = 64 << 20;

/// An array of JSON values being written, each checked before it goes in, and its length
/// checked as it grows: the records of a batch that share a key share one prefetched value,
/// and written out once per record a 16 MiB value in a batch of 2 048 such records would be
/// 32 GiB of text before a check at the end refused it.
struct JsonArray {
    text: Vec<u8>,
    /// Longest text it answers (past it, the view is `none`).
    limit: usize,
}

impl JsonArray {
    fn with_capacity(bytes: usize) -> Self {
        Self::with_limit(bytes, MAX_VIEW_BYTES)
    }

    fn with_limit(bytes: usize, limit: usize) -> Self {
        let mut text = Vec::with_capacity(bytes.min(limit) + 2);
        text.push(b'[');
        Self { text, limit }
    }

    /// `None` once the text is past its limit.
    fn within(&self) -> Option<()> {
        (self.text.len() <= self.limit).then_some(())
    }

    fn separate(&mut self) {
        if self.text.len() > 1 {
            self.text.push(b',');
        }
    }

    /// Appends `value` if it is one JSON value and fits; `None` if not.
    fn json(&mut self, value: &[u8]) -> Option<()> {
        // With the comma that may go before it.
        if self.text.len().saturating_add(value.len()).saturating_add(1) > self.limit {
            return None;
        }
        serde_json::from_slice::<IgnoredAny>(value).ok()?;
        self.separate();
        self.text.extend_from_slice(value);
        Some(())
    }

    fn null(&mut self) -> Option<()> {
        self.separate();
        self.text.extend_from_slice(b"null");
        self.within()
    }

    /// A record value: JSON as it is, a row rendered exactly (its text is not known before it
    /// is written, so the check follows: past the limit by at most one value's rendering).
    fn value(&mut self, value: &[u8]) -> Option<()> {
        if !is_row(value) {
            return self.json(value);
        }
        self.within()?;
        self.separate();
        row_to_exact_json(value, crate::schemas::schemas(), &mut self.text).ok()?;
        self.within()
    }

    fn finish(mut self) -> Option<String> {
        self.text.push(b']');
        self.within()?;
        // Every element was checked JSON, which is UTF-8.
        String::from_utf8(self.text).ok()
    }
}

impl Keyed {
    fn in_process(&self, import: &'static str) -> ImportResult<()> {
        match self.keys.call() {
            "process" => Ok(()),
            call => Err(trap(Violation::WrongCall { import, serves: "process", call })),
        }
    }

    fn records(&self) -> ImportResult<Table<'_, Row>> {
        Table::new(&self.batch.records).map_err(|e| trap(Violation::MalformedTable(e)))
    }
}

impl json_batch::Host for OperatorHost {
    fn keys(&mut self) -> ImportResult<Option<String>> {
        Ok(self.keyed.keys_json())
    }

    fn values(&mut self) -> ImportResult<Option<String>> {
        self.keyed.values_json()
    }

    fn prefetched(&mut self, state: u32) -> ImportResult<Option<String>> {
        self.keyed.prefetched_json(state)
    }

    fn set_values(&mut self, state: u32, writes: String) -> ImportResult<()> {
        self.keyed.set_values_json(state, &writes)
    }

    fn emit(&mut self, output: u32, keyed: bool, schema: u32, records: String) -> ImportResult<()> {
        self.keyed.emit_json(output, keyed, schema, &records)
    }
}

impl Keyed {
    fn keys_json(&self) -> Option<String> {
        let keys = &self.keys;
        let mut array = JsonArray::with_capacity(keys.data.len() + keys.entries.len());
        for key in keys.iter() {
            match key {
                Some(key) => {
                    array.json(key)?;
                }
                None => array.null()?,
            }
        }
        array.finish()
    }

    fn values_json(&self) -> ImportResult<Option<String>> {
        let k = self;
        k.in_process("json-batch.values")?;
        let records = k.records()?;
        let mut array = JsonArray::with_capacity(k.batch.data.len());
        for r in records.iter() {
            let Some(value) = r.value.slice(&k.batch.data) else { return Ok(None) };
            if array.value(value).is_none() {
                return Ok(None);
            }
        }
        Ok(array.finish())
    }

    fn prefetched_json(&self, state: u32) -> ImportResult<Option<String>> {
        let k = self;
        k.in_process("json-batch.prefetched")?;
        let Some(column) = k.prefetch.iter().position(|s| *s == state) else {
            return Err(trap(Violation::BadDeclaration(format!(
                "state id {state} is not a value state declared with prefetch"
            ))));
        };
        let columns = k.prefetch.len();
        let cells = Table::<Option<Span>>::new(&k.batch.prefetched).map_err(|e| trap(Violation::MalformedTable(e)))?;
        let rows = cells.len() / columns.max(1);
        let mut array = JsonArray::with_capacity(k.batch.data.len() / columns.max(1));
        for row in 0..rows {
            match cells.get(row * columns + column).flatten() {
                None => {
                    if array.null().is_none() {
                        return Ok(None);
                    }
                }
                Some(span) => {
                    let Some(value) = span.slice(&k.batch.data) else { return Ok(None) };
                    // A state value is a row where the Rust SDK wrote a struct.
                    if array.value(value).is_none() {
                        return Ok(None);
                    }
                }
            }
        }
        Ok(array.finish())
    }

    fn set_values_json(&mut self, state: u32, writes: &str) -> ImportResult<()> {
        let (handles, values, cleared): (Vec<u32>, Vec<&RawValue>, Vec<u32>) = serde_json::from_str(writes)
            .map_err(|e| trap(Violation::MalformedJson { what: "value writes", reason: e.to_string() }))?;
        if handles.len() != values.len() {
            return Err(trap(Violation::MalformedJson {
                what: "value writes",
                reason: format!("{} key handles for {} values", handles.len(), values.len()),
            }));
        }
        for (handle, value) in handles.into_iter().zip(values) {
            self.put_value(state, handle, value.get().as_bytes())?;
        }
        for handle in cleared {
            self.with_state_key(state, Some(super::Value), handle, None, |b, k, _| b.delete(k))?;
        }
        Ok(())
    }

    fn emit_json(&mut self, output: u32, keyed: bool, schema: u32, records: &str) -> ImportResult<()> {
        let k = self;
        // The text itself counts: parsing it holds a reference per element.
        let allowed = k.limits.max_output_bytes_per_call.min(eddy_core::MAX_BATCH_BYTES);
        limit("output bytes in one call", allowed, k.output_bytes.saturating_add(records.len()))?;
        let items: Vec<&RawValue> = serde_json::from_str(records)
            .map_err(|e| trap(Violation::MalformedJson { what: "emitted records", reason: e.to_string() }))?;
        let per = if keyed { 3 } else { 2 };
        if !items.len().is_multiple_of(per) {
            return Err(trap(Violation::MalformedJson {
                what: "emitted records",
                reason: format!("{} elements are not records of {per}", items.len()),
            }));
        }
        let mut row = Vec::new();
        for (i, record) in items.chunks_exact(per).enumerate() {
            let (key, value, timestamp) = match record {
                [key, value, timestamp] => (Some(key.get().as_bytes()), value, timestamp),
                [value, timestamp] => (None, value, timestamp),
                _ => unreachable!("chunks of `per`"),
            };
            let timestamp: Option<i64> = serde_json::from_str(timestamp.get()).map_err(|e| {
                trap(Violation::MalformedJson {
                    what: "emitted records",
                    reason: format!("record {i}'s timestamp: {e}"),
                })
            })?;
            let value = match schema {
                0 => value.get().as_bytes(),
                schema => {
                    row.clear();
                    eddy_wire::from_json::row_from_json_fields(value.get(), schema, &mut row).map_err(|e| {
                        trap(Violation::MalformedJson { what: "emitted records", reason: format!("record {i}: {e}") })
                    })?;
                    &row
                }
            };
            k.push_output(output, key, value, timestamp)?;
        }
        Ok(())
    }

    /// Adds one record to the call's output (`tag` 0 the main output), within the limits.
    fn push_output(&mut self, tag: u32, key: Option<&[u8]>, value: &[u8], timestamp: Option<i64>) -> ImportResult<()> {
        limit("emitted key bytes", self.limits.max_key_bytes, key.map_or(0, <[u8]>::len))?;
        limit("emitted value bytes", self.limits.max_value_bytes, value.len())?;
        let copied = key.map_or(0, <[u8]>::len) + value.len() + EMITTED_ROW_BYTES;
        self.output_bytes = self.output_bytes.saturating_add(copied);
        let allowed = self.limits.max_output_bytes_per_call.min(eddy_core::MAX_BATCH_BYTES);
        limit("output bytes in one call", allowed, self.output_bytes)?;
        let target = match tag {
            0 => &mut self.output.main,
            n => match self.output.side.get_mut(n as usize - 1) {
                Some((_, batch)) => batch,
                None => return Err(undeclared_output(n)),
            },
        };
        target.try_push(key, value, timestamp).map_err(|full| {
            trap(Violation::Limit {
                what: "output bytes in one call",
                limit: eddy_core::MAX_BATCH_BYTES,
                actual: full.held.saturating_add(full.adding),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use eddy_core::{HeapTimerService, KeyGroupRange, RecordBatch};
    use eddy_state::HeapStateBackend;
    use eddy_wire::row::RowWriter;
    use eddy_wire::schema::Schema;

    use super::*;
    use crate::bindings::state::StateKind;
    use crate::config::SandboxLimits;
    use crate::error::HostTrap;

    fn keyed(limits: SandboxLimits) -> Keyed {
        let mut k = Keyed::new(
            limits,
            Box::new(HeapStateBackend::default()),
            Box::new(HeapTimerService::default()),
            KeyGroupRange::all(128),
            128,
        );
        k.reads_json_batch = true;
        k
    }

    /// `k` as a `process` call over `records` ((key, value) pairs) finds it.
    fn process(k: &mut Keyed, records: &[(Option<&[u8]>, &[u8])]) {
        let mut batch = RecordBatch::default();
        for (key, value) in records {
            batch.try_push(*key, value, None).expect("fits");
        }
        let mut wit = std::mem::take(&mut k.batch);
        k.batch_for_guest(&batch, Arc::make_mut(&mut wit)).expect("batch");
        k.batch = wit;
    }

    /// A row of `fields` fields under schema id `schema`, as `write` fills it.
    fn row_of(fields: usize, schema: u32, write: impl FnOnce(&mut RowWriter<'_>)) -> Vec<u8> {
        let mut row = Vec::new();
        let mut w = RowWriter::new(&mut row, fields, schema);
        write(&mut w);
        w.finish();
        row
    }

    /// A row holding bytes, which JSON cannot say exactly.
    fn bytes_row() -> Vec<u8> {
        row_of(1, 0, |w| w.bytes(0, b"\x00"))
    }

    fn violation(e: wasmtime::Error) -> Violation {
        match e.downcast::<HostTrap>() {
            Ok(HostTrap::Violation(v)) => v,
            other => panic!("not a violation: {other:?}"),
        }
    }

    #[test]
    fn keys_are_one_array_and_a_key_that_is_not_one_value_gives_no_view() {
        let mut k = keyed(SandboxLimits::default());
        process(&mut k, &[(Some(b"\"fox\""), b"1"), (None, b"2"), (Some(b"[1,{\"a\":2}]"), b"3")]);
        assert_eq!(k.keys_json().as_deref(), Some(r#"["fox",null,[1,{"a":2}]]"#));
        // Spliced in as they are, these would put the next records' keys on other records.
        for hostile in [&b"1],[2"[..], b"1,2", b"", b"\"open"] {
            process(&mut k, &[(Some(hostile), b"1"), (Some(b"2"), b"1")]);
            assert_eq!(k.keys_json(), None, "{}", String::from_utf8_lossy(hostile));
        }
    }

    #[test]
    fn values_are_json_as_sent_and_rows_as_objects_unless_json_cannot_say_them() {
        let schema = Schema { name: "JsonBatchTest".into(), fields: vec!["n".into(), "s".into()] };
        let id = crate::schemas::schemas().declare(&schema).expect("schema");
        let row = row_of(2, id, |w| {
            w.i64(0, -5);
            w.str(1, "é\"");
        });
        let mut k = keyed(SandboxLimits::default());
        process(&mut k, &[(None, b"{\"b\":1,\"a\":[2]}"), (None, &row), (None, b"1.5")]);
        assert_eq!(
            k.values_json().expect("in process").as_deref(),
            Some(r#"[{"b":1,"a":[2]},{"n":-5,"s":"é\""},1.5]"#)
        );

        let bytes_row = bytes_row();
        for bad in [&bytes_row[..], b"1,2", b"not json"] {
            process(&mut k, &[(None, b"1"), (None, bad)]);
            assert_eq!(k.values_json().expect("in process"), None, "{bad:?}");
        }
        k.keys.clear("on-timer");
        let v = violation(k.values_json().expect_err("outside process"));
        assert!(v.to_string().contains("serves only process, not on-timer"), "{v}");
    }

    #[test]
    fn prefetched_values_come_per_record_with_null_for_none() {
        let mut k = keyed(SandboxLimits::default());
        let count = k.declare("count".into(), Some(StateKind::Value), true).expect("declare");
        let other = k.declare("other".into(), Some(StateKind::Value), false).expect("declare");
        process(&mut k, &[(Some(b"\"a\""), b"1")]);
        k.set_values_json(count, "[[0],[7],[]]").expect("write");
        process(&mut k, &[(Some(b"\"b\""), b"1"), (Some(b"\"a\""), b"1"), (Some(b"\"a\""), b"1")]);
        assert_eq!(k.prefetched_json(count).expect("prefetched").as_deref(), Some("[null,7,7]"));
        let v = violation(k.prefetched_json(other).expect_err("not prefetched"));
        assert!(v.to_string().contains("not a value state declared with prefetch"), "{v}");
    }

    #[test]
    fn an_array_refuses_what_would_take_it_past_its_limit_before_writing_it() {
        let ten = b"\"abcdefgh\"";
        let mut array = JsonArray::with_limit(1 << 20, 30);
        assert!(array.text.capacity() < 64, "reserves no more than it may write");
        assert_eq!(array.json(ten), Some(()));
        assert_eq!(array.json(ten), Some(()));
        // `[` and two values with a comma: 22 bytes; another would reach 33.
        assert_eq!(array.json(ten), None);
        assert_eq!(array.text.len(), 22, "refused before it was written");
        // Nulls and rows are checked as they go too, and the end as well.
        let mut nulls = JsonArray::with_limit(0, 30);
        let written = (0..10).take_while(|_| nulls.null().is_some()).count();
        assert_eq!(written, 6, "six nulls are 30 bytes with their commas and the `[`");
        let row = row_of(1, 0, |w| w.str(0, "thirty bytes of text in a row."));
        let mut rows = JsonArray::with_limit(0, 30);
        assert_eq!(rows.value(&row), None, "rendered past the limit");
        let mut full = JsonArray::with_limit(0, 22);
        assert_eq!(full.json(ten), Some(()));
        assert_eq!(full.json(ten), Some(()));
        assert_eq!(full.finish(), None, "the closing bracket passes the limit");
    }

    #[test]
    fn prefetched_rows_come_as_objects_and_a_row_json_cannot_say_gives_no_view() {
        // What the Rust SDK writes for a struct state value.
        let schema = Schema { name: "JsonBatchLeaders".into(), fields: vec!["count".into(), "auctions".into()] };
        let id = crate::schemas::schemas().declare(&schema).expect("schema");
        let row = row_of(2, id, |w| {
            w.u64(0, 3);
            w.json(1, b"[7,9]");
        });
        let mut k = keyed(SandboxLimits::default());
        let leaders = k.declare("leaders".into(), Some(StateKind::Value), true).expect("declare");
        process(&mut k, &[(Some(b"\"a\""), b"1"), (Some(b"\"b\""), b"1")]);
        k.put_value(leaders, 0, &row).expect("row");
        k.put_value(leaders, 1, b"{\"count\":1,\"auctions\":[2]}").expect("json");
        process(&mut k, &[(Some(b"\"b\""), b"1"), (Some(b"\"c\""), b"1"), (Some(b"\"a\""), b"1")]);
        assert_eq!(
            k.prefetched_json(leaders).expect("prefetched").as_deref(),
            Some(r#"[{"count":1,"auctions":[2]},null,{"count":3,"auctions":[7,9]}]"#)
        );
        // Bytes have no exact JSON: the SDK reads the values one by one instead.
        k.put_value(leaders, 0, &bytes_row()).expect("row");
        process(&mut k, &[(Some(b"\"b\""), b"1"), (Some(b"\"a\""), b"1")]);
        assert_eq!(k.prefetched_json(leaders).expect("prefetched"), None);
    }

    #[test]
    fn value_writes_apply_and_clear_and_malformed_ones_trap() {
        let mut k = keyed(SandboxLimits::default());
        let count = k.declare("count".into(), Some(StateKind::Value), true).expect("declare");
        process(&mut k, &[(Some(b"\"a\""), b"1"), (Some(b"\"b\""), b"1")]);
        k.set_values_json(count, r#"[[0,1],[{"n":1},"x"],[]]"#).expect("write");
        process(&mut k, &[(Some(b"\"a\""), b"1"), (Some(b"\"b\""), b"1")]);
        assert_eq!(k.prefetched_json(count).expect("read").as_deref(), Some(r#"[{"n":1},"x"]"#));
        k.set_values_json(count, "[[],[],[1]]").expect("clear");
        process(&mut k, &[(Some(b"\"a\""), b"1"), (Some(b"\"b\""), b"1")]);
        assert_eq!(k.prefetched_json(count).expect("read").as_deref(), Some(r#"[{"n":1},null]"#));
        for (writes, says) in [
            ("[[0],[1,2],[]]", "1 key handles for 2 values"),
            ("[[0],[1]]", "value writes is not what json-batch takes"),
            ("{}", "value writes is not what json-batch takes"),
            ("[[9],[1],[]]", "key handle 9 names no record"),
        ] {
            let v = violation(k.set_values_json(count, writes).expect_err(writes));
            assert!(v.to_string().contains(says), "{writes}: {v}");
        }
    }

    #[test]
    fn emitted_records_keep_their_text_rows_are_written_and_malformed_ones_trap() {
        let mut k = keyed(SandboxLimits::default());
        let side = k.declare("late".into(), None, false).expect("side output");
        k.emit_json(0, true, 0, r#"["fox",{"n":1},5,"dog",2.50,null]"#).expect("keyed");
        k.emit_json(side, false, 0, "[[1],null]").expect("unkeyed to a side output");
        k.emit_json(0, false, 3, r#"[["bid",-7,1.5,null],9]"#).expect("a row");
        let out = k.take_output();
        let main: Vec<_> =
            out.main.iter().map(|r| (r.key.map(<[u8]>::to_vec), r.value.to_vec(), r.timestamp)).collect();
        let row = row_of(4, 3, |w| {
            w.str(0, "bid");
            w.i64(1, -7);
            w.f64(2, 1.5);
            w.null(3);
        });
        assert_eq!(
            main,
            vec![
                (Some(b"\"fox\"".to_vec()), b"{\"n\":1}".to_vec(), Some(5)),
                (Some(b"\"dog\"".to_vec()), b"2.50".to_vec(), None),
                (None, row, Some(9)),
            ]
        );
        let late = out.side("late").expect("declared");
        assert_eq!(late.iter().map(|r| r.value.to_vec()).collect::<Vec<_>>(), vec![b"[1]".to_vec()]);

        for (output, keyed, schema, records, says) in [
            (0, true, 0, r#"["a",1]"#, "2 elements are not records of 3"),
            (0, false, 0, r#"[1,"soon"]"#, "record 0's timestamp"),
            (0, false, 0, "not json", "emitted records is not what json-batch takes"),
            (7, false, 0, "[1,null]", "side output id 7 was never declared"),
            (0, false, 3, "[[18446744073709551616],null]", "does not fit in 64 bits"),
        ] {
            let v = violation(k.emit_json(output, keyed, schema, records).expect_err(records));
            assert!(v.to_string().contains(says), "{records}: {v}");
        }
    }

    #[test]
    fn emitted_text_counts_against_the_output_limit_before_it_is_read() {
        let mut k = keyed(SandboxLimits { max_output_bytes_per_call: 200, ..SandboxLimits::default() });
        let big = format!("[\"{}\",null]", "x".repeat(300));
        let v = violation(k.emit_json(0, false, 0, &big).expect_err("too big"));
        assert!(matches!(v, Violation::Limit { what: "output bytes in one call", .. }), "{v}");
        k.begin_call();
        k.emit_json(0, false, 0, "[1,null,2,null]").expect("small");
        // What this call emitted already counts with the text.
        let v = violation(k.emit_json(0, false, 0, &format!("[\"{}\",null]", "y".repeat(120))).expect_err("sum"));
        assert!(matches!(v, Violation::Limit { what: "output bytes in one call", .. }), "{v}");
    }
}
