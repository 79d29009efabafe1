"""Every written user's packed history (compute/recent.py) extended with a batch's events in
one kernel call: the same bytes as `extend_packed` / `extend_with_inputs` per user (their
definition), without a Python step per user and field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numba as nb
import numpy as np

from worker.engine.compute.recent import HASH, Field, absent, column_bytes, field_key, names_of


def extended_histories(
    old: Sequence[bytes], slot: np.ndarray, ts: np.ndarray, types: Sequence[str], keep: int,
    session_gap_ms: float, columns: Mapping[Field, np.ndarray] | None = None,
) -> list[bytes]:  # fmt: skip
    """Each history of `old` (well-formed, as `valid` passes them, or b"") followed by the
    new events of its row in `slot` (times `ts`, `types`, the stored values `columns`), as
    extend_packed (no columns) and extend_with_inputs write them, keep >= 1."""
    order = np.argsort(slot, kind="stable")  # the events grouped by user, in order
    ts_ends = np.bincount(slot, minlength=len(old)).cumsum()
    names, name_ends, codes = _name_table(types)
    fields = list((columns or {}).items())
    # each row gathered in the users' order: values[:, order] of two rows or more is
    # Fortran-ordered, a layout the warm-up (one row) never compiled
    values = np.empty((len(fields), len(ts)), "<i8")
    for i, (f, v) in enumerate(fields):
        values[i] = np.frombuffer(column_bytes(f[0], v), "<i8")[order]
    nothing, keys, key_ends = _field_table(tuple(f for f, _ in fields))
    out, out_ends = _extend(
        np.frombuffer(b"".join(old), np.uint8), _ends(old),
        np.asarray(ts, np.int64)[order], ts_ends, codes[order], names, name_ends,
        values, nothing, keys, key_ends, keep, *_gap_of(session_gap_ms),
    )  # fmt: skip
    data, ends = out.tobytes(), out_ends.tolist()
    return [data[a:b] for a, b in zip([0, *ends][: len(ends)], ends, strict=True)]


def warm_up() -> None:
    """Compile (or load from cache) the kernel now, not on the first batch (~5 s cold)."""
    one = np.zeros(1, np.int64)
    extended_histories([b""], one, one, ["view"], 1, 0.0, {(HASH, "warm"): one})
    valid_histories([b"\xff" * 10])
    holding([b"\xff" * 10], "view")


@lru_cache(maxsize=16)
def _field_table(fields: tuple[Field, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's view of the fields a history keeps: each one's absent value (as int64
    bits), their headers as stored (concatenated) and where each ends; worked out once per
    set of fields (a model's), not per batch."""
    nothing = np.array([_bits(column_bytes(f[0], absent(f[0], 1))) for f in fields], np.int64)
    keys = [field_key(*f) for f in fields]
    return nothing, np.frombuffer(b"".join(keys), np.uint8), _ends(keys)


def _ends(parts: Sequence[bytes]) -> np.ndarray:
    """Where each of `parts` ends in their concatenation."""
    return np.fromiter(map(len, parts), np.int64, len(parts)).cumsum()


def _bits(raw: bytes) -> int:
    """An 8-byte stored value as the int64 of its bits."""
    return int(np.frombuffer(raw, "<i8")[0])


