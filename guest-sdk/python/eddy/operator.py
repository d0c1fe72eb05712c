"""Keyed operators: the `Operator` class users subclass, the contexts it is handed, and the
runner that drives it behind the `eddy:dataflow/operator` export.

The runner takes whole batches (one crossing per batch). A batch's keys, values and
prefetched state come as one JSON array each, parsed natively (`records`, `state`); what the
call writes and emits leaves as one JSON text per state and output (`state`, `output`). So a
call costs a handful of crossings and a few native JSON passes however many records it holds,
and the interpreter runs little but the operator's own code. A failed call's buffered writes
and output are dropped.
"""

import gc
import json
import traceback

from . import codec, errors, log
from .output import FLUSH_ITEMS, KEYED, SCALARS, Outputs
from .records import ABSENT, Batch, KeylessRecord, LazyRecord, Record, Timer
from .state import ListState, MapState, Scope, ValueState

EVENT_TIME = 0
PROCESSING_TIME = 1

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


class SideOutput:
    """A named side output, declared in `open`."""

    __slots__ = ("id", "name")

    def __init__(self, id, name):
        self.id = id
        self.name = name

    def __repr__(self):
        return f"SideOutput({self.name!r})"


class OpenContext:
    """Handed to `open`: declares states and side outputs."""

    def __init__(self, runner):
        self._runner = runner

    def value_state(self, name, prefetch=True):
        """A value state. Prefetched (its values for a batch's keys come with the batch, no
        crossing per read) unless `prefetch=False`, for states read now and then."""
        r = self._runner
        state = ValueState(r.scope, r.host.declare_state(name, "value", prefetch), name)
        r.value_states.append(state)
        return state

    def list_state(self, name):
        r = self._runner
        return ListState(r.scope, r.host.declare_state(name, "list", False), name)

    def map_state(self, name):
        r = self._runner
        return MapState(r.scope, r.host.declare_state(name, "map", False), name)

    def side_output(self, name):
        return SideOutput(self._runner.host.side_output(name), name)


