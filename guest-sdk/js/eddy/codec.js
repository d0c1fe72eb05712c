// How JavaScript values become the bytes Eddy stores and ships, and back. Record values and
// window accumulators are rows when they are instances of a class made by `schema` (its name
// and field names are the row's schema, as a Rust struct's are) and JSON otherwise; either is
// read back, rows as plain objects by field name.

import * as json from "./json.js";
import * as rows from "./rows.js";

const SCHEMA = Symbol("eddy.schema");

/** A row type: `schema("Totals", { purchases: 0, total_cents: 0 })` is a class whose
 * instances are written as rows of schema `Totals` with those fields in that order (the
 * values given are the defaults). `new Totals({ purchases: 1 })` fills in the rest, and
 * `Totals.from(value)` reads a stored row or object back as one. */
export function schema(name, defaults) {
  if (typeof name !== "string" || name.length === 0) throw new TypeError("a schema needs a name");
  if (defaults === null || typeof defaults !== "object") {
    throw new TypeError(`schema ${name} needs its fields and their defaults, as an object`);
  }
  const fields = Object.keys(defaults);
  const Row = class {
    constructor(init = {}) {
      for (const f of fields) {
        const given = init[f];
        this[f] = given === undefined ? structuredCopy(defaults[f]) : given;
      }
    }

    static from(value) {
      if (value instanceof Row) return value;
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        throw new TypeError(`a ${name} is read from an object, not from ${JSON.stringify(json.jsonText(value))}`);
      }
      return new Row(value);
    }
  };
  Object.defineProperty(Row, "name", { value: name });
  Row[SCHEMA] = { name, fields };
  return Row;
}

// Defaults that are arrays or objects are copied, so instances never share them.
function structuredCopy(v) {
  if (Array.isArray(v)) return v.map(structuredCopy);
  if (v !== null && typeof v === "object" && !(v instanceof Uint8Array)) {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, structuredCopy(x)]));
  }
  return v;
}

/** The schema (`{name, fields}`) of row class `cls`, or undefined for anything else. */
export function schemaOfClass(cls) {
  return cls ? cls[SCHEMA] : undefined;
}

/** The host's schemas as this instance has seen them, asked once per id or class. */
export class Schemas {
  constructor(declare, fieldsOf) {
    this.declare = declare;
    this.fieldsOf = fieldsOf;
    this.known = new Map();
    this.declared = new Map();
    // slots.get(schema id): {field name: slot}; the last schema asked is kept at hand.
    this.slots = new Map();
    this.lastId = -1;
    this.lastSlots = null;
    this.names = (id) => this.namesOf(id);
    this.nested = (value) => this.write(value);
  }

  /** The field names of schema `id`, or null when the host does not know it. */
  namesOf(id) {
    let names = this.known.get(id);
    if (names === undefined) {
      const found = this.fieldsOf(id);
      names = found ? [...found[1]] : null;
      this.known.set(id, names);
    }
    return names;
  }

  /** The slot of field `name` in rows of schema `id`, or -1. */
  slot(id, name) {
    let slots = this.lastSlots;
    if (id !== this.lastId) {
      slots = this.slots.get(id);
      if (slots === undefined) {
        slots = Object.create(null);
        (this.namesOf(id) ?? []).forEach((n, i) => {
          slots[n] = i;
        });
        this.slots.set(id, slots);
      }
      this.lastId = id;
      this.lastSlots = slots;
    }
    const slot = slots[name];
    return slot === undefined ? -1 : slot;
  }

  idOf(cls) {
    let id = this.declared.get(cls);
    if (id === undefined) {
      const { name, fields } = cls[SCHEMA];
      id = this.declare(name, fields);
      this.declared.set(cls, id);
      this.known.set(id, fields);
    }
    return id;
  }

  /** A row-class instance as a row (nested ones as nested rows), else null. */
  write(value) {
    const cls = value.constructor;
    const s = cls && cls[SCHEMA];
    if (!s) return null;
    const values = new Array(s.fields.length);
    for (let i = 0; i < values.length; i++) values[i] = value[s.fields[i]];
    return rows.writeRow(values, this.idOf(cls), this.nested);
  }
}

/** A record value or accumulator: a row-class instance as a row, anything else as JSON. */
export function encodeValue(value, schemas) {
  if (value !== null && typeof value === "object") {
    const row = schemas.write(value);
    if (row) return row;
  }
  return json.encodeJson(value);
}

/** A record value: a row as an object by field name (an array if its schema is unknown), or JSON. */
export function decodeValue(bytes, start, end, schemas) {
  if (end > start && bytes[start] === rows.MAGIC) return rows.readRow(bytes.subarray(start, end), schemas.names);
  return json.decodeJson(bytes, start, end);
}
