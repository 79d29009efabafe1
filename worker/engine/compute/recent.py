"""A user's recent events of the current session, kept in the state hash (field `recent`) so
that a new model can rebuild the user's state by replaying them (docs/contract.md, Model
artifacts and the registry), and the reasons and `intentstream explain` replay what was scored.

A hidden state means something only to the weights that wrote it; event types, times and the
declared inputs' values in stored form mean the same to every model. Layout (little-endian):
int64 time of the event before the first kept one (-1 = none), uint16 count word (the count n
in its low 15 bits; its top bit set when an input section follows the times), n int64 times
(epoch ms), [the input section], then n type names, each a uint8 length and its UTF-8 bytes
(types are at most 128 bytes). A field without the top bit, the layout before inputs, reads
as a history without inputs.

The input section holds the values of the inputs the scoring models (current and shadow)
declare, per event: uint8 field count F; F headers of a uint8 form (0 NUMBER: the value parsed,
before any transform, float64, NaN absent, +inf unusable; 1 HASH: the 32-bit value hash as
int64, -1 absent; model/input_encoding.py, Stored forms), a uint8 name length and the name; then F
columns of n 8-byte values. So an input costs 8 bytes per event and 2 + len(name) per user
(the section 1 more): at history-events 32, 256 bytes and the header.

Why these forms: a hash or a parsed number is what every model reads of a value (the bucket is
1 + hash mod (buckets - 1), the item memory keeps hashes), is fixed-size (raw bytes are not
bounded) and has room for "absent"; a hash takes 8 bytes, not 4, to hold -1 beside all 2^32
hashes with the columns' one stride. A field is keyed by form and name, so one name declared
numeric by a model and categorical by another keeps both. A field no scoring model declares
any more is dropped at the user's next scored event; an event kept from before a field was
declared holds it absent; an input a replaying model declares that the history does not hold
replays as absent (its learned default).

Every batch extends the history of each user it scores, so the worker keeps histories packed
(the field's bytes) and extends them all in one kernel call (compute/histories.py); its
definition is `extend_packed`, and `extend_with_inputs` where inputs are declared (per user: a
few slices and concatenations), which the cold paths (`extended`) and the tests use;
only a replay or a live-quality check unpacks one (`unpack`, `has`).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from model.input_encoding import Stored
from model.inputs import InputSpec

_HEAD = struct.Struct("<qH")
_ONE = struct.Struct("<q")
_WITH_INPUTS = 0x8000  # the count word's top bit: an input section follows the times
_COUNT = 0x7FFF

NUMBER, HASH = 0, 1  # a stored column's form
_DTYPE = {NUMBER: np.dtype("<f8"), HASH: np.dtype("<i8")}
_ABSENT = {NUMBER: struct.pack("<d", float("nan")), HASH: _ONE.pack(-1)}

Field = tuple[int, str]  # (form, input name)


@lru_cache(maxsize=4096)
def _name(type_: str) -> bytes:
    """A type name as stored: its length, then its UTF-8 bytes (a shop has few types)."""
    raw = type_.encode("utf-8")
    return bytes([len(raw)]) + raw


@lru_cache(maxsize=256)
def field_key(form: int, name: str) -> bytes:
    """A field's header as stored: its form, its name's length and the name (UTF-8)."""
    raw = name.encode("utf-8")
    return bytes([form, len(raw)]) + raw


def form_of(spec: InputSpec) -> int:
    """The form a history keeps an input's values in: NUMBER for numeric, else HASH."""
    return NUMBER if spec.kind == "numeric" else HASH


def column_bytes(form: int, values: np.ndarray) -> bytes:
    """A column of stored values as the section holds it (8 bytes each)."""
    return np.ascontiguousarray(values, _DTYPE[form]).tobytes()


