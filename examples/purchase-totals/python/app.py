"""Per-user purchase totals in Python: the twin of examples/purchase-totals (Rust). The host's
tumbling window calls this aggregate per user and hour; amounts are integer cents, so merging
in any order gives exactly the same total."""

from dataclasses import dataclass

import eddy


@dataclass
class Totals:
    """Running totals of one user in one window; also the window's result. Same name and
    fields as the Rust struct, so both read each other's accumulators."""

    purchases: int = 0
    total_cents: int = 0


class PurchaseTotals(eddy.Aggregate):
    accumulator = Totals

    def create_accumulator(self):
        return Totals()

    def add(self, acc, record):
        acc.purchases += 1
        acc.total_cents += record.value["amount_cents"]

    def merge(self, a, b):
        return Totals(a.purchases + b.purchases, a.total_cents + b.total_cents)


Aggregate = eddy.export_aggregate(PurchaseTotals)
