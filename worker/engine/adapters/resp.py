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
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_INT64_MIN = np.iinfo(np.int64).min
_NOTHING = np.zeros(0, np.uint8)
# Up to this many commands resp_commands packs with hiredis (about 5 µs a row of a state's
# HSET against the framers' fixed ~80; even at about 16 rows on the 2-core VM)
FEW_ROWS = 8


def resp_args(args: tuple | list) -> bytes:
    """Arguments as RESP bulk strings without the array header; hiredis packs them in C
    (redis-py's packer would first inspect each one, ~0.2 µs apiece)."""
    if not args:
        return b""
    packed = hiredis.pack_command(tuple(args))
    return packed[packed.index(b"\r\n") + 2 :]


def packed(*args: object) -> bytes:
    """A command as RESP (hiredis packs it in C)."""
    return hiredis.pack_command(args)


def command_head(n: int, *first: object) -> bytes:
    """A command of `n` arguments as RESP up to its `first` ones, the rest to follow framed
    (`bulk`): packed once for a command sent again and again with other values (a SET of
    the same key: hiredis's packing of the whole took 2.6 times as long, warm)."""
    return b"*%d\r\n" % n + resp_args(first)


def bulk(value: bytes) -> bytes:
    """A value as a RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _rows(h: np.ndarray) -> np.ndarray:
    """Each row of h (little-endian float32 bytes) as a RESP bulk string, framed by numpy:
    thousands of equal-sized blobs cost one copy."""
    rows = np.ascontiguousarray(h, "<f4").reshape(len(h), -1).view(np.uint8)
    prefix = b"$%d\r\n" % rows.shape[1]
    out = np.empty((len(h), len(prefix) + rows.shape[1] + 2), np.uint8)
    out[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
    out[:, len(prefix) : -2] = rows
    out[:, -2:] = np.frombuffer(b"\r\n", np.uint8)
    return out.reshape(-1)


def _blobs(values: Sequence[bytes]) -> np.ndarray:
    """Byte strings as RESP bulk strings (their concatenation framed by one kernel call)."""
    return _framed_joined(b"".join(values), values)


def _texts(values: Sequence[str]) -> np.ndarray:
    """Strings as RESP bulk strings of their UTF-8 bytes."""
    text = "".join(values)
    data = text.encode()
    if len(data) != len(text):  # not all ASCII: a string's length is not its bytes'
        return _blobs([v.encode() for v in values])
    return _framed_joined(data, values)


def _framed_joined(data: bytes, values: Sequence[bytes] | Sequence[str]) -> np.ndarray:
    """`values` laid end to end in `data` (as many bytes each as its len), framed. Their
    lengths go to the kernel as bytes when all are under 256 (the common case, and the
    cheapest to build), else as int64."""
    try:
        lengths = np.frombuffer(bytes(map(len, values)), np.uint8)
    except ValueError:
        lengths = np.fromiter(map(len, values), np.int64, len(values))
    return _framed(np.frombuffer(data, np.uint8), lengths)


def _ints(values: np.ndarray) -> np.ndarray:
    """Integers (int64) as RESP bulk strings of their decimals."""
    values = np.ascontiguousarray(values, np.int64)
    if values.min() == _INT64_MIN:  # no magnitude to negate
        return np.frombuffer(resp_args(values.tolist()), np.uint8)
    return _framed_ints(values)


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


_COLUMNS = (list, tuple, np.ndarray, Joined)  # the kinds of a template's columns


def resp_column(column: np.ndarray | Joined | Sequence) -> bytes:
    """A column of arguments as RESP bulk strings (see framed)."""
    return framed(column).tobytes()


def framed(column: np.ndarray | Joined | Sequence) -> np.ndarray:
    """A column of arguments as RESP bulk strings, uint8, by the cheapest framer for its
    kind: a 2-D float array's rows, a 1-D integer array's decimals, values laid end to end,
    byte strings, strings, else hiredis."""
    if not len(column):
        return _NOTHING
    if isinstance(column, Joined):
        return _framed(column.data, column.lengths)
    if isinstance(column, np.ndarray):
        if column.dtype.kind == "i":
            return _ints(column)
        if column.dtype.kind == "f":
            return _rows(column)
        return np.frombuffer(resp_args(column.tolist()), np.uint8)
    first = column[0]
    try:
        if isinstance(first, bytes):
            return _blobs(column)
        if isinstance(first, str):
            return _texts(column)
    except TypeError:  # a column mixing bytes and strings
        pass
    return np.frombuffer(resp_args(column), np.uint8)


def packed_command(args: Sequence, head: int) -> bytes:
    """A whole command as RESP: its first `head` arguments packed by hiredis, the rest (a
    column of one kind, e.g. a script's keys) by resp_column."""
    return b"*%d\r\n" % len(args) + resp_args(args[:head]) + resp_column(args[head:])


def resp_commands(template: Sequence, rows: np.ndarray | None = None) -> memoryview:
    """One command per row, each `template`'s items in order: an item that is a column (a
    list, a tuple, an array or Joined) stands for the row's value of it, any other item is a
    constant argument. `rows`: the rows to emit, in that order (default: every row). The
    commands' bytes, as a view of the kernel's output (bytes-like: no copy).

    Why: a transaction queues a command per score entry and per state, thousands a batch;
    each column is framed once by resp_column and one kernel call lays the rows out between
    the constant parts (hiredis would pack each argument apart, ~0.3 µs each). A few rows
    (at low traffic, a batch of an event or two) are packed by hiredis instead: the
    framers' fixed cost, ~60-80 µs a call on the 2-core VM, is more than theirs."""
    at = [i for i, x in enumerate(template) if isinstance(x, _COLUMNS)]
    n = len(template[at[0]]) if at else 0
    count = n if rows is None else len(rows)
    if not count:
        return memoryview(b"")
    if count <= FEW_ROWS and 0 < n <= 4 * FEW_ROWS:  # each column converted whole
        picked = range(n) if rows is None else np.asarray(rows, np.int64).tolist()
        return memoryview(_few_commands(template, at, picked))
    flags = [False] * len(template)
    for i in at:
        flags[i] = True
    columns = [template[i] for i in at]
    order = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    between: list[list] = [[]]  # the constants before each column, and after the last
    for item, column in zip(template, flags, strict=True):
        if column:
            between.append([])
        else:
            between[-1].append(item)
    segments = [resp_args(x) for x in between]
    segments[0] = b"*%d\r\n" % len(template) + segments[0]
    if not columns:  # one constant command, once per row
        return memoryview(segments[0] * len(order))
    pieces = [framed(c) for c in columns]
    data = np.concatenate(pieces)
    starts = np.empty((len(columns), n + 1), np.int64)
    base = 0
    for k, piece in enumerate(pieces):
        _element_starts(data, base, n, starts[k])
        base += len(piece)
    seg_at = np.cumsum([0, *map(len, segments)]).astype(np.int64)
    seg = np.frombuffer(b"".join(segments), np.uint8)
    return memoryview(_interleaved(data, starts, seg, seg_at, order))


def _few_commands(template: Sequence, at: list[int], rows: Sequence[int]) -> bytes:
    """resp_commands's bytes for a few rows, each command packed by hiredis from its
    arguments (as_arguments: the same bytes the framers write); `at`: where the columns
    are. No numpy on the way: at low traffic its calls' fixed cost was most of this."""
    return b"".join(_each_command(template, at, rows))


def packed_rows(template: Sequence, rows: Sequence[int] | None = None) -> list[bytes]:
    """resp_commands's commands one by one (the same bytes), each packed by hiredis: a
    group's commands to share out among its commits (adapters/group_packing.py)."""
    at = [i for i, x in enumerate(template) if isinstance(x, _COLUMNS)]
    n = len(template[at[0]]) if at else 0
    return _each_command(template, at, range(n) if rows is None else rows)


def _each_command(template: Sequence, at: list[int], rows: Sequence[int]) -> list[bytes]:
    """The command of each row, packed by hiredis (see _few_commands)."""
    args = list(template)
    columns = [(i, as_arguments(template[i])) for i in at]
    out = []
    for r in rows:
        for i, values in columns:
            args[i] = values[r]
        out.append(hiredis.pack_command(tuple(args)))
    return out


def as_arguments(column: np.ndarray | Joined | Sequence) -> list:
    """A column as plain command arguments (what resp_column frames): a float array's rows as
    little-endian float32 bytes, an integer array's values as ints."""
    if isinstance(column, Joined):
        return column.values()
    if not isinstance(column, np.ndarray):
        return list(column)
    if column.dtype.kind != "f":
        return column.tolist()
    if not len(column):
        return []
    blob = np.ascontiguousarray(column, "<f4").tobytes()
    size = len(blob) // len(column)
    return [blob[i : i + size] for i in range(0, len(blob), size)]


def warm_up() -> None:
    """Compile (or load from cache) the kernels now, not on the first commit."""
    framed([b"a"])  # lengths as bytes
    framed([b"a" * 256])  # lengths as int64
    framed(np.zeros(1, np.int64))
    framed(Joined(np.zeros(2, np.uint8), np.ones(2, np.int64)))  # a kernel's output (lean states)
    # commands laid out from columns: a few rows go through hiredis, more through the kernels
    resp_commands(["HSET", [b"k"], "f", [b"v"]])
    many = FEW_ROWS + 1
    resp_commands(["HSET", [b"k"] * many, "f", [b"v"] * many])


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
        _memcpy(out, at, data, start, length)
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


@nb.njit(cache=True)
def _element_starts(data: np.ndarray, at: int, n: int, out: np.ndarray) -> None:
    """Where each of the n bulk strings framed from data[at:] starts, and (out[n]) where the
    last ends."""
    for i in range(n):
        out[i] = at
        at += 1  # $
        length = 0
        while data[at] != 13:
            length = length * 10 + int(data[at]) - 48
            at += 1
        at += 2 + length + 2
    out[n] = at


@intrinsic
def _memcpy(typingctx, dst, dst_at, src, src_at, n):
    """n bytes of src from src_at to dst at dst_at, by LLVM's memcpy, unchecked: the caller
    sized dst. Why: most of a command's pieces are a few bytes, and a Numba slice assignment
    or byte loop costs ~10x more per piece than the copy (BENCHMARKS.md, The commit's Redis
    CPU)."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d, d_at, s, s_at, count = args
        d_arr = context.make_array(signature.args[0])(context, builder, d)
        s_arr = context.make_array(signature.args[2])(context, builder, s)
        d_ptr = builder.gep(d_arr.data, [d_at])
        s_ptr = builder.gep(s_arr.data, [s_at])
        cgutils.raw_memcpy(builder, d_ptr, s_ptr, count, 1)

    return sig, codegen


@nb.njit(cache=True)
def _interleaved(data, starts, seg, seg_at, order):
    """For each row of `order`: segment 0, column 0's value of the row, segment 1, ..., the
    last column's value, the closing segment. `starts[k]` bounds column k's values in
    data; `seg_at[j]` bounds segment j in seg."""
    C = starts.shape[0]
    size = 0
    for i in range(order.shape[0]):
        r = order[i]
        size += seg_at[C + 1]
        for k in range(C):
            size += starts[k, r + 1] - starts[k, r]
    out = np.empty(size, np.uint8)
    at = 0
    for i in range(order.shape[0]):
        r = order[i]
        for k in range(C):
            a, b = seg_at[k], seg_at[k + 1]
            _memcpy(out, at, seg, a, b - a)
            at += b - a
            a, b = starts[k, r], starts[k, r + 1]
            _memcpy(out, at, data, a, b - a)
            at += b - a
        a, b = seg_at[C], seg_at[C + 1]
        _memcpy(out, at, seg, a, b - a)
        at += b - a
    return out


def chunks(parts: list) -> list:
    """Bytes-like parts as the chunks to send: neighbours under 4 KB joined (a send each would
    be a system call each), big ones kept as they are (joining would copy them)."""
    out: list = []
    small: list = []
    for part in parts:
        if len(part) < 4096:
            small.append(part)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(part)
    if small:
        out.append(b"".join(small))
    return out
