"""The component's imports behind the host interface the runners use, and the export
classes componentize-py looks for (`Operator`, `Aggregate` in the `app` module). Only this
module touches the generated bindings (`wit_world`), which exist only inside a component
build; elsewhere (tests, `eddy.testing`) the exports are placeholders."""

_LEVELS = ("trace", "debug", "info", "warn", "error")


def _error(types, failure):
    kind, message = failure
    kinds = {
        "bad-config": types.ErrorKind.BAD_CONFIG,
        "bad-record": types.ErrorKind.BAD_RECORD,
        "failed": types.ErrorKind.FAILED,
    }
    from componentize_py_types import Err

    return Err(types.OperatorError(kind=kinds[kind], message=message))


class _Log:
    def __init__(self, log):
        self._log = log
        self._levels = [log.Level.TRACE, log.Level.DEBUG, log.Level.INFO, log.Level.WARN, log.Level.ERROR]

    def log(self, level, message):
        self._log.log(self._levels[level], message)


class _Schemas:
    def __init__(self, schemas):
        self.declare_schema = schemas.declare_schema
        self.schema_fields = schemas.schema_fields


class OperatorHost(_Log, _Schemas):
    """The keyed-operator world's imports."""

    def __init__(self):
        from wit_world.imports import json_batch, log, output, schemas, state, timers, types

        _Log.__init__(self, log)
        _Schemas.__init__(self, schemas)
        self._kinds = {"value": state.StateKind.VALUE, "list": state.StateKind.LIST, "map": state.StateKind.MAP}
        self._domains = [types.TimeDomain.EVENT_TIME, types.TimeDomain.PROCESSING_TIME]
        self._state = state
        self._timers = timers
        self._output = output
        self._types = types
        self.value_get = state.value_get
        self.list_get = state.list_get
        self.list_append = state.list_append
        self.list_replace = state.list_replace
        self.map_get = state.map_get
        self.map_put = state.map_put
        self.map_remove = state.map_remove
        self.map_entries = state.map_entries
        self.clear = state.clear
        self.current_watermark = timers.current_watermark
        self.current_processing_time = timers.current_processing_time
        self.side_output = output.side_output
        self.json_keys = json_batch.keys
        self.json_values = json_batch.values
        self.json_prefetched = json_batch.prefetched
        self.json_set_values = json_batch.set_values
        self.json_emit = json_batch.emit

    def declare_state(self, name, kind, prefetch):
        return self._state.declare(name, self._kinds[kind], prefetch)

    def register_timer(self, handle, domain, timestamp):
        self._timers.register_timer(handle, self._domains[domain], timestamp)

    def delete_timer(self, handle, domain, timestamp):
        self._timers.delete_timer(handle, self._domains[domain], timestamp)

    def emit(self, data, records):
        self._output.emit(self._types.OutputBatch(data=data, records=records))


class AggregateHost(_Log, _Schemas):
    """The window-aggregate world's imports."""

    def __init__(self):
        from wit_world.imports import log, schemas

        _Log.__init__(self, log)
        _Schemas.__init__(self, schemas)


def _in_component():
    try:
        import wit_world  # noqa: F401
    except ImportError:
        return False
    return True


def export_operator(cls):
    """The class componentize-py exports for operator class `cls`: assign it to `Operator`
    in the `app` module (`Operator = eddy.export_operator(MyOperator)`)."""
    if not _in_component():
        return type("Operator", (), {"__eddy_operator__": cls})
    from wit_world import exports
    from wit_world.imports import types

    from .operator import Runner

    runner = Runner(cls, OperatorHost())

    def check(failure):
        if failure is not None:
            raise _error(types, failure)

    # componentize-py makes a fresh export object per call, so the runner lives in the closure.
    class Operator(exports.Operator):
        def open(self, config):
            check(runner.open(config))

        def process(self, records):
            check(runner.process(records.data, records.records, records.prefetched_states, records.prefetched))

        def on_timer(self, timers):
            refs = [(t.key.offset, t.key.len, t.timestamp, t.domain.value, t.slot) for t in timers.timers]
            check(runner.on_timer(timers.data, refs))

        def close(self):
            check(runner.close())

    Operator.__eddy_operator__ = cls
    return Operator


def export_aggregate(cls):
    """The class componentize-py exports for aggregate class `cls`: assign it to `Aggregate`
    in the `app` module (`Aggregate = eddy.export_aggregate(MyAggregate)`)."""
    if not _in_component():
        return type("Aggregate", (), {"__eddy_aggregate__": cls})
    from wit_world import exports
    from wit_world.exports import aggregate as packed
    from wit_world.imports import types

    from .aggregate import AggregateRunner

    runner = AggregateRunner(cls, AggregateHost())

    def check(answer):
        result, failure = answer
        if failure is not None:
            raise _error(types, failure)
        return result

    def items(pair):
        data, spans = pair
        return packed.PackedItems(data=data, spans=spans)

    class Aggregate(exports.Aggregate):
        def open(self, config):
            check(runner.open(config))

        def create_accumulator(self):
            return check(runner.create_accumulator())

        def add(self, records, updates):
            return items(
                check(
                    runner.add(
                        records.data, records.records, updates.accumulators, updates.updates, updates.records
                    )
                )
            )

        def merge(self, a, b):
            return check(runner.merge(a, b))

        def get_results(self, accumulators):
            return items(check(runner.get_results(accumulators.data, accumulators.spans)))

    Aggregate.__eddy_aggregate__ = cls
    return Aggregate

