// @ts-check
// The keyed-operator world's imports behind the host interface the operator runner uses.

import * as jsonBatch from "eddy:dataflow/json-batch@0.4.0";
import * as output from "eddy:dataflow/output@0.4.0";
import * as state from "eddy:dataflow/state@0.4.0";
import * as timers from "eddy:dataflow/timers@0.4.0";
import { installHost } from "./host.js";
import { common, number } from "./wit-common.js";

/** @type {import("eddy:dataflow/types@0.4.0").TimeDomain[]} */
const DOMAINS = ["event-time", "processing-time"];

// Asked at the first timer, not at load: the build snapshots the module with no host to ask.
/** @type {boolean | null} */
let bigS64 = null;
function s64(n) {
  bigS64 ??= typeof timers.currentWatermark() === "bigint";
  return bigS64 ? BigInt(n) : n;
}

// QuickJS's Date.now() asks WASI for the time, which the component does not import (it traps);
// SpiderMonkey's is the build's time, frozen. The host's processing time is the guest's clock.
Date.now = () => number(timers.currentProcessingTime());

installHost({
  operator: () => ({
    ...common,
    declareState: (name, kind, prefetch) => state.declare(name, kind, prefetch),
    valueGet: (id, handle) => state.valueGet(id, handle) ?? null,
    listGet: (id, handle) => state.listGet(id, handle),
    listAppend: (id, handle, item) => state.listAppend(id, handle, item),
    listReplace: (id, handle, items) => state.listReplace(id, handle, items),
    mapGet: (id, handle, key) => state.mapGet(id, handle, key) ?? null,
    mapPut: (id, handle, key, value) => state.mapPut(id, handle, key, value),
    mapRemove: (id, handle, key) => state.mapRemove(id, handle, key),
    mapEntries: (id, handle) => state.mapEntries(id, handle),
    clear: (id, handle) => state.clear(id, handle),
    registerTimer: (handle, domain, at) => timers.registerTimer(handle, DOMAINS[domain], s64(at)),
    deleteTimer: (handle, domain, at) => timers.deleteTimer(handle, DOMAINS[domain], s64(at)),
    currentWatermark: () => number(timers.currentWatermark()),
    currentProcessingTime: () => number(timers.currentProcessingTime()),
    sideOutput: (name) => output.sideOutput(name),
    emit: (data, records) => output.emit({ data, records }),
    jsonKeys: () => jsonBatch.keys() ?? null,
    jsonValues: () => jsonBatch.values() ?? null,
    jsonPrefetched: (id) => jsonBatch.prefetched(id) ?? null,
    jsonSetValues: (id, writes) => jsonBatch.setValues(id, writes),
    jsonEmit: (output, keyed, schema, records) => jsonBatch.emit(output, keyed, schema | 0, records),
  }),
  timestamp: number,
});
