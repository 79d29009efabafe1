"""A user's recent events of the current session, kept in the state hash (field `recent`) so
that a new model can rebuild the user's state by replaying them (SPEC §5).

A hidden state means something only to the weights that wrote it; event types and times mean
the same to every model. Layout (little-endian): int64 time of the event before the first
kept one (-1 = none), uint16 count n, n int64 times (epoch ms), then n type names, each a
uint8 length and its UTF-8 bytes (types are at most 128 bytes).

Every batch extends the history of each user it scores, so a Recent keeps its parts packed
(times as bytes, names as length-prefixed bytes): extending one is a few concatenations, and
only a replay unpacks it.
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


def extended(
    recent: Recent, ts: list[int], types: list[str], keep: int, session_gap_ms: float
) -> Recent:
    """`recent` followed by a user's newly applied events (in order), cut where a gap
    exceeds the session gap (0 = never) and to the last `keep` events."""
    old = len(recent.names)
    new_raw = _ONE.pack(ts[0]) if len(ts) == 1 else struct.pack(f"<{len(ts)}q", *ts)
    ts_raw = recent.ts_raw + new_raw
    names = recent.names + tuple(map(_name, types))
    start = max(0, len(names) - keep)
    if session_gap_ms > 0 and ts:
        # `recent` is one session already: a new one can start only at a new event. (Were
        # there an older gap inside it, a replay would still be exact: the kernel restarts
        # the state there.)
        prev = _ONE.unpack_from(recent.ts_raw, 8 * (old - 1))[0] if old else None
        for k, t in enumerate(ts):
            if prev is not None and t - prev > session_gap_ms:
                start = max(start, old + k)
            prev = t
    if start == 0:
        return Recent(recent.prev_ts, ts_raw, names)
    prev_ts = _ONE.unpack_from(ts_raw, 8 * (start - 1))[0]
    return Recent(prev_ts, ts_raw[8 * start :], names[start:])
