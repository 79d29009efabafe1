"""A user's recent events of the current session, kept in the state hash (field `recent`) so
that a new model can rebuild the user's state by replaying them (SPEC §5).

A hidden state means something only to the weights that wrote it; event types and times mean
the same to every model. Layout (little-endian): int64 time of the event before the first
kept one (-1 = none), uint16 count n, n int64 times (epoch ms), then n type names, each a
uint8 length and its UTF-8 bytes (types are at most 128 bytes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


@dataclass
class Recent:
    """The events to replay: the session's kept events, and the time of the event before
    them (the first replayed event's gap is measured from it, as when it happened)."""

    prev_ts: int = -1
    ts: list[int] = field(default_factory=list)
    types: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ts)


# Each type name's length-prefixed bytes, made once: a commit packs thousands of `recent`s
# over a handful of types (bounded: type names come from producers).
_NAMES: dict[str, bytes] = {}
_MAX_NAMES = 4096


def _name(t: str) -> bytes:
    packed = _NAMES.get(t)
    if packed is None:
        raw = t.encode("utf-8")
        packed = bytes([len(raw)]) + raw
        if len(_NAMES) < _MAX_NAMES:
            _NAMES[t] = packed
    return packed


def pack(recent: Recent) -> bytes:
    """The `recent` field's bytes."""
    n = len(recent.ts)
    try:  # a C-level lookup per name while every name is known
        names = b"".join(map(_NAMES.__getitem__, recent.types))
    except KeyError:
        names = b"".join(map(_name, recent.types))
    return struct.pack(f"<qH{n}q", recent.prev_ts, n, *recent.ts) + names


def unpack(raw: bytes | None) -> Recent:
    """A `recent` field read from Redis; anything malformed reads as no history."""
    if not raw:
        return Recent()
    try:
        prev_ts, n = struct.unpack_from("<qH", raw)
        ts = list(struct.unpack_from(f"<{n}q", raw, 10))
        pos, types = 10 + 8 * n, []
        for _ in range(n):
            size = raw[pos]
            types.append(raw[pos + 1 : pos + 1 + size].decode("utf-8"))
            pos += 1 + size
        if pos != len(raw) or len(types) != n:
            return Recent()
    except (struct.error, IndexError, UnicodeDecodeError):
        return Recent()
    return Recent(prev_ts, ts, types)


def extended(
    recent: Recent, ts: list[int], types: list[str], keep: int, session_gap_ms: float
) -> Recent:
    """`recent` followed by a user's newly applied events (in order), cut where a gap
    exceeds the session gap (0 = never) and to the last `keep` events."""
    all_ts = recent.ts + ts
    all_types = recent.types + types
    n = len(all_ts)
    start = max(0, n - keep)
    if session_gap_ms > 0:
        # the last gap within the kept tail, scanned in plain Python: a numpy call per user
        # cost more than the few dozen comparisons
        for i in range(n - 1, start, -1):
            if all_ts[i] - all_ts[i - 1] > session_gap_ms:
                start = i
                break
    if start == 0:
        return Recent(recent.prev_ts, all_ts, all_types)
    return Recent(all_ts[start - 1], all_ts[start:], all_types[start:])
