// The JavaScript codec against the shared table Rust's eddy-wire and serde_json wrote
// (guest-sdk/testdata/codec-table.json): every row reads as Eddy renders it, rows a dynamically
// typed writer can reproduce are written back byte for byte, and keys and state values are
// written exactly as serde_json writes them.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { encodeValue, schema, Schemas } from "../eddy/codec.js";
import { decodeJson, encodeJson, jsonText } from "../eddy/json.js";
import { readRow, ROW, schemaId, writeRow } from "../eddy/rows.js";
import { decode, decodePortable, encode, encodePortable } from "../eddy/utf8.js";

const TABLE = JSON.parse(readFileSync(new URL("../../testdata/codec-table.json", import.meta.url), "utf8"));
const SCHEMAS = new Map(Object.entries(TABLE.schemas).map(([k, v]) => [Number(k), v]));
const fromHex = (text) => Uint8Array.from(text.match(/../g) ?? [], (h) => parseInt(h, 16));
const toHex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

// A read value as Eddy's sinks render it: bytes as lists of numbers, BigInts as JSON numbers.
function rendered(value) {
  if (value instanceof Uint8Array) return [...value];
  if (typeof value === "bigint") return JSON.parse(String(value)); // the table's JSON parse loses the same digits
  if (Array.isArray(value)) return value.map(rendered);
  if (value !== null && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, rendered(v)]));
  return value;
}

// A row as [schema id, values], nested rows the same: what a writer needs to write it back.
function rawTree(bytes) {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = v.getUint16(2, true);
  const kindsAt = 8 + 8 * Math.ceil(n / 64);
  const slotsAt = kindsAt + Math.ceil(n / 8) * 8;
  const values = readRow(bytes);
  return [
    v.getUint32(4, true),
    values.map((x, i) => {
      if (bytes[kindsAt + i] !== ROW || x === null) return x;
      const off = v.getUint32(slotsAt + 8 * i, true);
      return { tree: rawTree(bytes.subarray(off, off + v.getUint32(slotsAt + 8 * i + 4, true))) };
    }),
  ];
}

function writeTree([id, values]) {
  return writeRow(values, id, (x) => (x && x.tree ? writeTree(x.tree) : null));
}

test("every row reads as Eddy renders it", () => {
  const names = (id) => (SCHEMAS.has(id) ? SCHEMAS.get(id)[1] : null);
  for (const c of TABLE.rows) assert.deepEqual(rendered(readRow(fromHex(c.hex), names)), c.meaning, c.name);
});

test("rows with natural kinds are written byte for byte", () => {
  const natural = TABLE.rows.filter((c) => c.natural);
  assert.ok(natural.length >= 4);
  for (const c of natural) assert.equal(toHex(writeTree(rawTree(fromHex(c.hex)))), c.hex, c.name);
});

test("schema classes are written as Rust structs are", () => {
  const Totals = schema("Totals", { purchases: 0, total_cents: 0 });
  const schemas = new Schemas((name, fields) => schemaId(name, fields), () => null);
  const accumulator = TABLE.rows.find((c) => c.name === "accumulator");
  assert.equal(toHex(encodeValue(new Totals({ purchases: 4, total_cents: 5248 }), schemas)), accumulator.hex);
  for (const [id, [name, fields]] of SCHEMAS) assert.equal(schemaId(name, fields), id, name);
});

test("keys and state are written as serde_json writes them", () => {
  for (const text of TABLE.json) assert.equal(jsonText(decodeJson(encode(text))), text, text);
});

test("integers past 2^53 stay exact and floats are written as f64s", () => {
  assert.equal(decodeJson(encode("18446744073709551615")), 18446744073709551615n);
  assert.equal(decodeJson(encode('{"id":9007199254740993}')).id, 9007199254740993n);
  assert.equal(jsonText(9007199254740993n), "9007199254740993");
  // A literal table of what serde_json 1.0.154 writes for these f64s.
  const floats = [[1e16, "1e+16"], [1e-6, "1e-6"], [0.00001, "0.00001"], [2 ** 53, "9007199254740992.0"], [-0, "0"], [1.7976931348623157e308, "1.7976931348623157e+308"]];
  for (const [x, text] of floats) assert.equal(jsonText(x), text, String(x));
});

test("what JSON cannot hold is refused by name", () => {
  assert.throws(() => encodeJson(NaN), /NaN cannot be written as JSON/);
  assert.throws(() => encodeJson(() => 1), /a function cannot be written as JSON/);
  assert.throws(() => encodeJson(1n << 64n), /does not fit in 64 bits/);
});

test("UTF-8 is what TextEncoder writes, with or without one, and malformed bytes are refused", () => {
  const malformed = [[0x61, 0xff], [0xe6, 0x97], [0xc0, 0x80], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80]];
  for (const [enc, dec] of [[encode, decode], [encodePortable, decodePortable]]) {
    for (const text of ["fox", "Été", "日本", "🦊 emoji", "", "\u0000\u007f\u0080\u07ff\u0800\uffff"]) {
      assert.deepEqual(enc(text), new TextEncoder().encode(text), text);
      assert.equal(dec(new TextEncoder().encode(text)), text);
    }
    for (const bytes of malformed) assert.throws(() => dec(Uint8Array.from(bytes)), /malformed UTF-8/, String(bytes));
  }
});

test("long texts decode whole, however they are made", () => {
  const long = "x".repeat(200_000) + "é" + "y".repeat(70_000);
  for (const dec of [decode, decodePortable]) assert.equal(dec(new TextEncoder().encode(long)), long);
  assert.equal(decodeJson(encode(JSON.stringify("z".repeat(100_000)))), "z".repeat(100_000));
});
