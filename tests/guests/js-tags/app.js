// The JavaScript twin of tests/guests/tags: list state `tags`, map state `counts`, same output.

import { Operator, exportOperator } from "eddy";

class Tags extends Operator {
  open(ctx) {
    this.tags = ctx.listState("tags");
    this.counts = ctx.mapState("counts");
  }

  process(record, ctx) {
    const tag = record.field("tag");
    this.tags.append(tag);
    const count = this.counts.get(tag, 0) + 1;
    this.counts.put(tag, count);
    ctx.emit(record.key, { tags: this.tags.get(), count, distinct: this.counts.entries().length });
  }
}

export const operator = exportOperator(Tags);
