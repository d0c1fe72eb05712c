//! Two-phase windows: the first phase's partials against literal tables, and a driver that
//! runs records through the first phase into a window reading partials, for the differential
//! test against the reference.

use eddy_plan::KeyBy;

use super::*;

/// Each partial as (key, pane start, count, sum), sorted.
fn partials(batch: &RecordBatch) -> Vec<(String, i64, i64, i64)> {
    let mut out: Vec<_> = batch
        .iter()
        .map(|r| {
            let (count, sum) = sum_count(r.value).expect("a partial is a SumCount accumulator");
            let key = String::from_utf8(r.key.expect("partials are keyed").to_vec()).expect("utf8");
            (key, r.timestamp.expect("partials are timestamped"), count, sum)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_first_phase_folds_a_batch_into_one_partial_per_key_and_pane_in_one_add() {
    let kind = WindowKind::Sliding { size_ms: 20, slide_ms: 10 };
    let mut local = LocalWindowAggregate::new("win", kind, KeyBy::Key, SumCount::default());
    let events = [ev(1, 3, 1), ev(2, 5, 2), ev(1, 12, 3), ev(1, 7, 4), ev(2, -1, 5), ev(1, 10, 6)];
    let out = local.fold(&batch(&events)).expect("fold");
    // Panes are slides: [0, 10) and [10, 20), and [-10, 0) for the event at -1.
    let k = |n: u8| format!("\"k{n}\"");
    let expected = vec![(k(1), 0, 2, 5), (k(1), 10, 2, 9), (k(2), -10, 1, 5), (k(2), 0, 1, 2)];
    assert_eq!(partials(&out), expected);
    assert_eq!((local.aggregate.adds.calls, local.aggregate.adds.groups), (1, 4), "one add for the batch");

    // Keyed by a field, the partial carries the field's JSON as its key, as the router keys.
    let mut by_v = LocalWindowAggregate::new("win", kind, KeyBy::Field("/v".into()), SumCount::default());
    let out = by_v.fold(&batch(&[ev(1, 3, 7), ev(2, 4, 7), ev(1, 5, 8)])).expect("fold");
    assert_eq!(partials(&out), vec![("7".into(), 0, 2, 14), ("8".into(), 0, 1, 8)]);
}

#[test]
fn the_first_phase_refuses_a_batch_without_keys_or_event_time_naming_the_step() {
    let kind = WindowKind::Tumbling { size_ms: 10 };
    let mut local = LocalWindowAggregate::new("highest", kind, KeyBy::Key, SumCount::default());
    let mut keyless = RecordBatch::default();
    keyless.push(None, br#"{"v": 1}"#, Some(3));
    let err = local.fold(&keyless).expect_err("no key").to_string();
    assert!(err.contains("highest (first phase)") && err.contains("key_by") && err.contains("no key"), "{err}");
    let mut untimed = RecordBatch::default();
    untimed.push(Some(b"\"k1\""), br#"{"v": 1}"#, None);
    let err = local.fold(&untimed).expect_err("no timestamp").to_string();
    assert!(err.contains("no event timestamp"), "{err}");
    assert_eq!(local.aggregate.adds.calls, 0, "nothing was folded");
    assert!(local.fold(&RecordBatch::default()).expect("empty").is_empty());
}

/// A two-phase window's config: partials in, no allowed lateness, late partials dropped.
fn partials_config(kind: WindowKind) -> WindowConfig {
    WindowConfig { kind, allowed_lateness_ms: 0, late_data: LateData::Drop, max_parallelism: 128, partial_input: true }
}

#[test]
fn a_window_reading_partials_merges_them_and_judges_lateness_per_pane() {
    let kind = WindowKind::Tumbling { size_ms: 10 };
    let mut local = LocalWindowAggregate::new("win", kind, KeyBy::Key, SumCount::default());
    let mut window =
        WindowOperator::new("win", partials_config(kind), SumCount::default(), Box::new(HeapStateBackend::default()));
    // Two first-phase batches in one window batch: the second's partial of [0, 10) merges
    // with the first's before anything is stored, the third's with the stored accumulator.
    let mut input = local.fold(&batch(&[ev(1, 1, 1), ev(1, 2, 2), ev(2, 12, 10)])).expect("fold");
    input.try_extend(&local.fold(&batch(&[ev(1, 3, 4)])).expect("fold")).expect("room");
    assert!(window.process(&input).expect("process").main.is_empty());
    assert_eq!(window.aggregate().adds.calls, 0, "a window reading partials never adds records");
    window.process(&local.fold(&batch(&[ev(1, 9, 8)])).expect("fold")).expect("process");
    let fired = emitted(&window.on_watermark(9).expect("watermark").main);
    assert_eq!(fired, vec![single(4, 15, 1, 0, 10)]);
    // [0, 10) is gone: a partial of it is late, dropped and counted, and changes nothing.
    window.process(&local.fold(&batch(&[ev(1, 5, 100), ev(2, 15, 1)])).expect("fold")).expect("process");
    assert_eq!(window.late_records(), 1, "one partial late");
    let fired = emitted(&window.on_watermark(i64::MAX).expect("final").main);
    assert_eq!(fired, vec![single(2, 11, 2, 10, 20)]);
    assert_eq!(window.state().expect("state").approximate_len(), 0, "all purged");
}

/// Records through the first phase in batches of `batch_size`, the partials of `gather`
/// batches at a time into a window reading partials (allowed lateness 0, late partials
/// dropped), with a `BoundedOutOfOrderness` watermark of `bound` after each of those; the
/// window is rebuilt from its backend every `restart_every` window batches. Returns the
/// results in emission order, the late partials and the state entries left.
pub(super) fn drive_two_phase(
    kind: WindowKind,
    bound: i64,
    events: &[Ev],
    batch_size: usize,
    gather: usize,
    restart_every: usize,
) -> (Vec<Emitted>, u64, usize) {
    let new = |state: Box<dyn StateBackend>| {
        WindowOperator::new("win", partials_config(kind), SumCount::default(), state).with_write_back_budget(2_048)
    };
    let mut local = LocalWindowAggregate::new("win", kind, KeyBy::Key, SumCount::default());
    let mut window = new(Box::<HeapStateBackend>::default());
    let mut generator = BoundedOutOfOrderness::new(bound);
    let (mut in_order, mut late) = (Vec::new(), 0);
    for (n, records) in events.chunks(batch_size * gather).enumerate() {
        let mut input = RecordBatch::default();
        for chunk in records.chunks(batch_size) {
            input.try_extend(&local.fold(&batch(chunk)).expect("fold")).expect("room");
        }
        in_order.extend(emitted(&window.process(&input).expect("process").main));
        for e in records {
            generator.on_event(e.ts);
        }
        let out = window.on_watermark(generator.current()).expect("watermark");
        check_firing_order(kind, &out.main);
        in_order.extend(emitted(&out.main));
        if (n + 1) % restart_every == 0 {
            late += window.late_records();
            window = new(window.into_state().expect("written back"));
            let out = window.on_watermark(generator.current()).expect("watermark after a restore");
            assert!(out.main.is_empty(), "a restored operator re-fired {:?}", emitted(&out.main));
        }
    }
    in_order.extend(emitted(&window.on_watermark(i64::MAX).expect("final watermark").main));
    late += window.late_records();
    (in_order, late, window.state().expect("written back").approximate_len())
}
