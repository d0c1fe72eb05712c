"""Nexmark q1 in Python, the twin of examples/nexmark/q1: every bid with its price converted
from dollars to euros (price * 908 // 1000), unkeyed, with the bid's event time. Reads only
the fields it needs from each event's row."""

from dataclasses import dataclass

import eddy


@dataclass
class EuroBid:
    auction: int
    bidder: int
    price: int
    date_time: int


class CurrencyConversion(eddy.Operator):
    def process(self, record, ctx):
        if record.field("type") != "bid":
            return
        field = record.field
        ctx.emit_value(EuroBid(field("auction"), field("bidder"), field("price") * 908 // 1000, field("date_time")))


Operator = eddy.export_operator(CurrencyConversion)
