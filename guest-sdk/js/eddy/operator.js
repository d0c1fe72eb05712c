// Keyed operators: the `Operator` class users extend, what it is handed, and the runner that
// drives it behind the `eddy:dataflow/operator` export. A call takes a whole batch: records
// are read from the packed tables, and a record's key and value are decoded only when the
// operator asks for them. Value-state writes are buffered and handed to the host in one
// `value-set-many` at the end of the call, and output in one `emit`, so a call costs a
// handful of crossings however many records it holds. A failed call's buffered writes and
// output are dropped.

import { readI64, words, Writer } from "./bytes.js";
import * as codec from "./codec.js";
import * as errors from "./errors.js";
import * as json from "./json.js";
import * as log from "./log.js";
import * as rows from "./rows.js";

export const ABSENT = 0xffffffff;
export const EVENT_TIME = 0;
export const PROCESSING_TIME = 1;
const OUTPUT_FLUSH_BYTES = 1 << 20;
const UNSET = Symbol("unset");
// A value-state write that clears the state.
const CLEARED = Symbol("cleared");
const NO_KEY =
  "keyed state needs the current record's key: there is none in open/close (use state in " +
  "process or onTimer) nor for a record without a key (add key_by before this step)";

/** A stream operator. Extend it and export it from the component's entry module:
 *
 *     class Counter extends Operator {
 *       open(ctx) { this.count = ctx.valueState("count"); }
 *       process(record, ctx) {
 *         const n = this.count.get(0) + 1;
 *         this.count.set(n);
 *         ctx.emit(record.key, n);
 *       }
 *     }
 *     export const operator = exportOperator(Counter);
 *
 * The host makes one instance per subtask and calls `open` once, `process` for every record
 * in order, `onTimer` for every timer that fires and `close` at the end of a bounded input.
 * State handles act on the key of the record or timer being handled. */
export class Operator {
  /** Declare states and side outputs through `ctx`; `config` is the step's `config` from
   * the pipeline, decoded from JSON (null when there is none). */
  open(_ctx, _config) {}

  process(_record, _ctx) {
    throw new errors.OperatorError("an Operator must define process(record, ctx)");
  }

  /** Handles one timer of the current key; the default ignores timers. */
  onTimer(_timer, _ctx) {}

  /** Called at the end of a bounded input; the default does nothing. */
  close(_ctx) {}
}

/** One input record, valid during the call that received it. */
export class Record {
  constructor(call, ko, kl, vo, vl, timestamp) {
    this.call = call;
    this.ko = ko;
    this.kl = kl;
    this.vo = vo;
    this.vl = vl;
    /** Event time in ms since the Unix epoch, or null. */
    this.timestamp = timestamp;
    this.decodedKey = UNSET;
    this.decodedValue = UNSET;
    this.row = undefined;
    this.header = undefined;
  }

  /** The key, decoded from JSON. */
  get key() {
    if (this.decodedKey === UNSET) {
      if (this.kl === ABSENT) throw new errors.BadRecord("record has no key (is the stream keyed?)");
      try {
        this.decodedKey = json.decodeJson(this.call.data, this.ko, this.ko + this.kl);
      } catch (e) {
        throw new errors.BadRecord(`key is not JSON: ${e.message}`);
      }
      this.call.lastKey = this.decodedKey;
      this.call.lastKeyAt = this.ko;
      this.call.lastKeyLength = this.kl;
    }
    return this.decodedKey;
  }

  /** The raw key bytes, null on a stream that is not keyed. */
  get keyBytes() {
    return this.kl === ABSENT ? null : this.call.data.slice(this.ko, this.ko + this.kl);
  }

  /** The value: an object for a row or JSON object, else what the JSON holds. */
  get value() {
    if (this.decodedValue === UNSET) {
      try {
        this.decodedValue = codec.decodeValue(this.call.data, this.vo, this.vo + this.vl, this.call.schemas);
      } catch (e) {
        throw new errors.BadRecord(`value is neither JSON nor a row: ${e.message}`);
      }
    }
    return this.decodedValue;
  }

