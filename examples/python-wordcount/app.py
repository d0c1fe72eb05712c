"""Word count's keyed counter in Python: the twin of examples/wordcount/count (Rust).

Same contract (wit/dataflow.wit, world keyed-operator), same JSON encoding of keys and values,
same output for the same input -- proving the contract is language-neutral. Built with
componentize-py:

    componentize-py -d wit -w keyed-operator componentize -p examples/python-wordcount app -o python_wordcount.wasm
"""

import json
import struct

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log, output, state, types


# A record row of a batch or an output batch (wit/dataflow.wit, `batch`): key offset and
# length, value offset and length, timestamp, flags (bit 0: has a timestamp), key slot or output.
ROW = struct.Struct("<IIIIqII")
ABSENT = 0xFFFFFFFF


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
        rows = bytearray()
        for handle in range(len(records.records) // ROW.size):
            key_off, key_len, value_off, value_len, ts, flags, _slot = ROW.unpack_from(records.records, handle * ROW.size)
            if key_len == ABSENT:
                raise fail(types.ErrorKind.BAD_RECORD, "record has no key (is the stream keyed?)")
            try:
                word = json.loads(data[key_off : key_off + key_len])
                n = json.loads(data[value_off : value_off + value_len])
            except ValueError as e:
                raise fail(types.ErrorKind.BAD_RECORD, str(e))
            current = state.value_get(COUNT_STATE, handle)
            count = (json.loads(current) if current is not None else 0) + n
            state.value_set(COUNT_STATE, handle, encode(count))
            key_bytes, value_bytes = encode(word), encode(count)
            key_at = len(out)
            out += key_bytes
            value_at = len(out)
            out += value_bytes
            rows += ROW.pack(key_at, len(key_bytes), value_at, len(value_bytes), ts, flags & 1, 0)
        if rows:
            output.emit(types.OutputBatch(data=bytes(out), records=bytes(rows)))

    def on_timer(self, timers: types.TimerBatch) -> None:
        pass

    def close(self) -> None:
        log.log(log.Level.INFO, "python word counter closed")
