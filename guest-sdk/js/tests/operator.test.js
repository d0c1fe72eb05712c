// The operator and aggregate runners on the in-memory host (eddy/testing): state semantics,
// timers, side outputs, errors and what a failed call leaves behind. Oracles are literal
// tables and plain arithmetic, not the SDK.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Aggregate, BadRecord, EVENT_TIME, Operator, schema } from "../eddy/index.js";
import { Runner } from "../eddy/operator.js";
import { arrayText } from "../eddy/state.js";
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

// What the JSON views of a batch must not change: order, snapshots, records kept, fallbacks.

const Blob = schema("Blob", { name: "", data: new Uint8Array(0) });

// Emits every form to one output, in an order the output must keep.
class Mixed extends Operator {
  process(record, ctx) {
    const shared = { n: 1 };
    ctx.emit(record.key, shared);
    shared.n = 2; // after the emit: not in the output
    ctx.emit(record.key, new Bid({ type: "bid", auction: 7, price: -3 }));
    ctx.emit(record.key, new Blob({ name: "b", data: Uint8Array.of(0, 255) }));
    ctx.emitValue(1.5);
    ctx.emit(record.key, 12345678901234567n);
    ctx.emit(record.key, 1e21);
    ctx.emit(record.key, "last");
  }
}

// Keeps its records past their calls, and mutates what it got from state.
class Keeper extends Operator {
  open(ctx) {
    this.kept = [];
    this.items = ctx.valueState("items");
  }

  process(record, ctx) {
    this.kept.push(record);
    const items = this.items.get([]);
    items.push(record.value);
    this.items.set(items);
    items.push("not set"); // after the set: not stored
    ctx.emitValue(this.kept.map((r) => [r.key, r.value]));
  }
}

test("every form of output keeps its order, and emitted values their state at the emit", () => {
  const h = new Harness(Mixed);
  assert.deepEqual(plain(h.process([["k", 0]])), [
    ["k", { n: 1 }],
    ["k", { type: "bid", auction: 7, price: -3 }],
    ["k", { name: "b", data: Uint8Array.of(0, 255) }],
    [null, 1.5],
    ["k", 12345678901234567n],
    ["k", 1e21],
    ["k", "last"],
  ]);
});

test("a batch's JSON text is what serde_json writes, whichever writer ran", () => {
  // serde_json's texts (as the shared codec table has them): integers exact, floats as f64.
  const table = [
    [[1, "a", null, true], '[1,"a",null,true]'],
    [[12345678901234567n], "[12345678901234567]"],
    [[1e21, 1.5e300, 1e16], "[1e+21,1.5e+300,1e+16]"],
    [[9007199254740994], "[9007199254740994.0]"],
    [["e+", 0.1], '["e+",0.1]'],
  ];
  for (const [values, text] of table) assert.equal(arrayText(values), text, JSON.stringify(String(values)));
});

test("records outlive their call, and state values are copies", () => {
  const h = new Harness(Keeper);
  h.process([["a", "x"]]);
  const out = plain(h.process([["a", "y"], ["b", "z"]]));
  assert.deepEqual(out.at(-1), [null, [["a", "x"], ["a", "y"], ["b", "z"]]]);
  assert.deepEqual(h.value("items", "a"), ["x", "y"]);
});

test("values no view can carry are read one by one", () => {
  // A row holding bytes has no exact JSON: the batch's values are read from their bytes.
  const out = plain(new Harness(Fields).process([[null, new Blob({ name: "b", data: Uint8Array.of(1) })], [null, new Bid({ type: "bid", auction: 1, price: 2 })]]));
  assert.deepEqual(out, [[null, [null, null, "none"]], [null, ["bid", 2, "none"]]]);
});

test("a record without a key says so when its key is read", () => {
  class KeyReader extends Operator {
    process(record, ctx) {
      ctx.emitValue(record.value);
      ctx.emitValue(record.key);
    }
  }
  assert.throws(() => new Harness(KeyReader).process([[null, 5]]), (e) => e instanceof Failed && e.kind === "bad-record" && /record has no key/.test(e.detail));
});

test("what JSON cannot hold fails the call that gave it", () => {
  class Nan extends Operator {
    open(ctx) {
      this.s = ctx.valueState("s");
    }

    process() {
      this.s.set(NaN);
    }
  }
  assert.throws(() => new Harness(Nan).process([["a", 1]]), (e) => e instanceof Failed && /cannot be written as JSON/.test(e.detail));
});
