"""eddy: stream operators in Python for Eddy.

An operator is a WebAssembly component built with componentize-py against `wit/dataflow.wit`;
this package hides the generated bindings behind an `Operator` class (or an `Aggregate` for
the host's windows), typed keyed state, timers, side outputs, logging and errors. The keyed
counter of word count, complete:

    import eddy

    class Count(eddy.Operator):
        def open(self, ctx, config):
            self.count = ctx.value_state("count")

        def process(self, record, ctx):
            n = self.count.get(0) + record.value
            self.count.set(n)
            ctx.emit(record.key, n)

    Operator = eddy.export_operator(Count)

`eddy build DIR` makes the component (`eddy new --lang python DIR` scaffolds one with a test);
`eddy.testing.Harness` runs an operator in plain Python, without the host, for unit tests.

What to know:
- Keys and state are JSON, byte for byte what the Rust SDK writes, so state and keys mean the
  same in every language. Record values and accumulators are rows when they are dataclasses
  (the class name and field names are the schema) and JSON otherwise; both are read back,
  rows as dicts by field name (`record.value_as(Cls)` for a dataclass).
- State handles act on the key of the record or timer being handled; in `open` and `close`
  there is no key.
- Raise `eddy.BadRecord`, `eddy.BadConfig` or `eddy.OperatorError` for failures you
  understand; any other exception is caught and reported as a failure with its message (its
  traceback goes to the host's log). Either fails the task; its output and value-state writes
  of that call are dropped.
- The guest has no clock, randomness, files, network or environment: time is
  `ctx.processing_time()` and `ctx.watermark()`, from the host.
"""

from . import log
from ._wit import export_aggregate, export_operator
from .aggregate import Aggregate
from .codec import from_value
from .errors import BadConfig, BadRecord, OperatorError
from .operator import EVENT_TIME, PROCESSING_TIME, Context, OpenContext, Operator, Record, SideOutput, Timer

__all__ = [
    "EVENT_TIME",
    "PROCESSING_TIME",
    "Aggregate",
    "BadConfig",
    "BadRecord",
    "Context",
    "OpenContext",
    "Operator",
    "OperatorError",
    "Record",
    "SideOutput",
    "Timer",
    "export_aggregate",
    "export_operator",
    "from_value",
    "log",
]
