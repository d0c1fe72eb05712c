"""Word count's keyed counter in Python: the twin of examples/wordcount/count (Rust).

Same contract (wit/dataflow.wit, world keyed-operator), same JSON encoding of keys and values,
same output for the same input -- proving the contract is language-neutral. Built with
componentize-py:

    componentize-py -d wit -w keyed-operator componentize -p examples/python-wordcount app -o python_wordcount.wasm
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log, output, state, types


def encode(value) -> bytes:
    # Byte-identical to serde_json's compact output for the values used here.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def fail(kind: types.ErrorKind, message: str) -> Err:
    return Err(types.OperatorError(kind=kind, message=message))


# componentize-py makes a fresh `Operator` object per export call, so the instance's
# lasting data lives at module level (one component instance = one subtask).
COUNT_STATE = None


class Operator(exports.Operator):
    def open(self, config: str) -> None:
        global COUNT_STATE
        COUNT_STATE = state.declare("count", state.StateKind.VALUE, False)

    def process(self, records: types.Batch) -> None:
        data = records.data
        out = bytearray()
        refs = []
        for handle, r in enumerate(records.records):
            if r.key is None:
                raise fail(types.ErrorKind.BAD_RECORD, "record has no key (is the stream keyed?)")
            try:
                word = json.loads(data[r.key.offset : r.key.offset + r.key.len])
                n = json.loads(data[r.value.offset : r.value.offset + r.value.len])
            except ValueError as e:
                raise fail(types.ErrorKind.BAD_RECORD, str(e))
            current = state.value_get(COUNT_STATE, handle)
            count = (json.loads(current) if current is not None else 0) + n
            state.value_set(COUNT_STATE, handle, encode(count))
            key_bytes, value_bytes = encode(word), encode(count)
            key_span = types.Span(offset=len(out), len=len(key_bytes))
            out += key_bytes
            value_span = types.Span(offset=len(out), len=len(value_bytes))
            out += value_bytes
            refs.append(types.OutputRef(output=0, key=key_span, value=value_span, timestamp=r.timestamp))
        if refs:
            output.emit(types.OutputBatch(data=bytes(out), records=refs))

    def on_timer(self, timers: types.TimerBatch) -> None:
        pass

    def close(self) -> None:
        log.log(log.Level.INFO, "python word counter closed")
