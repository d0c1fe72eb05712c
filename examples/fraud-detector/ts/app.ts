// Fraud detection in TypeScript: the twin of examples/fraud-detector (Rust), Flink's
// `FraudDetector`. Keyed by account, an alert when a small transaction (< $1.00) is followed
// by a large one (> $500.00) within a minute of processing time. A flag in value state
// remembers the small transaction; a processing-time timer clears it, and its time is kept in
// state so it can be deleted.

import { Context, OpenContext, Operator, PROCESSING_TIME, Record, ValueState, exportOperator, schema } from "eddy";

const SMALL_AMOUNT_CENTS = 100;
const LARGE_AMOUNT_CENTS = 50_000;
const ONE_MINUTE_MS = 60_000;

interface Transaction {
  account_id: number;
  amount_cents: number;
}

const Alert = schema("Alert", { account_id: 0, amount_cents: 0 });

class FraudDetector extends Operator {
  private flag!: ValueState<boolean>;
  private timer!: ValueState<number>;

  open(ctx: OpenContext): void {
    this.flag = ctx.valueState<boolean>("flag");
    this.timer = ctx.valueState<number>("timer", { prefetch: false });
  }

  private cleanUp(ctx: Context): void {
    const at = this.timer.get();
    if (at !== null) ctx.deleteTimer(PROCESSING_TIME, at);
    this.timer.clear();
    this.flag.clear();
  }

  process(record: Record, ctx: Context): void {
    const tx = record.value as Transaction;
    if (this.flag.get(false)) {
      if (tx.amount_cents > LARGE_AMOUNT_CENTS) {
        ctx.emit(tx.account_id, new Alert({ account_id: tx.account_id, amount_cents: tx.amount_cents }));
      }
      this.cleanUp(ctx);
    }
    if (tx.amount_cents < SMALL_AMOUNT_CENTS) {
      this.flag.set(true);
      const at = ctx.processingTime() + ONE_MINUTE_MS;
      ctx.registerTimer(PROCESSING_TIME, at);
      this.timer.set(at);
    }
  }

  onTimer(): void {
    this.timer.clear();
    this.flag.clear();
  }
}

export const operator = exportOperator(FraudDetector);
