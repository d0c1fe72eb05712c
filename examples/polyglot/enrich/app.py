"""Step 2 of the polyglot pipeline, in Python: every purchase gets a size band and the user's
running number of purchases (value state), as a row Rust, JavaScript and Go read by name."""

from dataclasses import dataclass

import eddy

LARGE_CENTS = 800


@dataclass
class Enriched:
    user_id: str
    amount_cents: int
    band: str
    nth: int


class Enrich(eddy.Operator):
    def open(self, ctx, config):
        self.seen = ctx.value_state("seen")

    def process(self, record, ctx):
        p = record.value
        nth = self.seen.get(0) + 1
        self.seen.set(nth)
        band = "large" if p["amount_cents"] >= LARGE_CENTS else "small"
        ctx.emit(record.key, Enriched(p["user_id"], p["amount_cents"], band, nth))


Operator = eddy.export_operator(Enrich)
