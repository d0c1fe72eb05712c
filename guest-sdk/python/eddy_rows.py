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
"""

import json
import struct

MAGIC = 0xB7
VERSION = 1
BOOL, I64, U64, F64, STR, BYTES, ROW, JSON = 1, 2, 3, 4, 5, 6, 7, 8


def is_row(value):
    """Whether `value` (bytes) is a row rather than JSON."""
    return len(value) > 0 and value[0] == MAGIC


def _layout(n):
    words = (n + 63) // 64
    kinds = 8 + 8 * words
    slots = kinds + (n + 7) // 8 * 8
    return kinds, slots, slots + 8 * n


def read_row(buf, names=None, schemas=None):
    """The row in `buf` as a dict (with `names`, or `schemas(id) -> names`) or a list."""
    magic, version, n, schema = struct.unpack_from("<BBHI", buf, 0)
    if magic != MAGIC:
        raise ValueError("not a row (first byte is not 0xB7)")
    if version != VERSION:
        raise ValueError(f"row layout version {version}; this reader reads version {VERSION}")
    kinds_at, slots_at, end = _layout(n)
    if len(buf) < end:
        raise ValueError("row shorter than its header and slots")
    if names is None and schemas is not None and schema != 0:
        names = schemas(schema)
    values = []
    for i in range(n):
        null = buf[8 + 8 * (i // 64) + (i % 64) // 8] >> (i % 8) & 1
        kind = buf[kinds_at + i]
        at = slots_at + 8 * i
        if null:
            values.append(None)
        elif kind == BOOL:
            values.append(buf[at] != 0)
        elif kind == I64:
            values.append(struct.unpack_from("<q", buf, at)[0])
        elif kind == U64:
            values.append(struct.unpack_from("<Q", buf, at)[0])
        elif kind == F64:
            values.append(struct.unpack_from("<d", buf, at)[0])
        elif kind in (STR, BYTES, ROW, JSON):
            offset, length = struct.unpack_from("<II", buf, at)
            if offset + length > len(buf):
                raise ValueError(f"field {i} points outside the row")
            part = bytes(buf[offset:offset + length])
            if kind == STR:
                values.append(part.decode("utf-8"))
            elif kind == BYTES:
                values.append(list(part))
            elif kind == ROW:
                values.append(read_row(part, schemas=schemas))
            else:
                values.append(json.loads(part))
        else:
            raise ValueError(f"field {i} has an unknown kind byte {kind}")
    if names is not None and len(names) == n:
        return dict(zip(names, values))
    return values


def write_row(values, schema_id=0):
    """`values` (None, bool, int, float, str, bytes, dict or list) as a row; ints are i64 when
    negative, else u64; dicts and lists are embedded JSON."""
    n = len(values)
    kinds_at, slots_at, end = _layout(n)
    buf = bytearray(end)
    struct.pack_into("<BBHI", buf, 0, MAGIC, VERSION, n, schema_id)
    for i, v in enumerate(values):
        at = slots_at + 8 * i
        kind = None
        if v is None:
            buf[8 + 8 * (i // 64) + (i % 64) // 8] |= 1 << (i % 8)
            continue
        if isinstance(v, bool):
            kind = BOOL
            struct.pack_into("<Q", buf, at, int(v))
        elif isinstance(v, int):
            kind = I64 if v < 0 else U64
            struct.pack_into("<q" if v < 0 else "<Q", buf, at, v)
        elif isinstance(v, float):
            kind = F64
            struct.pack_into("<d", buf, at, v)
        else:
            if isinstance(v, str):
                kind, part = STR, v.encode("utf-8")
            elif isinstance(v, (bytes, bytearray)):
                kind, part = BYTES, bytes(v)
            else:
                kind, part = JSON, json.dumps(v, separators=(",", ":")).encode("utf-8")
            struct.pack_into("<II", buf, at, len(buf), len(part))
            buf += part
        buf[kinds_at + i] = kind
    return bytes(buf)


def main():
    """Reads `schemas.json` ({id: [name, [fields]]}) and length-prefixed rows from stdin (u32 LE
    length, then the row); writes each row as one JSON line (what Eddy's sinks print)."""
    import sys

    with open(sys.argv[1]) as f:
        known = {int(k): v[1] for k, v in json.load(f).items()}
    data = sys.stdin.buffer.read()
    at = 0
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        row = data[at + 4:at + 4 + length]
        at += 4 + length
        print(json.dumps(read_row(row, schemas=known.get), separators=(",", ":"), ensure_ascii=False))


if __name__ == "__main__":
    main()
