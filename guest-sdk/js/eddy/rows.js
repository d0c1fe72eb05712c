// Eddy rows: the binary records of wit/dataflow.wit (the Rust crate eddy-wire, module `row`,
// is the definition; docs/architecture.md says why), little-endian fixed-width fields:
//
//   u8 0xB7 | u8 version 1 | u16 field count n | u32 schema id
//   null bits: ceil(n / 64) u64 words
//   kinds: n bytes (1 bool, 2 i64, 3 u64, 4 f64, 5 str, 6 bytes, 7 row, 8 JSON), padded to 8
//   slots: n x 8 bytes (numbers in place; variable kinds as u32 offset | u32 length)
//   variable region
//
// Field names come from the schema the id names; without them a row reads as an array.
// 64-bit integers read as Numbers when a Number holds them exactly, else as BigInts.

import * as json from "./json.js";
import * as utf8 from "./utf8.js";

export const MAGIC = 0xb7;
const VERSION = 1;
export const BOOL = 1;
export const I64 = 2;
export const U64 = 3;
export const F64 = 4;
export const STR = 5;
export const BYTES = 6;
export const ROW = 7;
export const JSON_TEXT = 8;
const MAX_FIELDS = 0xffff;
const TWO32 = 4294967296;
const SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** Whether `bytes` hold a row rather than JSON. */
export function isRow(bytes, start = 0, end = bytes.length) {
  return end > start && bytes[start] === MAGIC;
}

/** The id Eddy gives schema (`name`, `fields`): FNV-1a (32 bits) over the UTF-8 bytes
 * `name 0xFF field 0xFF ...`, 1 where that is 0 (`declare-schema` in the WIT). */
