// Word count, step 1, in TypeScript: the twin of examples/wordcount/split. Each input value is
// a line of text; emits one record per word, keyed by the lower-cased word, with value 1.

import { Context, Operator, Record, exportOperator } from "eddy";

// Rust's `char::is_alphanumeric` is Unicode's Alphabetic or Numeric.
const WORD = /[\p{Alphabetic}\p{N}]+/gu;

class Split extends Operator {
  process(record: Record, ctx: Context): void {
    // One match call for the whole line: an interpreter pays per call, not per character.
    const words = (record.value as string).match(WORD) ?? [];
    for (let i = 0; i < words.length; i++) ctx.emit(words[i].toLowerCase(), 1);
  }
}

export const operator = exportOperator(Split);
