// Nexmark q1 in JavaScript, the twin of examples/nexmark/q1: every bid with its price converted
// from dollars to euros (price * 908 / 1000, rounded down), unkeyed, with the bid's event
// time. Reads only the fields it needs from each event's row.

import { Operator, exportOperator, schema } from "eddy";

const EuroBid = schema("EuroBid", { auction: 0, bidder: 0, price: 0, date_time: 0 });

class CurrencyConversion extends Operator {
  process(record, ctx) {
    if (record.field("type") !== "bid") return;
    ctx.emitValue(
      new EuroBid({
        auction: record.field("auction"),
        bidder: record.field("bidder"),
        price: Math.floor((record.field("price") * 908) / 1000),
        date_time: record.field("date_time"),
      }),
    );
  }
}

export const operator = exportOperator(CurrencyConversion);
