"""What a call emits, buffered per output and handed to the host when the call ends.

Records go across as JSON text (`json-batch.emit`): one `json.dumps` of a flat list per
output replaces a row or JSON writer run per record in the interpreter. A dataclass value is
sent as its field values and written as a row by the host, byte for byte as
`rows.write_row` would; one the host cannot write from JSON (a field holding bytes, a nested
dataclass, a float that is not finite) goes the binary way (`output.emit`). Within an output,
records keep their order: a record of another form than the ones buffered (keyed or not, JSON
or row of another schema, binary) first sends those.
"""

import dataclasses
import math
import operator
import struct

from . import codec
from .state import snapshot

RECORD = struct.Struct("<IIIIqII")
ABSENT = 0xFFFFFFFF
_dumps = codec.dumps

# Forms of a buffered run of records: (keyed, schema id), schema 0 for JSON values.
KEYED = (True, 0)
UNKEYED = (False, 0)
_BINARY = "binary"
# Values and keys written as JSON as they are (nothing can change them later).
SCALARS = frozenset([int, str, float, bool, type(None)])
# Field types a row written from JSON holds exactly.
_ROW_FIELDS = frozenset([int, str, float, bool, type(None), list, dict])
# Records buffered per output before they are sent, so the host's per-call output limit
# stops a runaway operator before the guest's memory does.
FLUSH_ITEMS = 3 * 8192


class Pending:
    """One output's buffered records: a run of one form."""

    __slots__ = ("id", "form", "items", "data", "rows")

    def __init__(self, id):
        self.id = id
        self.form = None
        # JSON forms: the flat list (key, value, timestamp, ... or value, timestamp, ...).
        self.items = []
        # The binary form: the packed table over its bytes.
        self.data = bytearray()
        self.rows = bytearray()


class Outputs:
    """The call's output, per output id (0 the main output)."""

    def __init__(self, host, schemas):
        self._host = host
        self._schemas = schemas
        self.main = Pending(0)
        self._side = {}
        # Per dataclass: (schema id, field getter), declared to the host once.
        self._rows = {}

    def pending(self, output):
        if output == 0:
            return self.main
        p = self._side.get(output)
        if p is None:
            p = self._side[output] = Pending(output)
        return p

    def push(self, output, keyed, key, value, timestamp):
        """Buffers one record of any form."""
        p = self.pending(output)
        t = type(value)
        if keyed and type(key) not in SCALARS:
            key = snapshot(key)
        form = KEYED if keyed else UNKEYED
        if t not in SCALARS:
            if dataclasses.is_dataclass(t):
                fields = self._row_fields(t, value)
                if fields is None:
                    return self._push_binary(p, key if keyed else None, value, timestamp)
                form = (keyed, fields[0])
                value = fields[1]
            else:
                value = snapshot(value)
        if p.form != form:
            self.send(p)
            p.form = form
        if keyed:
            p.items += (key, value, timestamp)
        else:
            p.items += (value, timestamp)
        if len(p.items) >= FLUSH_ITEMS:
            self.send(p)

    def _row_fields(self, cls, value):
        """(schema id, field values) of dataclass `value`, or None if JSON cannot carry them."""
        known = self._rows.get(cls)
        if known is None:
            schema, names = self._schemas.of_class(cls)
            getter = operator.attrgetter(*names) if len(names) > 1 else (lambda v, n=names: tuple(getattr(v, f) for f in n))
            known = self._rows[cls] = (schema, getter)
        schema, getter = known
        fields = getter(value)
        types = set(map(type, fields))
        if not _ROW_FIELDS.issuperset(types):
            return None
        if float in types and not all(math.isfinite(f) for f in fields if type(f) is float):
            return None
        if list in types or dict in types:
            fields = snapshot(list(fields))
        return schema, fields

    def _push_binary(self, p, key, value, timestamp):
        if p.form is not _BINARY:
            self.send(p)
            p.form = _BINARY
        data = p.data
        if key is None:
            ko, kl = 0, ABSENT
        else:
            k = codec.encode_json(key)
            ko, kl = len(data), len(k)
            data += k
        v = codec.encode_value(value, self._schemas)
        vo = len(data)
        data += v
        p.rows += RECORD.pack(ko, kl, vo, len(v), timestamp or 0, 0 if timestamp is None else 1, p.id)
        if len(data) >= 1 << 20:
            self.send(p)

    def send(self, p):
        """Hands `p`'s buffered records to the host."""
        if p.items:
            keyed, schema = p.form
            try:
                text = _dumps(p.items)
            except (TypeError, ValueError) as e:
                raise ValueError(f"an emitted record cannot be written as JSON: {e}") from None
            p.items.clear()
            self._host.json_emit(p.id, keyed, schema, text)
        if p.rows:
            self._host.emit(bytes(p.data), bytes(p.rows))
            p.data.clear()
            p.rows.clear()

    def flush(self):
        self.send(self.main)
        for p in self._side.values():
            self.send(p)

    def discard(self):
        for p in (self.main, *self._side.values()):
            p.items.clear()
            p.data.clear()
            p.rows.clear()
            p.form = None
