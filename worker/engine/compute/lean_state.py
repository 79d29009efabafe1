"""The lean layout's packed state field `s` (docs/contract.md, The lean layout): everything
of a user's state but `score` and `model` in one binary value, so a commit writes three
fields per user instead of eight or more.

Why: Redis spends most of a commit's CPU per argument and per hash field (each argument is
interned as a Lua string, each field is a hash entry to find and replace), not per byte. Three
fields cost about a third less Redis CPU per event than the full layout's (BENCHMARKS.md,
The commit's Redis CPU).

Layout, little-endian: uint8 version (1); uint32 the lengths of h, last_id, event_ids,
recent, rules and items; int64 last_ts; int64 n; then the six values, in that order, as the
full layout stores them in the fields of those names.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import numba as nb
import numpy as np

from worker.common.entry_ids import entry_id

VERSION = 1
_HEADER = struct.Struct("<B6Iqq")
HEADER_BYTES = _HEADER.size  # 41

# The full layout's fields that `s` holds, in its order (score and model stay fields).
PACKED_FIELDS = (b"h", b"last_id", b"last_ts", b"n", b"event_ids", b"recent", b"rules", b"items")


class PackedState(NamedTuple):
    """A packed state's values, each as the full layout's field of that name holds it."""

    h: bytes
    last_id: bytes
    last_ts: bytes
    n: bytes
    event_ids: bytes
    recent: bytes
    rules: bytes
    items: bytes


def unpack_state(raw: bytes | None) -> PackedState | None:
    """The values of a stored `s`, or None when it is absent or not a version-1 field whose
    lengths add up (the caller counts it as an invalid state)."""
    if raw is None or len(raw) < HEADER_BYTES:
        return None
    version, *lengths, last_ts, n = _HEADER.unpack_from(raw)
    if version != VERSION or HEADER_BYTES + sum(lengths) != len(raw):
        return None
    values, at = [], HEADER_BYTES
    for length in lengths:
        values.append(raw[at : at + length])
        at += length
    h, last_id, event_ids, recent, rules, items = values
    return PackedState(h, last_id, b"%d" % last_ts, b"%d" % n, event_ids, recent, rules, items)


def as_fields(state: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A stored state hash in the full layout's fields: a valid `s` read out over the fields
    it holds, unless the fields hold a later entry (`last_id`): a worker of the other layout
    wrote last."""
    packed = unpack_state(state.get(b"s"))
    if packed is None:
        return state
    if b"last_id" in state and later_id(state[b"last_id"], packed.last_id):
        return state
    out = {k: v for k, v in state.items() if k != b"s" and k not in PACKED_FIELDS}
    out.update((k, v) for k, v in zip(PACKED_FIELDS, packed, strict=True) if v or k == b"h")
    return out


def later_id(a: bytes, b: bytes) -> bool:
    """Whether entry id a is above entry id b (an unparsable id is below every other)."""
    return _ordered(a) > _ordered(b)


def _ordered(raw: bytes) -> tuple[int, int]:
    try:
        return entry_id(raw)
    except ValueError:
        return (-1, -1)


def packed_states(
    h: np.ndarray, last_ts: np.ndarray, n: np.ndarray, columns: Sequence[Sequence[bytes]]
) -> tuple[np.ndarray, np.ndarray]:
    """The `s` values of K states, laid end to end, and their lengths: h (K, ...) float32
    rows, last_ts and n (K,) int64, `columns` the five byte-string columns last_id,
    event_ids, recent, rules, items (K each). One kernel call; Python only joins the
    columns."""
    k = len(h)
    rows = np.ascontiguousarray(h, "<f4").reshape(k, -1).view(np.uint8)
    data = np.frombuffer(b"".join(b"".join(c) for c in columns), np.uint8)
    lengths = np.empty((len(columns), k), np.int64)
    for j, column in enumerate(columns):
        lengths[j] = np.fromiter(map(len, column), np.int64, k)
    ints = np.stack([np.asarray(last_ts, np.int64), np.asarray(n, np.int64)], axis=1)
    return _pack(rows, ints, data, lengths)


@nb.njit(cache=True)
def _le(out: np.ndarray, at: int, value: int, width: int) -> None:
    """`value` as `width` little-endian bytes at out[at:] (two's complement)."""
    v = np.uint64(value)
    for b in range(width):
        out[at + b] = np.uint8(v & np.uint64(255))
        v >>= np.uint64(8)


@nb.njit(cache=True)
def _pack(rows, ints, data, lengths):
    """The packed values (see the module's docstring) of each row, end to end, and their
    lengths. `data` holds the columns one after another, each its K values end to end."""
    K, C = rows.shape[0], lengths.shape[0]
    size = np.empty(K, np.int64)
    for u in range(K):
        size[u] = 41 + rows.shape[1]
        for j in range(C):
            size[u] += lengths[j, u]
    out = np.empty(size.sum(), np.uint8)
    starts = np.zeros(C, np.int64)  # where each column begins in data
    for j in range(1, C):
        starts[j] = starts[j - 1] + lengths[j - 1].sum()
    at = 0
    for u in range(K):
        out[at] = 1  # VERSION
        _le(out, at + 1, rows.shape[1], 4)
        for j in range(C):
            _le(out, at + 5 + 4 * j, lengths[j, u], 4)
        _le(out, at + 25, ints[u, 0], 8)
        _le(out, at + 33, ints[u, 1], 8)
        at += 41
        out[at : at + rows.shape[1]] = rows[u]
        at += rows.shape[1]
        for j in range(C):
            m = lengths[j, u]
            out[at : at + m] = data[starts[j] : starts[j] + m]
            starts[j] += m
            at += m
    return out, size


def warm_up() -> None:
    """Compile (or load from cache) the packing kernel now, not at a lean worker's first commit."""
    one = np.zeros(1, np.int64)
    packed_states(np.zeros((1, 1, 2), np.float32), one, one, [[b"w"]] * 5)
