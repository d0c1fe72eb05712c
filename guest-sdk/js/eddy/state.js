// Keyed state handles. Each acts on the key of the record or timer being handled (its key
// slot: the first record of the call with an equal key, which is also its handle for the
// host).
//
// Value state is buffered: reads come from this call's writes, then from the values the host
// prefetched for the batch (one JSON array per state, parsed once), then from the host;
// writes go to the host in one `json-batch.set-values` per state when the call ends. A failed
// call's writes are dropped. List and map state go straight to their imports.
//
// This SDK writes values as JSON and reads rows as well: the Rust SDK writes a struct as a
// row, and a job whose operator moves between languages keeps its state (the host renders
// prefetched rows into the JSON array).

import * as codec from "./codec.js";
import * as errors from "./errors.js";
import * as json from "./json.js";
import { ABSENT, arrayOf } from "./records.js";

export const NO_KEY =
  "keyed state needs the current record's key: there is none in open/close (use state in " +
  "process or onTimer) nor for a record without a key (add key_by before this step)";

/** What the handles need of the call in progress: its host and schemas, and the key slot (-1
 * for none) and row being handled. */
export class Scope {
  constructor(host, schemas) {
    this.host = host;
    this.schemas = schemas;
    this.slot = -1;
    this.row = -1;
    // Records in the batch being processed (0 outside process).
    this.n = 0;
    // The batch's prefetched cells as u32 words (offset, length per state per record).
    this.prefetched = null;
    this.width = 0;
  }

  handle() {
    if (this.slot < 0) throw new errors.OperatorError(NO_KEY);
    return this.slot;
  }
}

/** `value` as state or output keeps it: scalars as they are, anything else a copy through
 * JSON, so later changes to the caller's object do not leak in and what cannot be written as
 * JSON fails at the call that gave it. */
export function snapshot(value) {
  const t = typeof value;
  if (t === "string" || t === "boolean" || t === "bigint" || value === null || value === undefined) return value;
  if (t === "number") {
    if (!Number.isFinite(value)) throw new TypeError(`${value} cannot be written as JSON`);
    return value;
  }
  return json.parseJson(json.jsonText(value));
}

/** A stored value, item or map value: JSON as this SDK writes it, or a row where the Rust SDK
 * wrote a struct (so a job moved between languages reads its state). */
function stored(scope, bytes) {
  return codec.decodeValue(bytes, 0, bytes.length, scope.schemas);
}

// A clear, among a call's writes.
const CLEARED = Symbol("cleared");

/** One value per key (written as JSON; a struct the Rust SDK wrote as a row reads as an object). */
export class ValueState {
  constructor(scope, id, name) {
    this.scope = scope;
    this.id = id;
    this.name = name;
    // This call's writes: `index[slot]` is the write's position + 1 in `slots`/`values`
    // (typed and plain arrays: QuickJS's Map costs microseconds per operation).
    this.index = new Uint32Array(1024);
    this.slots = [];
    this.values = [];
    this.clears = false;
    // Its column among the batch's prefetched states (-1 if not prefetched), and the
    // column's values: undefined until read, null where there is none to read.
    this.column = -1;
    this.col = null;
  }

  /** A new call; `prefetchedStates` are the ids whose values came with its batch. */
  begin(prefetchedStates) {
    this.column = -1;
    for (let c = 0; c < prefetchedStates.length; c++) if (prefetchedStates[c] === this.id) this.column = c;
    this.col = this.column < 0 ? null : undefined;
  }

  /** The value for the current key, or `fallback` if none was set. */
  get(fallback = null) {
    // The common cases first, in as few steps as the interpreter can take them: a value this
    // call wrote, or one prefetched with the batch. (A slot of -1, no key, indexes nothing.)
    const s = this.scope;
    const w = this.index[s.slot];
    if (w > 0) {
      const v = this.values[w - 1];
      if (v === CLEARED) return fallback;
      // A copy of what can change: the caller's later changes are not writes.
      return v !== null && typeof v === "object" ? json.parseJson(json.jsonText(v)) : v;
    }
    let col = this.col;
    if (col === undefined) col = this.fetch();
    if (col !== null && s.slot >= 0) {
      const v = col[s.row];
      if (v !== null) return v;
    }
    return this.read(fallback);
  }

  /** The value when it is neither written nor prefetched (or prefetched as `null`). */
  read(fallback) {
    const s = this.scope;
    const slot = s.handle();
    if (this.col !== null) {
      const length = s.prefetched[2 * (s.row * s.width + this.column) + 1];
      return length === ABSENT ? fallback : null;
    }
    const raw = s.host.valueGet(this.id, slot);
    return raw === null || raw === undefined ? fallback : stored(s, raw);
  }

