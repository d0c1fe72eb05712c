"""The operator and aggregate runners on the in-memory host (eddy.testing): state semantics,
timers, side outputs, errors and what a failed call leaves behind. Oracles are literal
tables and plain dict arithmetic, not the SDK."""

import unittest
from dataclasses import dataclass

import eddy
from eddy.testing import AggregateHarness, Failed, Harness


class Counter(eddy.Operator):
    def open(self, ctx, config):
        self.count = ctx.value_state("count")
        self.step = (config or {}).get("step", 1)

    def process(self, record, ctx):
        n = self.count.get(0) + self.step
        self.count.set(n)
        ctx.emit(record.key, n)


class Lists(eddy.Operator):
    """Keeps every value per key in a list and a map of value -> occurrences."""

    def open(self, ctx, config):
        self.seen = ctx.list_state("seen")
        self.counts = ctx.map_state("counts")
        self.dupes = ctx.side_output("dupes")

    def process(self, record, ctx):
        self.seen.append(record.value)
        n = self.counts.get(record.value, 0) + 1
        self.counts.put(record.value, n)
        if n > 1:
            ctx.emit(record.key, record.value, to=self.dupes)
        ctx.emit(record.key, {"seen": self.seen.get(), "counts": dict(self.counts.items())})


class Failing(eddy.Operator):
    def open(self, ctx, config):
        self.count = ctx.value_state("count")

    def process(self, record, ctx):
        self.count.set(self.count.get(0) + 1)
        ctx.emit(record.key, "before the failure")
        if record.value == "boom":
            raise ZeroDivisionError("the record said boom")
        if record.value == "bad":
            raise eddy.BadRecord("bad is not a number")


class Timers(eddy.Operator):
    def process(self, record, ctx):
        ctx.register_timer(eddy.EVENT_TIME, record.value)
        ctx.register_timer(eddy.EVENT_TIME, record.value)  # twice: fires once

    def on_timer(self, timer, ctx):
        ctx.emit(timer.key, [timer.timestamp, ctx.watermark()])


class StateInOpen(eddy.Operator):
    def open(self, ctx, config):
        self.count = ctx.value_state("count")
        self.count.get()


@dataclass
class Bid:
    type: str
    auction: int
    price: int


class Fields(eddy.Operator):
    def process(self, record, ctx):
        ctx.emit_value([record.field("type"), record.field("price"), record.field("nope", "none")])


@dataclass
class Totals:
    purchases: int = 0
    total_cents: int = 0


class PurchaseTotals(eddy.Aggregate):
    accumulator = Totals

    def create_accumulator(self):
        return Totals()

    def add(self, acc, record):
        acc.purchases += 1
        acc.total_cents += record.value["amount_cents"]

    def merge(self, a, b):
        return Totals(a.purchases + b.purchases, a.total_cents + b.total_cents)


class Operators(unittest.TestCase):
    def test_value_state_counts_across_records_and_batches(self):
        h = Harness(Counter)
        self.assertEqual(h.process([("a", 1), ("b", 1), ("a", 1)]), [("a", 1), ("b", 1), ("a", 2)])
        self.assertEqual(h.process([("a", 1)]), [("a", 3)])
        self.assertEqual(h.value("count", "a"), 3)
        self.assertEqual(Harness(Counter, config={"step": 5}).process([("x", 0)]), [("x", 5)])

    def test_list_map_state_and_side_outputs(self):
        h = Harness(Lists)
        h.process([("k", "x"), ("k", "y")])
        out = h.process([("k", "x"), ("j", "x")])
        main = [o for o in out if o.side is None]
        dupes = [o for o in out if o.side == "dupes"]
        self.assertEqual(main[0], ("k", {"seen": ["x", "y", "x"], "counts": {"x": 2, "y": 1}}))
        self.assertEqual(main[1], ("j", {"seen": ["x"], "counts": {"x": 1}}))
        self.assertEqual(dupes, [("k", "x")])

    def test_an_exception_fails_the_call_with_its_message_and_drops_its_writes_and_output(self):
        h = Harness(Failing)
        self.assertEqual(h.process([("a", "ok")]), [("a", "before the failure")])
        with self.assertRaises(Failed) as failed:
            h.process([("a", "ok"), ("a", "boom")])
        self.assertEqual(failed.exception.kind, "failed")
        self.assertIn("ZeroDivisionError: the record said boom", failed.exception.message)
        self.assertTrue(any("Traceback" in line for level, line in h.host.logs if level == "error"))
        self.assertEqual(h.value("count", "a"), 1, "the failed call's writes did not land")
        self.assertEqual(h.host.emitted, [], "nor did its output")
        with self.assertRaises(Failed) as bad:
            h.process([("a", "bad")])
        self.assertEqual((bad.exception.kind, bad.exception.message), ("bad-record", "bad is not a number"))

    def test_timers_fire_once_in_timestamp_order_when_time_passes_them(self):
        h = Harness(Timers)
        h.process([("a", 30), ("b", 10), ("a", 20)])
        self.assertEqual(h.advance_watermark(15), [("b", [10, 15])])
        self.assertEqual(h.advance_watermark(40), [("a", [20, 40]), ("a", [30, 40])])
        self.assertEqual(h.advance_watermark(50), [])

    def test_state_without_a_key_is_refused_with_what_to_do(self):
        with self.assertRaises(Failed) as failed:
            Harness(StateInOpen)
        self.assertIn("there is none in open/close", failed.exception.message)
        with self.assertRaises(Failed) as unkeyed:
            Harness(Counter).process([(None, 1)])
        self.assertIn("add key_by before this step", unkeyed.exception.message)

    def test_one_field_is_read_from_a_row_or_json(self):
        h = Harness(Fields)
        out = h.process([(None, Bid("bid", 7, 300)), (None, {"type": "person", "price": 2}), (None, 5)])
        self.assertEqual(out, [(None, ["bid", 300, "none"]), (None, ["person", 2, "none"]), (None, [None, None, "none"])])

    def test_bad_config_is_named(self):
        from eddy.operator import Runner
        from eddy.testing import _Host

        failure = Runner(Counter, _Host()).open("{not json")
        self.assertEqual(failure[0], "bad-config")
        self.assertIn("not JSON", failure[1])


