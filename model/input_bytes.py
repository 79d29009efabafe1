"""A batch's declared inputs in stored form (model/input_encoding.py, Stored forms) straight from
their raw bytes: every value of every input in one buffer, hashed or parsed in one kernel
call, no Python per value.

`numeric_values` and `value_hashes` are the definition; this gives their bits for raw bytes.
An empty value is absent (the worker's reader leaves one too long empty). Hashes are FNV-1a
as `fnv1a32`. Numbers of the plain decimal form `-?digits[.digits]` with at most 15 digits
parse here: the digits are an exact integer below 2^53 and 10^k an exact double, so one IEEE
division is the correctly rounded value numpy's parser gives; any other form (exponents,
`inf`, spaces, more digits) goes to `numeric_values`, for those values alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numba as nb
import numpy as np

from model.input_encoding import numeric_values
from model.value_hash import FNV_PRIME, hash_seed

_FAST_DIGITS = 15  # 10^15 < 2^53: such digits are an exact float64
_TEN = 10.0 ** np.arange(_FAST_DIGITS + 1)  # exact: every 10^k up to 10^22 is a double


@dataclass(frozen=True)
class RawInputs:
    """The raw values of a batch's declared inputs: value (input c, event e) is
    data[starts[c, e]:ends[c, e]], empty where the event lacks it."""

    names: tuple[str, ...]
    data: bytes
    starts: np.ndarray  # (C, N) int64
    ends: np.ndarray  # (C, N) int64

    def __len__(self) -> int:
        return self.starts.shape[1]


def stored_forms(
    raw: RawInputs, wanted: Sequence[tuple[str, bool]], rows: np.ndarray
) -> list[np.ndarray]:
    """The stored values of the events `rows` of each (name, numeric) of `wanted` (a name
    `raw` holds): float64 numbers where numeric (numeric_values), else int64 hashes of the
    name's values (value_hashes), all in one kernel call."""
    at, numeric, seeds = _plan(raw.names, tuple(wanted))
    starts, ends = raw.starts.take(at, 0).take(rows, 1), raw.ends.take(at, 0).take(rows, 1)
    buf = np.frombuffer(raw.data, np.uint8)
    hashes, numbers, slow = _stored(buf, starts, ends, seeds, numeric, _TEN)
    _parse_slow(raw.data, starts, ends, numbers, slow)
    return [numbers[k] if is_numeric else hashes[k] for k, (_, is_numeric) in enumerate(wanted)]


@lru_cache(maxsize=64)
def _plan(names: tuple[str, ...], wanted: tuple[tuple[str, bool], ...]) -> tuple[np.ndarray, ...]:
    """(rows of `names`, numeric flags, hash seeds) of `wanted`: the same few per worker, so
    worked out once each, not per batch (never written to)."""
    at = np.array([names.index(name) for name, _ in wanted], np.int64)
    numeric = np.array([is_numeric for _, is_numeric in wanted], np.bool_)
    seeds = np.array([hash_seed(name) for name, _ in wanted], np.int64)
    return at, numeric, seeds


def _parse_slow(data: bytes, starts: np.ndarray, ends: np.ndarray, numbers: np.ndarray,
                slow: np.ndarray) -> None:  # fmt: skip
    """numeric_values of the values the kernel left (`slow`), written into `numbers`."""
    where = np.nonzero(slow)
    if where[0].size:
        spans = zip(starts[where].tolist(), ends[where].tolist(), strict=True)
        values = [data[a:b] for a, b in spans]
        numbers[where] = numeric_values(values)


@nb.njit(cache=True)
def _stored(buf, starts, ends, seeds, numeric, ten):
    """(hashes (K, R) int64, numbers (K, R) float64, slow (K, R) bool): each value's hash
    continued from its input's seed (-1 absent) where not `numeric`; else its number (NaN
    absent), or `slow` where not of the plain decimal form."""
    K, R = starts.shape
    hashes = np.full((K, R), -1, np.int64)
    numbers = np.full((K, R), np.nan)
    slow = np.zeros((K, R), np.bool_)
    for k in range(K):
        for r in range(R):
            a, b = starts[k, r], ends[k, r]
            if b == a:
                continue
            if numeric[k]:
                value, ok = _decimal(buf, a, b, ten)
                numbers[k, r] = value
                slow[k, r] = not ok
            else:
                hashes[k, r] = _fnv1a(buf, a, b, seeds[k])
    return hashes, numbers, slow


@nb.njit(cache=True)
def _fnv1a(buf, a, b, seed):
    """FNV-1a 32-bit of buf[a:b] continued from `seed`, as int64 (model/value_hash.py)."""
    h = np.uint64(seed)
    for j in range(a, b):
        h = ((h ^ np.uint64(buf[j])) * np.uint64(FNV_PRIME)) & np.uint64(0xFFFFFFFF)
    return np.int64(h)


@nb.njit(cache=True)
def _decimal(buf, a, b, ten):
    """(value, True) of buf[a:b] when it is `-?digits[.digits]` of at most 15 digits,
    else (NaN, False)."""
    negative = buf[a] == 45  # "-"
    j = a + 1 if negative else a
    mantissa, digits, point, after = np.int64(0), 0, False, 0
    while j < b:
        c = buf[j]
        if 48 <= c <= 57:
            digits += 1
            if digits > _FAST_DIGITS:
                return np.nan, False
            mantissa = mantissa * 10 + (c - 48)
            if point:
                after += 1
        elif c == 46 and not point and digits > 0:  # ".", after a digit
            point = True
        else:
            return np.nan, False
        j += 1
    if digits == 0 or (point and after == 0):
        return np.nan, False
    value = np.float64(mantissa) / ten[after]
    return (-value if negative else value), True


def warm_up() -> None:
    """Compile (or load from cache) the kernel now, not on a rich model's first batch."""
    raw = RawInputs(("warm",), b"1.5", np.zeros((1, 1), np.int64), np.full((1, 1), 3))
    stored_forms(raw, [("warm", True), ("warm", False)], np.zeros(1, np.int64))