@dataclass(frozen=True)
class Recent:
    """The events to replay: the session's kept events, the time of the event before
    them (the first replayed event's gap is measured from it, as when it happened), and the
    declared inputs' values of each."""

    prev_ts: int = -1
    ts_raw: bytes = b""  # int64 little-endian times
    names: tuple[bytes, ...] = ()  # length-prefixed UTF-8 type names
    columns: tuple[tuple[bytes, bytes], ...] = ()  # (field_key, its n 8-byte values)

    @classmethod
    def of(
        cls, prev_ts: int, ts: list[int], types: list[str],
        columns: Mapping[Field, np.ndarray] | None = None,
    ) -> Recent:  # fmt: skip
        held = tuple((field_key(*f), column_bytes(f[0], v)) for f, v in (columns or {}).items())
        return cls(prev_ts, struct.pack(f"<{len(ts)}q", *ts), tuple(map(_name, types)), held)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def ts(self) -> list[int]:
        return list(struct.unpack(f"<{len(self.names)}q", self.ts_raw))

    @property
    def types(self) -> list[str]:
        return [n[1:].decode("utf-8") for n in self.names]

    @property
    def fields(self) -> list[Field]:
        """The (form, name) of each input the history holds."""
        return [(k[0], k[2:].decode("utf-8")) for k, _ in self.columns]

    def column(self, form: int, name: str) -> np.ndarray | None:
        """An input's kept values in stored form (None when the history does not hold it)."""
        key = field_key(form, name)
        raw = next((values for k, values in self.columns if k == key), None)
        return None if raw is None else np.frombuffer(raw, _DTYPE[form])

    def stored_inputs(self, specs: Sequence[InputSpec]) -> dict[str, Stored]:
        """Each declared input's kept values as a model reads them; an input the history
        does not hold reads as absent for every event."""
        out = {}
        for spec in specs:
            values = self.column(form_of(spec), spec.name)
            held = values if values is not None else absent(form_of(spec), len(self))
            out[spec.name] = Stored(held)
        return out

    def has(self, type_: str) -> bool:
        """Whether an event of this type is among the kept ones."""
        return _name(type_) in self.names


def absent(form: int, n: int) -> np.ndarray:
    """n absent values of a form: NaN numbers or -1 hashes."""
    return np.full(n, np.nan) if form == NUMBER else np.full(n, -1, np.int64)


def pack(recent: Recent) -> bytes:
    """The `recent` field's bytes."""
    n = len(recent.names)
    if not recent.columns:
        return _HEAD.pack(recent.prev_ts, n) + recent.ts_raw + b"".join(recent.names)
    return (_HEAD.pack(recent.prev_ts, n | _WITH_INPUTS) + recent.ts_raw
            + _section([k for k, _ in recent.columns], [c for _, c in recent.columns])
            + b"".join(recent.names))  # fmt: skip


def _section(keys: list[bytes], columns: list[bytes]) -> bytes:
    """The input section: the field count, the fields' headers, then their columns."""
    return bytes([len(keys)]) + b"".join(keys) + b"".join(columns)


def unpack(raw: bytes | None) -> Recent:
    """A `recent` field read from Redis; anything malformed reads as no history."""
    if not raw or len(raw) < _HEAD.size:
        return Recent()
    try:
        prev_ts, word = _HEAD.unpack_from(raw)
        n = word & _COUNT
        pos = _HEAD.size + 8 * n
        ts_raw = raw[_HEAD.size : pos]
        columns: tuple[tuple[bytes, bytes], ...] = ()
        if word & _WITH_INPUTS:
            columns, pos = _columns(raw, pos, n)
        names = []
        for _ in range(n):
            size = raw[pos]
            names.append(raw[pos : pos + 1 + size])
            raw[pos + 1 : pos + 1 + size].decode("utf-8")
            pos += 1 + size
        if pos != len(raw) or len(ts_raw) != 8 * n:
            return Recent()
    except (IndexError, UnicodeDecodeError, ValueError):
        return Recent()
    return Recent(prev_ts, ts_raw, tuple(names), columns)


