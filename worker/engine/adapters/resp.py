"""Columns of command arguments framed as RESP bulk strings (`$<length>\\r\\n<bytes>\\r\\n`),
the bytes a commit sends, by the cheapest framer for each kind of column.

A commit carries thousands of arguments; hiredis's packer costs about 0.3-0.5 µs apiece here
(a `sprintf` per argument), which was a tenth of the worker's CPU per event. A column of byte
strings is joined once and framed by one Numba kernel from its lengths; a column of ASCII
strings the same after one `join` and `encode`; integers are formatted by the kernel from an
int64 array. Anything else goes through hiredis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import hiredis
import numba as nb
import numpy as np

_INT64_MIN = np.iinfo(np.int64).min


def resp_args(args: tuple | list) -> bytes:
    """Arguments as RESP bulk strings without the array header; hiredis packs them in C
    (redis-py's packer would first inspect each one, ~0.2 µs apiece)."""
    if not args:
        return b""
    packed = hiredis.pack_command(tuple(args))
    return packed[packed.index(b"\r\n") + 2 :]


def resp_rows(h: np.ndarray) -> bytes:
    """Each row of h (little-endian float32 bytes) as a RESP bulk string, framed by numpy:
    thousands of equal-sized blobs cost one copy."""
    rows = np.ascontiguousarray(h, "<f4").reshape(len(h), -1).view(np.uint8)
    prefix = b"$%d\r\n" % rows.shape[1]
    out = np.empty((len(h), len(prefix) + rows.shape[1] + 2), np.uint8)
    out[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
    out[:, len(prefix) : -2] = rows
    out[:, -2:] = np.frombuffer(b"\r\n", np.uint8)
    return out.tobytes()


def resp_blobs(values: Sequence[bytes]) -> bytes:
    """Byte strings as RESP bulk strings (their concatenation framed by one kernel call)."""
    if not values:
        return b""
    return _framed_joined(b"".join(values), values)


def resp_texts(values: Sequence[str]) -> bytes:
    """Strings as RESP bulk strings of their UTF-8 bytes."""
    if not values:
        return b""
    text = "".join(values)
    data = text.encode()
    if len(data) != len(text):  # not all ASCII: a string's length is not its bytes'
        return resp_blobs([v.encode() for v in values])
    return _framed_joined(data, values)


def _framed_joined(data: bytes, values: Sequence[bytes] | Sequence[str]) -> bytes:
    """`values` laid end to end in `data` (as many bytes each as its len), framed. Their
    lengths go to the kernel as bytes when all are under 256 (the common case, and the
    cheapest to build), else as int64."""
    try:
        lengths = np.frombuffer(bytes(map(len, values)), np.uint8)
    except ValueError:
        lengths = np.fromiter(map(len, values), np.int64, len(values))
    return _framed(np.frombuffer(data, np.uint8), lengths).tobytes()


def resp_ints(values: np.ndarray) -> bytes:
    """Integers (int64) as RESP bulk strings of their decimals."""
    if not len(values):
        return b""
    values = np.ascontiguousarray(values, np.int64)
    if values.min() == _INT64_MIN:  # no magnitude to negate
        return resp_args(values.tolist())
    return _framed_ints(values).tobytes()


@dataclass(frozen=True)
class Joined:
    """A column of byte strings laid end to end (a kernel's output), and their lengths."""

    data: np.ndarray  # uint8
    lengths: np.ndarray  # int64, one per value

    def __len__(self) -> int:
        return len(self.lengths)

    def values(self) -> list[bytes]:
        """The column's values as bytes, one each."""
        blob, ends = self.data.tobytes(), np.cumsum(self.lengths).tolist()
        return [blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def resp_column(column: np.ndarray | Joined | Sequence) -> bytes:
    """A column of arguments as RESP bulk strings, by the cheapest framer for its kind: a 2-D
    float array's rows, a 1-D integer array's decimals, values laid end to end, byte
    strings, strings, else hiredis."""
    if isinstance(column, Joined):
        return _framed(column.data, column.lengths).tobytes() if len(column) else b""
    if isinstance(column, np.ndarray):
        if column.dtype.kind == "i":
            return resp_ints(column)
        return resp_rows(column) if column.dtype.kind == "f" else resp_args(column.tolist())
    if not column:
        return b""
    first = column[0]
    try:
        if isinstance(first, bytes):
            return resp_blobs(column)
        if isinstance(first, str):
            return resp_texts(column)
    except TypeError:  # a column mixing bytes and strings
        pass
    return resp_args(column)


def packed_command(args: Sequence, head: int) -> bytes:
    """A whole command as RESP: its first `head` arguments packed by hiredis, the rest (a
    column of one kind, e.g. a script's keys) by resp_column."""
    return b"*%d\r\n" % len(args) + resp_args(args[:head]) + resp_column(args[head:])


def as_arguments(column: np.ndarray | Joined | Sequence) -> list:
    """A column as plain command arguments (what resp_column frames): a float array's rows as
    little-endian float32 bytes, an integer array's values as ints."""
    if isinstance(column, Joined):
        return column.values()
    if not isinstance(column, np.ndarray):
        return list(column)
    if column.dtype.kind != "f":
        return column.tolist()
    blob = np.ascontiguousarray(column, "<f4").tobytes()
    size = len(blob) // len(column) if len(column) else 0
    return [blob[i : i + size] for i in range(0, len(blob), size)]


def warm_up() -> None:
    """Compile (or load from cache) the kernels now, not on the first commit."""
    resp_blobs([b"a"])  # lengths as bytes
    resp_blobs([b"a" * 256])  # lengths as int64
    resp_ints(np.zeros(1, np.int64))


# 10**k for k = 0..19: a decimal's width by comparisons, not divisions
_POWERS = np.array([10**k for k in range(20)], np.uint64)


@nb.njit(cache=True)
def _digits(n: np.uint64, powers: np.ndarray) -> int:
    """Decimal digits of n."""
    width = 1
    while width < 20 and n >= powers[width]:
        width += 1
    return width


@nb.njit(cache=True)
def _write_decimal(out: np.ndarray, at: int, n: np.uint64, width: int) -> None:
    """n in `width` decimal digits at out[at:]."""
    ten = np.uint64(10)
    for k in range(width - 1, -1, -1):
        q = n // ten
        out[at + k] = np.uint8(48 + (n - q * ten))
        n = q


@nb.njit(cache=True)
def _head(out: np.ndarray, at: int, length: int, powers: np.ndarray) -> int:
    """A bulk string's `$<length>\\r\\n` at out[at:]; the position after it."""
    width = _digits(np.uint64(length), powers)
    out[at] = 36  # $
    _write_decimal(out, at + 1, np.uint64(length), width)
    out[at + 1 + width] = 13
    out[at + 2 + width] = 10
    return at + 3 + width


@nb.njit(cache=True)
def _crlf(out: np.ndarray, at: int) -> int:
    """A bulk string's closing `\\r\\n` at out[at:]; the position after it."""
    out[at] = 13
    out[at + 1] = 10
    return at + 2


@nb.njit(cache=True)
def _framed(data: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The values of `lengths` bytes laid end to end in data, each framed as
    `$<length>\\r\\n<bytes>\\r\\n`."""
    powers = _POWERS
    size = 0
    for i in range(lengths.shape[0]):
        length = int(lengths[i])
        size += 5 + _digits(np.uint64(length), powers) + length
    out = np.empty(size, np.uint8)
    at = 0
    start = 0
    for i in range(lengths.shape[0]):
        length = int(lengths[i])
        at = _head(out, at, length, powers)
        out[at : at + length] = data[start : start + length]
        at = _crlf(out, at + length)
        start += length
    return out


@nb.njit(cache=True)
def _framed_ints(values: np.ndarray) -> np.ndarray:
    """Each value's decimal (a leading '-' when negative) framed as a RESP bulk string."""
    powers = _POWERS
    size = 0
    for i in range(values.shape[0]):
        v = values[i]
        magnitude = np.uint64(-v) if v < 0 else np.uint64(v)
        length = _digits(magnitude, powers) + (1 if v < 0 else 0)
        size += 5 + _digits(np.uint64(length), powers) + length
    out = np.empty(size, np.uint8)
    at = 0
    for i in range(values.shape[0]):
        v = values[i]
        magnitude = np.uint64(-v) if v < 0 else np.uint64(v)
        width = _digits(magnitude, powers)
        at = _head(out, at, width + (1 if v < 0 else 0), powers)
        if v < 0:
            out[at] = 45  # -
            at += 1
        _write_decimal(out, at, magnitude, width)
        at = _crlf(out, at + width)
    return out
