// Run an operator or aggregate in plain Node, without a component or the host, for unit
// tests. The in-memory host keeps state per (state, key) as the real one does (keys and values
// as the bytes the SDK writes), fires timers in timestamp order when time is advanced, and
// decodes what the operator emits:
//
//     import { Harness } from "eddy/testing";
//     const h = new Harness(Count);
//     assert.deepEqual(h.process([["fox", 1], ["fox", 2]]), [["fox", 1], ["fox", 3]]);
//
// It checks the contract the host enforces (state only under a record's or timer's key,
// timers only for it), but not the host's limits or the sandbox: `eddy run` does that.

import { AggregateRunner } from "./aggregate.js";
import { view, Writer } from "./bytes.js";
import * as codec from "./codec.js";
import * as json from "./json.js";
import { ABSENT, EVENT_TIME, PROCESSING_TIME, Runner } from "./operator.js";
import { schemaId, writeRow } from "./rows.js";
import { arrayText } from "./state.js";

export const MIN_WATERMARK = -(2 ** 63);
const LEVELS = ["trace", "debug", "info", "warn", "error"];

/** The operator failed a call: `kind` is the WIT error kind, the message what it said. */
export class Failed extends Error {
  constructor(kind, message) {
    super(`${kind}: ${message}`);
    this.kind = kind;
    this.detail = message;
  }
}

const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
const fromHex = (text) => Uint8Array.from(text.match(/../g) ?? [], (h) => parseInt(h, 16));
const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

/** The imports, kept in memory; keys and values as hex of their bytes. */
class MemoryHost {
  constructor() {
    this.schemas = new Map();
    this.states = new Map();
    this.values = new Map();
    this.lists = new Map();
    this.maps = new Map();
    this.timers = new Map();
    this.sides = new Map();
    this.keys = [];
    this.emitted = [];
    this.logs = [];
    this.watermark = MIN_WATERMARK;
    this.now = 0;
    // The \`process\` call in progress: [data, records, prefetched states, prefetched cells].
    this.batch = null;
    this.reader = new codec.Schemas(this.declareSchema, this.schemaFields);
  }

  declareSchema = (name, fields) => {
    const id = schemaId(name, fields);
    this.schemas.set(id, [name, [...fields]]);
    return id;
  };

  schemaFields = (id) => this.schemas.get(id) ?? null;

  declareState(name, kind, _prefetch) {
    const known = this.states.get(name);
    if (known && known[1] !== kind) throw new Error(`state ${name} declared as ${known[1]} and then as ${kind} (the host traps)`);
    if (!known) this.states.set(name, [this.states.size, kind]);
    return this.states.get(name)[0];
  }

  key(state, handle) {
    const key = this.keys[handle];
    if (key === undefined || key === null) throw new Error(`key handle ${handle} names no key of this call (the host traps)`);
    return `${state}/${key}`;
  }

  valueGet(state, handle) {
    return this.values.get(this.key(state, handle)) ?? null;
  }

  listGet(state, handle) {
    return [...(this.lists.get(this.key(state, handle)) ?? [])];
  }

  listAppend(state, handle, item) {
    const key = this.key(state, handle);
    this.lists.set(key, [...(this.lists.get(key) ?? []), item.slice()]);
  }

  listReplace(state, handle, items) {
    this.lists.set(this.key(state, handle), items.map((i) => i.slice()));
  }

  mapOf(state, handle) {
    const key = this.key(state, handle);
    if (!this.maps.has(key)) this.maps.set(key, new Map());
    return this.maps.get(key);
  }

  mapGet(state, handle, k) {
    return this.mapOf(state, handle).get(hex(k)) ?? null;
  }

  mapPut(state, handle, k, v) {
    this.mapOf(state, handle).set(hex(k), v.slice());
  }

  mapRemove(state, handle, k) {
    this.mapOf(state, handle).delete(hex(k));
  }

  mapEntries(state, handle) {
    return [...this.mapOf(state, handle).entries()].sort((a, b) => cmp(a[0], b[0])).map(([k, v]) => [fromHex(k), v]);
  }

  clear(state, handle) {
    const key = this.key(state, handle);
    this.values.delete(key);
    this.lists.delete(key);
    this.maps.delete(key);
  }

  timerId(handle, domain, at) {
    this.key(0, handle);
    return `${domain}/${at}/${this.keys[handle]}`;
  }

  registerTimer(handle, domain, at) {
    this.timers.set(this.timerId(handle, domain, at), [domain, at, this.keys[handle]]);
  }

  deleteTimer(handle, domain, at) {
    this.timers.delete(this.timerId(handle, domain, at));
  }

  currentWatermark() {
    return this.watermark;
  }

  currentProcessingTime() {
    return this.now;
  }

  sideOutput(name) {
    if (!this.sides.has(name)) this.sides.set(name, this.sides.size + 1);
    return this.sides.get(name);
  }