def _columns(raw: bytes, pos: int, n: int) -> tuple[tuple[tuple[bytes, bytes], ...], int]:
    """The input section at `pos` of a history of n events: its (field_key, column) pairs
    and the position after it. ValueError or IndexError when malformed."""
    count = raw[pos]
    pos += 1
    keys = []
    for _ in range(count):
        form, size = raw[pos], raw[pos + 1]
        if form not in _DTYPE:
            raise ValueError(f"unknown form {form}")
        keys.append(raw[pos : pos + 2 + size])
        raw[pos + 2 : pos + 2 + size].decode("utf-8")
        pos += 2 + size
    columns = []
    for key in keys:
        columns.append((key, raw[pos : pos + 8 * n]))
        pos += 8 * n
    if pos > len(raw):
        raise ValueError("truncated input section")
    return tuple(columns), pos


def _offsets(raw: bytes, pos: int, n: int) -> tuple[dict[bytes, int], int]:
    """Each field's column offset in the input section at `pos` of a well-formed history of
    n events (extend's path: read as validated), and the position after the section."""
    count, at = raw[pos], pos + 1
    col = at
    for _ in range(count):  # past the headers: the first column
        col += 2 + raw[col + 1]
    offsets = {}
    for _ in range(count):
        end = at + 2 + raw[at + 1]
        offsets[raw[at:end]] = col
        col += 8 * n
        at = end
    return offsets, col


def valid(raw: bytes | None) -> bytes:
    """A `recent` field as read from Redis if it is well-formed and holds events, else b"".
    The definition of compute/histories.py's `valid_histories`, which the states' reader
    runs over a batch's fields in one kernel call."""
    recent = unpack(raw)
    return raw if len(recent) else b""  # type: ignore[return-value]


def has(raw: bytes, type_: str) -> bool:
    """Whether a packed history holds an event of this type."""
    return bool(raw) and _name(type_) in unpack(raw).names


def extended(
    recent: Recent, ts: list[int], types: list[str], keep: int, session_gap_ms: float,
    columns: Mapping[Field, np.ndarray] | None = None,
) -> Recent:  # fmt: skip
    """`recent` followed by a user's newly applied events (in order, with the stored values
    `columns` of the scoring models' inputs), cut where a gap exceeds the session gap
    (0 = never) and to the last `keep` events."""
    raw = pack(recent) if len(recent) else b""
    if not columns:
        return unpack(extend_packed(raw, ts, names_of(types), keep, session_gap_ms))
    new = {field_key(*f): column_bytes(f[0], v) for f, v in columns.items()}
    return unpack(extend_with_inputs(raw, ts, names_of(types), keep, session_gap_ms, new))


def names_of(types: list[str]) -> list[bytes]:
    """Type names as stored (see extend_packed)."""
    return [_name(t) for t in types]


def _first_kept(
    raw: bytes, ts_end: int, n_old: int, ts: list[int], keep: int, session_gap_ms: float
) -> int:
    """The index (among the old events, then the new) of the first event a history keeps."""
    total = n_old + len(ts)
    start = total - keep if total > keep else 0
    if session_gap_ms > 0:
        # `raw` is one session already: a new one can start only at a new event. (Were there
        # an older gap inside it, a replay would still be exact: the kernel restarts there.)
        last = _ONE.unpack_from(raw, ts_end - 8)[0] if n_old else None
        for k, t in enumerate(ts):
            if last is not None and t - last > session_gap_ms and n_old + k > start:
                start = n_old + k
            last = t
    return start


