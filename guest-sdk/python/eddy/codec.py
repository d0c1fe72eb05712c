"""How Python values become the bytes Eddy stores and ships, and back.

Keys and state are JSON, byte for byte what the Rust SDK (serde_json) writes for the same
value: keys are hashed and compared as bytes, so the word "fox" must be the same key in every
language. Record values and window accumulators are rows when they are dataclasses (the
dataclass's name and field names are the row's schema, as a Rust struct's are) and JSON
otherwise; either is read back, rows as dicts by field name.
"""

import dataclasses
import json

from . import rows

_loads = json.loads
# Characters serde_json escapes in a string; a string without them is written as is.
_NEEDS_ESCAPE = frozenset('"\\') | frozenset(chr(c) for c in range(0x20))


def json_default(value):
    """What JSON writes for what it has no form of: dataclasses as objects, bytes and sets as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (bytes, bytearray)):
        return list(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"a {type(value).__name__} cannot be written as JSON")


# Compact JSON text of any value, as every writer in this SDK writes it.
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=json_default).encode


def encode_json(value):
    """`value` as compact JSON bytes, as serde_json writes it (dataclasses as objects)."""
    t = type(value)
    if t is int:
        return str(value).encode()
    if t is str and _NEEDS_ESCAPE.isdisjoint(value):
        return b'"' + value.encode("utf-8") + b'"'
    try:
        return dumps(value).encode("utf-8")
    except ValueError as e:
        # NaN and infinities: serde_json writes them as null, which would not read back.
        raise ValueError(f"{value!r} cannot be written as JSON: {e}") from None


def decode_json(data):
    """JSON bytes back to Python (objects as dicts). Strings without escapes and small
    non-negative integers, most keys and counts, skip the parser."""
    if data[:1] == b'"':
        if data.count(b'"') == 2 and data[-1:] == b'"' and b"\\" not in data:
            return data[1:-1].decode("utf-8")
    elif data.isdigit() and (len(data) == 1 or data[0] != 0x30):
        return int(data)
    return _loads(data.decode("utf-8"))


class Schemas:
    """The host's schemas as this instance has seen them, and the dataclasses it has
    declared: asked once per id or class."""

    def __init__(self, declare, fields):
        self._declare = declare
        self._fields = fields
        self._names = {}
        self._classes = {}
        self._slots = {}

    def names(self, schema):
        """The field names of schema id `schema`, or None if the host does not know it."""
        try:
            return self._names[schema]
        except KeyError:
            found = self._fields(schema)
            names = list(found[1]) if found is not None else None
            self._names[schema] = names
            return names

    def index(self, schema, name):
        """The slot of field `name` in rows of schema id `schema`, or None."""
        key = (schema, name)
        try:
            return self._slots[key]
        except KeyError:
            names = self.names(schema)
            slot = names.index(name) if names is not None and name in names else None
            self._slots[key] = slot
            return slot

    def of_class(self, cls):
        """(schema id, field names) of dataclass `cls`, declared to the host the first time."""
        known = self._classes.get(cls)
        if known is None:
            fields = [f.name for f in dataclasses.fields(cls)]
            known = (self._declare(cls.__name__, fields), fields)
            self._classes[cls] = known
            self._names[known[0]] = fields
        return known

    def write(self, value):
        """A dataclass instance as a row (nested dataclasses as nested rows), else None."""
        cls = type(value)
        if not dataclasses.is_dataclass(cls):
            return None
        schema, fields = self.of_class(cls)
        return rows.write_row([getattr(value, f) for f in fields], schema, self.write)


def encode_value(value, schemas):
    """A record value or accumulator: a dataclass as a row, anything else as JSON."""
    if type(value) in _SCALARS:
        return encode_json(value)
    row = schemas.write(value)
    return row if row is not None else encode_json(value)


_SCALARS = frozenset([int, str, float, bool, type(None), list, dict])


def decode_value(data, schemas):
    """A record value: a row as a dict by field name (a list if its schema is unknown), or JSON."""
    if data[:1] == b"\xb7":
        return rows.read_row(data, schemas=schemas.names)
    return decode_json(data)


def from_value(cls, value):
    """`value` (a dict, as values are read) as dataclass `cls`; fields the value lacks take
    their defaults, and fields the class does not name are ignored."""
    if isinstance(value, cls) or not dataclasses.is_dataclass(cls):
        return value
    if not isinstance(value, dict):
        raise TypeError(f"a {cls.__name__} is read from an object, not from {type(value).__name__}")
    args = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            v = value[f.name]
            inner = f.type if isinstance(f.type, type) else None
            args[f.name] = from_value(inner, v) if inner is not None and dataclasses.is_dataclass(inner) and isinstance(v, dict) else v
    return cls(**args)
