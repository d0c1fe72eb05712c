// The TypeScript twin of tests/guests/tags: list state `tags`, map state `counts`, same output.

import { Context, ListState, MapState, OpenContext, Operator, Record, exportOperator } from "eddy";

class Tags extends Operator {
  private tags!: ListState<string>;
  private counts!: MapState<string, number>;

  open(ctx: OpenContext): void {
    this.tags = ctx.listState<string>("tags");
    this.counts = ctx.mapState<string, number>("counts");
  }

  process(record: Record, ctx: Context): void {
    const tag = record.field<string>("tag", "");
    this.tags.append(tag);
    const count = this.counts.get(tag, 0) + 1;
    this.counts.put(tag, count);
    ctx.emit(record.key, { tags: this.tags.get(), count, distinct: this.counts.entries().length });
  }
}

export const operator = exportOperator(Tags);
