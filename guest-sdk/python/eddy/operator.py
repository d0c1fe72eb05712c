"""Keyed operators: the `Operator` class users subclass, what it is handed, and the runner
that drives it behind the `eddy:dataflow/operator` export.

The runner takes whole batches (one crossing per batch): records are read from the packed
tables with `struct.iter_unpack`, and a record's key and value are decoded only when the
operator asks for them. Value-state writes are buffered and handed to the host in one
`value-set-many` at the end of the call, and output in one `emit`, so a call costs a handful
of crossings however many records it holds. A failed call's buffered writes and output are
dropped.
"""

import json
import struct
import traceback

from . import codec, errors, log, rows

RECORD = struct.Struct("<IIIIqII")
CELL = struct.Struct("<II")
WRITE = struct.Struct("<IIII")
ABSENT = 0xFFFFFFFF
OUTPUT_FLUSH_BYTES = 1 << 20

EVENT_TIME = 0
PROCESSING_TIME = 1

_UNSET = object()
# Values read back from this call's own writes without decoding them again.
_IMMUTABLE = (int, float, str, bool, type(None), tuple, frozenset, bytes)

_NO_KEY = (
    "keyed state needs the current record's key: there is none in open/close (use state in "
    "process or on_timer) nor for a record without a key (add key_by before this step)"
)


class Operator:
    """A stream operator. Subclass it, and export it from the component's `app` module:

        class Counter(eddy.Operator):
            def open(self, ctx, config):
                self.count = ctx.value_state("count")

            def process(self, record, ctx):
                n = (self.count.get() or 0) + 1
                self.count.set(n)
                ctx.emit(record.key, n)

        Operator = eddy.export_operator(Counter)

    The host makes one instance per subtask and calls `open` once, `process` for every
    record in order, `on_timer` for every timer that fires and `close` at the end of a
    bounded input. State handles act on the key of the record or timer being handled.
    """

    def open(self, ctx, config):
        """Declare states and side outputs through `ctx`; `config` is the step's `config`
        from the pipeline, decoded from JSON (None when there is none)."""

    def process(self, record, ctx):
        """Handles one record."""
        raise NotImplementedError("an Operator must define process(self, record, ctx)")

    def on_timer(self, timer, ctx):
        """Handles one timer of the current key. The default ignores timers."""

    def close(self, ctx):
        """Called at the end of a bounded input. The default does nothing."""