  /** The raw value bytes (a row or JSON). */
  get valueBytes() {
    return this.call.data.slice(this.vo, this.vo + this.vl);
  }

  /** Top-level field `name` of the value (`fallback` if it has none). From a row only that
   * field is read: the way to filter on one field. */
  field(name, fallback = null) {
    const data = this.call.data;
    if (this.decodedValue === UNSET && this.vl > 0 && data[this.vo] === rows.MAGIC) {
      try {
        // The row and its header are read once per record, however many fields are asked.
        if (this.row === undefined) {
          this.row = data.subarray(this.vo, this.vo + this.vl);
          this.header = rows.header(this.row);
        }
        const slot = this.call.schemas.slot(this.header.schema, name);
        if (slot < 0) return fallback;
        const v = rows.fieldOf(this.row, this.header, slot, this.call.schemas.names);
        return v === null || v === undefined ? fallback : v;
      } catch (e) {
        throw new errors.BadRecord(`value is not a whole row: ${e.message}`);
      }
    }
    const value = this.value;
    if (value === null || typeof value !== "object" || !(name in value)) return fallback;
    return value[name];
  }

  /** The value as row class `cls` (made by `schema`); fields it lacks take their defaults. */
  valueAs(cls) {
    try {
      return cls.from(this.value);
    } catch (e) {
      throw new errors.BadRecord(`value is not a ${cls.name}: ${e.message}`);
    }
  }
}

/** A timer that fired, for the current key. */
export class Timer {
  constructor(call, ko, kl, timestamp, domain) {
    this.call = call;
    this.ko = ko;
    this.kl = kl;
    /** When it was set to fire (ms). */
    this.timestamp = timestamp;
    /** `EVENT_TIME` or `PROCESSING_TIME`. */
    this.domain = domain;
  }

  /** The key it was registered for, decoded. */
  get key() {
    try {
      return json.decodeJson(this.call.data, this.ko, this.ko + this.kl);
    } catch (e) {
      throw new errors.BadRecord(`timer key is not JSON: ${e.message}`);
    }
  }

  get keyBytes() {
    return this.call.data.slice(this.ko, this.ko + this.kl);
  }
}

/** What the call in progress brought in and has buffered. */
class Call {
  constructor(host) {
    this.host = host;
    this.schemas = new codec.Schemas(host.declareSchema, host.schemaFields);
    this.handle = -1;
    this.slot = 0;
    this.row = -1;
    this.data = new Uint8Array(0);
    // prefetchCol[state id]: the state's column in `prefetched`, or undefined.
    this.prefetchCol = [];
    this.prefetchWidth = 0;
    this.prefetched = null;
    // Value-state writes in order, one per (state, key slot), in parallel arrays; a value is a
    // scalar as is (encoded at the flush), anything else already encoded (it may change after
    // the set), or CLEARED. `slotWrites[state][slot]` is the write's index + 1: typed arrays,
    // because QuickJS's Map costs microseconds per operation.
    this.slotWrites = [];
    this.writeStates = [];
    this.writeSlots = [];
    this.writeValues = [];
    this.outData = new Writer(1 << 14);
    this.outRows = new Writer(1 << 12);
    this.stateData = new Writer(1 << 12);
    this.stateTable = new Writer(1 << 12);
    this.lastKey = UNSET;
    this.lastKeyAt = 0;
    this.lastKeyLength = 0;
  }

  begin(data, prefetchedStates = [], prefetched = null) {
    this.data = data;
    this.prefetchCol.length = 0;
    for (let i = 0; i < prefetchedStates.length; i++) this.prefetchCol[prefetchedStates[i]] = i;
    this.prefetchWidth = prefetchedStates.length;
    this.prefetched = prefetched && prefetched.length > 0 ? words(prefetched) : null;
    this.clearWrites();
    this.handle = -1;
    this.row = -1;
    this.lastKey = UNSET;
  }

  keyHandle() {
    if (this.handle < 0) throw new errors.OperatorError(NO_KEY);
    return this.handle;
  }

  /** This call's write to `state` for key slot `slot`, or undefined. */
  written(state, slot) {
    const t = this.slotWrites[state];
    const i = t !== undefined && slot < t.length ? t[slot] : 0;
    return i === 0 ? undefined : this.writeValues[i - 1];
  }