  emit(data, records) {
    const t = view(records);
    for (let at = 0; at < records.length; at += 32) {
      const ko = t.getUint32(at, true);
      const kl = t.getUint32(at + 4, true);
      const vo = t.getUint32(at + 8, true);
      const vl = t.getUint32(at + 12, true);
      const ts = t.getUint32(at + 24, true) & 1 ? Number(t.getBigInt64(at + 16, true)) : null;
      this.emitted.push([kl === ABSENT ? null : data.slice(ko, ko + kl), data.slice(vo, vo + vl), ts, t.getUint32(at + 28, true)]);
    }
  }

  log(level, message) {
    this.logs.push([LEVELS[level], message]);
  }

  // The `json-batch` views and writes, as the host answers them.

  jsonKeys() {
    try {
      return arrayText(this.keys.map((k) => (k === null ? null : json.decodeJson(fromHex(k)))));
    } catch {
      return null;
    }
  }

  jsonValues() {
    const [data, table] = this.inProcess();
    const t = view(table);
    const values = [];
    try {
      for (let at = 0; at < table.length; at += 32) {
        const vo = t.getUint32(at + 8, true);
        values.push(codec.decodeValue(data, vo, vo + t.getUint32(at + 12, true), this.reader));
      }
    } catch {
      return null;
    }
    return values.every(exact) ? arrayText(values) : null;
  }

  jsonPrefetched(state) {
    const [data, , states, cells] = this.inProcess();
    const column = states.indexOf(state);
    if (column < 0) throw new Error(`state ${state} is not prefetched (the host traps)`);
    const c = view(cells);
    const values = [];
    for (let at = 8 * column; at < cells.length; at += 8 * states.length) {
      const off = c.getUint32(at, true);
      const length = c.getUint32(at + 4, true);
      values.push(length === ABSENT ? null : json.decodeJson(data, off, off + length));
    }
    return arrayText(values);
  }

  jsonSetValues(state, writes) {
    const [handles, values, cleared] = json.parseJson(writes);
    if (handles.length !== values.length) throw new Error("as many handles as values (the host traps)");
    handles.forEach((h, i) => this.values.set(this.key(state, h), json.encodeJson(values[i])));
    for (const h of cleared) this.values.delete(this.key(state, h));
  }

  jsonEmit(output, keyed, schema, records) {
    const items = json.parseJson(records);
    const width = keyed ? 3 : 2;
    for (let at = 0; at < items.length; at += width) {
      const value = items[at + width - 2];
      const encoded = schema === 0 ? json.encodeJson(value) : writeRow(value, schema >>> 0);
      this.emitted.push([keyed ? json.encodeJson(items[at]) : null, encoded, items[at + width - 1], output]);
    }
  }

  inProcess() {
    if (this.batch === null) throw new Error("json-batch values serve only process (the host traps)");
    return this.batch;
  }
}

/** Whether JSON says `value` exactly (the host's views refuse bytes and non-finite numbers). */
function exact(value) {
  if (value instanceof Uint8Array) return false;
  if (typeof value === "number") return Number.isFinite(value);
  if (value !== null && typeof value === "object") return Object.values(value).every(exact);
  return true;
}

function check(failure) {
  if (failure !== null) throw new Failed(failure[0], failure[1]);
}

function configText(config) {
  return config === undefined || config === null ? "" : json.jsonText(config);
}

/** One operator instance over the in-memory host. Output records are [key, value] arrays
 * with `timestamp` and `side` (null for the main output) properties. */
export class Harness {
  constructor(operatorClass, config) {
    this.host = new MemoryHost();
    this.schemas = new codec.Schemas(this.host.declareSchema, this.host.schemaFields);
    this.runner = new Runner(operatorClass.eddyOperator ?? operatorClass, this.host);
    check(this.runner.open(configText(config)));
  }

  outputs() {
    const sides = new Map([...this.host.sides].map(([k, v]) => [v, k]));
    const out = this.host.emitted.map(([key, value, ts, side]) => {
      const o = [key === null ? null : json.decodeJson(key), codec.decodeValue(value, 0, value.length, this.schemas)];
      o.timestamp = ts;
      o.side = sides.get(side) ?? null;
      return o;
    });
    this.host.emitted = [];
    return out;
  }