export function schemaId(name, fields) {
  let h = 0x811c9dc5;
  for (const part of [name, ...fields]) {
    for (const b of utf8.encode(part)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
    h = Math.imul(h ^ 0xff, 0x01000193) >>> 0;
  }
  return h || 1;
}

function layout(n) {
  const kinds = 8 + 8 * Math.ceil(n / 64);
  const slots = kinds + Math.ceil(n / 8) * 8;
  return [kinds, slots, slots + 8 * n];
}

function view(bytes) {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

function exact(big) {
  return big <= SAFE && big >= -SAFE ? Number(big) : big;
}

/** The parsed header of the row in `bytes`, for `fieldOf` (checked: a short or foreign
 * buffer throws). */
export function header(bytes) {
  if (bytes.length < 8) throw new RangeError("not a row (shorter than a row header)");
  if (bytes[0] !== MAGIC) throw new RangeError("not a row (first byte is not 0xB7)");
  if (bytes[1] !== VERSION) throw new RangeError(`row layout version ${bytes[1]}; this reader reads version ${VERSION}`);
  const v = view(bytes);
  const n = v.getUint16(2, true);
  const [kinds, slots, end] = layout(n);
  if (bytes.length < end) throw new RangeError("row shorter than its header and slots");
  return { v, n, schema: v.getUint32(4, true), kinds, slots };
}

/** Field `i` of the row in `bytes` whose `header` is `h`; undefined past its last field. */
export function fieldOf(bytes, h, i, names) {
  return i >= 0 && i < h.n ? field(bytes, h, i, names) : undefined;
}

function field(bytes, h, i, names) {
  if ((bytes[8 + 8 * Math.floor(i / 64) + Math.floor((i % 64) / 8)] >> (i % 8)) & 1) return null;
  const at = h.slots + 8 * i;
  const v = h.v;
  switch (bytes[h.kinds + i]) {
    case U64: {
      const hi = v.getUint32(at + 4, true);
      return hi < 0x200000 ? hi * TWO32 + v.getUint32(at, true) : exact(v.getBigUint64(at, true));
    }
    case I64: {
      const hi = v.getInt32(at + 4, true);
      return hi < 0x200000 && hi >= -0x200000 ? hi * TWO32 + v.getUint32(at, true) : exact(v.getBigInt64(at, true));
    }
    case F64:
      return v.getFloat64(at, true);
    case BOOL:
      return bytes[at] !== 0;
    case STR:
    case BYTES:
    case ROW:
    case JSON_TEXT: {
      const offset = v.getUint32(at, true);
      const length = v.getUint32(at + 4, true);
      if (offset + length > bytes.length) throw new RangeError(`field ${i} points outside the row`);
      const kind = bytes[h.kinds + i];
      if (kind === STR) return utf8.decode(bytes, offset, offset + length);
      if (kind === BYTES) return bytes.slice(offset, offset + length);
      if (kind === ROW) return readRow(bytes.subarray(offset, offset + length), names);
      return json.parseJson(utf8.decode(bytes, offset, offset + length));
    }
    default:
      throw new RangeError(`field ${i} has an unknown kind byte ${bytes[h.kinds + i]}`);
  }
}

/** The schema id of the row in `bytes`. */
export function schemaOf(bytes) {
  return view(bytes).getUint32(4, true);
}

/** The row in `bytes` as an object by field name (`names(schemaId)` gives them) or, when its
 * schema is unknown, an array. Nested rows read the same way; embedded JSON is parsed; bytes
 * come back as Uint8Arrays. */
export function readRow(bytes, names) {
  const h = header(bytes);
  const fieldNames = names && h.schema !== 0 ? names(h.schema) : null;
  if (fieldNames && fieldNames.length === h.n) {
    const out = {};
    for (let i = 0; i < h.n; i++) out[fieldNames[i]] = field(bytes, h, i, names);
    return out;
  }
  const out = new Array(h.n);
  for (let i = 0; i < h.n; i++) out[i] = field(bytes, h, i, names);
  return out;
}

/** Field `i` of the row in `bytes` without decoding the others; undefined past its last. */
export function readField(bytes, i, names) {
  const h = header(bytes);
  return i >= 0 && i < h.n ? field(bytes, h, i, names) : undefined;
}

function writeInt(v, at, value, i) {
  if (typeof value === "bigint") {
    if (value < 0n) {
      if (value < -(1n << 63n)) throw new RangeError(`field ${i}: ${value} does not fit in 64 bits`);
      v.setBigInt64(at, value, true);
      return I64;
    }
    if (value >= 1n << 64n) throw new RangeError(`field ${i}: ${value} does not fit in 64 bits`);
    v.setBigUint64(at, value, true);
    return U64;
  }
  // Two 32-bit halves: exact for every safe integer, and no BigInt on the common path.
  const hi = Math.floor(value / TWO32);
  v.setUint32(at, value - hi * TWO32, true);
  v.setInt32(at + 4, hi, true);
  return value < 0 ? I64 : U64;
}

/** `values` as a row of schema `schema`. Integers are i64 when negative, else u64 (Eddy's
 * readers take either for any integer field); other Numbers are f64; a value `nested(value)`
 * turns into bytes is a nested row; strings, Uint8Arrays and anything else JSON can write
 * take their kinds. */
export function writeRow(values, schema = 0, nested = null) {
  const n = values.length;
  if (n > MAX_FIELDS) throw new RangeError(`a row holds at most ${MAX_FIELDS} fields, not ${n}`);
  const [kindsAt, slotsAt, fixed] = layout(n);
  const parts = [];
  let size = fixed;
  const head = new Uint8Array(fixed);
  const v = view(head);
  head[0] = MAGIC;
  head[1] = VERSION;
  v.setUint16(2, n, true);
  v.setUint32(4, schema, true);
  for (let i = 0; i < n; i++) {
    const value = values[i];
    const at = slotsAt + 8 * i;
    let kind;
    if (value === null || value === undefined) {
      head[8 + 8 * Math.floor(i / 64) + Math.floor((i % 64) / 8)] |= 1 << (i % 8);
      continue;
    }
    const t = typeof value;
    if (t === "boolean") {
      kind = BOOL;
      head[at] = value ? 1 : 0;
    } else if (t === "bigint" || (t === "number" && Number.isSafeInteger(value))) {
      kind = writeInt(v, at, value, i);
    } else if (t === "number") {
      kind = F64;
      v.setFloat64(at, value, true);
    } else {
      let part = nested ? nested(value) : null;
      if (part) kind = ROW;
      else if (t === "string") {
        kind = STR;
        part = utf8.encode(value);
      } else if (value instanceof Uint8Array) {
        kind = BYTES;
        part = value;
      } else {
        kind = JSON_TEXT;
        part = json.encodeJson(value);
      }
      v.setUint32(at, size, true);
      v.setUint32(at + 4, part.length, true);
      parts.push(part);
      size += part.length;
    }
    head[kindsAt + i] = kind;
  }
  if (parts.length === 0) return head;
  const out = new Uint8Array(size);
  out.set(head, 0);
  let at = fixed;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}
