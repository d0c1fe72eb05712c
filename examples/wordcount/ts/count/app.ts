// Word count, step 2, in TypeScript: the twin of examples/wordcount/count. Keyed by word;
// keeps a running count per word in value state and emits (word, count) after every record.

import { Context, OpenContext, Operator, Record, ValueState, exportOperator } from "eddy";

class Count extends Operator {
  private count!: ValueState<number>;

  open(ctx: OpenContext): void {
    this.count = ctx.valueState<number>("count");
  }

  process(record: Record, ctx: Context): void {
    const count = this.count.get(0) + (record.value as number);
    this.count.set(count);
    ctx.emit(record.key, count);
  }
}

export const operator = exportOperator(Count);
