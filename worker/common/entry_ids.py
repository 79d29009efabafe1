"""A stream entry id (`<ms>-<seq>`): its order key and whether a value is one."""

from __future__ import annotations


def entry_id(raw: bytes) -> tuple[int, int]:
    """(ms, seq) of a stream entry id, for ordering and for its arrival time."""
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)


def valid_id(raw: bytes) -> bool:
    """Whether `raw` is a full stream entry id `<ms>-<seq>` (both 64-bit unsigned)."""
    ms, sep, seq = raw.partition(b"-")
    return (bool(sep) and ms.isdigit() and seq.isdigit() and int(ms) < 2**64
            and int(seq) < 2**64)  # fmt: skip
