// Step 1 of the polyglot pipeline, in TypeScript: each generated event {user, v} becomes a
// Purchase row of v items at $1.25, keyed by the user. A record without a user or a count
// is a bad record, named.

import { BadRecord, Context, Operator, Record, exportOperator, schema } from "eddy";

const PRICE_CENTS = 125;
const Purchase = schema("Purchase", { user_id: "", amount_cents: 0 });

class Parse extends Operator {
  process(record: Record, ctx: Context): void {
    const user = record.field<string | null>("user", null);
    const items = record.field<number | null>("v", null);
    if (typeof user !== "string" || typeof items !== "number") {
      throw new BadRecord(`an event needs a user and a count v: ${JSON.stringify(record.value)}`);
    }
    ctx.emit(user, new Purchase({ user_id: user, amount_cents: items * PRICE_CENTS }));
  }
}

export const operator = exportOperator(Parse);