  fetch() {
    const col = arrayOf(this.scope.host.jsonPrefetched(this.id), this.scope.n);
    this.col = col;
    return col;
  }

  /** Replaces the value for the current key. */
  set(value) {
    const slot = this.scope.slot;
    if (slot < 0) throw new errors.OperatorError(NO_KEY);
    // Numbers and strings as they are (the common case, checked inline); anything else as
    // `snapshot` keeps it.
    const t = typeof value;
    this.write(slot, (t === "number" && value - value === 0) || t === "string" ? value : snapshot(value));
  }

  /** Removes the value for the current key. */
  clear() {
    this.write(this.scope.handle(), CLEARED);
    this.clears = true;
  }

  write(slot, value) {
    const w = this.index[slot];
    if (w > 0) {
      this.values[w - 1] = value;
      return;
    }
    if (slot >= this.index.length) {
      const grown = new Uint32Array(2 ** Math.ceil(Math.log2(slot + 1)));
      grown.set(this.index);
      this.index = grown;
    }
    this.slots.push(slot);
    this.values.push(value);
    this.index[slot] = this.values.length;
  }

  /** Hands this call's writes to the host. */
  flush() {
    const slots = this.slots;
    if (slots.length === 0) return;
    let text;
    if (this.clears) {
      const values = this.values;
      const written = [];
      const writtenValues = [];
      const cleared = [];
      for (let i = 0; i < slots.length; i++) {
        if (values[i] === CLEARED) cleared.push(slots[i]);
        else {
          written.push(slots[i]);
          writtenValues.push(values[i]);
        }
      }
      text = `[${JSON.stringify(written)},${arrayText(writtenValues)},${JSON.stringify(cleared)}]`;
    } else {
      text = `[${JSON.stringify(slots)},${arrayText(this.values)},[]]`;
    }
    this.scope.host.jsonSetValues(this.id, text);
    this.discard();
  }

  discard() {
    // One native fill rather than an interpreted loop over the writes.
    this.index.fill(0);
    this.slots.length = 0;
    this.values.length = 0;
    this.clears = false;
  }
}

// Numbers JSON.stringify writes otherwise than serde_json (integral floats of 16 digits and
// more: serde writes 1e16 as `1e+16`, 2^53 + 2 as `9007199254740994.0`), and BigInts, which
// it refuses: written the exact way.
const NOT_SERDE = /\d{16}/;

/** `values` as one JSON array, as serde_json writes each: the engine's own writer where it
 * writes the same text, the SDK's where it would not. */
export function arrayText(values) {
  let text;
  try {
    text = JSON.stringify(values);
  } catch {
    text = undefined;
  }
  if (text === undefined || NOT_SERDE.test(text)) text = `[${values.map((v) => json.jsonText(v)).join(",")}]`;
  return text;
}

/** An ordered list per key. */
export class ListState {
  constructor(scope, id, name) {
    this.scope = scope;
    this.id = id;
    this.name = name;
  }

  /** Every item for the current key, oldest first. */
  get() {
    return this.scope.host.listGet(this.id, this.scope.handle()).map((b) => stored(this.scope, b));
  }

  /** Appends one item for the current key (as cheap however long the list is). */
  append(item) {
    this.scope.host.listAppend(this.id, this.scope.handle(), json.encodeJson(item));
  }

  /** Replaces every item for the current key. */
  replace(items) {
    this.scope.host.listReplace(this.id, this.scope.handle(), items.map((i) => json.encodeJson(i)));
  }

  clear() {
    this.scope.host.clear(this.id, this.scope.handle());
  }
}

/** A map from user keys to values per key (keys JSON, values read as value state reads them). */
export class MapState {
  constructor(scope, id, name) {
    this.scope = scope;
    this.id = id;
    this.name = name;
  }

  get(mapKey, fallback = null) {
    const raw = this.scope.host.mapGet(this.id, this.scope.handle(), json.encodeJson(mapKey));
    return raw === null || raw === undefined ? fallback : stored(this.scope, raw);
  }

  put(mapKey, value) {
    this.scope.host.mapPut(this.id, this.scope.handle(), json.encodeJson(mapKey), json.encodeJson(value));
  }

  remove(mapKey) {
    this.scope.host.mapRemove(this.id, this.scope.handle(), json.encodeJson(mapKey));
  }

  /** Every [map key, value] of the current key, ordered by the map key's JSON bytes. */
  entries() {
    const host = this.scope.host;
    return host.mapEntries(this.id, this.scope.handle()).map(([k, v]) => [json.decodeJson(k), stored(this.scope, v)]);
  }

  clear() {
    this.scope.host.clear(this.id, this.scope.handle());
  }
}