class Record:
    """One input record, valid during the call that received it. `key` and `value` are
    decoded on first use: a record whose value is never read costs no decoding."""

    __slots__ = ("_call", "_data", "_ko", "_kl", "_vo", "_vl", "timestamp", "_key", "_value")

    def __init__(self, call, data, ko, kl, vo, vl, timestamp):
        self._call = call
        self._data = data
        self._ko = ko
        self._kl = kl
        self._vo = vo
        self._vl = vl
        #: Event time in ms since the Unix epoch, or None.
        self.timestamp = timestamp
        self._key = _UNSET
        self._value = _UNSET

    @property
    def key(self):
        """The key, decoded from JSON."""
        if self._key is _UNSET:
            if self._kl == ABSENT:
                raise errors.BadRecord("record has no key (is the stream keyed?)")
            raw = self._data[self._ko:self._ko + self._kl]
            try:
                self._key = codec.decode_json(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise errors.BadRecord(f"key is not JSON: {e}") from None
            self._call.last_key = (self._key, raw)
        return self._key

    @property
    def key_bytes(self):
        """The raw key bytes, None on a stream that is not keyed."""
        return None if self._kl == ABSENT else self._data[self._ko:self._ko + self._kl]

    @property
    def value(self):
        """The value: a dict for a row or JSON object, else what the JSON holds."""
        if self._value is _UNSET:
            try:
                self._value = codec.decode_value(self._data[self._vo:self._vo + self._vl], self._call.schemas)
            except (ValueError, UnicodeDecodeError) as e:
                raise errors.BadRecord(f"value is neither JSON nor a row: {e}") from None
        return self._value

    @property
    def value_bytes(self):
        """The raw value bytes (a row or JSON)."""
        return self._data[self._vo:self._vo + self._vl]

    def field(self, name, default=None):
        """Top-level field `name` of the value (`default` if it has none). From a row only
        that field is read, nothing else is decoded: the way to filter on one field."""
        if self._value is _UNSET and self._vl > 0 and self._data[self._vo] == 0xB7:
            raw = self._data[self._vo:self._vo + self._vl]
            schemas = self._call.schemas
            try:
                slot = schemas.index(rows.schema_of(raw), name)
                return default if slot is None else rows.read_field(raw, slot, schemas.names)
            except (ValueError, UnicodeDecodeError) as e:
                raise errors.BadRecord(f"value is not a whole row: {e}") from None
        value = self.value
        return value.get(name, default) if isinstance(value, dict) else default

    def value_as(self, cls):
        """The value as dataclass `cls` (fields it lacks take their defaults)."""
        try:
            return codec.from_value(cls, self.value)
        except TypeError as e:
            raise errors.BadRecord(f"value is not a {cls.__name__}: {e}") from None

    def __repr__(self):
        return f"Record(key={self.key_bytes!r}, value={self.value_bytes!r}, timestamp={self.timestamp})"


class Timer:
    """A timer that fired, for the current key."""

    __slots__ = ("_call", "_raw", "_key", "timestamp", "domain")

    def __init__(self, call, raw_key, timestamp, domain):
        self._call = call
        self._raw = raw_key
        self._key = _UNSET
        #: When it was set to fire (ms).
        self.timestamp = timestamp
        #: `eddy.EVENT_TIME` or `eddy.PROCESSING_TIME`.
        self.domain = domain

    @property
    def key(self):
        """The key it was registered for, decoded."""
        if self._key is _UNSET:
            try:
                self._key = codec.decode_json(self._raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise errors.BadRecord(f"timer key is not JSON: {e}") from None
            self._call.last_key = (self._key, self._raw)
        return self._key

    @property
    def key_bytes(self):
        return self._raw


class _Call:
    """What the call in progress brought in and has buffered."""

    def __init__(self, host):
        self.host = host
        self.schemas = codec.Schemas(host.declare_schema, host.schema_fields)
        self.handle = None
        self.slot = 0
        self.row = None
        self.data = b""
        self.prefetch_cols = {}
        self.prefetch_width = 0
        self.prefetched = b""
        self.writes = {}
        self.out_data = bytearray()
        self.out_rows = bytearray()
        self.last_key = (_UNSET, None)

    def begin(self, data, prefetched_states=(), prefetched=b""):
        self.data = data
        self.prefetch_cols = {s: i for i, s in enumerate(prefetched_states)}
        self.prefetch_width = len(prefetched_states)
        self.prefetched = prefetched
        self.writes.clear()
        self.handle = None
        self.row = None

    def key_handle(self):
        if self.handle is None:
            raise errors.OperatorError(_NO_KEY)
        return self.handle

    def flush_state(self):
        if not self.writes:
            return
        data = bytearray()
        table = bytearray()
        for (state, slot), (encoded, _) in self.writes.items():
            if encoded is None:
                table += WRITE.pack(state, slot, 0, ABSENT)
            else:
                table += WRITE.pack(state, slot, len(data), len(encoded))
                data += encoded
        self.writes.clear()
        self.host.value_set_many(bytes(data), bytes(table))

    def flush_output(self):
        if self.out_rows:
            self.host.emit(bytes(self.out_data), bytes(self.out_rows))
            self.out_data.clear()
            self.out_rows.clear()

    def discard(self):
        self.writes.clear()
        self.out_data.clear()
        self.out_rows.clear()

    def key_bytes_of(self, key):
        """JSON bytes of `key`; a key just read from a record is not encoded again."""
        last, raw = self.last_key
        if key is last and type(key) in (str, int):
            return raw
        return codec.encode_json(key)

    def push(self, output, key, value, timestamp):
        data = self.out_data
        if key is _UNSET:
            ko, kl = 0, ABSENT
        else:
            k = self.key_bytes_of(key)
            ko, kl = len(data), len(k)
            data += k
        v = codec.encode_value(value, self.schemas)
        vo = len(data)
        data += v
        flags = 0 if timestamp is None else 1
        self.out_rows += RECORD.pack(ko, kl, vo, len(v), timestamp or 0, flags, output)
        if len(data) >= OUTPUT_FLUSH_BYTES:
            self.flush_output()


class SideOutput:
    """A named side output, declared in `open`."""

    __slots__ = ("id", "name")

    def __init__(self, id, name):
        self.id = id
        self.name = name

    def __repr__(self):
        return f"SideOutput({self.name!r})"


class ValueState:
    """One value per key (JSON, as every SDK stores it)."""

    __slots__ = ("_call", "id", "name")

    def __init__(self, call, id, name):
        self._call = call
        self.id = id
        self.name = name

    def get(self, default=None):
        """The value for the current key, or `default` if none was set."""
        c = self._call
        if c.handle is None:
            raise errors.OperatorError(_NO_KEY)
        written = c.writes.get((self.id, c.slot))
        if written is not None:
            encoded, obj = written
            if encoded is None:
                return default
            return obj if obj is not _UNSET else codec.decode_json(encoded)
        col = c.prefetch_cols.get(self.id)
        if col is not None and c.row is not None:
            off, length = CELL.unpack_from(c.prefetched, 8 * (c.row * c.prefetch_width + col))
            if length == ABSENT:
                return default
            return codec.decode_json(c.data[off:off + length])
        raw = c.host.value_get(self.id, c.handle)
        return default if raw is None else codec.decode_json(raw)

    def set(self, value):
        """Replaces the value for the current key."""
        c = self._call
        if c.handle is None:
            raise errors.OperatorError(_NO_KEY)
        keep = value if isinstance(value, _IMMUTABLE) else _UNSET
        c.writes[(self.id, c.slot)] = (codec.encode_json(value), keep)

    def clear(self):
        """Removes the value for the current key."""
        c = self._call
        if c.handle is None:
            raise errors.OperatorError(_NO_KEY)
        c.writes[(self.id, c.slot)] = (None, _UNSET)


class ListState:
    """An ordered list per key."""

    __slots__ = ("_call", "id", "name")

    def __init__(self, call, id, name):
        self._call = call
        self.id = id
        self.name = name

    def get(self):
        """All items for the current key, oldest first."""
        c = self._call
        return [codec.decode_json(b) for b in c.host.list_get(self.id, c.key_handle())]

    def append(self, item):
        """Appends one item for the current key (as cheap however long the list is)."""
        c = self._call
        c.host.list_append(self.id, c.key_handle(), codec.encode_json(item))

    def replace(self, items):
        """Replaces every item for the current key."""
        c = self._call
        c.host.list_replace(self.id, c.key_handle(), [codec.encode_json(i) for i in items])

    def clear(self):
        c = self._call
        c.host.clear(self.id, c.key_handle())


class MapState:
    """A map from user keys to values per key; both JSON."""

    __slots__ = ("_call", "id", "name")

    def __init__(self, call, id, name):
        self._call = call
        self.id = id
        self.name = name

    def get(self, map_key, default=None):
        c = self._call
        raw = c.host.map_get(self.id, c.key_handle(), codec.encode_json(map_key))
        return default if raw is None else codec.decode_json(raw)

    def put(self, map_key, value):
        c = self._call
        c.host.map_put(self.id, c.key_handle(), codec.encode_json(map_key), codec.encode_json(value))

    def remove(self, map_key):
        c = self._call
        c.host.map_remove(self.id, c.key_handle(), codec.encode_json(map_key))

    def items(self):
        """Every (map key, value) of the current key, ordered by the map key's JSON bytes."""
        c = self._call
        return [(codec.decode_json(k), codec.decode_json(v)) for k, v in c.host.map_entries(self.id, c.key_handle())]

    def clear(self):
        c = self._call
        c.host.clear(self.id, c.key_handle())


class OpenContext:
    """Handed to `open`: declares states and side outputs."""

    def __init__(self, call):
        self._call = call

    def value_state(self, name, prefetch=True):
        """A value state. Prefetched (its values for a batch's keys come with the batch, no
        crossing per read) unless `prefetch=False`, for states read now and then."""
        return ValueState(self._call, self._call.host.declare_state(name, "value", prefetch), name)

    def list_state(self, name):
        return ListState(self._call, self._call.host.declare_state(name, "list", False), name)

    def map_state(self, name):
        return MapState(self._call, self._call.host.declare_state(name, "map", False), name)

    def side_output(self, name):
        return SideOutput(self._call.host.side_output(name), name)


class Context:
    """Handed to `process`, `on_timer` and `close`: output, timers and time."""

    def __init__(self, call):
        self._call = call
        #: Timestamp of the record or timer being handled; emitted records inherit it.
        self.timestamp = None

    def emit(self, key, value, to=None):
        """Emits a keyed record (to side output `to`, else the main output)."""
        self._call.push(0 if to is None else to.id, key, value, self.timestamp)

    def emit_value(self, value, to=None):
        """Emits a record without a key."""
        self._call.push(0 if to is None else to.id, _UNSET, value, self.timestamp)

    def register_timer(self, domain, timestamp):
        """A timer for the current key (`eddy.EVENT_TIME` or `eddy.PROCESSING_TIME`); one
        (key, domain, timestamp) fires once however often it is registered."""
        self._call.host.register_timer(self._call.key_handle(), domain, int(timestamp))

    def delete_timer(self, domain, timestamp):
        self._call.host.delete_timer(self._call.key_handle(), domain, int(timestamp))

    def watermark(self):
        """The operator's event-time watermark (ms); -2**63 before the first."""
        return self._call.host.current_watermark()

    def processing_time(self):
        """The host's processing time (ms since the Unix epoch): the guest's only clock."""
        return self._call.host.current_processing_time()


def _decode_config(config):
    if not config.strip():
        return None
    try:
        return json.loads(config)
    except ValueError as e:
        raise errors.BadConfig(f"config {config!r} is not JSON: {e}") from None


class Runner:
    """Drives one operator instance through the WIT's life cycle; `host` is the imports
    (the component's, or `eddy.testing`'s in-memory host). Every method returns None or
    (error kind, message)."""

    def __init__(self, cls, host):
        self._cls = cls
        self._host = host
        log._bind(host)
        self._call = _Call(host)
        self._ctx = Context(self._call)
        self._op = None

    def _guarded(self, body):
        call = self._call
        try:
            body()
        except Exception as e:  # noqa: BLE001 - every failure becomes an operator error
            call.discard()
            call.handle = None
            if not isinstance(e, errors.OperatorError):
                self._host.log(4, "".join(traceback.format_exception(e))[-4000:])
            return errors.describe(e)
        call.handle = None
        # State first: by the time the host sees the output, the state it reflects is stored.
        call.flush_state()
        call.flush_output()
        return None

    def _operator(self):
        if self._op is None:
            raise errors.OperatorError("operator called before a successful open")
        return self._op

    def open(self, config):
        def body():
            self._call.begin(b"")
            op = self._cls()
            op.open(OpenContext(self._call), _decode_config(config))
            self._op = op

        return self._guarded(body)

    def process(self, data, records, prefetched_states, prefetched):
        def body():
            op = self._operator()
            call = self._call
            ctx = self._ctx
            call.begin(data, prefetched_states, prefetched)
            process = op.process
            for i, (ko, kl, vo, vl, ts, flags, slot) in enumerate(RECORD.iter_unpack(records)):
                ts = ts if flags & 1 else None
                call.handle = None if kl == ABSENT else i
                call.slot = slot
                call.row = i
                ctx.timestamp = ts
                process(Record(call, data, ko, kl, vo, vl, ts), ctx)

        return self._guarded(body)

    def on_timer(self, data, timers):
        """`timers`: (key offset, key length, timestamp, domain, slot) per timer."""

        def body():
            op = self._operator()
            call = self._call
            ctx = self._ctx
            call.begin(data)
            for i, (ko, kl, ts, domain, slot) in enumerate(timers):
                call.handle = i
                call.slot = slot
                call.row = None
                ctx.timestamp = ts
                op.on_timer(Timer(call, data[ko:ko + kl], ts, domain), ctx)

        return self._guarded(body)

    def close(self):
        def body():
            self._call.begin(b"")
            self._ctx.timestamp = None
            self._operator().close(self._ctx)

        return self._guarded(body)
