// What a call emits, buffered per output and handed to the host when the call ends.
//
// Records go across as JSON text (`json-batch.emit`): one `JSON.stringify` of a flat array per
// output replaces a row or JSON writer run per record in the interpreter. A row-class value is
// sent as its field values and written as a row by the host, byte for byte as `rows.js` would;
// one the host cannot write from JSON (a field holding bytes, a BigInt, a nested row, a number
// that is not a safe integer nor a finite float) goes the binary way (`output.emit`). Within
// an output, records keep their order: a record of another form than the ones buffered (keyed
// or not, JSON or row of another schema, binary) first sends those.

import { Writer } from "./bytes.js";
import * as codec from "./codec.js";
import * as json from "./json.js";
import { ABSENT } from "./records.js";
import { arrayText, snapshot } from "./state.js";

// Forms of a buffered run of records.
export const KEYED = { keyed: true, schema: 0 };
const UNKEYED = { keyed: false, schema: 0 };
const BINARY = { keyed: null, schema: -1 };
// Records buffered per output before they are sent, so the host's per-call output limit
// stops a runaway operator before the guest's memory does.
export const FLUSH_ITEMS = 3 * 8192;

/** One output's buffered records: a run of one form. */
class Pending {
  constructor(id) {
    this.id = id;
    this.form = null;
    // JSON forms: the flat array (key, value, timestamp, ... or value, timestamp, ...).
    this.items = [];
    // The binary form: the packed table over its bytes.
    this.data = new Writer(1 << 12);
    this.rows = new Writer(1 << 10);
  }
}

/** Whether `v` is written as JSON as it is (nothing can change it later). */
export function isScalar(v) {
  const t = typeof v;
  return t === "string" || t === "number" || t === "boolean" || t === "bigint" || v === null || v === undefined;
}

/** The call's output, per output id (0 the main output). */
export class Outputs {
  constructor(host, schemas) {
    this.host = host;
    this.schemas = schemas;
    this.main = new Pending(0);
    this.side = [];
    // Per row class: its schema id and the forms of its runs, keyed and not.
    this.rowForms = new Map();
  }

  pending(output) {
    if (output === 0) return this.main;
    let p = this.side[output];
    if (p === undefined) this.side[output] = p = new Pending(output);
    return p;
  }

  /** Buffers one record of any form (`keyed` false: `key` is ignored). */
  push(output, keyed, key, value, timestamp) {
    const p = this.pending(output);
    if (keyed && !isScalar(key)) key = snapshot(key);
    let form = keyed ? KEYED : UNKEYED;
    if (!isScalar(value)) {
      const row = this.rowOf(value, keyed);
      if (row === undefined) value = snapshot(value);
      else if (row === null) return this.pushBinary(p, keyed, key, value, timestamp);
      else [form, value] = row;
    }
    if (p.form !== form) {
      this.send(p);
      p.form = form;
    }
    if (keyed) p.items.push(key, value, timestamp);
    else p.items.push(value, timestamp);
    if (p.items.length >= FLUSH_ITEMS) this.send(p);
  }

  /** [form, field values] of a row-class instance; null if JSON cannot carry its fields;
   * undefined if `value` is no row-class instance. */
  rowOf(value, keyed) {
    const cls = value.constructor;
    const s = codec.schemaOfClass(cls);
    if (!s) return undefined;
    let forms = this.rowForms.get(cls);
    if (forms === undefined) {
      const schema = this.schemas.idOf(cls);
      forms = [{ keyed: false, schema }, { keyed: true, schema }];
      this.rowForms.set(cls, forms);
    }
    const names = s.fields;
    const fields = new Array(names.length);
    let copy = false;
    for (let i = 0; i < names.length; i++) {
      const v = value[names[i]];
      const t = typeof v;
      if (t === "number") {
        // The row writer's kinds: safe integers are integers, other finite numbers floats.
        if (!Number.isSafeInteger(v) && (!Number.isFinite(v) || Number.isInteger(v))) return null;
      } else if (t === "bigint" || v instanceof Uint8Array || (t === "object" && v !== null && codec.schemaOfClass(v.constructor))) {
        return null;
      } else if (t === "object" && v !== null) {
        copy = true;
      }
      fields[i] = v;
    }
    return [forms[keyed ? 1 : 0], copy ? snapshot(fields) : fields];
  }

  pushBinary(p, keyed, key, value, timestamp) {
    if (p.form !== BINARY) {
      this.send(p);
      p.form = BINARY;
    }
    const data = p.data;
    let ko = 0;
    let kl = ABSENT;
    if (keyed) {
      ko = data.length;
      data.append(json.encodeJson(key));
      kl = data.length - ko;
    }
    const vo = data.length;
    data.append(codec.encodeValue(value, this.schemas));
    p.rows.record(ko, kl, vo, data.length - vo, timestamp, p.id);
    if (data.length >= 1 << 20) this.send(p);
  }

  /** Hands `p`'s buffered records to the host. */
  send(p) {
    if (p.items.length > 0) {
      const text = arrayText(p.items);
      p.items.length = 0;
      this.host.jsonEmit(p.id, p.form.keyed, p.form.schema, text);
    }
    if (p.rows.length > 0) this.host.emit(p.data.take(), p.rows.take());
  }

  flush() {
    this.send(this.main);
    for (const p of this.side) if (p !== undefined) this.send(p);
  }

  discard() {
    for (const p of [this.main, ...this.side]) {
      if (p === undefined) continue;
      p.items.length = 0;
      p.data.clear();
      p.rows.clear();
      p.form = null;
    }
  }
}
