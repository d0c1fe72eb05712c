// Window aggregates: the `Aggregate` class users extend and the runner behind the
// `eddy:dataflow/aggregate` export. The host's window operators keep the accumulators (as
// bytes, in keyed state) and call the aggregate once per batch for every (key, window) the
// batch touches; an accumulator is an instance of a `schema` class (stored as a row, readable
// by every SDK) or anything JSON holds.

import { words, Writer } from "./bytes.js";
import * as codec from "./codec.js";
import * as errors from "./errors.js";
import * as log from "./log.js";
import { decodeConfig, logUnexpected } from "./operator.js";
import { Batch, LazyRecord } from "./records.js";

/** An aggregate function for the host's tumbling, sliding and session windows:
 *
 *     const Totals = schema("Totals", { purchases: 0, total_cents: 0 });
 *     class PurchaseTotals extends Aggregate {
 *       static accumulator = Totals;
 *       createAccumulator() { return new Totals(); }
 *       add(acc, record) { acc.purchases += 1; acc.total_cents += record.field("amount_cents"); }
 *       merge(a, b) { return new Totals({ purchases: a.purchases + b.purchases, total_cents: a.total_cents + b.total_cents }); }
 *     }
 *     export const aggregate = exportAggregate(PurchaseTotals);
 *
 * `add` may change `acc` in place (return nothing) or return the new accumulator. The static
 * `accumulator`, a `schema` class, is what stored accumulators are read back as (plain
 * objects without it). */
export class Aggregate {
  /** `config` is the step's `config`, decoded from JSON (null when there is none). */
  open(_config) {}

  createAccumulator() {
    throw new errors.OperatorError("an Aggregate must define createAccumulator()");
  }

  add(_acc, _record) {
    throw new errors.OperatorError("an Aggregate must define add(acc, record)");
  }

  merge(_a, _b) {
    throw new errors.OperatorError(`${this.constructor.name} does not merge accumulators (session windows need merge)`);
  }

  /** What a window emits; the accumulator itself by default. */
  result(acc) {
    return acc;
  }
}

/** Byte strings back to back, with an 8-byte (offset, length) span each: `packed-items`. */
class Packed {
  constructor() {
    this.data = new Writer(1 << 12);
    this.spans = new Writer(1 << 10);
  }

  push(bytes) {
    this.spans.u32(this.data.length);
    this.spans.u32(bytes.length);
    this.data.append(bytes);
  }

  take() {
    return [this.data.take(), this.spans.take()];
  }
}

/** Drives one aggregate instance; every method returns [result, null] or [null, [kind, message]]. */
export class AggregateRunner {
  constructor(cls, host) {
    this.cls = cls;
    this.host = host;
    log.bind(host);
    this.schemas = new codec.Schemas(host.declareSchema, host.schemaFields);
    this.agg = null;
  }

  guarded(body) {
    try {
      return [body(), null];
    } catch (e) {
      logUnexpected(this.host, e);
      return [null, errors.describe(e)];
    }
  }

  aggregate() {
    if (this.agg === null) throw new errors.OperatorError("aggregate called before a successful open");
    return this.agg;
  }

  read(bytes, start = 0, end = bytes.length) {
    let value;
    try {
      value = codec.decodeValue(bytes, start, end, this.schemas);
    } catch (e) {
      throw new errors.OperatorError(`an accumulator the host stored is neither a row nor JSON: ${e.message}`);
    }
    const cls = this.agg.constructor.accumulator;
    return cls ? cls.from(value) : value;
  }

  write(acc) {
    return codec.encodeValue(acc, this.schemas);
  }

  open(config) {
    return this.guarded(() => {
      const agg = new this.cls();
      agg.open(decodeConfig(config));
      this.agg = agg;
    });
  }

  createAccumulator() {
    return this.guarded(() => this.write(this.aggregate().createAccumulator()));
  }

  /** One batch into many accumulators: returns [items data, spans] in update order. */
  add(data, records, accumulators, updates, indices) {
    return this.guarded(() => {
      const agg = this.aggregate();
      // No views: an aggregate reads the values of the records each window holds.
      const batch = new Batch(data, records, this.schemas);
      const u = words(updates);
      const out = new Packed();
      for (let at = 0; at < u.length; at += 4) {
        const accOff = u[at];
        let acc = this.read(accumulators, accOff, accOff + u[at + 1]);
        const first = u[at + 2];
        const count = u[at + 3];
        for (let k = first; k < first + count; k++) {
          const next = agg.add(acc, { __proto__: LazyRecord.prototype, batch, i: indices[k] });
          if (next !== undefined) acc = next;
        }
        out.push(this.write(acc));
      }
      return out.take();
    });
  }

  merge(a, b) {
    return this.guarded(() => this.write(this.aggregate().merge(this.read(a), this.read(b))));
  }

  getResults(data, spans) {
    return this.guarded(() => {
      const agg = this.aggregate();
      const s = words(spans);
      const out = new Packed();
      for (let at = 0; at < s.length; at += 2) {
        out.push(this.write(agg.result(this.read(data, s[at], s[at] + s[at + 1]))));
      }
      return out.take();
    });
  }
}
