// The TypeScript twin of tests/guests/tags: list state `tags`, map state `counts`, value
// state `first`, same output.

import { Context, ListState, MapState, OpenContext, Operator, Record, ValueState, exportOperator } from "eddy";

class Tags extends Operator {
  private tags!: ListState<string>;
  private counts!: MapState<string, number>;
  private first!: ValueState<{ tag: string; records: number }>;

  open(ctx: OpenContext): void {
    this.tags = ctx.listState<string>("tags");
    this.counts = ctx.mapState<string, number>("counts");
    this.first = ctx.valueState<{ tag: string; records: number }>("first");
  }

  process(record: Record, ctx: Context): void {
    const tag = record.field<string>("tag", "");
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
