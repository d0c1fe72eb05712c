// The operator and aggregate runners on the in-memory host (eddy/testing): state semantics,
// timers, side outputs, errors and what a failed call leaves behind. Oracles are literal
// tables and plain arithmetic, not the SDK.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Aggregate, BadRecord, EVENT_TIME, Operator, schema } from "../eddy/index.js";
import { Runner } from "../eddy/operator.js";
import { AggregateHarness, Failed, Harness } from "../eddy/testing.js";

class Counter extends Operator {
  open(ctx, config) {
    this.count = ctx.valueState("count");
    this.step = config?.step ?? 1;
  }

  process(record, ctx) {
    const n = this.count.get(0) + this.step;
    this.count.set(n);
    ctx.emit(record.key, n);
  }
}

// Keeps every value per key in a list and a map of value -> occurrences.
class Lists extends Operator {
  open(ctx) {
    this.seen = ctx.listState("seen");
    this.counts = ctx.mapState("counts");
    this.dupes = ctx.sideOutput("dupes");
  }

  process(record, ctx) {
    this.seen.append(record.value);
    const n = this.counts.get(record.value, 0) + 1;
    this.counts.put(record.value, n);
    if (n > 1) ctx.emit(record.key, record.value, this.dupes);
    ctx.emit(record.key, { seen: this.seen.get(), counts: Object.fromEntries(this.counts.entries()) });
  }
}

class Failing extends Operator {
  open(ctx) {
    this.count = ctx.valueState("count");
  }

  process(record, ctx) {
    this.count.set(this.count.get(0) + 1);
    ctx.emit(record.key, "before the failure");
    if (record.value === "boom") null.boom();
    if (record.value === "bad") throw new BadRecord("bad is not a number");
    if (record.value === "string") throw "a thrown string";
  }
}

class Timers extends Operator {
  process(record, ctx) {
    ctx.registerTimer(EVENT_TIME, record.value);
    ctx.registerTimer(EVENT_TIME, record.value); // twice: fires once
  }

  onTimer(timer, ctx) {
    ctx.emit(timer.key, [timer.timestamp, ctx.watermark()]);
  }
}

class StateInOpen extends Operator {
  open(ctx) {
    ctx.valueState("count").get();
  }
}

const Bid = schema("Bid", { type: "", auction: 0, price: 0 });

class Fields extends Operator {
  process(record, ctx) {
    ctx.emitValue([record.field("type"), record.field("price"), record.field("nope", "none")]);
  }
}

const Totals = schema("Totals", { purchases: 0, total_cents: 0 });

class PurchaseTotals extends Aggregate {
  static accumulator = Totals;

  createAccumulator() {
    return new Totals();
  }

  add(acc, record) {
    acc.purchases += 1;
    acc.total_cents += record.field("amount_cents");
  }

  merge(a, b) {
    return new Totals({ purchases: a.purchases + b.purchases, total_cents: a.total_cents + b.total_cents });
  }
}

const plain = (outputs) => outputs.map((o) => [...o]);

test("value state counts across records and batches", () => {
  const h = new Harness(Counter);
  assert.deepEqual(plain(h.process([["a", 1], ["b", 1], ["a", 1]])), [["a", 1], ["b", 1], ["a", 2]]);
  assert.deepEqual(plain(h.process([["a", 1]])), [["a", 3]]);
  assert.equal(h.value("count", "a"), 3);
  assert.deepEqual(plain(new Harness(Counter, { step: 5 }).process([["x", 0]])), [["x", 5]]);
});

test("list and map state and side outputs", () => {
  const h = new Harness(Lists);
  h.process([["k", "x"], ["k", "y"]]);
  const out = h.process([["k", "x"], ["j", "x"]]);
  const main = plain(out.filter((o) => o.side === null));
  const dupes = plain(out.filter((o) => o.side === "dupes"));
  assert.deepEqual(main[0], ["k", { seen: ["x", "y", "x"], counts: { x: 2, y: 1 } }]);
  assert.deepEqual(main[1], ["j", { seen: ["x"], counts: { x: 1 } }]);
  assert.deepEqual(dupes, [["k", "x"]]);
});

test("an exception fails the call with its message and drops its writes and output", () => {
  const h = new Harness(Failing);
  assert.deepEqual(plain(h.process([["a", "ok"]])), [["a", "before the failure"]]);
  assert.throws(() => h.process([["a", "ok"], ["a", "boom"]]), (e) => e instanceof Failed && e.kind === "failed" && /^TypeError: Cannot read properties of null/.test(e.detail));
  assert.ok(h.host.logs.some(([level, line]) => level === "error" && line.includes("operator.test.js")), "the stack reaches the log");
  assert.equal(h.value("count", "a"), 1, "the failed call's writes did not land");
  assert.deepEqual(h.host.emitted, [], "nor did its output");
  assert.throws(() => h.process([["a", "bad"]]), (e) => e.kind === "bad-record" && e.detail === "bad is not a number");
  assert.throws(() => h.process([["a", "string"]]), (e) => e.kind === "failed" && e.detail === "thrown: a thrown string");
});

test("timers fire once in timestamp order when time passes them", () => {
  const h = new Harness(Timers);
  h.process([["a", 30], ["b", 10], ["a", 20]]);
  assert.deepEqual(plain(h.advanceWatermark(15)), [["b", [10, 15]]]);
  assert.deepEqual(plain(h.advanceWatermark(40)), [["a", [20, 40]], ["a", [30, 40]]]);
  assert.deepEqual(plain(h.advanceWatermark(50)), []);
});

test("state without a key is refused with what to do", () => {
  assert.throws(() => new Harness(StateInOpen), (e) => e.detail.includes("there is none in open/close"));
  assert.throws(() => new Harness(Counter).process([[null, 1]]), (e) => e.detail.includes("add key_by before this step"));
});

test("one field is read from a row or JSON", () => {
  const h = new Harness(Fields);
  const out = h.process([[null, new Bid({ type: "bid", auction: 7, price: 300 })], [null, { type: "person", price: 2 }], [null, 5]]);
  assert.deepEqual(plain(out), [[null, ["bid", 300, "none"]], [null, ["person", 2, "none"]], [null, [null, null, "none"]]]);
});

test("bad config is named", () => {
  const h = new Harness(Counter);
  const failure = new Runner(Counter, h.host).open("{not json");
  assert.equal(failure[0], "bad-config");
  assert.match(failure[1], /not JSON/);
});

test("accumulators fold, merge and give results", () => {
  const h = new AggregateHarness(PurchaseTotals);
  const a = h.accumulate([{ amount_cents: 100 }, { amount_cents: 250 }]);
  const b = h.accumulate([{ amount_cents: 7 }], a);
  assert.deepEqual({ ...h.result(b) }, { purchases: 3, total_cents: 357 });
  assert.deepEqual({ ...h.result(h.merge(a, b)) }, { purchases: 5, total_cents: 707 });
  assert.deepEqual({ ...h.window([]) }, { purchases: 0, total_cents: 0 });
});

test("an aggregate without merge says so", () => {
  class NoMerge extends Aggregate {
    createAccumulator() {
      return 0;
    }

    add(acc) {
      return acc + 1;
    }
  }
  const h = new AggregateHarness(NoMerge);
  assert.equal(h.window([1, 2, 3]), 3);
  assert.throws(() => h.merge(h.accumulate([1]), h.accumulate([2])), (e) => e.detail.includes("does not merge accumulators"));
});
