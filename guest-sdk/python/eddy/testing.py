"""Run an operator or aggregate in plain Python, without a component or the host, for unit
tests. The in-memory host keeps state per (state, key) as the real one does (keys and
values as the bytes the SDK writes), fires timers in timestamp order when time is advanced,
and decodes what the operator emits:

    from eddy.testing import Harness

    h = Harness(Count)
    assert h.process([("fox", 1), ("fox", 2)]) == [("fox", 1), ("fox", 3)]

It checks the same contract the host enforces (state only under a record's or timer's key,
timers only for it), but not the host's limits or the sandbox: `eddy run` does that.
"""

import json
import math
import struct

from . import codec, rows
from .aggregate import SPAN, UPDATE, AggregateRunner
from .operator import EVENT_TIME, PROCESSING_TIME, Runner
from .records import ABSENT, RECORD
from .rows import schema_id

MIN_WATERMARK = -(1 << 63)


class Failed(Exception):
    """The operator failed a call: `kind` is the WIT error kind, the message what it said."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class _Host:
    """The imports, kept in memory."""

    def __init__(self):
        self.schemas = {}
        self.states = {}
        self.values = {}
        self.lists = {}
        self.maps = {}
        self.timers = set()
        self.sides = {}
        self.keys = []
        self.emitted = []
        self.logs = []
        self.watermark = MIN_WATERMARK
        self.now = 0
        # The `process` call in progress: its bytes, packed records and prefetched cells.
        self.batch = None

    def declare_schema(self, name, fields):
        id = schema_id(name, fields)
        self.schemas[id] = (name, list(fields))
        return id

    def schema_fields(self, id):
        return self.schemas.get(id)

    def declare_state(self, name, kind, prefetch):
        known = self.states.get(name)
        if known is not None and known[1] != kind:
            raise RuntimeError(f"state {name!r} declared as {known[1]} and then as {kind} (the host traps)")
        if known is None:
            known = self.states[name] = (len(self.states), kind)
        return known[0]

    def _key(self, handle):
        if handle is None or not 0 <= handle < len(self.keys) or self.keys[handle] is None:
            raise RuntimeError(f"key handle {handle} names no key of this call (the host traps)")
        return self.keys[handle]

    def value_get(self, state, handle):
        return self.values.get((state, self._key(handle)))

    def list_get(self, state, handle):
        return list(self.lists.get((state, self._key(handle)), []))

    def list_append(self, state, handle, item):
        self.lists.setdefault((state, self._key(handle)), []).append(bytes(item))

    def list_replace(self, state, handle, items):
        self.lists[(state, self._key(handle))] = [bytes(i) for i in items]

    def map_get(self, state, handle, map_key):
        return self.maps.get((state, self._key(handle)), {}).get(bytes(map_key))

    def map_put(self, state, handle, map_key, value):
        self.maps.setdefault((state, self._key(handle)), {})[bytes(map_key)] = bytes(value)

    def map_remove(self, state, handle, map_key):
        self.maps.get((state, self._key(handle)), {}).pop(bytes(map_key), None)

    def map_entries(self, state, handle):
        return sorted(self.maps.get((state, self._key(handle)), {}).items())

    def clear(self, state, handle):
        key = (state, self._key(handle))
        for store in (self.values, self.lists, self.maps):
            store.pop(key, None)

    def register_timer(self, handle, domain, timestamp):
        self.timers.add((domain, timestamp, self._key(handle)))

    def delete_timer(self, handle, domain, timestamp):
        self.timers.discard((domain, timestamp, self._key(handle)))

    def current_watermark(self):
        return self.watermark

    def current_processing_time(self):
        return self.now

    def side_output(self, name):
        return self.sides.setdefault(name, len(self.sides) + 1)

    def emit(self, data, records):
        for ko, kl, vo, vl, ts, flags, output in RECORD.iter_unpack(records):
            key = None if kl == ABSENT else bytes(data[ko:ko + kl])
            self.emitted.append((key, bytes(data[vo:vo + vl]), ts if flags & 1 else None, output))

    # The `json-batch` views and writes, as the host answers them.

    def json_keys(self):
        try:
            keys = [None if k is None else codec.decode_json(k) for k in self.keys]
        except (ValueError, UnicodeDecodeError):
            return None
        return codec.dumps(keys)

    def json_values(self):
        data, table, _, _ = self._in_process()
        schemas = codec.Schemas(self.declare_schema, self.schema_fields)
        try:
            values = [codec.decode_value(data[vo:vo + vl], schemas) for _, _, vo, vl, _, _, _ in RECORD.iter_unpack(table)]
        except (ValueError, UnicodeDecodeError):
            return None
        return codec.dumps(values) if all(map(_exact, values)) else None

    def json_prefetched(self, state):
        data, _, states, cells = self._in_process()
        if state not in states:
            raise RuntimeError(f"state {state} is not prefetched (the host traps)")
        width, column = len(states), states.index(state)
        spans = list(struct.iter_unpack("<II", cells))
        values = []
        for row in range(len(spans) // width):
            off, length = spans[row * width + column]
            values.append(None if length == ABSENT else codec.decode_json(data[off:off + length]))
        return codec.dumps(values)

    def json_set_values(self, state, writes):
        handles, values, cleared = json.loads(writes)
        for handle, value in zip(handles, values, strict=True):
            self.values[(state, self._key(handle))] = codec.encode_json(value)
        for handle in cleared:
            self.values.pop((state, self._key(handle)), None)

    def json_emit(self, output, keyed, schema, records):
        items = json.loads(records)
        width = 3 if keyed else 2
        for at in range(0, len(items), width):
            key = codec.encode_json(items[at]) if keyed else None
            value, ts = items[at + width - 2], items[at + width - 1]
            encoded = rows.write_row(value, schema) if schema else codec.encode_json(value)
            self.emitted.append((key, encoded, ts, output))

    def _in_process(self):
        if self.batch is None:
            raise RuntimeError("json-batch values serve only process (the host traps)")
        return self.batch

    def log(self, level, message):
        self.logs.append((("trace", "debug", "info", "warn", "error")[level], message))


def _exact(value):
    """Whether JSON says `value` exactly (the host's views refuse bytes and non-finite floats)."""
    if isinstance(value, (bytes, bytearray)):
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(map(_exact, value.values()))
    if isinstance(value, list):
        return all(map(_exact, value))
    return True


def _check(failure):
    if failure is not None:
        raise Failed(*failure)


class Output(tuple):
    """An emitted record: (key, value), with `timestamp` and `side` (None for the main output)."""

    timestamp = None
    side = None


class Harness:
    """One operator instance over the in-memory host."""

    def __init__(self, operator_class, config=None):
        self.host = _Host()
        self._schemas = codec.Schemas(self.host.declare_schema, self.host.schema_fields)
        self._runner = Runner(getattr(operator_class, "__eddy_operator__", operator_class), self.host)
        _check(self._runner.open("" if config is None else codec.encode_json(config).decode()))

    def _outputs(self):
        sides = {v: k for k, v in self.host.sides.items()}
        out = []
        for key, value, ts, side in self.host.emitted:
            o = Output((None if key is None else codec.decode_json(key), codec.decode_value(value, self._schemas)))
            o.timestamp = ts
            o.side = sides.get(side)
            out.append(o)
        self.host.emitted.clear()
        return out

    def process(self, records):
        """Hands `records` to the operator as one batch; each is (key, value) or
        (key, value, timestamp), key None for an unkeyed record. Returns what it emitted."""
        data = bytearray()
        table = bytearray()
        first = {}
        self.host.keys = []
        for i, record in enumerate(records):
            key, value = record[0], record[1]
            ts = record[2] if len(record) > 2 else None
            v = codec.encode_value(value, self._schemas)
            if key is None:
                ko, kl, slot = 0, ABSENT, i
                self.host.keys.append(None)
            else:
                k = codec.encode_json(key)
                ko, kl = len(data), len(k)
                data += k
                slot = first.setdefault(k, i)
                self.host.keys.append(k)
            vo = len(data)
            data += v
            table += RECORD.pack(ko, kl, vo, len(v), ts or 0, 0 if ts is None else 1, slot)
        # Prefetch every prefetched value state, as the host does.
        prefetched_states = sorted(id for id, kind in self.host.states.values() if kind == "value")
        cells = bytearray()
        for key in self.host.keys:
            for state in prefetched_states:
                value = None if key is None else self.host.values.get((state, key))
                if value is None:
                    cells += struct.pack("<II", 0, ABSENT)
                else:
                    cells += struct.pack("<II", len(data), len(value))
                    data += value
        self.host.batch = (bytes(data), bytes(table), prefetched_states, bytes(cells))
        try:
            _check(self._runner.process(*self.host.batch))
        finally:
            self.host.batch = None
        return self._outputs()

    def _fire(self, domain, upto):
        due = sorted(t for t in self.host.timers if t[0] == domain and t[1] <= upto)
        out = []
        if due:
            self.host.timers.difference_update(due)
            data = bytearray()
            refs = []
            first = {}
            self.host.keys = []
            for i, (_, ts, key) in enumerate(due):
                refs.append((len(data), len(key), ts, domain, first.setdefault(key, i)))
                data += key
                self.host.keys.append(key)
            _check(self._runner.on_timer(bytes(data), refs))
            out = self._outputs()
        return out

    def advance_watermark(self, watermark):
        """Moves event time to `watermark`, firing due event-time timers; returns the output."""
        self.host.watermark = watermark
        return self._fire(EVENT_TIME, watermark)

    def advance_processing_time(self, now):
        """Moves the host's clock to `now`, firing due processing-time timers; returns the output."""
        self.host.now = now
        return self._fire(PROCESSING_TIME, now)

    def close(self):
        _check(self._runner.close())
        return self._outputs()

    def timers(self):
        """The registered timers: (domain, timestamp, key), sorted."""
        return sorted((d, ts, codec.decode_json(k)) for d, ts, k in self.host.timers)

    def value(self, state, key):
        """What value state `state` holds for `key` (decoded), None if nothing."""
        id, _ = self.host.states[state]
        raw = self.host.values.get((id, codec.encode_json(key)))
        return None if raw is None else codec.decode_json(raw)


class AggregateHarness:
    """One aggregate instance, driven as a window would drive it."""

    def __init__(self, aggregate_class, config=None):
        self.host = _Host()
        self._schemas = codec.Schemas(self.host.declare_schema, self.host.schema_fields)
        self._runner = AggregateRunner(getattr(aggregate_class, "__eddy_aggregate__", aggregate_class), self.host)
        result, failure = self._runner.open("" if config is None else codec.encode_json(config).decode())
        _check(failure)

    def _call(self, answer):
        result, failure = answer
        _check(failure)
        return result

    def accumulate(self, values, acc=None):
        """Folds `values` (record values) into `acc` (bytes; a new accumulator if None) in one
        `add`; returns the new accumulator's bytes."""
        if acc is None:
            acc = self._call(self._runner.create_accumulator())
        data = bytearray()
        table = bytearray()
        for v in values:
            encoded = codec.encode_value(v, self._schemas)
            table += RECORD.pack(0, ABSENT, len(data), len(encoded), 0, 0, len(table) // 32)
            data += encoded
        updates = UPDATE.pack(0, len(acc), 0, len(values))
        out, spans = self._call(self._runner.add(bytes(data), bytes(table), acc, updates, list(range(len(values)))))
        off, length = SPAN.unpack_from(spans, 0)
        return out[off:off + length]

    def merge(self, a, b):
        return self._call(self._runner.merge(a, b))

    def result(self, acc):
        """What a window holding accumulator `acc` (bytes) emits, decoded."""
        out, spans = self._call(self._runner.get_results(acc, SPAN.pack(0, len(acc))))
        off, length = SPAN.unpack_from(spans, 0)
        return codec.decode_value(out[off:off + length], self._schemas)

    def window(self, values):
        """The result of one window over `values`."""
        return self.result(self.accumulate(values))


