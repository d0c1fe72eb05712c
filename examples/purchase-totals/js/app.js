// Per-user purchase totals in JavaScript: the twin of examples/purchase-totals (Rust). The
// host's tumbling window calls this aggregate per user and hour; amounts are integer cents, so
// merging in any order gives exactly the same total.

import { Aggregate, exportAggregate, schema } from "eddy";

// Running totals of one user in one window; also the window's result. Same name and fields
// as the Rust struct, so both read each other's accumulators.
const Totals = schema("Totals", { purchases: 0, total_cents: 0 });

class PurchaseTotals extends Aggregate {
  static accumulator = Totals;

  createAccumulator() {
    return new Totals();
  }

  add(acc, record) {
    acc.purchases += 1;
    acc.total_cents += record.field("amount_cents");
  }

  merge(a, b) {
    return new Totals({ purchases: a.purchases + b.purchases, total_cents: a.total_cents + b.total_cents });
  }
}

export const aggregate = exportAggregate(PurchaseTotals);
