// Keyed operators: the `Operator` class users extend, the contexts it is handed, and the
// runner that drives it behind the `eddy:dataflow/operator` export. A call takes a whole
// batch: its keys, values and prefetched state come as one JSON array each, parsed by the
// engine (`records.js`, `state.js`); what the call writes and emits leaves as one JSON text
// per state and output (`state.js`, `output.js`). So a call costs a handful of crossings and
// a few native JSON passes however many records it holds, and the interpreter runs little
// but the operator's own code. A failed call's buffered writes and output are dropped.

import { readI64, words } from "./bytes.js";
import * as codec from "./codec.js";
import * as errors from "./errors.js";
import * as json from "./json.js";
import * as log from "./log.js";
import { FLUSH_ITEMS, KEYED, Outputs } from "./output.js";
import { ABSENT, arrayOf, Batch, KeylessRecord, LazyRecord, Record, Timer } from "./records.js";
import { ListState, MapState, Scope, ValueState } from "./state.js";

export { ABSENT, Record, Timer };
export const EVENT_TIME = 0;
export const PROCESSING_TIME = 1;

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

/** A named side output, declared in `open`. */
export class SideOutput {
  constructor(id, name) {
    this.id = id;
    this.name = name;
  }
}

/** Handed to `open`: declares states and side outputs. */
export class OpenContext {
  constructor(runner) {
    this.runner = runner;
  }

  /** A value state, prefetched (its values for a batch's keys come with the batch, no
   * crossing per read) unless `{ prefetch: false }`, for states read now and then. */
  valueState(name, { prefetch = true } = {}) {
    const r = this.runner;
    const state = new ValueState(r.scope, r.host.declareState(name, "value", prefetch), name);
    r.valueStates.push(state);
    return state;
  }

  listState(name) {
    const r = this.runner;
    return new ListState(r.scope, r.host.declareState(name, "list", false), name);
  }

  mapState(name) {
    const r = this.runner;
    return new MapState(r.scope, r.host.declareState(name, "map", false), name);
  }

  sideOutput(name) {
    return new SideOutput(this.runner.host.sideOutput(name), name);
  }
}

/** Handed to `process`, `onTimer` and `close`: output, timers and time. */
export class Context {
  constructor(scope, outputs) {
    this.scope = scope;
    this.outputs = outputs;
    this.main = outputs.main;
    /** Timestamp of the record or timer being handled; emitted records inherit it. */
    this.timestamp = null;
  }

  /** Emits a keyed record (to side output `to`, else the main output). */
  emit(key, value, to = null) {
    if (to === null) {
      const main = this.main;
      const tv = typeof value;
      const tk = typeof key;
      if (main.form === KEYED && (tv === "number" || tv === "string") && (tk === "string" || tk === "number")) {
        main.items.push(key, value, this.timestamp);
        if (main.items.length >= FLUSH_ITEMS) this.outputs.send(main);
        return;
      }
      this.outputs.push(0, true, key, value, this.timestamp);
    } else {
      this.outputs.push(to.id, true, key, value, this.timestamp);
    }
  }

  /** Emits a record without a key. */
  emitValue(value, to = null) {
    this.outputs.push(to === null ? 0 : to.id, false, null, value, this.timestamp);
  }

  /** A timer for the current key (`EVENT_TIME` or `PROCESSING_TIME`); one (key, domain,
   * timestamp) fires once however often it is registered. */
  registerTimer(domain, timestamp) {
    this.scope.host.registerTimer(this.timerHandle(), domain, Math.trunc(Number(timestamp)));
  }

  deleteTimer(domain, timestamp) {
    this.scope.host.deleteTimer(this.timerHandle(), domain, Math.trunc(Number(timestamp)));
  }

  timerHandle() {
    if (this.scope.slot < 0) {
      throw new errors.OperatorError(
        "timers need the current record's key: there is none in open/close nor for a record " +
          "without a key (add key_by before this step)",
      );
    }
    return this.scope.slot;
  }

  /** The operator's event-time watermark (ms); -(2 ** 63) before the first. */
  watermark() {
    return this.scope.host.currentWatermark();
  }

