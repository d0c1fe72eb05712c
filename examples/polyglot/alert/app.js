// Step 4 of the polyglot pipeline, in JavaScript: a keyed alert on the hourly totals the Rust
// window emits. A window whose total reaches the threshold is an alert, numbered per user
// (value state); the others pass unseen.

import { Operator, exportOperator, schema } from "eddy";

const Alert = schema("Alert", { user_id: "", start: 0, total_cents: 0, nth: 0 });

class Spend extends Operator {
  open(ctx, config) {
    this.threshold = config?.threshold_cents ?? 20_000;
    this.alerts = ctx.valueState("alerts");
  }

  process(record, ctx) {
    const window = record.value;
    if (window.result.total_cents < this.threshold) return;
    const nth = this.alerts.get(0) + 1;
    this.alerts.set(nth);
    ctx.emit(record.key, new Alert({ user_id: record.key, start: window.start, total_cents: window.result.total_cents, nth }));
  }
}

export const operator = exportOperator(Spend);
