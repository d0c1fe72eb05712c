"""Eddy rows in pure Python: read and write the binary records of `wit/dataflow.wit`.

Nothing but `struct`: the layout is little-endian fixed-width fields (the Rust crate
`eddy-wire`, module `row`, is the definition; `docs/architecture.md` says why):

    u8 0xB7 | u8 version 1 | u16 field count n | u32 schema id
    null bits: ceil(n / 64) u64 words
    kinds: n bytes (1 bool, 2 i64, 3 u64, 4 f64, 5 str, 6 bytes, 7 row, 8 JSON), padded to 8
    slots: n x 8 bytes (numbers in place; variable kinds as u32 offset | u32 length)
    variable region

Field names come from the schema the id names (`schemas.schema-fields` in a guest); without
them a row reads as a list.

    >>> row = write_row(["bid", 1007, -5, "Google"], schema_id=0)
    >>> read_row(row)
    ['bid', 1007, -5, 'Google']
    >>> read_row(row, names=["type", "auction", "delta", "channel"])
    {'type': 'bid', 'auction': 1007, 'delta': -5, 'channel': 'Google'}

Run as a program it reads `schemas.json` ({id: [name, [fields]]}) and length-prefixed rows
from stdin and prints each row as one JSON line, as Eddy's sinks do.
"""

import json
import struct

MAGIC = 0xB7
VERSION = 1
BOOL, I64, U64, F64, STR, BYTES, ROW, JSON = 1, 2, 3, 4, 5, 6, 7, 8
MAX_FIELDS = 0xFFFF

_HEADER = struct.Struct("<BBHI")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_SPAN = struct.Struct("<II")


def is_row(value):
    """Whether `value` (bytes) is a row rather than JSON."""
    return len(value) > 0 and value[0] == MAGIC


def schema_id(name, fields):
    """The id Eddy gives schema (`name`, `fields`): FNV-1a (32 bits) over the UTF-8 bytes
    `name 0xFF field 0xFF ...`, 1 where that is 0 (`wit/dataflow.wit`, `declare-schema`).

    >>> schema_id("Totals", ["purchases", "total_cents"]) == schema_id("Totals", ["purchases", "total_cents"])
    True
    """
    h = 0x811C9DC5
    for part in [name, *fields]:
        for b in part.encode("utf-8") + b"\xff":
            h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h or 1


def _layout(n):
    words = (n + 63) // 64
    kinds = 8 + 8 * words
    slots = kinds + (n + 7) // 8 * 8
    return kinds, slots, slots + 8 * n


def _field(buf, i, kinds_at, slots_at, schemas):
    """Field `i` of the row in `buf` (its layout offsets given), decoded alone."""
    if buf[8 + 8 * (i // 64) + (i % 64) // 8] >> (i % 8) & 1:
        return None
    at = slots_at + 8 * i
    kind = buf[kinds_at + i]
    if kind == U64:
        return _U64.unpack_from(buf, at)[0]
    if kind == I64:
        return _I64.unpack_from(buf, at)[0]
    if kind == F64:
        return _F64.unpack_from(buf, at)[0]
    if kind == BOOL:
        return buf[at] != 0
    if kind in (STR, BYTES, ROW, JSON):
        offset, length = _SPAN.unpack_from(buf, at)
        if offset + length > len(buf):
            raise ValueError(f"field {i} points outside the row")
        part = bytes(buf[offset:offset + length])
        if kind == STR:
            return part.decode("utf-8")
        if kind == BYTES:
            return part
        if kind == ROW:
            return read_row(part, schemas=schemas)
        return json.loads(part)
    raise ValueError(f"field {i} has an unknown kind byte {kind}")


def read_field(buf, i, schemas=None):
    """Field `i` of the row in `buf`, without decoding the others; None past its last field.

    >>> read_field(write_row(["bid", 1007]), 1)
    1007
    """
    magic, version, n, _ = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a row of layout version 1")
    if not 0 <= i < n:
        return None
    kinds_at, slots_at, end = _layout(n)
    if len(buf) < end:
        raise ValueError("row shorter than its header and slots")
    return _field(buf, i, kinds_at, slots_at, schemas)


def schema_of(buf):
    """The schema id of the row in `buf`."""
    return _HEADER.unpack_from(buf, 0)[3]


def read_row(buf, names=None, schemas=None):
    """The row in `buf` as a dict (with `names`, or `schemas(id) -> names`) or a list.
    Nested rows are read the same way; embedded JSON is parsed; bytes come back as `bytes`."""
    if len(buf) < 8:
        raise ValueError("not a row (shorter than a row header)")
    magic, version, n, schema = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ValueError("not a row (first byte is not 0xB7)")
    if version != VERSION:
        raise ValueError(f"row layout version {version}; this reader reads version {VERSION}")
    kinds_at, slots_at, end = _layout(n)
    if len(buf) < end:
        raise ValueError("row shorter than its header and slots")
    if names is None and schemas is not None and schema != 0:
        names = schemas(schema)
    values = [_field(buf, i, kinds_at, slots_at, schemas) for i in range(n)]
    if names is not None and len(names) == n:
        return dict(zip(names, values))
    return values


def write_row(values, schema_id=0, nested=None):
    """`values` (None, bool, int, float, str, bytes, or anything JSON can write) as a row.
    Ints are i64 when negative, else u64 (Eddy's readers take either for any integer field);
    a value `nested(value)` turns into bytes (a dataclass, say) is a nested row; anything else
    that is not a scalar is embedded JSON."""
    n = len(values)
    if n > MAX_FIELDS:
        raise ValueError(f"a row holds at most {MAX_FIELDS} fields, not {n}")
    kinds_at, slots_at, end = _layout(n)
    buf = bytearray(end)
    _HEADER.pack_into(buf, 0, MAGIC, VERSION, n, schema_id)
    for i, v in enumerate(values):
        at = slots_at + 8 * i
        if v is None:
            buf[8 + 8 * (i // 64) + (i % 64) // 8] |= 1 << (i % 8)
            continue
        t = type(v)
        if t is bool:
            kind = BOOL
            buf[at] = 1 if v else 0
        elif t is int:
            if v < 0:
                if v < -(1 << 63):
                    raise ValueError(f"field {i}: {v} does not fit in 64 bits")
                kind = I64
                _I64.pack_into(buf, at, v)
            else:
                if v >= 1 << 64:
                    raise ValueError(f"field {i}: {v} does not fit in 64 bits")
                kind = U64
                _U64.pack_into(buf, at, v)
        elif t is float:
            kind = F64
            _F64.pack_into(buf, at, v)
        else:
            inner = nested(v) if nested is not None else None
            if inner is not None:
                kind, part = ROW, inner
            elif t is str:
                kind, part = STR, v.encode("utf-8")
            elif t in (bytes, bytearray, memoryview):
                kind, part = BYTES, bytes(v)
            else:
                kind, part = JSON, json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            _SPAN.pack_into(buf, at, len(buf), len(part))
            buf += part
        buf[kinds_at + i] = kind
    return bytes(buf)


def _jsonable(value):
    if isinstance(value, (bytes, bytearray)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def main():
    import sys

    with open(sys.argv[1]) as f:
        known = {int(k): v[1] for k, v in json.load(f).items()}
    data = sys.stdin.buffer.read()
    at = 0
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        row = data[at + 4:at + 4 + length]
        at += 4 + length
        print(json.dumps(read_row(row, schemas=known.get), separators=(",", ":"), ensure_ascii=False, default=_jsonable))


if __name__ == "__main__":
    main()
