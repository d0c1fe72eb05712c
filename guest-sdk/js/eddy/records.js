// What an operator is handed: the records of a batch, and the timers that fire.
//
// A batch comes as the WIT's packed tables (`types.batch`). An interpreter pays for every
// property read and call, so a batch's keys and values come across as one JSON array each
// (`json-batch` in `wit/dataflow.wit`), parsed by the engine's own `JSON.parse`: a record is
// then a plain object holding its key and value. Where the host cannot give a view (a value
// that is not JSON, a row holding bytes) or there is no host to ask (an aggregate's records),
// values are read one by one from the bytes, which also names the bad record.

import { readI64, words } from "./bytes.js";
import * as codec from "./codec.js";
import * as errors from "./errors.js";
import * as json from "./json.js";
import * as rows from "./rows.js";

export const ABSENT = 0xffffffff;

/** The records of one call: the packed table over the bytes, and views of it. */
export class Batch {
  constructor(data, records, schemas, host = null) {
    this.data = data;
    // Per record 8 u32 words: key offset, key length, value offset, value length, timestamp
    // (two words), flags, slot.
    this.t = words(records);
    this.n = records.length >>> 5;
    this.schemas = schemas;
    // The host's views serve only the call in progress: `live` ends with it.
    this.host = host;
    this.live = host !== null;
  }

  /** Every record's key decoded, in order (null where a record has none), or null if the
   * host has no view of them. */
  keys() {
    return this.live ? arrayOf(this.host.jsonKeys(), this.n) : null;
  }

  /** Every record's value decoded, in order, or null if the host has no view of them. */
  values() {
    return this.live ? arrayOf(this.host.jsonValues(), this.n) : null;
  }

  keyBytes(i) {
    const kl = this.t[8 * i + 1];
    if (kl === ABSENT) return null;
    const ko = this.t[8 * i];
    return this.data.slice(ko, ko + kl);
  }

  valueBytes(i) {
    const vo = this.t[8 * i + 2];
    return this.data.slice(vo, vo + this.t[8 * i + 3]);
  }

  timestamp(i) {
    return this.t[8 * i + 6] & 1 ? readI64(this.t, 8 * i + 4) : null;
  }

  decodeKey(i) {
    const ko = this.t[8 * i];
    const kl = this.t[8 * i + 1];
    if (kl === ABSENT) throw new errors.BadRecord("record has no key (is the stream keyed?)");
    try {
      return json.decodeJson(this.data, ko, ko + kl);
    } catch (e) {
      throw new errors.BadRecord(`key is not JSON: ${e.message}`);
    }
  }

  decodeValue(i) {
    const vo = this.t[8 * i + 2];
    try {
      return codec.decodeValue(this.data, vo, vo + this.t[8 * i + 3], this.schemas);
    } catch (e) {
      throw new errors.BadRecord(`value is neither JSON nor a row: ${e.message}`);
    }
  }
}

/** The JSON array `text` of `n` elements, or null (no text, not JSON, another length). */
export function arrayOf(text, n) {
  if (typeof text !== "string") return null;
  try {
    const array = json.parseJson(text);
    return Array.isArray(array) && array.length === n ? array : null;
  } catch {
    return null;
  }
}

/** One input record, read-only: `key` and `value` decoded (a batch at a time). Records are
 * made as object literals over this prototype (no constructor call per record):
 * `{ __proto__: Record.prototype, batch, i, key, value }`. */
export class Record {
  /** Event time in ms since the Unix epoch, or null. */
  get timestamp() {
    return this.batch.timestamp(this.i);
  }

  /** The raw key bytes, null on a stream that is not keyed. */
  get keyBytes() {
    return this.batch.keyBytes(this.i);
  }

  /** The raw value bytes (a row or JSON). */
  get valueBytes() {
    return this.batch.valueBytes(this.i);
  }

  /** Top-level field `name` of the value (`fallback` if it has none; a null field is null). */
  field(name, fallback = null) {
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

/** A record of a stream that is not keyed: asking for its key is the error. */
export class KeylessRecord extends Record {
  get key() {
    return this.batch.decodeKey(this.i);
  }
}

/** A record whose key and value are read from its bytes when asked: where no view of them
 * came (an aggregate's records, values the host could not render). */
export class LazyRecord extends Record {
  get key() {
    return this.batch.decodeKey(this.i);
  }

  get value() {
    return this.batch.decodeValue(this.i);
  }

  /** From a row only that field is read, nothing else decoded. */
  field(name, fallback = null) {
    const b = this.batch;
    const vo = b.t[8 * this.i + 2];
    const end = vo + b.t[8 * this.i + 3];
    if (end > vo && b.data[vo] === rows.MAGIC) {
      try {
        const row = b.data.subarray(vo, end);
        const header = rows.header(row);
        const slot = b.schemas.slot(header.schema, name);
        return slot < 0 ? fallback : rows.fieldOf(row, header, slot, b.schemas.names);
      } catch (e) {
        throw new errors.BadRecord(`value is not a whole row: ${e.message}`);
      }
    }
    return super.field(name, fallback);
  }
}

/** A timer that fired, for the current key. */
export class Timer {
  constructor(key, keyBytes, timestamp, domain) {
    /** The key it was registered for, decoded. */
    this.key = key;
    /** The key's raw bytes. */
    this.keyBytes = keyBytes;
    /** When it was set to fire (ms). */
    this.timestamp = timestamp;
    /** `EVENT_TIME` or `PROCESSING_TIME`. */
    this.domain = domain;
  }
}