  write(state, slot, value) {
    let t = this.slotWrites[state];
    if (t === undefined || slot >= t.length) {
      const grown = new Uint32Array(Math.max(1024, 2 ** Math.ceil(Math.log2(slot + 1))));
      if (t !== undefined) grown.set(t);
      this.slotWrites[state] = t = grown;
    }
    const i = t[slot];
    if (i !== 0) {
      this.writeValues[i - 1] = value;
      return;
    }
    this.writeStates.push(state);
    this.writeSlots.push(slot);
    this.writeValues.push(value);
    t[slot] = this.writeValues.length;
  }

  clearWrites() {
    const states = this.writeStates;
    const slots = this.writeSlots;
    for (let i = 0; i < states.length; i++) this.slotWrites[states[i]][slots[i]] = 0;
    states.length = 0;
    slots.length = 0;
    this.writeValues.length = 0;
  }

  flushState() {
    const states = this.writeStates;
    if (states.length === 0) return;
    const slots = this.writeSlots;
    const values = this.writeValues;
    const data = this.stateData;
    const table = this.stateTable;
    for (let i = 0; i < states.length; i++) {
      const value = values[i];
      if (value === CLEARED) {
        table.words4(states[i], slots[i], 0, ABSENT);
      } else {
        const at = data.length;
        if (value instanceof Encoded) data.append(value.bytes);
        else writeJson(data, value);
        table.words4(states[i], slots[i], at, data.length - at);
      }
    }
    this.clearWrites();
    this.host.valueSetMany(data.take(), table.take());
  }

  flushOutput() {
    if (this.outRows.length > 0) this.host.emit(this.outData.take(), this.outRows.take());
  }

  discard() {
    this.clearWrites();
    this.outData.clear();
    this.outRows.clear();
  }

  push(output, key, value, timestamp) {
    const out = this.outData;
    let ko = 0;
    let kl = ABSENT;
    if (key !== UNSET) {
      ko = out.length;
      // A key just read from a record is copied, not encoded again.
      if (key === this.lastKey && (typeof key === "string" || typeof key === "number")) {
        const at = this.lastKeyAt;
        out.copy(this.data, at, at + this.lastKeyLength);
      } else {
        writeJson(out, key);
      }
      kl = out.length - ko;
    }
    const vo = out.length;
    if (value !== null && typeof value === "object") out.append(codec.encodeValue(value, this.schemas));
    else writeJson(out, value);
    this.outRows.record(ko, kl, vo, out.length - vo, timestamp, output);
    if (out.length >= OUTPUT_FLUSH_BYTES) this.flushOutput();
  }
}

/** A value-state write of a value that may change after the set, encoded at the set. */
class Encoded {
  constructor(bytes) {
    this.bytes = bytes;
  }
}

/** JSON of `value` into `w`, with integers and plain ASCII strings written in place. */
function writeJson(w, value) {
  if (typeof value === "number" && Number.isSafeInteger(value)) {
    w.plain(String(value), false);
  } else if (typeof value !== "string" || !w.plain(value, true)) {
    w.append(json.encodeJson(value));
  }
}

/** A named side output, declared in `open`. */
export class SideOutput {
  constructor(id, name) {
    this.id = id;
    this.name = name;
  }
}

/** One value per key (JSON, as every SDK stores it). */
export class ValueState {
  constructor(call, id, name) {
    this.call = call;
    this.id = id;
    this.name = name;
  }

  /** The value for the current key, or `fallback` if none was set. */
  get(fallback = null) {
    const c = this.call;
    if (c.handle < 0) throw new errors.OperatorError(NO_KEY);
    const written = c.written(this.id, c.slot);
    if (written !== undefined) {
      if (written === CLEARED) return fallback;
      return written instanceof Encoded ? json.decodeJson(written.bytes) : written;
    }
    const col = c.prefetchCol[this.id];
    if (col !== undefined && c.row >= 0 && c.prefetched) {
      const at = 2 * (c.row * c.prefetchWidth + col);
      const length = c.prefetched[at + 1];
      if (length === ABSENT) return fallback;
      const off = c.prefetched[at];
      return json.decodeJson(c.data, off, off + length);
    }
    const raw = c.host.valueGet(this.id, c.handle);
    return raw === null || raw === undefined ? fallback : json.decodeJson(raw);
  }

