// The JavaScript twin of tests/guests/tags: list state `tags`, map state `counts`, value
// state `first`, same output.

import { Operator, exportOperator } from "eddy";

class Tags extends Operator {
  open(ctx) {
    this.tags = ctx.listState("tags");
    this.counts = ctx.mapState("counts");
    // Read from the host one by one, not prefetched: the SDK itself reads the rows the Rust
    // operator wrote (the TypeScript twin reads them prefetched, rendered by the host).
    this.first = ctx.valueState("first", { prefetch: false });
  }

  process(record, ctx) {
    const tag = record.field("tag");
    this.tags.append(tag);
    const count = this.counts.get(tag, 0) + 1;
    this.counts.put(tag, count);
    const first = this.first.get() ?? { tag, records: 0 };
    first.records += 1;
    this.first.set(first);
    ctx.emit(record.key, {
      tags: this.tags.get(),
      count,
      distinct: this.counts.entries().length,
      first: first.tag,
      records: first.records,
    });
  }
}

export const operator = exportOperator(Tags);
