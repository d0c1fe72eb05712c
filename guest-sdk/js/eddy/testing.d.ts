// Types of eddy/testing: operators and aggregates run in plain Node over an in-memory host.

import type { Aggregate, AggregateExport, Json, Operator, OperatorExport } from "./index.js";

export const MIN_WATERMARK: number;

/** The operator failed a call: `kind` is the WIT error kind, `detail` what it said. */
export class Failed extends Error {
  readonly kind: "failed" | "bad-config" | "bad-record";
  readonly detail: string;
}

/** An emitted record: [key, value], with its timestamp and side output (null for the main one). */
export type Output = [Json, unknown] & { timestamp: number | null; side: string | null };

/** An input record: [key, value] or [key, value, timestamp]; key null for an unkeyed record. */
export type Input = [Json, unknown] | [Json, unknown, number];

export class Harness {
  constructor(operator: (new () => Operator) | OperatorExport, config?: Json);
  process(records: Input[]): Output[];
  advanceWatermark(watermark: number): Output[];
  advanceProcessingTime(now: number): Output[];
  close(): Output[];
  timers(): [number, number, Json][];
  value(state: string, key: Json): Json;
}

export class AggregateHarness {
  constructor(aggregate: (new () => Aggregate<any, any>) | AggregateExport, config?: Json);
  accumulate(values: unknown[], acc?: Uint8Array): Uint8Array;
  merge(a: Uint8Array, b: Uint8Array): Uint8Array;
  result(acc: Uint8Array): unknown;
  window(values: unknown[]): unknown;
}
