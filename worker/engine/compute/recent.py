"""A user's recent events of the current session, kept in the state hash (field `recent`) so
that a new model can rebuild the user's state by replaying them (docs/contract.md, Model
artifacts and the registry).

A hidden state means something only to the weights that wrote it; event types and times mean
the same to every model. Layout (little-endian): int64 time of the event before the first
kept one (-1 = none), uint16 count n, n int64 times (epoch ms), then n type names, each a
uint8 length and its UTF-8 bytes (types are at most 128 bytes).

Every batch extends the history of each user it scores, so the worker keeps histories packed
(the field's bytes) and extends them in place with a few slices and concatenations
(`extend_packed`); only a replay or a live-quality check unpacks one (`unpack`, `has`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

_HEAD = struct.Struct("<qH")
_ONE = struct.Struct("<q")


@lru_cache(maxsize=4096)
def _name(type_: str) -> bytes:
    """A type name as stored: its length, then its UTF-8 bytes (a shop has few types)."""
    raw = type_.encode("utf-8")
    return bytes([len(raw)]) + raw


@dataclass(frozen=True)
class Recent:
    """The events to replay: the session's kept events, and the time of the event before
    them (the first replayed event's gap is measured from it, as when it happened)."""

    prev_ts: int = -1
    ts_raw: bytes = b""  # int64 little-endian times
    names: tuple[bytes, ...] = ()  # length-prefixed UTF-8 type names

    @classmethod
    def of(cls, prev_ts: int, ts: list[int], types: list[str]) -> Recent:
        return cls(prev_ts, struct.pack(f"<{len(ts)}q", *ts), tuple(map(_name, types)))

    def __len__(self) -> int:
        return len(self.names)

    @property
    def ts(self) -> list[int]:
        return list(struct.unpack(f"<{len(self.names)}q", self.ts_raw))

    @property
    def types(self) -> list[str]:
        return [n[1:].decode("utf-8") for n in self.names]

    def has(self, type_: str) -> bool:
        """Whether an event of this type is among the kept ones."""
        return _name(type_) in self.names


def pack(recent: Recent) -> bytes:
    """The `recent` field's bytes."""
    return _HEAD.pack(recent.prev_ts, len(recent.names)) + recent.ts_raw + b"".join(recent.names)


def unpack(raw: bytes | None) -> Recent:
    """A `recent` field read from Redis; anything malformed reads as no history."""
    if not raw or len(raw) < _HEAD.size:
        return Recent()
    try:
        prev_ts, n = _HEAD.unpack_from(raw)
        pos = _HEAD.size + 8 * n
        ts_raw = raw[_HEAD.size : pos]
        names = []
        for _ in range(n):
            size = raw[pos]
            names.append(raw[pos : pos + 1 + size])
            raw[pos + 1 : pos + 1 + size].decode("utf-8")
            pos += 1 + size
        if pos != len(raw) or len(ts_raw) != 8 * n:
            return Recent()
    except (IndexError, UnicodeDecodeError):
        return Recent()
    return Recent(prev_ts, ts_raw, tuple(names))


def valid(raw: bytes | None) -> bytes:
    """A `recent` field as read from Redis if it is well-formed and holds events, else b""."""
    recent = unpack(raw)
    return raw if len(recent) else b""  # type: ignore[return-value]


def has(raw: bytes, type_: str) -> bool:
    """Whether a packed history holds an event of this type."""
    return bool(raw) and _name(type_) in unpack(raw).names


def extended(
    recent: Recent, ts: list[int], types: list[str], keep: int, session_gap_ms: float
) -> Recent:
    """`recent` followed by a user's newly applied events (in order), cut where a gap
    exceeds the session gap (0 = never) and to the last `keep` events."""
    raw = pack(recent) if len(recent) else b""
    return unpack(extend_packed(raw, ts, names_of(types), keep, session_gap_ms))


def names_of(types: list[str]) -> list[bytes]:
    """Type names as stored (see extend_packed)."""
    return [_name(t) for t in types]


def extend_packed(
    raw: bytes, ts: list[int], names: list[bytes], keep: int, session_gap_ms: float
) -> bytes:
    """`extended` on packed histories (b"" = none): the field's bytes after the new events
    (times `ts`, stored names `names`). The worker's per-user path: slices, no unpacking."""
    prev_ts, n_old = _HEAD.unpack_from(raw) if raw else (-1, 0)
    n_new = len(ts)
    total = n_old + n_new
    start = total - keep if total > keep else 0  # the first event kept
    ts_end = _HEAD.size + 8 * n_old
    if session_gap_ms > 0:
        # `raw` is one session already: a new one can start only at a new event. (Were there
        # an older gap inside it, a replay would still be exact: the kernel restarts there.)
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
