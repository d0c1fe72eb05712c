"""Fraud detection in Python: the twin of examples/fraud-detector (Rust), Flink's
`FraudDetector`. Keyed by account, an alert when a small transaction (< $1.00) is followed by
a large one (> $500.00) within a minute of processing time. A flag in value state remembers
the small transaction; a processing-time timer clears it, and its time is kept in state so it
can be deleted."""

from dataclasses import dataclass

import eddy

SMALL_AMOUNT_CENTS = 100
LARGE_AMOUNT_CENTS = 50_000
ONE_MINUTE_MS = 60_000


@dataclass
class Alert:
    account_id: int
    amount_cents: int


class FraudDetector(eddy.Operator):
    def open(self, ctx, config):
        self.flag = ctx.value_state("flag")
        self.timer = ctx.value_state("timer", prefetch=False)

    def clean_up(self, ctx):
        at = self.timer.get()
        if at is not None:
            ctx.delete_timer(eddy.PROCESSING_TIME, at)
        self.timer.clear()
        self.flag.clear()

    def process(self, record, ctx):
        tx = record.value
        if self.flag.get(False):
            if tx["amount_cents"] > LARGE_AMOUNT_CENTS:
                ctx.emit(tx["account_id"], Alert(tx["account_id"], tx["amount_cents"]))
            self.clean_up(ctx)
        if tx["amount_cents"] < SMALL_AMOUNT_CENTS:
            self.flag.set(True)
            at = ctx.processing_time() + ONE_MINUTE_MS
            ctx.register_timer(eddy.PROCESSING_TIME, at)
            self.timer.set(at)

    def on_timer(self, timer, ctx):
        self.timer.clear()
        self.flag.clear()


Operator = eddy.export_operator(FraudDetector)