@dataclass
class Blob:
    """A row the host cannot write from JSON (bytes): it goes the binary way."""

    name: str
    data: bytes


class Mixed(eddy.Operator):
    """Emits every form to one output, in an order the output must keep."""

    def process(self, record, ctx):
        shared = {"n": 1}
        ctx.emit(record.key, shared)
        shared["n"] = 2  # after the emit: not in the output
        ctx.emit(record.key, Bid("bid", 7, -3))
        ctx.emit(record.key, Blob("b", b"\x00\xff"))
        ctx.emit_value(1.5)
        ctx.emit(record.key, "last")


class Keeper(eddy.Operator):
    """Keeps its records past their calls, and mutates what it got from state."""

    def open(self, ctx, config):
        self.kept = []
        self.items = ctx.value_state("items")

    def process(self, record, ctx):
        self.kept.append(record)
        items = self.items.get([])
        items.append(record.value)
        self.items.set(items)
        items.append("not set")  # after the set: not stored
        ctx.emit_value([[r.key, r.value] for r in self.kept])


class BatchViews(unittest.TestCase):
    """What the JSON views of a batch must not change: order, snapshots, records kept, fallbacks."""

    def test_every_form_of_output_keeps_its_order_and_emitted_values_their_state_at_emit(self):
        out = Harness(Mixed).process([("k", 0)])
        self.assertEqual(
            out,
            [
                ("k", {"n": 1}),
                ("k", {"type": "bid", "auction": 7, "price": -3}),
                ("k", {"name": "b", "data": b"\x00\xff"}),
                (None, 1.5),
                ("k", "last"),
            ],
        )

    def test_records_outlive_their_call_and_state_values_are_copies(self):
        h = Harness(Keeper)
        h.process([("a", "x")])
        out = h.process([("a", "y"), ("b", "z")])
        self.assertEqual(out[-1], (None, [["a", "x"], ["a", "y"], ["b", "z"]]))
        self.assertEqual(h.value("items", "a"), ["x", "y"])

    def test_values_no_view_can_carry_are_read_one_by_one(self):
        # A row holding bytes has no exact JSON: the batch's values are read from their bytes.
        out = Harness(Fields).process([(None, Blob("b", b"\x01")), (None, Bid("bid", 1, 2))])
        self.assertEqual(out, [(None, [None, None, "none"]), (None, ["bid", 2, "none"])])

    def test_a_record_without_a_key_says_so_when_its_key_is_read(self):
        class KeyReader(eddy.Operator):
            def process(self, record, ctx):
                ctx.emit_value(record.value)
                ctx.emit_value(record.key)

        with self.assertRaises(Failed) as failed:
            Harness(KeyReader).process([(None, 5)])
        self.assertEqual(failed.exception.kind, "bad-record")
        self.assertIn("record has no key", failed.exception.message)

    def test_what_json_cannot_hold_fails_the_call_that_gave_it(self):
        class Nan(eddy.Operator):
            def open(self, ctx, config):
                self.s = ctx.value_state("s")

            def process(self, record, ctx):
                self.s.set(float("nan"))

        with self.assertRaises(Failed) as failed:
            Harness(Nan).process([("a", 1)])
        self.assertIn("cannot be written as JSON", failed.exception.message)


class Aggregates(unittest.TestCase):
    def test_accumulators_fold_merge_and_result(self):
        h = AggregateHarness(PurchaseTotals)
        a = h.accumulate([{"amount_cents": 100}, {"amount_cents": 250}])
        b = h.accumulate([{"amount_cents": 7}], acc=a)
        self.assertEqual(h.result(b), {"purchases": 3, "total_cents": 357})
        self.assertEqual(h.result(h.merge(a, b)), {"purchases": 5, "total_cents": 707})
        self.assertEqual(h.window([]), {"purchases": 0, "total_cents": 0})

    def test_an_aggregate_without_merge_says_so(self):
        class NoMerge(eddy.Aggregate):
            def create_accumulator(self):
                return 0

            def add(self, acc, record):
                return acc + 1

        h = AggregateHarness(NoMerge)
        self.assertEqual(h.window([1, 2, 3]), 3)
        with self.assertRaises(Failed) as failed:
            h.merge(b"1", b"2")
        self.assertIn("session windows need merge", failed.exception.message)


if __name__ == "__main__":
    unittest.main()
