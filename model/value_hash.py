"""The stable hash of an input's values: FNV-1a 32-bit of the input's name, a separator and
the value's bytes, the same in every process and language (model/input_encoding.py buckets it)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numba as nb
import numpy as np

from model.values import value_bytes

_FNV_OFFSET = 2166136261
FNV_PRIME = 16777619
_SEP = b"\x1f"


def fnv1a32(data: bytes, h: int = _FNV_OFFSET) -> int:
    """FNV-1a 32-bit of `data`, continuing from state `h` (plain Python; the reference)."""
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFF
    return h


@lru_cache(maxsize=1024)
def hash_seed(name: str) -> int:
    """The hash's state after input `name` and the separator: where each value's hash goes on."""
    return fnv1a32(name.encode("utf-8") + _SEP)


def value_hash(name: str, value: bytes | str) -> int:
    """The 32-bit hash of one (non-empty) value of input `name` (plain Python)."""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return fnv1a32(name.encode("utf-8") + _SEP + raw)


@nb.njit(cache=True)
def _fnv1a_batch(buf, ends, seed):
    """Each value's FNV-1a 32-bit hash continued from `seed` (the name's prefix), as int64;
    -1 for an empty value (missing). Value i is buf[ends[i-1]:ends[i]]."""
    n = ends.shape[0]
    out = np.empty(n, np.int64)
    start = 0
    for i in range(n):
        end = ends[i]
        if end == start:
            out[i] = -1
        else:
            h = np.uint64(seed)
            for j in range(start, end):
                h = ((h ^ np.uint64(buf[j])) * np.uint64(FNV_PRIME)) & np.uint64(0xFFFFFFFF)
            out[i] = np.int64(h)
        start = end
    return out


def value_hashes(name: str, values: Sequence[bytes | str | int | float | None]) -> np.ndarray:
    """The 32-bit hash of every value of a batch (int64), -1 where missing (None or empty).

    Per-event Python: one comprehension (bytes as given, text encoded) and a join; the hash
    itself runs in one Numba kernel over the concatenated bytes.
    """
    raw = [v if type(v) is bytes else value_bytes(v) for v in values]
    ends = np.cumsum(np.fromiter(map(len, raw), np.int64, len(raw)))
    buf = np.frombuffer(b"".join(raw), np.uint8)
    return _fnv1a_batch(buf, ends, hash_seed(name))
