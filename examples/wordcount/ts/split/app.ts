// Word count, step 1, in TypeScript: the twin of examples/wordcount/split. Each input value is
// a line of text; emits one record per word, keyed by the lower-cased word, with value 1.

import { Context, Operator, Record, exportOperator } from "eddy";

// Rust's `char::is_alphanumeric` is Unicode's Alphabetic or Numeric.
const WORD = /[\p{Alphabetic}\p{N}]+/gu;

class Split extends Operator {
  process(record: Record, ctx: Context): void {
    const line = record.value as string;
    for (const [word] of line.matchAll(WORD)) ctx.emit(word.toLowerCase(), 1);
  }
}

export const operator = exportOperator(Split);
