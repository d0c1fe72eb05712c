"""What an operator is handed: the records of a batch, and the timers that fire.

A batch comes as the WIT's packed tables (`types.batch`). Reading them a field at a time is
what an interpreter is slowest at, so a batch's keys, and its values when first asked for,
come across as one JSON array each (`json-batch` in `wit/dataflow.wit`), parsed natively by
`json.loads`: a record is then an index into those lists. Where the host cannot give a view
(a value that is not JSON, a row holding bytes) or there is no host to ask (an aggregate's
records, or a record kept after its call), values are read one by one from the bytes, which
also names the bad record.
"""

import json
import operator
import struct

from . import codec, errors, rows

RECORD = struct.Struct("<IIIIqII")
ABSENT = 0xFFFFFFFF

_loads = json.loads
_UNSET = object()


class Batch:
    """The records of one call: the packed table over the bytes, and views of it."""

    __slots__ = ("data", "words", "longs", "n", "schemas", "host", "live")

    def __init__(self, data, records, schemas, host=None):
        self.data = data
        # Per record 8 u32 words: key offset, key length, value offset, value length,
        # timestamp (words 4-5, the i64 at long 2), flags, slot.
        self.words = memoryview(records).cast("I")
        self.longs = memoryview(records).cast("q")
        self.n = len(records) // RECORD.size
        self.schemas = schemas
        # The host's views serve only the call in progress: `live` ends with it.
        self.host = host
        self.live = host is not None

    def keys(self):
        """Every record's key decoded, in order (None where a record has none), or None if
        the host has no view of them."""
        if not self.live:
            return None
        text = self.host.json_keys()
        if text is None:
            return None
        try:
            keys = _loads(text)
        except ValueError:
            return None
        return keys if len(keys) == self.n else None

    def values(self):
        """Every record's value decoded, in order, or None if the host has no view of them."""
        if not self.live:
            return None
        text = self.host.json_values()
        if text is None:
            return None
        try:
            values = _loads(text)
        except ValueError:
            return None
        return values if len(values) == self.n else None

    def key_bytes(self, i):
        kl = self.words[8 * i + 1]
        if kl == ABSENT:
            return None
        ko = self.words[8 * i]
        return self.data[ko:ko + kl]

    def value_bytes(self, i):
        vo = self.words[8 * i + 2]
        return self.data[vo:vo + self.words[8 * i + 3]]

    def timestamp(self, i):
        return self.longs[4 * i + 2] if self.words[8 * i + 6] & 1 else None

    def timestamps(self):
        """Every record's timestamp, None where it has none."""
        stamps = self.longs[2::4].tolist()
        flags = self.words[6::8].tolist()
        if all(f & 1 for f in flags):
            return stamps
        return [ts if f & 1 else None for ts, f in zip(stamps, flags)]

    def decode_key(self, i):
        raw = self.key_bytes(i)
        if raw is None:
            raise errors.BadRecord("record has no key (is the stream keyed?)")
        try:
            return codec.decode_json(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise errors.BadRecord(f"key is not JSON: {e}") from None

    def decode_value(self, i):
        try:
            return codec.decode_value(self.value_bytes(i), self.schemas)
        except (ValueError, UnicodeDecodeError) as e:
            raise errors.BadRecord(f"value is neither JSON nor a row: {e}") from None


class Record(tuple):
    """One input record, read-only: `key` and `value` decoded (a batch at a time)."""

    # A tuple (batch, index, key, value): built and read by C code, no interpreter frame per
    # record or per attribute read.
    __slots__ = ()

    key = property(operator.itemgetter(2), doc="The key, decoded from JSON.")
    value = property(operator.itemgetter(3), doc="The value: a dict for a row or JSON object, else what the JSON holds.")

    @property
    def timestamp(self):
        """Event time in ms since the Unix epoch, or None."""
        return self[0].timestamp(self[1])

    @property
    def key_bytes(self):
        """The raw key bytes, None on a stream that is not keyed."""
        return self[0].key_bytes(self[1])

    @property
    def value_bytes(self):
        """The raw value bytes (a row or JSON)."""
        return self[0].value_bytes(self[1])

    def field(self, name, default=None):
        """Top-level field `name` of the value (`default` if it has none)."""
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


class KeylessRecord(Record):
    """A record of a stream that is not keyed: asking for its key is the error."""

    __slots__ = ()

    @property
    def key(self):
        return self[0].decode_key(self[1])


class LazyRecord(Record):
    """A record whose key and value are read from its bytes when asked: where no view of them
    came, or its key is missing (reading it is the error)."""

    __slots__ = ()

    @property
    def key(self):
        return self[0].decode_key(self[1])

    @property
    def value(self):
        return self[0].decode_value(self[1])

    def field(self, name, default=None):
        """From a row only that field is read, nothing else decoded."""
        b = self[0]
        raw = self.value_bytes
        if raw[:1] == b"\xb7":
            try:
                slot = b.schemas.index(rows.schema_of(raw), name)
                return default if slot is None else rows.read_field(raw, slot, b.schemas.names)
            except (ValueError, UnicodeDecodeError) as e:
                raise errors.BadRecord(f"value is not a whole row: {e}") from None
        value = self.value
        return value.get(name, default) if isinstance(value, dict) else default


class Timer:
    """A timer that fired, for the current key."""

    __slots__ = ("key", "key_bytes", "timestamp", "domain")

    def __init__(self, key, key_bytes, timestamp, domain):
        #: The key it was registered for, decoded.
        self.key = key
        #: The key's raw bytes.
        self.key_bytes = key_bytes
        #: When it was set to fire (ms).
        self.timestamp = timestamp
        #: `eddy.EVENT_TIME` or `eddy.PROCESSING_TIME`.
        self.domain = domain

    def __repr__(self):
        return f"Timer(key={self.key_bytes!r}, timestamp={self.timestamp}, domain={self.domain})"
