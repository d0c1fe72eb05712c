"""Window aggregates: the `Aggregate` class users subclass and the runner behind the
`eddy:dataflow/aggregate` export. The host's window operators keep the accumulators (as
bytes, in keyed state) and call the aggregate once per batch for every (key, window) the
batch touches; an accumulator is a dataclass (stored as a row, readable by every SDK) or
anything JSON holds."""

import struct
import traceback

from . import codec, errors, log
from .operator import _decode_config
from .records import Batch, LazyRecord

UPDATE = struct.Struct("<IIII")
SPAN = struct.Struct("<II")


class Aggregate:
    """An aggregate function for the host's tumbling, sliding and session windows:

        @dataclass
        class Totals:
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

    `add` may change `acc` in place (return None) or return the new accumulator.
    `accumulator`, a dataclass, is what stored accumulators are read back as (dicts without it).
    """

    accumulator = None

    def open(self, config):
        """`config` is the step's `config`, decoded from JSON (None when there is none)."""

    def create_accumulator(self):
        raise NotImplementedError("an Aggregate must define create_accumulator(self)")

    def add(self, acc, record):
        raise NotImplementedError("an Aggregate must define add(self, acc, record)")

    def merge(self, a, b):
        raise errors.OperatorError(f"{type(self).__name__} does not merge accumulators (session windows need merge)")

    def result(self, acc):
        """What a window emits; the accumulator itself by default."""
        return acc


class AggregateRunner:
    """Drives one aggregate instance; every method returns (result, None) or (None, (kind, message))."""

    def __init__(self, cls, host):
        self._cls = cls
        self._host = host
        log._bind(host)
        self._schemas = codec.Schemas(host.declare_schema, host.schema_fields)
        self._agg = None

    def _guarded(self, body):
        try:
            return body(), None
        except Exception as e:  # noqa: BLE001 - every failure becomes an operator error
            if not isinstance(e, errors.OperatorError):
                self._host.log(4, "".join(traceback.format_exception(e))[-4000:])
            return None, errors.describe(e)

    def _aggregate(self):
        if self._agg is None:
            raise errors.OperatorError("aggregate called before a successful open")
        return self._agg

    def _read(self, raw):
        try:
            value = codec.decode_value(raw, self._schemas)
        except (ValueError, UnicodeDecodeError) as e:
            raise errors.OperatorError(f"an accumulator the host stored is neither a row nor JSON: {e}") from None
        cls = self._agg.accumulator
        return codec.from_value(cls, value) if cls is not None else value

    def _write(self, acc):
        return codec.encode_value(acc, self._schemas)

    def open(self, config):
        def body():
            agg = self._cls()
            agg.open(_decode_config(config))
            self._agg = agg

        return self._guarded(body)

    def create_accumulator(self):
        return self._guarded(lambda: self._write(self._aggregate().create_accumulator()))

    def add(self, data, records, accumulators, updates, indices):
        """One batch into many accumulators: returns (items data, spans) in update order."""

        def body():
            agg = self._aggregate()
            # No views: an aggregate reads the values of the records each window holds.
            batch = Batch(data, records, self._schemas)
            out = bytearray()
            spans = bytearray()
            for acc_off, acc_len, first, count in UPDATE.iter_unpack(updates):
                acc = self._read(accumulators[acc_off:acc_off + acc_len])
                for index in indices[first:first + count]:
                    new = agg.add(acc, LazyRecord((batch, index, None, None)))
                    if new is not None:
                        acc = new
                encoded = self._write(acc)
                spans += SPAN.pack(len(out), len(encoded))
                out += encoded
            return bytes(out), bytes(spans)

        return self._guarded(body)

    def merge(self, a, b):
        return self._guarded(lambda: self._write(self._aggregate().merge(self._read(a), self._read(b))))

    def get_results(self, data, spans):
        def body():
            agg = self._aggregate()
            out = bytearray()
            out_spans = bytearray()
            for off, length in SPAN.iter_unpack(spans):
                encoded = codec.encode_value(agg.result(self._read(data[off:off + length])), self._schemas)
                out_spans += SPAN.pack(len(out), len(encoded))
                out += encoded
            return bytes(out), bytes(out_spans)

        return self._guarded(body)
