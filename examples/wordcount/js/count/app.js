// Word count, step 2, in JavaScript: the twin of examples/wordcount/count. Keyed by word;
// keeps a running count per word in value state and emits (word, count) after every record.

import { Operator, exportOperator } from "eddy";

class Count extends Operator {
  open(ctx) {
    this.count = ctx.valueState("count");
  }

  process(record, ctx) {
    const count = this.count.get(0) + record.value;
    this.count.set(count);
    ctx.emit(record.key, count);
  }
}

export const operator = exportOperator(Count);