def extend_packed(
    raw: bytes, ts: list[int], names: list[bytes], keep: int, session_gap_ms: float
) -> bytes:
    """`extended` on packed histories (b"" = none) for events without inputs: the field's
    bytes after the new events (times `ts`, stored names `names`): slices, no unpacking. The
    definition of compute/histories.py's batched path for type-only models."""
    prev_ts, n_old = _HEAD.unpack_from(raw) if raw else (-1, 0)
    n_new = len(ts)
    total = n_old + n_new
    if total > keep:  # keep <= 1000: a count word with the top bit always lands here
        if n_old & _WITH_INPUTS:  # a section the models scoring now do not declare: dropped
            return extend_with_inputs(raw, ts, names, keep, session_gap_ms, {})
        start = total - keep  # the first event kept
    else:
        start = 0
    ts_end = _HEAD.size + 8 * n_old
    if session_gap_ms > 0:  # _first_kept, inlined: a call costs the hot path 3-4 %
        last = _ONE.unpack_from(raw, ts_end - 8)[0] if n_old else None
        for k, t in enumerate(ts):
            if last is not None and t - last > session_gap_ms and n_old + k > start:
                start = n_old + k
            last = t
    new_ts = _ONE.pack(ts[0]) if n_new == 1 else struct.pack(f"<{n_new}q", *ts)
    new_names = names[0] if n_new == 1 else b"".join(names)
    if start == 0:
        return (
            _HEAD.pack(prev_ts, total)
            + raw[_HEAD.size : ts_end]
            + new_ts
            + raw[ts_end:]
            + new_names
        )
    if start >= n_old:  # only new events are kept
        k = start - n_old
        before = ts[k - 1] if k else _ONE.unpack_from(raw, ts_end - 8)[0]
        return _HEAD.pack(before, total - start) + new_ts[8 * k :] + b"".join(names[k:])
    before = _ONE.unpack_from(raw, _HEAD.size + 8 * (start - 1))[0]
    pos = ts_end
    for _ in range(start):  # skip the names of the dropped events
        pos += 1 + raw[pos]
    kept_ts = raw[_HEAD.size + 8 * start : ts_end]
    return _HEAD.pack(before, total - start) + kept_ts + new_ts + raw[pos:] + new_names


def extend_with_inputs(
    raw: bytes, ts: list[int], names: list[bytes], keep: int, session_gap_ms: float,
    inputs: Mapping[bytes, bytes],
) -> bytes:  # fmt: skip
    """extend_packed for events with inputs: `inputs` holds, per field_key, the new events'
    column_bytes of the scoring models' inputs; the section keeps these fields (old events
    without one: absent) and drops the others."""
    prev_ts, word = _HEAD.unpack_from(raw) if raw else (-1, 0)
    n_old = word & _COUNT
    ts_end = _HEAD.size + 8 * n_old
    held, names_at = _offsets(raw, ts_end, n_old) if word & _WITH_INPUTS else ({}, ts_end)
    start = _first_kept(raw, ts_end, n_old, ts, keep, session_gap_ms)
    cut_old, cut_new = min(start, n_old), max(start - n_old, 0)  # dropped old, dropped new
    if start == 0:
        before = prev_ts
    elif cut_new:
        before = ts[cut_new - 1]
    else:
        before = _ONE.unpack_from(raw, _HEAD.size + 8 * (start - 1))[0]
    pos = names_at
    for _ in range(cut_old):  # skip the names of the dropped events
        pos += 1 + raw[pos]
    new_ts = struct.pack(f"<{len(ts)}q", *ts)
    kept_ts = raw[_HEAD.size + 8 * cut_old : ts_end] + new_ts[8 * cut_new :]
    kept_names = raw[pos:] + b"".join(names[cut_new:])
    n = n_old + len(ts) - start
    if not inputs:
        return _HEAD.pack(before, n) + kept_ts + kept_names
    end = 8 * n_old
    columns = [
        (raw[held[k] + 8 * cut_old : held[k] + end] if k in held
         else _ABSENT[k[0]] * (n_old - cut_old)) + values[8 * cut_new :]
        for k, values in inputs.items()
    ]  # fmt: skip
    return (_HEAD.pack(before, n | _WITH_INPUTS) + kept_ts + _section(list(inputs), columns)
            + kept_names)  # fmt: skip