def _name_table(types: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's distinct type names as stored (concatenated, their ends) and each event's
    index among them: a shop has few types, so per event only a dict look-up."""
    distinct = {t: i for i, t in enumerate(dict.fromkeys(types))}
    stored = names_of(list(distinct))
    codes = np.fromiter(map(distinct.__getitem__, types), np.int64, len(types))
    return np.frombuffer(b"".join(stored), np.uint8), _ends(stored), codes


def _gap_of(session_gap_ms: float) -> tuple[bool, np.uint64]:
    """Whether gaps cut sessions, and the floor of the gap: an integer gap d exceeds a gap g
    exactly when d > floor(g), so the kernel compares integers, as Python's ints do."""
    if not session_gap_ms > 0 or session_gap_ms >= 2.0**64:  # no int64 gap exceeds 2^64
        return False, np.uint64(0)
    return True, np.uint64(math.floor(session_gap_ms))


@nb.njit(cache=True)
def _int64_at(buf, pos):
    """The little-endian int64 at buf[pos]."""
    x = np.int64(0)
    for j in range(8):
        x |= np.int64(buf[pos + j]) << (8 * j)
    return x


@nb.njit(cache=True)
def _put_int64(out, pos, x):
    """Write x little-endian at out[pos]."""
    for j in range(8):
        out[pos + j] = (x >> (8 * j)) & 0xFF


@nb.njit(cache=True)
def _copy(out, pos, src, a, b):
    """Copy src[a:b] to out[pos:]; the position after it."""
    for j in range(b - a):  # unsigned indices: no negative-index wrap, so the loop vectorizes
        out[np.uint64(pos + j)] = src[np.uint64(a + j)]
    return pos + (b - a)


@nb.njit(cache=True)
def _bound(buf, ends, codes, name_ends, F, keys_len):
    """An upper bound of the output's size: every old and new byte, a section's header, and
    every old event's value of every field."""
    total = 0
    a = 0
    for u in range(ends.shape[0]):
        n_old = (np.int64(buf[a + 8]) | (np.int64(buf[a + 9]) << 8)) & 0x7FFF if ends[u] > a else 0
        total += ends[u] - a + 11 + keys_len + 8 * F * n_old
        a = ends[u]
    for e in range(codes.shape[0]):
        c = codes[e]
        total += 8 + 8 * F + name_ends[c] - (name_ends[c - 1] if c else 0)
    return total


@nb.njit(cache=True)
def _first_kept(buf, ts_at, n_old, ts, e0, e1, keep, use_gap, gap):
    """The index (among the old events, then the new) of the first event a history keeps
    (recent._first_kept), gaps compared as unsigned integers so none overflows."""
    total = n_old + e1 - e0
    start = total - keep if total > keep else 0
    if use_gap:
        has_last = n_old > 0
        last = _int64_at(buf, ts_at + 8 * (n_old - 1)) if has_last else np.int64(0)
        for k in range(e1 - e0):
            t = ts[e0 + k]
            cut = has_last and t > last and np.uint64(t) - np.uint64(last) > gap
            if cut and n_old + k > start:
                start = n_old + k
            last = t
            has_last = True
    return start


@nb.njit(cache=True)
def _section(buf, at, end, n_old, key_buf, key_ends, held):
    """For each new field, the offset of its column in the old input section at `at` (-1 =
    not held; of a key repeated, the last, as recent._offsets), written into `held`; and
    the offset after the section (which ends by `end`)."""
    F = key_ends.shape[0]
    keys_len = key_ends[F - 1] if F else 0
    count = buf[at]
    if count == F and at + 1 + keys_len <= end and same_bytes(buf, at + 1, key_buf, 0, keys_len):
        # the fields of the batch before, in the same order: the usual case, no search
        col = at + 1 + keys_len
        for f in range(F):
            held[f] = col + 8 * n_old * f
        return col + 8 * n_old * F
    held[:] = -1
    col = at + 1
    for _ in range(count):  # past the headers: the first column
        col += 2 + buf[col + 1]
    head = at + 1
    for _ in range(count):
        size = 2 + buf[head + 1]
        for f in range(key_ends.shape[0]):
            k0 = key_ends[f - 1] if f else 0
            if key_ends[f] - k0 == size and same_bytes(buf, head, key_buf, k0, size):
                held[f] = col
        head += size
        col += 8 * n_old
    return col


@nb.njit(cache=True)
def same_bytes(a, i, b, j, size):
    """Whether a[i:i+size] equals b[j:j+size]."""
    for k in range(size):  # noqa: SIM110 (a loop: numba compiles no generator into all())
        if a[i + k] != b[j + k]:
            return False
    return True


@nb.njit(cache=True)
def _extend(buf, ends, ts, ts_ends, codes, names, name_ends, values, nothing, key_buf,
            key_ends, keep, use_gap, gap):  # fmt: skip
    """The users' extended fields, concatenated, and their ends: user u's old field is
    buf[ends[u-1]:ends[u]], its new events ts[ts_ends[u-1]:ts_ends[u]] (names[codes], the
    input values `values` (F, E) of the fields key_buf[key_ends]), as extend_with_inputs
    writes them (no section when F is 0: extend_packed's bytes)."""
    F = key_ends.shape[0]
    keys_len = key_ends[F - 1] if F else 0
    out = np.empty(_bound(buf, ends, codes, name_ends, F, keys_len), np.uint8)
    out_ends = np.empty(ends.shape[0], np.int64)
    held = np.empty(F, np.int64)  # per user: where each field's old column starts (-1: none)
    pos = 0
    a = 0
    e0 = 0
    for u in range(ends.shape[0]):
        b, e1 = ends[u], ts_ends[u]
        prev_ts, word = np.int64(-1), 0
        if b > a:
            prev_ts, word = _int64_at(buf, a), np.int64(buf[a + 8]) | (np.int64(buf[a + 9]) << 8)
        n_old = word & 0x7FFF
        ts_at = a + 10
        names_at = ts_at + 8 * n_old if b > a else b  # no field: no names either
        held[:] = -1
        if word & 0x8000:
            names_at = _section(buf, names_at, b, n_old, key_buf, key_ends, held)
        start = _first_kept(buf, ts_at, n_old, ts, e0, e1, keep, use_gap, gap)
        cut_old, cut_new = min(start, n_old), max(start - n_old, 0)
        if start == 0:
            before = prev_ts
        elif cut_new:
            before = ts[e0 + cut_new - 1]
        else:
            before = _int64_at(buf, ts_at + 8 * (start - 1))
        n = n_old + e1 - e0 - start
        _put_int64(out, pos, before)
        count_word = n | 0x8000 if F else n
        out[pos + 8] = count_word & 0xFF
        out[pos + 9] = count_word >> 8
        pos = _copy(out, pos + 10, buf, ts_at + 8 * cut_old, ts_at + 8 * n_old)
        for e in range(e0 + cut_new, e1):
            _put_int64(out, pos, ts[e])
            pos += 8
        if F:
            out[pos] = F
            pos = _copy(out, pos + 1, key_buf, 0, keys_len)
            for f in range(F):
                if held[f] >= 0:
                    pos = _copy(out, pos, buf, held[f] + 8 * cut_old, held[f] + 8 * n_old)
                else:
                    for _ in range(n_old - cut_old):
                        _put_int64(out, pos, nothing[f])
                        pos += 8
                for e in range(e0 + cut_new, e1):
                    _put_int64(out, pos, values[f, e])
                    pos += 8
        at = names_at
        for _ in range(cut_old):  # past the names of the dropped events
            at += 1 + buf[at]
        pos = _copy(out, pos, buf, at, b)
        for e in range(e0 + cut_new, e1):
            c = codes[e]
            pos = _copy(out, pos, names, name_ends[c - 1] if c else 0, name_ends[c])
        out_ends[u] = pos
        a, e0 = b, e1
    return out[:pos], out_ends


def valid_histories(raws: Sequence[bytes | None]) -> list[bytes]:
    """`recent.valid` of each field read from Redis (b"" for one malformed or without
    events), for a batch of users in one kernel call."""
    present = [raw or b"" for raw in raws]
    if not any(present):
        return present  # type: ignore[return-value]
    ok = _well_formed(np.frombuffer(b"".join(present), np.uint8), _ends(present))
    return [raw if good else b"" for raw, good in zip(present, ok.tolist(), strict=True)]


def holding(raws: Sequence[bytes], type_: str) -> list[bool]:
    """`recent.has(raw, type_)` of each packed history, for a batch in one kernel call."""
    if not raws:
        return []
    name = np.frombuffer(names_of([type_])[0], np.uint8)
    buf = np.frombuffer(b"".join(raws), np.uint8)
    return _holding(buf, _ends(raws), name).tolist()


@nb.njit(cache=True)
def _holding(buf, ends, name):
    """Whether each field laid end to end in buf is a well-formed history holding an event
    whose length-prefixed type name is `name`."""
    out = np.zeros(ends.shape[0], np.bool_)
    a = 0
    for u in range(ends.shape[0]):
        b = ends[u]
        if _history_ok(buf, a, b):
            n = (np.int64(buf[a + 8]) | (np.int64(buf[a + 9]) << 8)) & 0x7FFF
            pos = _names_at(buf, a)
            for _ in range(n):
                size = np.int64(buf[pos]) + 1
                if size == name.shape[0] and same_bytes(buf, pos, name, 0, size):
                    out[u] = True
                    break
                pos += size
        a = b
    return out


@nb.njit(cache=True)
def _names_at(buf, a):
    """Where the type names start in the well-formed history at buf[a]."""
    word = np.int64(buf[a + 8]) | (np.int64(buf[a + 9]) << 8)
    n = word & 0x7FFF
    pos = a + 10 + 8 * n
    if word & 0x8000:
        count = np.int64(buf[pos])
        pos += 1
        for _ in range(count):
            pos += 2 + np.int64(buf[pos + 1])
        pos += 8 * n * count
    return pos


@nb.njit(cache=True)
def _utf8(buf, a, b):
    """Whether buf[a:b] is UTF-8 as Python's strict decoder takes it (no overlong forms, no
    surrogates, nothing above U+10FFFF)."""
    i = a
    while i < b:
        c = buf[i]
        if c < 0x80:
            i += 1
            continue
        lo, hi = 0x80, 0xBF
        if 0xC2 <= c <= 0xDF:
            need = 1
        elif c == 0xE0:
            need, lo = 2, 0xA0
        elif c == 0xED:
            need, hi = 2, 0x9F
        elif 0xE1 <= c <= 0xEF:
            need = 2
        elif c == 0xF0:
            need, lo = 3, 0x90
        elif c == 0xF4:
            need, hi = 3, 0x8F
        elif 0xF1 <= c <= 0xF3:
            need = 3
        else:
            return False
        if i + need >= b:
            return False
        if not lo <= buf[i + 1] <= hi:
            return False
        for k in range(2, need + 1):
            if not 0x80 <= buf[i + k] <= 0xBF:
                return False
        i += need + 1
    return True


@nb.njit(cache=True)
def _after_name(buf, at, b):
    """The position after the length-prefixed UTF-8 name whose length byte is buf[at], or
    -1 when it does not fit before b or is not UTF-8."""
    if at >= b:
        return -1
    end = at + 1 + np.int64(buf[at])
    return end if end <= b and _utf8(buf, at + 1, end) else -1


@nb.njit(cache=True)
def _history_ok(buf, a, b):
    """Whether buf[a:b] is a history `recent.unpack` reads back with at least one event."""
    if b - a < 10:
        return False
    word = np.int64(buf[a + 8]) | (np.int64(buf[a + 9]) << 8)
    n = word & 0x7FFF
    pos = a + 10 + 8 * n
    if n == 0 or pos > b:
        return False
    if word & 0x8000:  # the input section: field headers (a form, a name), then their columns
        if pos >= b:
            return False
        count = np.int64(buf[pos])
        pos += 1
        for _ in range(count):
            if pos >= b or buf[pos] > 1:  # forms NUMBER (0) and HASH (1)
                return False
            pos = _after_name(buf, pos + 1, b)
            if pos < 0:
                return False
        pos += 8 * n * count
        if pos > b:
            return False
    for _ in range(n):  # the type names
        pos = _after_name(buf, pos, b)
        if pos < 0:
            return False
    return pos == b


@nb.njit(cache=True)
def _well_formed(buf, ends):
    """_history_ok of each field laid end to end in buf."""
    ok = np.zeros(ends.shape[0], np.bool_)
    a = 0
    for u in range(ends.shape[0]):
        ok[u] = _history_ok(buf, a, ends[u])
        a = ends[u]
    return ok
