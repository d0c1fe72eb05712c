// Eddy's JavaScript and TypeScript SDK: operators with keyed state, timers and side outputs,
// and aggregates for the host's windows, over the `eddy:dataflow` WIT the user never sees.
//
//     import { Operator, exportOperator } from "eddy";
//
//     class Count extends Operator {
//       open(ctx) { this.count = ctx.valueState("count"); }
//       process(record, ctx) {
//         const n = this.count.get(0) + record.value;
//         this.count.set(n);
//         ctx.emit(record.key, n);
//       }
//     }
//     export const operator = exportOperator(Count);
//
// `eddy build` bundles it into a component; `eddy/testing` runs it in plain Node.

import { AggregateRunner } from "./aggregate.js";
import { hostFor, timestamp } from "./host.js";
import { Runner } from "./operator.js";

export { Aggregate } from "./aggregate.js";
export { schema } from "./codec.js";
export { BadConfig, BadRecord, OperatorError } from "./errors.js";
export * as log from "./log.js";
export { EVENT_TIME, Operator, PROCESSING_TIME } from "./operator.js";

// The WIT's `operator-error` from [kind, message]: thrown, it becomes the call's `err`.
function check(failure) {
  if (failure !== null) throw { kind: failure[0], message: failure[1] };
}

function answer([result, failure]) {
  check(failure);
  return result;
}

/** The `operator` export for operator class `cls`: `export const operator = exportOperator(MyOperator)`. */
export function exportOperator(cls) {
  let runner = null;
  const live = () => (runner ??= new Runner(cls, hostFor("operator")));
  return {
    eddyOperator: cls,
    open: (config) => check(live().open(config)),
    process: (b) => check(live().process(b.data, b.records, b.prefetchedStates, b.prefetched)),
    onTimer: (t) =>
      check(live().onTimer(t.data, t.timers.map((r) => [r.key.offset, r.key.len, timestamp(r.timestamp), r.domain === "processing-time" ? 1 : 0, r.slot]))),
    close: () => check(live().close()),
  };
}

/** The `aggregate` export for aggregate class `cls`: `export const aggregate = exportAggregate(MyAggregate)`. */
export function exportAggregate(cls) {
  let runner = null;
  const live = () => (runner ??= new AggregateRunner(cls, hostFor("aggregate")));
  const items = ([data, spans]) => ({ data, spans });
  return {
    eddyAggregate: cls,
    open: (config) => check(live().open(config)[1]),
    createAccumulator: () => answer(live().createAccumulator()),
    add: (b, u) => items(answer(live().add(b.data, b.records, u.accumulators, u.updates, u.records))),
    merge: (a, b) => answer(live().merge(a, b)),
    getResults: (acc) => items(answer(live().getResults(acc.data, acc.spans))),
  };
}