  /** Replaces the value for the current key. */
  set(value) {
    const c = this.call;
    if (c.handle < 0) throw new errors.OperatorError(NO_KEY);
    // Scalars are kept as they are; an object could change after the set, so it is encoded now.
    c.write(this.id, c.slot, value === null || typeof value !== "object" ? value : new Encoded(json.encodeJson(value)));
  }

  /** Removes the value for the current key. */
  clear() {
    const c = this.call;
    if (c.handle < 0) throw new errors.OperatorError(NO_KEY);
    c.write(this.id, c.slot, CLEARED);
  }
}

/** An ordered list per key. */
export class ListState {
  constructor(call, id, name) {
    this.call = call;
    this.id = id;
    this.name = name;
  }

  /** Every item for the current key, oldest first. */
  get() {
    const c = this.call;
    return c.host.listGet(this.id, c.keyHandle()).map((b) => json.decodeJson(b));
  }

  /** Appends one item for the current key (as cheap however long the list is). */
  append(item) {
    const c = this.call;
    c.host.listAppend(this.id, c.keyHandle(), json.encodeJson(item));
  }

  /** Replaces every item for the current key. */
  replace(items) {
    const c = this.call;
    c.host.listReplace(this.id, c.keyHandle(), items.map((i) => json.encodeJson(i)));
  }

  clear() {
    const c = this.call;
    c.host.clear(this.id, c.keyHandle());
  }
}

/** A map from user keys to values per key; both JSON. */
export class MapState {
  constructor(call, id, name) {
    this.call = call;
    this.id = id;
    this.name = name;
  }

  get(mapKey, fallback = null) {
    const c = this.call;
    const raw = c.host.mapGet(this.id, c.keyHandle(), json.encodeJson(mapKey));
    return raw === null || raw === undefined ? fallback : json.decodeJson(raw);
  }

  put(mapKey, value) {
    const c = this.call;
    c.host.mapPut(this.id, c.keyHandle(), json.encodeJson(mapKey), json.encodeJson(value));
  }

  remove(mapKey) {
    const c = this.call;
    c.host.mapRemove(this.id, c.keyHandle(), json.encodeJson(mapKey));
  }

  /** Every [map key, value] of the current key, ordered by the map key's JSON bytes. */
  entries() {
    const c = this.call;
    return c.host.mapEntries(this.id, c.keyHandle()).map(([k, v]) => [json.decodeJson(k), json.decodeJson(v)]);
  }

  clear() {
    const c = this.call;
    c.host.clear(this.id, c.keyHandle());
  }
}

/** Handed to `open`: declares states and side outputs. */
export class OpenContext {
  constructor(call) {
    this.call = call;
  }

  /** A value state, prefetched (its values for a batch's keys come with the batch, no
   * crossing per read) unless `{ prefetch: false }`, for states read now and then. */
  valueState(name, { prefetch = true } = {}) {
    return new ValueState(this.call, this.call.host.declareState(name, "value", prefetch), name);
  }

  listState(name) {
    return new ListState(this.call, this.call.host.declareState(name, "list", false), name);
  }

  mapState(name) {
    return new MapState(this.call, this.call.host.declareState(name, "map", false), name);
  }

  sideOutput(name) {
    return new SideOutput(this.call.host.sideOutput(name), name);
  }
}

/** Handed to `process`, `onTimer` and `close`: output, timers and time. */
export class Context {
  constructor(call) {
    this.call = call;
    /** Timestamp of the record or timer being handled; emitted records inherit it. */
    this.timestamp = null;
  }

  /** Emits a keyed record (to side output `to`, else the main output). */
  emit(key, value, to = null) {
    this.call.push(to === null ? 0 : to.id, key, value, this.timestamp);
  }