  /** The host's processing time (ms since the Unix epoch): the guest's only clock. */
  processingTime() {
    return this.scope.host.currentProcessingTime();
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

const RECORD = Record.prototype;
const KEYLESS = KeylessRecord.prototype;
const LAZY = LazyRecord.prototype;

/** Drives one operator instance through the WIT's life cycle; `host` is the imports (the
 * component's, or `eddy/testing`'s in-memory host). Every method returns null or
 * [error kind, message]. */
export class Runner {
  constructor(cls, host) {
    this.cls = cls;
    this.host = host;
    log.bind(host);
    this.schemas = new codec.Schemas(host.declareSchema, host.schemaFields);
    this.scope = new Scope(host, this.schemas);
    this.outputs = new Outputs(host, this.schemas);
    this.valueStates = [];
    this.ctx = new Context(this.scope, this.outputs);
    this.op = null;
  }

  begin(prefetchedStates = [], prefetched = null, n = 0) {
    const s = this.scope;
    s.slot = -1;
    s.row = -1;
    s.n = n;
    s.width = prefetchedStates.length;
    s.prefetched = prefetched;
    for (const state of this.valueStates) state.begin(prefetchedStates);
  }

  guarded(body) {
    try {
      body();
      // State first: by the time the host sees the output, the state it reflects is stored.
      for (const state of this.valueStates) state.flush();
      this.outputs.flush();
      return null;
    } catch (e) {
      for (const state of this.valueStates) state.discard();
      this.outputs.discard();
      logUnexpected(this.host, e);
      return errors.describe(e);
    } finally {
      this.scope.slot = -1;
      this.scope.row = -1;
    }
  }

  operator() {
    if (this.op === null) throw new errors.OperatorError("operator called before a successful open");
    return this.op;
  }

  open(config) {
    return this.guarded(() => {
      this.begin();
      const op = new this.cls();
      op.open(new OpenContext(this), decodeConfig(config));
      this.op = op;
    });
  }

  process(data, records, prefetchedStates, prefetched) {
    const batch = new Batch(data, records, this.schemas, this.host);
    try {
      return this.guarded(() => {
        const op = this.operator();
        const scope = this.scope;
        const ctx = this.ctx;
        const n = batch.n;
        const t = batch.t;
        this.begin(prefetchedStates, prefetched && prefetched.length > 0 ? words(prefetched) : null, n);
        const keys = batch.keys();
        const values = batch.values();
        // Every record keyed: a missing key is rendered null, and most batches have no null key.
        let keyed = keys !== null && values !== null;
        if (keyed && keys.indexOf(null) >= 0) for (let i = 0; keyed && i < n; i++) if (t[8 * i + 1] === ABSENT) keyed = false;
        for (let i = 0; i < n; i++) {
          const at = 8 * i;
          scope.row = i;
          ctx.timestamp = t[at + 6] & 1 ? readI64(t, at + 4) : null;
          if (keyed) {
            scope.slot = t[at + 7];
            op.process({ __proto__: RECORD, batch, i, key: keys[i], value: values[i] }, ctx);
          } else if (keys === null || values === null) {
            scope.slot = t[at + 1] === ABSENT ? -1 : t[at + 7];
            op.process({ __proto__: LAZY, batch, i }, ctx);
          } else if (t[at + 1] === ABSENT) {
            scope.slot = -1;
            op.process({ __proto__: KEYLESS, batch, i, value: values[i] }, ctx);
          } else {
            scope.slot = t[at + 7];
            op.process({ __proto__: RECORD, batch, i, key: keys[i], value: values[i] }, ctx);
          }
        }
      });
    } finally {
      batch.live = false;
    }
  }

  /** `timers`: [key offset, key length, timestamp, domain, slot] per timer. */
  onTimer(data, timers) {
    return this.guarded(() => {
      const op = this.operator();
      const scope = this.scope;
      const ctx = this.ctx;
      this.begin();
      const keys = arrayOf(this.host.jsonKeys(), timers.length);
      for (let i = 0; i < timers.length; i++) {
        const [ko, kl, ts, domain, slot] = timers[i];
        const raw = data.slice(ko, ko + kl);
        scope.slot = slot;
        ctx.timestamp = ts;
        op.onTimer(new Timer(keys !== null ? keys[i] : timerKey(raw), raw, ts, domain), ctx);
      }
    });
  }

  close() {
    return this.guarded(() => {
      this.begin();
      this.ctx.timestamp = null;
      this.operator().close(this.ctx);
    });
  }
}

function timerKey(raw) {
  try {
    return json.decodeJson(raw);
  } catch (e) {
    throw new errors.BadRecord(`timer key is not JSON: ${e.message}`);
  }
}
