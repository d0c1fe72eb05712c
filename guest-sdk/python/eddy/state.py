"""Keyed state handles. Each acts on the key of the record or timer being handled (its key
slot: the first record of the call with an equal key, which is also its handle for the host).

Value state is buffered: reads come from this call's writes, then from the values the host
prefetched for the batch (one JSON array per state, parsed once), then from the host; writes
go to the host in one `json-batch.set-values` per state when the call ends. A failed call's
writes are dropped. List and map state go straight to their imports.

This SDK writes values as JSON and reads rows as well: the Rust SDK writes a struct as a row,
and a job whose operator moves between languages keeps its state (the host renders
prefetched rows into the JSON array).
"""

import json
import math
import struct

from . import codec, errors

_loads = json.loads
_dumps = codec.dumps
CELL = struct.Struct("<II")
ABSENT = 0xFFFFFFFF
_UNSET = object()
_CLEARED = object()
# Values kept as they are: nothing can change them after they are set.
_IMMUTABLE = frozenset([int, str, bool, type(None)])
_SCALAR = _IMMUTABLE | {float}

NO_KEY = (
    "keyed state needs the current record's key: there is none in open/close (use state in "
    "process or on_timer) nor for a record without a key (add key_by before this step)"
)


class Scope:
    """What the handles need to know of the call in progress: its host and schemas, and the
    key slot and row being handled (`slot` None where there is no key)."""

    __slots__ = ("host", "schemas", "slot", "row", "prefetched", "prefetched_width")

    def __init__(self, host, schemas):
        self.host = host
        self.schemas = schemas
        self.slot = None
        self.row = -1
        self.prefetched = b""
        self.prefetched_width = 0


def snapshot(value):
    """`value` as state or output keeps it: scalars as they are, anything else a copy through
    JSON (so later changes to the caller's object do not leak in, and what cannot be written as
    JSON fails here, at the call that gave it)."""
    t = type(value)
    if t in _IMMUTABLE:
        return value
    if t is float:
        if not math.isfinite(value):
            raise ValueError(f"{value!r} cannot be written as JSON")
        return value
    try:
        return _loads(_dumps(value))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{value!r} cannot be written as JSON: {e}") from None


class ValueState:
    """One value per key (written as JSON; a struct the Rust SDK wrote as a row reads as a dict)."""

    __slots__ = ("_scope", "id", "name", "_writes", "_clears", "_column", "_col")

    def __init__(self, scope, id, name):
        self._scope = scope
        self.id = id
        self.name = name
        # This call's writes by key slot (`_CLEARED` for a clear), and whether any is a clear.
        self._writes = {}
        self._clears = False
        # Its column among the batch's prefetched states (None if not prefetched), and the
        # column's values: None until read, False where there is none to read.
        self._column = None
        self._col = False

    def begin(self, prefetched_states):
        """A new call; `prefetched_states` are the ids whose values came with its batch."""
        try:
            self._column = prefetched_states.index(self.id)
            self._col = None
        except ValueError:
            self._column = None
            self._col = False

    def get(self, default=None):
        """The value for the current key, or `default` if none was set."""
        # The common cases first, in as few steps as the interpreter can take them: a value
        # this call wrote, or one prefetched with the batch.
        s = self._scope
        v = self._writes.get(s.slot, _UNSET)
        if v is _UNSET:
            col = self._col
            if col is None:
                col = self._fetch()
            if col is not False:
                v = col[s.row]
                if v is not None:
                    return v
            return self._read(default)
        if type(v) in _SCALAR:
            return v
        if v is _CLEARED:
            return default
        # A copy of what can change: the caller's later changes are not writes.
        return _loads(_dumps(v))

    def _read(self, default):
        """The value when it is neither written nor prefetched (or prefetched as `null`)."""
        s = self._scope
        if s.slot is None:
            raise errors.OperatorError(NO_KEY)
        if self._col is not False:
            _, length = CELL.unpack_from(s.prefetched, 8 * (s.row * s.prefetched_width + self._column))
            return default if length == ABSENT else None
        raw = s.host.value_get(self.id, s.slot)
        return default if raw is None else codec.decode_value(raw, s.schemas)

    def _fetch(self):
        text = self._scope.host.json_prefetched(self.id)
        col = False
        if text is not None:
            try:
                col = _loads(text)
            except ValueError:
                col = False
        self._col = col
        return col

    def set(self, value):
        """Replaces the value for the current key."""
        slot = self._scope.slot
        if slot is None:
            raise errors.OperatorError(NO_KEY)
        self._writes[slot] = value if type(value) in _IMMUTABLE else snapshot(value)

    def clear(self):
        """Removes the value for the current key."""
        slot = self._scope.slot
        if slot is None:
            raise errors.OperatorError(NO_KEY)
        self._writes[slot] = _CLEARED
        self._clears = True

    def flush(self):
        """Hands this call's writes to the host."""
        w = self._writes
        if not w:
            return
        if self._clears:
            cleared = [slot for slot, v in w.items() if v is _CLEARED]
            for slot in cleared:
                del w[slot]
        else:
            cleared = []
        self._scope.host.json_set_values(self.id, _dumps((list(w), list(w.values()), cleared)))
        self.discard()

    def discard(self):
        self._writes.clear()
        self._clears = False


class _Keyed:
    """A state reached through one import per operation, for the current key."""

    __slots__ = ("_scope", "id", "name")

    def __init__(self, scope, id, name):
        self._scope = scope
        self.id = id
        self.name = name

    def _handle(self):
        slot = self._scope.slot
        if slot is None:
            raise errors.OperatorError(NO_KEY)
        return slot


class ListState(_Keyed):
    """An ordered list per key."""

    __slots__ = ()

    def get(self):
        """All items for the current key, oldest first."""
        schemas = self._scope.schemas
        return [codec.decode_value(b, schemas) for b in self._scope.host.list_get(self.id, self._handle())]

    def append(self, item):
        """Appends one item for the current key (as cheap however long the list is)."""
        self._scope.host.list_append(self.id, self._handle(), codec.encode_json(item))

    def replace(self, items):
        """Replaces every item for the current key."""
        self._scope.host.list_replace(self.id, self._handle(), [codec.encode_json(i) for i in items])

    def clear(self):
        self._scope.host.clear(self.id, self._handle())


class MapState(_Keyed):
    """A map from user keys to values per key (keys JSON, values read as value state reads them)."""

    __slots__ = ()

    def get(self, map_key, default=None):
        raw = self._scope.host.map_get(self.id, self._handle(), codec.encode_json(map_key))
        return default if raw is None else codec.decode_value(raw, self._scope.schemas)

    def put(self, map_key, value):
        self._scope.host.map_put(self.id, self._handle(), codec.encode_json(map_key), codec.encode_json(value))

    def remove(self, map_key):
        self._scope.host.map_remove(self.id, self._handle(), codec.encode_json(map_key))

    def items(self):
        """Every (map key, value) of the current key, ordered by the map key's JSON bytes."""
        host, schemas = self._scope.host, self._scope.schemas
        return [(codec.decode_json(k), codec.decode_value(v, schemas)) for k, v in host.map_entries(self.id, self._handle())]

    def clear(self):
        self._scope.host.clear(self.id, self._handle())