  /** Emits a record without a key. */
  emitValue(value, to = null) {
    this.call.push(to === null ? 0 : to.id, UNSET, value, this.timestamp);
  }

  /** A timer for the current key (`EVENT_TIME` or `PROCESSING_TIME`); one (key, domain,
   * timestamp) fires once however often it is registered. */
  registerTimer(domain, timestamp) {
    this.call.host.registerTimer(this.call.keyHandle(), domain, Math.trunc(Number(timestamp)));
  }

  deleteTimer(domain, timestamp) {
    this.call.host.deleteTimer(this.call.keyHandle(), domain, Math.trunc(Number(timestamp)));
  }

  /** The operator's event-time watermark (ms); -(2 ** 63) before the first. */
  watermark() {
    return this.call.host.currentWatermark();
  }

  /** The host's processing time (ms since the Unix epoch): the guest's only clock. */
  processingTime() {
    return this.call.host.currentProcessingTime();
  }
}

export function decodeConfig(config) {
  if (config.trim() === "") return null;
  try {
    return json.parseJson(config);
  } catch (e) {
    throw new errors.BadConfig(`config ${JSON.stringify(config)} is not JSON: ${e.message}`);
  }
}

/** Reports a failure the operator did not choose (not an OperatorError) with its stack. */
export function logUnexpected(host, e) {
  if (!(e instanceof errors.OperatorError)) {
    const stack = e instanceof Error && e.stack ? `${e.name}: ${e.message}\n${e.stack}` : String(e);
    host.log(4, stack.slice(-4000));
  }
}

/** Drives one operator instance through the WIT's life cycle; `host` is the imports (the
 * component's, or `eddy/testing`'s in-memory host). Every method returns null or
 * [error kind, message]. */
export class Runner {
  constructor(cls, host) {
    this.cls = cls;
    this.host = host;
    log.bind(host);
    this.call = new Call(host);
    this.ctx = new Context(this.call);
    this.op = null;
  }

  guarded(body) {
    const call = this.call;
    try {
      body();
    } catch (e) {
      call.discard();
      call.handle = -1;
      logUnexpected(this.host, e);
      return errors.describe(e);
    }
    call.handle = -1;
    // State first: by the time the host sees the output, the state it reflects is stored.
    call.flushState();
    call.flushOutput();
    return null;
  }

  operator() {
    if (this.op === null) throw new errors.OperatorError("operator called before a successful open");
    return this.op;
  }

  open(config) {
    return this.guarded(() => {
      this.call.begin(new Uint8Array(0));
      const op = new this.cls();
      op.open(new OpenContext(this.call), decodeConfig(config));
      this.op = op;
    });
  }

  process(data, records, prefetchedStates, prefetched) {
    return this.guarded(() => {
      const op = this.operator();
      const call = this.call;
      const ctx = this.ctx;
      call.begin(data, prefetchedStates, prefetched);
      const t = words(records);
      const n = records.length >>> 5;
      for (let i = 0; i < n; i++) {
        const at = 8 * i;
        const kl = t[at + 1];
        const ts = t[at + 6] & 1 ? readI64(t, at + 4) : null;
        call.handle = kl === ABSENT ? -1 : i;
        call.slot = t[at + 7];
        call.row = i;
        ctx.timestamp = ts;
        op.process(new Record(call, t[at], kl, t[at + 2], t[at + 3], ts), ctx);
      }
    });
  }

  /** `timers`: [key offset, key length, timestamp, domain, slot] per timer. */
  onTimer(data, timers) {
    return this.guarded(() => {
      const op = this.operator();
      const call = this.call;
      const ctx = this.ctx;
      call.begin(data);
      for (let i = 0; i < timers.length; i++) {
        const [ko, kl, ts, domain, slot] = timers[i];
        call.handle = i;
        call.slot = slot;
        call.row = -1;
        ctx.timestamp = ts;
        op.onTimer(new Timer(call, ko, kl, ts, domain), ctx);
      }
    });
  }

  close() {
    return this.guarded(() => {
      this.call.begin(new Uint8Array(0));
      this.ctx.timestamp = null;
      this.operator().close(this.ctx);
    });
  }
}
