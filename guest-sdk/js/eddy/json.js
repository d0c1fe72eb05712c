// Keys and state values are JSON, byte for byte what the Rust SDK (serde_json) writes for the
// same value: keys are hashed and compared as bytes, so "fox" must be the same key in every
// language. JavaScript has one number type, so an integral Number is written as an integer
// and any other as serde_json writes an f64; integers beyond 2^53 are BigInts both ways.

import * as utf8 from "./utf8.js";

const SAFE = Number.MAX_SAFE_INTEGER;
const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
// A run of 16 digits may be an integer a Number cannot hold exactly.
const LONG_DIGITS = /\d{16}/;

/** f64 `x` as serde_json writes it: positional between 1e-5 and 1e16, else `de±x`. */
export function floatText(x) {
  if (!Number.isFinite(x)) throw new TypeError(`${x} cannot be written as JSON`);
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const abs = Math.abs(x);
  if (abs >= 1e-5 && abs < 1e16) {
    // JavaScript writes this range positionally too (it switches at 1e-7 and 1e21).
    const text = String(x);
    return text.includes(".") ? text : `${text}.0`;
  }
  const [mantissa, exp] = x.toExponential().split("e");
  return `${mantissa}e${exp[0] === "-" ? "" : "+"}${exp.replace("+", "")}`;
}

function write(value, parts) {
  switch (typeof value) {
    case "string":
      parts.push(JSON.stringify(value));
      return;
    case "number":
      parts.push(Number.isInteger(value) && Math.abs(value) <= SAFE ? String(value) : floatText(value));
      return;
    case "bigint":
      if (value > U64_MAX || value < I64_MIN) throw new RangeError(`${value} does not fit in 64 bits`);
      parts.push(String(value));
      return;
    case "boolean":
      parts.push(value ? "true" : "false");
      return;
    case "undefined":
      parts.push("null");
      return;
    case "object":
      break;
    default:
      throw new TypeError(`a ${typeof value} cannot be written as JSON`);
  }
  if (value === null) {
    parts.push("null");
  } else if (Array.isArray(value) || value instanceof Uint8Array) {
    parts.push("[");
    for (let i = 0; i < value.length; i++) {
      if (i > 0) parts.push(",");
      write(value[i], parts);
    }
    parts.push("]");
  } else if (value instanceof Map) {
    writeEntries(value.entries(), parts);
  } else {
    writeEntries(Object.entries(value), parts);
  }
}

function writeEntries(entries, parts) {
  parts.push("{");
  let first = true;
  for (const [k, v] of entries) {
    if (v === undefined) continue;
    if (!first) parts.push(",");
    first = false;
    parts.push(JSON.stringify(String(k)), ":");
    write(v, parts);
  }
  parts.push("}");
}

/** `value` as compact JSON text, as serde_json writes it. */
export function jsonText(value) {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number" && Number.isInteger(value) && Math.abs(value) <= SAFE) return String(value);
  const parts = [];
  write(value, parts);
  return parts.join("");
}

/** `value` as compact JSON bytes, as serde_json writes them. */
export function encodeJson(value) {
  return utf8.encode(jsonText(value));
}

/** JSON text back to values; integers a Number cannot hold exactly become BigInts. */
export function parseJson(text) {
  if (!LONG_DIGITS.test(text)) return JSON.parse(text);
  return new ExactParser(text).document();
}

/** JSON bytes `bytes[start, end)` back to values. Keys and counts skip the parser. */
export function decodeJson(bytes, start = 0, end = bytes.length) {
  const first = bytes[start];
  if (first === 0x22 && end - start >= 2 && bytes[end - 1] === 0x22) {
    let i = start + 1;
    for (; i < end - 1; i++) {
      const b = bytes[i];
      if (b < 0x20 || b > 0x7e || b === 0x22 || b === 0x5c) break;
    }
    if (i === end - 1) return utf8.ascii(bytes, start + 1, end - 1);
  }
  if (first >= 0x30 && first <= 0x39 && end - start < 16) {
    let n = 0;
    let i = start;
    for (; i < end; i++) {
      const d = bytes[i] - 0x30;
      if (d < 0 || d > 9) break;
      n = n * 10 + d;
    }
    if (i === end && (end - start === 1 || first !== 0x30)) return n;
  }
  return parseJson(utf8.decode(bytes, start, end));
}

// A second parser only for documents with long digit runs: it keeps such integers exact.
class ExactParser {
  constructor(text) {
    this.text = text;
    this.at = 0;
  }

  document() {
    const value = this.value();
    this.space();
    if (this.at !== this.text.length) this.fail("unexpected text after the value");
    return value;
  }

  fail(what) {
    throw new SyntaxError(`${what} at character ${this.at} of JSON`);
  }

  space() {
    while (/\s/.test(this.text[this.at] ?? "")) this.at++;
  }

  value() {
    this.space();
    const c = this.text[this.at];
    if (c === "{") return this.object();
    if (c === "[") return this.array();
    if (c === '"') return this.string();
    if (c === "-" || (c >= "0" && c <= "9")) return this.number();
    for (const [word, v] of [["true", true], ["false", false], ["null", null]]) {
      if (this.text.startsWith(word, this.at)) {
        this.at += word.length;
        return v;
      }
    }
    return this.fail("expected a value");
  }

  object() {
    const out = {};
    this.at++;
    this.space();
    if (this.text[this.at] === "}") {
      this.at++;
      return out;
    }
    for (;;) {
      this.space();
      if (this.text[this.at] !== '"') this.fail("expected a key");
      const key = this.string();
      this.space();
      if (this.text[this.at++] !== ":") this.fail("expected ':'");
      out[key] = this.value();
      this.space();
      const c = this.text[this.at++];
      if (c === "}") return out;
      if (c !== ",") this.fail("expected ',' or '}'");
    }
  }

  array() {
    const out = [];
    this.at++;
    this.space();
    if (this.text[this.at] === "]") {
      this.at++;
      return out;
    }
    for (;;) {
      out.push(this.value());
      this.space();
      const c = this.text[this.at++];
      if (c === "]") return out;
      if (c !== ",") this.fail("expected ',' or ']'");
    }
  }

  string() {
    const m = /^"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/.exec(this.text.slice(this.at));
    if (!m) this.fail("malformed string");
    this.at += m[0].length;
    return JSON.parse(m[0]);
  }

  number() {
    const m = /^-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(this.text.slice(this.at));
    if (!m) this.fail("malformed number");
    this.at += m[0].length;
    if (m[1] === undefined && m[2] === undefined) {
      const n = Number(m[0]);
      if (Number.isSafeInteger(n)) return n;
      const big = BigInt(m[0]);
      // serde_json reads integers beyond 64 bits as f64; so does this.
      return big > U64_MAX || big < I64_MIN ? n : big;
    }
    return Number(m[0]);
  }
}