class Context:
    """Handed to `process`, `on_timer` and `close`: output, timers and time."""

    __slots__ = ("_scope", "_outputs", "_main", "timestamp")

    def __init__(self, scope, outputs):
        self._scope = scope
        self._outputs = outputs
        self._main = outputs.main
        #: Timestamp of the record or timer being handled; emitted records inherit it.
        self.timestamp = None

    def emit(self, key, value, to=None):
        """Emits a keyed record (to side output `to`, else the main output)."""
        if to is None:
            main = self._main
            if main.form is KEYED and type(value) in SCALARS and type(key) in SCALARS:
                main.items += (key, value, self.timestamp)
                if len(main.items) >= FLUSH_ITEMS:
                    self._outputs.send(main)
                return
            self._outputs.push(0, True, key, value, self.timestamp)
        else:
            self._outputs.push(to.id, True, key, value, self.timestamp)

    def emit_value(self, value, to=None):
        """Emits a record without a key."""
        self._outputs.push(0 if to is None else to.id, False, None, value, self.timestamp)

    def _handle(self):
        slot = self._scope.slot
        if slot is None:
            raise errors.OperatorError(
                "timers need the current record's key: there is none in open/close nor for a record "
                "without a key (add key_by before this step)"
            )
        return slot

    def register_timer(self, domain, timestamp):
        """A timer for the current key (`eddy.EVENT_TIME` or `eddy.PROCESSING_TIME`); one
        (key, domain, timestamp) fires once however often it is registered."""
        self._scope.host.register_timer(self._handle(), domain, int(timestamp))

    def delete_timer(self, domain, timestamp):
        self._scope.host.delete_timer(self._handle(), domain, int(timestamp))

    def watermark(self):
        """The operator's event-time watermark (ms); -2**63 before the first."""
        return self._scope.host.current_watermark()

    def processing_time(self):
        """The host's processing time (ms since the Unix epoch): the guest's only clock."""
        return self._scope.host.current_processing_time()


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
        self.host = host
        log._bind(host)
        self.schemas = codec.Schemas(host.declare_schema, host.schema_fields)
        self.scope = Scope(host, self.schemas)
        self.outputs = Outputs(host, self.schemas)
        self.value_states = []
        self._ctx = Context(self.scope, self.outputs)
        self._op = None

    def _begin(self, prefetched_states=(), prefetched=b""):
        s = self.scope
        s.slot = None
        s.row = -1
        s.prefetched = prefetched
        s.prefetched_width = len(prefetched_states)
        for state in self.value_states:
            state.begin(prefetched_states)

    def _guarded(self, body):
        scope = self.scope
        try:
            body()
            # State first: by the time the host sees the output, the state it reflects is stored.
            for state in self.value_states:
                state.flush()
            self.outputs.flush()
        except Exception as e:  # noqa: BLE001 - every failure becomes an operator error
            for state in self.value_states:
                state.discard()
            self.outputs.discard()
            if not isinstance(e, errors.OperatorError):
                self.host.log(4, "".join(traceback.format_exception(e))[-4000:])
            return errors.describe(e)
        finally:
            scope.slot = None
            scope.row = -1
        return None

    def _operator(self):
        if self._op is None:
            raise errors.OperatorError("operator called before a successful open")
        return self._op

    def open(self, config):
        def body():
            self._begin()
            op = self._cls()
            op.open(OpenContext(self), _decode_config(config))
            self._op = op
            # Everything loaded so far (the interpreter, the SDK, the operator) lives as long
            # as the instance: the collector need not look at it again.
            gc.freeze()

        return self._guarded(body)

    def process(self, data, records, prefetched_states, prefetched):
        batch = Batch(data, records, self.schemas, self.host)

        def body():
            process = self._operator().process
            scope = self.scope
            ctx = self._ctx
            self._begin(list(prefetched_states), prefetched)
            n = batch.n
            words = batch.words
            slots = words[7::8].tolist()
            stamps = batch.timestamps()
            keys = batch.keys()
            values = batch.values()
            if keys is None or values is None or ABSENT in words[1::8]:
                # Some records have no key (their slot is None), or a view is missing.
                lengths = words[1::8].tolist()
                for i in range(n):
                    keyed = lengths[i] != ABSENT
                    scope.slot = slots[i] if keyed else None
                    scope.row = i
                    ctx.timestamp = stamps[i]
                    if keys is None or values is None:
                        record = LazyRecord((batch, i, None, None))
                    elif keyed:
                        record = Record((batch, i, keys[i], values[i]))
                    else:
                        record = KeylessRecord((batch, i, None, values[i]))
                    process(record, ctx)
                return
            for i in range(n):
                scope.slot = slots[i]
                scope.row = i
                ctx.timestamp = stamps[i]
                process(Record((batch, i, keys[i], values[i])), ctx)

        try:
            return self._guarded(body)
        finally:
            batch.live = False

    def on_timer(self, data, timers):
        """`timers`: (key offset, key length, timestamp, domain, slot) per timer."""

        def body():
            on_timer = self._operator().on_timer
            scope = self.scope
            ctx = self._ctx
            self._begin()
            text = self.host.json_keys()
            keys = _timer_keys(text, len(timers))
            for i, (ko, kl, ts, domain, slot) in enumerate(timers):
                raw = data[ko:ko + kl]
                key = keys[i] if keys is not None else _decode_timer_key(raw)
                scope.slot = slot
                ctx.timestamp = ts
                on_timer(Timer(key, raw, ts, domain), ctx)

        return self._guarded(body)

    def close(self):
        def body():
            self._begin()
            self._ctx.timestamp = None
            self._operator().close(self._ctx)

        return self._guarded(body)


def _timer_keys(text, n):
    if text is None:
        return None
    try:
        keys = json.loads(text)
    except ValueError:
        return None
    return keys if len(keys) == n else None


def _decode_timer_key(raw):
    try:
        return codec.decode_json(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.BadRecord(f"timer key is not JSON: {e}") from None