  /** Hands `records` ([key, value] or [key, value, timestamp]; key null for an unkeyed
   * record) to the operator as one batch; returns what it emitted. */
  process(records) {
    const data = new Writer();
    const table = new Writer();
    const first = new Map();
    this.host.keys = [];
    records.forEach(([key, value, ts = null], i) => {
      const v = codec.encodeValue(value, this.schemas);
      let ko = 0;
      let kl = ABSENT;
      let slot = i;
      if (key === null) {
        this.host.keys.push(null);
      } else {
        const k = json.encodeJson(key);
        ko = data.length;
        kl = k.length;
        data.append(k);
        if (!first.has(hex(k))) first.set(hex(k), i);
        slot = first.get(hex(k));
        this.host.keys.push(hex(k));
      }
      const vo = data.length;
      data.append(v);
      for (const n of [ko, kl, vo, v.length]) table.u32(n);
      table.i64(ts ?? 0);
      table.u32(ts === null ? 0 : 1);
      table.u32(slot);
    });
    // Every value state is prefetched, as the host does for states declared with prefetch.
    const prefetched = [...this.host.states.values()].filter(([, kind]) => kind === "value").map(([id]) => id).sort((a, b) => a - b);
    const cells = new Writer();
    for (const key of this.host.keys) {
      for (const state of prefetched) {
        const value = key === null ? undefined : this.host.values.get(`${state}/${key}`);
        if (value === undefined) {
          cells.u32(0);
          cells.u32(ABSENT);
        } else {
          cells.u32(data.length);
          cells.u32(value.length);
          data.append(value);
        }
      }
    }
    this.host.batch = [data.take(), table.take(), prefetched, cells.take()];
    try {
      check(this.runner.process(...this.host.batch));
    } finally {
      this.host.batch = null;
    }
    return this.outputs();
  }

  fire(domain, upto) {
    const due = [...this.host.timers.entries()].filter(([, [d, at]]) => d === domain && at <= upto).sort((a, b) => a[1][1] - b[1][1] || cmp(a[1][2], b[1][2]));
    if (due.length === 0) return [];
    const data = new Writer();
    const refs = [];
    const first = new Map();
    this.host.keys = [];
    due.forEach(([id, [, at, key]], i) => {
      this.host.timers.delete(id);
      const bytes = fromHex(key);
      if (!first.has(key)) first.set(key, i);
      refs.push([data.length, bytes.length, at, domain, first.get(key)]);
      data.append(bytes);
      this.host.keys.push(key);
    });
    check(this.runner.onTimer(data.take(), refs));
    return this.outputs();
  }

  /** Moves event time to `watermark`, firing due event-time timers; returns the output. */
  advanceWatermark(watermark) {
    this.host.watermark = watermark;
    return this.fire(EVENT_TIME, watermark);
  }

  /** Moves the host's clock to `now`, firing due processing-time timers; returns the output. */
  advanceProcessingTime(now) {
    this.host.now = now;
    return this.fire(PROCESSING_TIME, now);
  }

  close() {
    check(this.runner.close());
    return this.outputs();
  }

  /** The registered timers: [domain, timestamp, key], sorted. */
  timers() {
    return [...this.host.timers.values()].map(([d, at, k]) => [d, at, json.decodeJson(fromHex(k))]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  }

  /** What value state `state` holds for `key` (decoded), null if nothing. */
  value(state, key) {
    const [id] = this.host.states.get(state);
    const raw = this.host.values.get(`${id}/${hex(json.encodeJson(key))}`);
    return raw === undefined ? null : json.decodeJson(raw);
  }
}

/** One aggregate instance, driven as a window would drive it. */
export class AggregateHarness {
  constructor(aggregateClass, config) {
    this.host = new MemoryHost();
    this.schemas = new codec.Schemas(this.host.declareSchema, this.host.schemaFields);
    this.runner = new AggregateRunner(aggregateClass.eddyAggregate ?? aggregateClass, this.host);
    check(this.runner.open(configText(config))[1]);
  }

  answer([result, failure]) {
    check(failure);
    return result;
  }

  /** Folds `values` (record values) into `acc` (bytes; a new accumulator if omitted) in one
   * `add`; returns the new accumulator's bytes. */
  accumulate(values, acc) {
    const start = acc ?? this.answer(this.runner.createAccumulator());
    const data = new Writer();
    const table = new Writer();
    values.forEach((value, i) => {
      const v = codec.encodeValue(value, this.schemas);
      for (const n of [0, ABSENT, data.length, v.length]) table.u32(n);
      table.i64(0);
      table.u32(0);
      table.u32(i);
      data.append(v);
    });
    const updates = new Writer();
    for (const n of [0, start.length, 0, values.length]) updates.u32(n);
    const [out, spans] = this.answer(this.runner.add(data.take(), table.take(), start, updates.take(), values.map((_, i) => i)));
    const s = view(spans);
    return out.slice(s.getUint32(0, true), s.getUint32(0, true) + s.getUint32(4, true));
  }

  merge(a, b) {
    return this.answer(this.runner.merge(a, b));
  }

  /** What a window holding accumulator `acc` (bytes) emits, decoded. */
  result(acc) {
    const spans = new Writer();
    spans.u32(0);
    spans.u32(acc.length);
    const [out, outSpans] = this.answer(this.runner.getResults(acc, spans.take()));
    const s = view(outSpans);
    const off = s.getUint32(0, true);
    return codec.decodeValue(out, off, off + s.getUint32(4, true), this.schemas);
  }

  /** The result of one window over `values`. */
  window(values) {
    return this.result(this.accumulate(values));
  }
}
