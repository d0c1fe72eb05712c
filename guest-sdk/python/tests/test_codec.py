"""The Python codec against the shared table Rust's eddy-wire and serde_json wrote
(guest-sdk/testdata/codec-table.json): every row reads as Eddy renders it, rows a dynamically
typed writer can reproduce are written back byte for byte, and keys and state values are
written exactly as serde_json writes them."""

import json
import pathlib
import unittest

from eddy import codec, rows

TABLE = json.loads((pathlib.Path(__file__).parents[2] / "testdata" / "codec-table.json").read_text())
SCHEMAS = {int(k): v for k, v in TABLE["schemas"].items()}


def rendered(value):
    """A read value as Eddy's sinks render it (bytes as lists of numbers)."""
    if isinstance(value, bytes):
        return list(value)
    if isinstance(value, dict):
        return {k: rendered(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rendered(v) for v in value]
    return value


def raw_tree(buf):
    """A row as (schema id, values), nested rows the same: what a writer needs to write it back."""
    _, _, _, schema = rows._HEADER.unpack_from(buf, 0)
    values = rows.read_row(buf)
    kinds_at, _, _ = rows._layout(len(values))
    out = []
    for i, v in enumerate(values):
        if buf[kinds_at + i] == rows.ROW and v is not None:
            offset, length = rows._SPAN.unpack_from(buf, rows._layout(len(values))[1] + 8 * i)
            out.append(raw_tree(buf[offset:offset + length]))
        else:
            out.append(v)
    return (schema, out)


def write_tree(tree):
    schema, values = tree
    return rows.write_row(values, schema, nested=lambda v: write_tree(v) if isinstance(v, tuple) else None)


class CodecTable(unittest.TestCase):
    def test_every_row_reads_as_eddy_renders_it(self):
        names = lambda id: SCHEMAS[id][1] if id in SCHEMAS else None  # noqa: E731
        for case in TABLE["rows"]:
            with self.subTest(case["name"]):
                got = rows.read_row(bytes.fromhex(case["hex"]), schemas=names)
                self.assertEqual(rendered(got), case["meaning"])

    def test_rows_with_natural_kinds_are_written_byte_for_byte(self):
        natural = [c for c in TABLE["rows"] if c["natural"]]
        self.assertGreaterEqual(len(natural), 4)
        for case in natural:
            with self.subTest(case["name"]):
                buf = bytes.fromhex(case["hex"])
                self.assertEqual(write_tree(raw_tree(buf)).hex(), case["hex"])

    def test_dataclasses_are_written_as_rust_structs_are(self):
        from dataclasses import dataclass

        @dataclass
        class Totals:
            purchases: int
            total_cents: int

        schemas = codec.Schemas(lambda name, fields: rows.schema_id(name, fields), lambda id: None)
        accumulator = next(c for c in TABLE["rows"] if c["name"] == "accumulator")
        self.assertEqual(codec.encode_value(Totals(4, 5248), schemas).hex(), accumulator["hex"])
        for id, (name, fields) in SCHEMAS.items():
            self.assertEqual(rows.schema_id(name, fields), id, name)

    def test_keys_and_state_are_written_as_serde_json_writes_them(self):
        for text in TABLE["json"]:
            with self.subTest(text):
                value = codec.decode_json(text.encode())
                self.assertEqual(codec.encode_json(value).decode(), text)

    def test_what_json_cannot_hold_is_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, "nan"):
            codec.encode_json(float("nan"))
        with self.assertRaisesRegex(TypeError, "object"):
            codec.encode_json(object())


if __name__ == "__main__":
    unittest.main()
