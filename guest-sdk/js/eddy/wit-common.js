// @ts-check
// The imports both worlds have (log, schemas), and the engine differences every binding
// hides: SpiderMonkey (componentize-js) hands s64 values over as unsigned BigInts and wants
// BigInts back, QuickJS (jco's qjs backend) uses Numbers; a missing option is `undefined` in
// one and `null` in the other. Only the wit-*.js modules touch the WIT (`eddy:dataflow/*`),
// which exists only inside a component build: `eddy build` puts one first in the bundle, and
// `eddy/testing` installs an in-memory host instead.

import * as log from "eddy:dataflow/log@0.4.0";
import * as schemas from "eddy:dataflow/schemas@0.4.0";

/** @type {import("eddy:dataflow/log@0.4.0").Level[]} */
const LEVELS = ["trace", "debug", "info", "warn", "error"];

/** A WIT s64 as a Number. */
export function number(s64) {
  return typeof s64 === "bigint" ? Number(BigInt.asIntN(64, s64)) : s64;
}

// Schema ids are u32s, half of them past 2^31: QuickJS lowers a Number past 2^31 given for a
// u32 wrongly (the host saw another id) but takes the same bits as a negative int32, and may
// hand u32 results back negative; so ids go out as `id | 0` and come back as `>>> 0`.
export const common = {
  log: (level, message) => log.log(LEVELS[level], message),
  declareSchema: (name, fields) => schemas.declareSchema(name, fields) >>> 0,
  schemaFields: (id) => schemas.schemaFields(id | 0) ?? null,
};
