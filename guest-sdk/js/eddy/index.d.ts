// Types of Eddy's JavaScript SDK, for TypeScript operators (`eddy build` checks them with tsc
// before bundling). The runtime is index.js; see it for what each part does.

/** Event time: fires when the operator's watermark passes the timestamp. */
export const EVENT_TIME: 0;
/** Processing time: fires when the host's clock passes the timestamp. */
export const PROCESSING_TIME: 1;
export type TimeDomain = typeof EVENT_TIME | typeof PROCESSING_TIME;

/** What JSON keys and state values hold; integers past 2^53 are BigInts. */
export type Json = null | boolean | number | bigint | string | Json[] | { [field: string]: Json };

/** A row type made by `schema`: instances are written as rows of that schema. */
export interface RowClass<T extends object> {
  new (init?: Partial<T>): T;
  /** A stored row or plain object read back as an instance (missing fields defaulted). */
  from(value: unknown): T;
  readonly name: string;
}

/** A row type named `name` with the fields of `defaults`, in that order, defaulting to them. */
export function schema<T extends object>(name: string, defaults: T): RowClass<T>;

/** One input record, valid during the call that received it. */
export class Record {
  /** Event time in ms since the Unix epoch, or null. */
  readonly timestamp: number | null;
  /** The key, decoded from JSON (a BadRecord on a stream that is not keyed). */
  readonly key: Json;
  readonly keyBytes: Uint8Array | null;
  /** The value: an object for a row or JSON object, else what the JSON holds. */
  readonly value: unknown;
  readonly valueBytes: Uint8Array;
  /** Top-level field `name` of the value (`fallback` if it has none; a null field is null). */
  field<T = unknown>(name: string, fallback?: T): T;
  /** The value as an instance of row class `cls`. */
  valueAs<T extends object>(cls: RowClass<T>): T;
}

/** A timer that fired, for the current key. */
export class Timer {
  readonly timestamp: number;
  readonly domain: TimeDomain;
  readonly key: Json;
  readonly keyBytes: Uint8Array;
}

/** One value per key. */
export class ValueState<T> {
  readonly name: string;
  get(): T | null;
  get(fallback: T): T;
  set(value: T): void;
  clear(): void;
}

/** An ordered list per key. */
export class ListState<T> {
  readonly name: string;
  get(): T[];
  append(item: T): void;
  replace(items: T[]): void;
  clear(): void;
}

/** A map from user keys to values per key, ordered by the map key's JSON bytes. */
export class MapState<K, V> {
  readonly name: string;
  get(mapKey: K): V | null;
  get(mapKey: K, fallback: V): V;
  put(mapKey: K, value: V): void;
  remove(mapKey: K): void;
  entries(): [K, V][];
  clear(): void;
}

/** A named side output, declared in `open`. */
export class SideOutput {
  readonly id: number;
  readonly name: string;
}

/** Handed to `open`: declares states and side outputs. */
export class OpenContext {
  valueState<T = Json>(name: string, options?: { prefetch?: boolean }): ValueState<T>;
  listState<T = Json>(name: string): ListState<T>;
  mapState<K = Json, V = Json>(name: string): MapState<K, V>;
  sideOutput(name: string): SideOutput;
}

/** Handed to `process`, `onTimer` and `close`: output, timers and time. */
export class Context {
  /** Timestamp of the record or timer being handled; emitted records inherit it. */
  timestamp: number | null;
  emit(key: unknown, value: unknown, to?: SideOutput | null): void;
  emitValue(value: unknown, to?: SideOutput | null): void;
  registerTimer(domain: TimeDomain, timestamp: number): void;
  deleteTimer(domain: TimeDomain, timestamp: number): void;
  /** The operator's event-time watermark (ms); -(2 ** 63) before the first. */
  watermark(): number;
  /** The host's processing time (ms since the Unix epoch): the guest's only clock. */
  processingTime(): number;
}

/** A stream operator; extend it and export it with `exportOperator`. */
export class Operator {
  open(ctx: OpenContext, config: Json): void;
  process(record: Record, ctx: Context): void;
  onTimer(timer: Timer, ctx: Context): void;
  close(ctx: Context): void;
}

/** An aggregate function for the host's windows; extend it and export it with `exportAggregate`. */
export class Aggregate<A = unknown, R = A> {
  /** The row class stored accumulators are read back as (plain objects without it). */
  static accumulator?: RowClass<object>;
  open(config: Json): void;
  createAccumulator(): A;
  /** Changes `acc` in place (returns nothing) or returns the new accumulator. */
  add(acc: A, record: Record): A | void;
  merge(a: A, b: A): A;
  /** What a window emits; the accumulator itself by default. */
  result(acc: A): R;
}

/** A failure the operator chose (`error-kind.failed`); anything else thrown is reported too. */
export class OperatorError extends Error {
  readonly kind: "failed" | "bad-config" | "bad-record";
}
/** The step's configuration is unusable; retrying will not help. */
export class BadConfig extends OperatorError {}
/** A record could not be interpreted. */
export class BadRecord extends OperatorError {}

/** Logging to the host's log (job, task, subtask and operator attached; rate-limited). */
export namespace log {
  function trace(...parts: unknown[]): void;
  function debug(...parts: unknown[]): void;
  function info(...parts: unknown[]): void;
  function warn(...parts: unknown[]): void;
  function error(...parts: unknown[]): void;
}

/** What a component exports; built by the functions below, called only by the host. */
/** What the WIT's `batch` and `timer-batch` hand the SDK (it reads them; operators do not). */
export interface WitBatch {
  data: Uint8Array;
  records: Uint8Array;
  prefetchedStates: Uint32Array;
  prefetched: Uint8Array;
}
export interface WitTimerBatch {
  data: Uint8Array;
  timers: Array<{ key: { offset: number; len: number }; timestamp: bigint; domain: "event-time" | "processing-time"; slot: number }>;
}
export interface WitPackedItems {
  data: Uint8Array;
  spans: Uint8Array;
}

/** The `operator` export, as the WIT's `eddy:dataflow/operator` interface is typed (an
 * `eddy build` of a TypeScript operator checks that against types generated from the WIT). */
export interface OperatorExport {
  readonly eddyOperator: new () => Operator;
  open(config: string): void;
  process(records: WitBatch): void;
  onTimer(timers: WitTimerBatch): void;
  close(): void;
}
/** The `aggregate` export, as the WIT's `eddy:dataflow/aggregate` interface is typed. */
export interface AggregateExport {
  readonly eddyAggregate: new () => Aggregate<any, any>;
  open(config: string): void;
  createAccumulator(): Uint8Array;
  add(records: WitBatch, updates: { accumulators: Uint8Array; updates: Uint8Array; records: Uint32Array }): WitPackedItems;
  merge(a: Uint8Array, b: Uint8Array): Uint8Array;
  getResults(accumulators: WitPackedItems): WitPackedItems;
}

/** The `operator` export: `export const operator = exportOperator(MyOperator)`. */
export function exportOperator(cls: new () => Operator): OperatorExport;
/** The `aggregate` export: `export const aggregate = exportAggregate(MyAggregate)`. */
export function exportAggregate(cls: new () => Aggregate<any, any>): AggregateExport;
