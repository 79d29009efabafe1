"""A batch of one producer's layout parsed column by column: each event field's values joined
into one buffer and checked, split and converted by kernels, instead of an entry at a time in
Python (about 6 µs an entry on a slow machine, most of the worker's parse).

It gives what the entry-at-a-time parse (worker/common/events.py, `parse_flat_entry`'s fast
path) gives for a batch in which every entry has the same field names, in the layout
`publish()` sends (user_id, type[, ts][, event_id][, producer], then fields that are none of
these), and every entry is valid: each value obviously valid, its time within the timestamp
rule, its user in the partition read. For any other batch it gives None, and the batch is
parsed entry by entry, which decides every dead letter and its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

import numba as nb
import numpy as np

from worker.common.dedup import MAX_TIME, Producer
from worker.common.events import (
    MAX_EVENT_ID_BYTES,
    MAX_PRODUCER_ID_BYTES,
    MAX_TS_MS,
    MAX_TYPE_BYTES,
    MAX_USER_ID_BYTES,
    MIN_TS_MS,
)

_SEP = b"\0"
_NAMES = itemgetter(slice(None, None, 2))
_OPTIONAL = (b"ts", b"event_id", b"producer")  # after user_id and type, in this order
_EVENT_FIELDS = frozenset((b"user_id", b"type", *_OPTIONAL))
_TS_DIGITS = 15  # as the entry-at-a-time parse: more digits are not a plain ts
_ID_DIGITS = 18  # an entry id's part below 10^18 fits int64; Redis's others go entry by entry


@dataclass
class Columns:
    """A batch's valid events, every entry one, in stream order."""

    users: list[str]
    types: list[str]
    ts: list[int]
    entry_keys: list[tuple[int, int]]  # each entry id as (ms, seq)
    seconds: np.ndarray  # each entry id's time in whole seconds, within dedup.MAX_TIME
    event_ids: list[bytes | None]
    producers: list[Producer | None]


def same_names(flats: list[list]) -> bool:
    """Whether every entry's fields have the first entry's names, in its order, and a value
    each (one list comparison per entry, no hashing)."""
    if not flats:
        return False
    sizes = list(map(len, flats))
    if sizes[0] % 2 or sizes.count(sizes[0]) != len(sizes):
        return False
    orders = list(map(_NAMES, flats))
    return orders.count(orders[0]) == len(orders)


def parsed_columns(
    ids: list[bytes], flats: list[list], partition: int, partitions: int, max_skew_ms: int
) -> Columns | None:
    """The events of entries (`ids`, their field lists `flats`, all of one order: see
    `same_names`) when every one is a valid event of `partition` of `partitions`; else None."""
    at = _layout(flats[0][::2])
    if at is None:
        return None
    ms, seq = _entry_ids(ids)
    users = _texts(flats, at["user_id"], MAX_USER_ID_BYTES)
    types = _texts(flats, at["type"], MAX_TYPE_BYTES)
    if ms is None or users is None or types is None:
        return None
    if "ts" in at:
        ts = _timestamps(flats, at["ts"])
        if ts is None or not _in_time(ts, ms, max_skew_ms):
            return None
    elif (ms > MAX_TS_MS).any():
        return None
    else:
        ts = ms
    event_ids = _event_ids(flats, at["event_id"]) if "event_id" in at else [None] * len(flats)
    producers = _producers(flats, at["producer"]) if "producer" in at else [None] * len(flats)
    if event_ids is None or producers is None:
        return None
    if partitions > 1 and (_partitions(*users[1], partitions) != partition).any():
        return None
    entry_keys = list(zip(ms.tolist(), seq.tolist(), strict=True))
    seconds = np.minimum(ms // 1000, MAX_TIME)
    return Columns(users[0], types[0], ts.tolist(), entry_keys, seconds, event_ids, producers)


def _layout(names: list[bytes]) -> dict[str, int] | None:
    """The index of each event field's value in the fields named `names`, when they are in
    `publish()`'s layout; else None."""
    if len(names) < 2 or names[0] != b"user_id" or names[1] != b"type":
        return None
    at, k = {"user_id": 1, "type": 3}, 2
    for name in _OPTIONAL:
        if k < len(names) and names[k] == name:
            at[name.decode()] = 2 * k + 1
            k += 1
    return at if _EVENT_FIELDS.isdisjoint(names[k:]) else None


def nul_spans(buf: bytes, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where each of the `count` values joined by NUL in `buf` starts and ends (one numpy
    pass, no Python per value); None when one of them held a NUL (the NULs' count tells)."""
    cut = np.flatnonzero(np.frombuffer(buf, np.uint8) == 0)
    if len(cut) != count - 1:
        return None
    return np.concatenate(([0], cut + 1)), np.concatenate((cut, [len(buf)]))


def _joined(flats: list[list], at: int) -> tuple[bytes, np.ndarray, np.ndarray] | None:
    """The entries' values at index `at`, joined by NUL, with each one's start and end in the
    buffer; None when one holds a NUL (no event field's valid value does)."""
    # a list comprehension, not map(itemgetter): about 1.7x faster on CPython 3.11
    buf = _SEP.join([f[at] for f in flats])
    spans = nul_spans(buf, len(flats))
    return None if spans is None else (buf, *spans)


def _texts(
    flats: list[list], at: int, max_bytes: int
) -> tuple[list[str], tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """The values at `at` decoded (UTF-8), each 1..max_bytes bytes, and the buffer they were
    joined in (as bytes, starts, ends); None when one is not so."""
    joined = _joined(flats, at)
    if joined is None:
        return None
    buf, starts, ends = joined
    size = ends - starts
    if size.min() < 1 or size.max() > max_bytes:
        return None
    try:
        texts = buf.decode("utf-8").split("\0")
    except UnicodeDecodeError:
        return None
    return texts, (np.frombuffer(buf, np.uint8), starts, ends)


def _timestamps(flats: list[list], at: int) -> np.ndarray | None:
    """The values at `at` as epoch ms, each 1..15 ASCII digits and at most MAX_TS_MS; else
    None."""
    joined = _joined(flats, at)
    if joined is None:
        return None
    buf, starts, ends = joined
    values, ok = _decimals(np.frombuffer(buf, np.uint8), starts, ends, _TS_DIGITS)
    return values if ok and values.max() <= MAX_TS_MS else None


def _in_time(ts: np.ndarray, ms: np.ndarray, max_skew_ms: int) -> bool:
    """Whether every event time keeps the timestamp rule (`ts_problem` finds no problem)."""
    given = ts != ms
    return not (given & ((ts < MIN_TS_MS) | (ts - ms > max_skew_ms))).any()


def _event_ids(flats: list[list], at: int) -> list[bytes] | None:
    """The values at `at`, each 1..MAX_EVENT_ID_BYTES printable ASCII bytes; else None."""
    joined = _joined(flats, at)
    if joined is None:
        return None
    buf, starts, ends = joined
    if not _printable(np.frombuffer(buf, np.uint8), starts, ends, MAX_EVENT_ID_BYTES):
        return None
    return [f[at] for f in flats]


def _producers(flats: list[list], at: int) -> list[Producer | None] | None:
    """The values at `at` as producer stamps (`producer_stamp`'s), every one valid; else
    None. Their form checked and their sequences read by one kernel call: a regular
    expression and an int() per event cost about 0.6 µs each, a twentieth of the worker's
    time an event."""
    values = [f[at] for f in flats]
    buf = _SEP.join(values)
    spans = nul_spans(buf, len(values))
    if spans is None:
        return None
    id_ends, seqs, ok = _stamps(np.frombuffer(buf, np.uint8), *spans, MAX_PRODUCER_ID_BYTES)
    if not ok:
        return None
    ids = list(map(bytes.__getitem__, values, map(slice, (id_ends - spans[0]).tolist())))
    return list(zip(ids, seqs.tolist(), strict=True))


def _entry_ids(ids: Sequence[bytes]) -> tuple[np.ndarray | None, np.ndarray]:
    """(ms, seq) int64 of each entry id `<ms>-<seq>` (or `<ms>`), each part at most 18
    digits; (None, _) when one is otherwise."""
    buf = _SEP.join(ids)
    spans = nul_spans(buf, len(ids))
    if spans is None:
        return None, np.zeros(0, np.int64)
    starts, ends = spans
    ms, seq, ok = _ids(np.frombuffer(buf, np.uint8), starts, ends, _ID_DIGITS)
    return (ms, seq) if ok else (None, seq)


def _partitions(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """Each user's partition (worker/common/keys.py, `partition_of`) from its UTF-8 bytes."""
    return _crc32(buf, starts, ends, _CRC_TABLE) % n


@nb.njit(cache=True)
def _decimals(buf, starts, ends, max_digits):
    """Each piece buf[starts[i]:ends[i]] as an integer of 1..max_digits ASCII digits, and
    whether all are."""
    n = starts.shape[0]
    out = np.zeros(n, np.int64)
    for i in range(n):
        a, b = starts[i], ends[i]
        if b - a < 1 or b - a > max_digits:
            return out, False
        v = 0
        for j in range(a, b):
            d = buf[j] - 48
            if d < 0 or d > 9:
                return out, False
            v = v * 10 + d
        out[i] = v
    return out, True


@nb.njit(cache=True)
def _ids(buf, starts, ends, max_digits):
    """(ms, seq, ok) of each piece `<ms>-<seq>` or `<ms>` (seq 0), each part 1..max_digits
    ASCII digits."""
    n = starts.shape[0]
    ms = np.zeros(n, np.int64)
    seq = np.zeros(n, np.int64)
    for i in range(n):
        part, v, digits = 0, 0, 0
        for j in range(starts[i], ends[i]):
            c = buf[j]
            if c == 45 and part == 0 and digits > 0:  # '-'
                ms[i], part, v, digits = v, 1, 0, 0
                continue
            d = c - 48
            if d < 0 or d > 9 or digits == max_digits:
                return ms, seq, False
            v, digits = v * 10 + d, digits + 1
        if digits == 0:
            return ms, seq, False
        if part == 0:
            ms[i] = v
        else:
            seq[i] = v
    return ms, seq, True


@nb.njit(cache=True)
def _stamps(buf, starts, ends, max_id_bytes):
    """Each piece `<id>:<sequence>` (events.py's `_PRODUCER`: an id of 1..max_id_bytes
    printable ASCII bytes but colon and space, a sequence of 1..18 ASCII digits): where its
    id ends, its sequence, and whether all are so."""
    n = starts.shape[0]
    id_ends = np.zeros(n, np.int64)
    seqs = np.zeros(n, np.int64)
    for i in range(n):
        a, b = starts[i], ends[i]
        colon = a
        while colon < b and buf[colon] != 58:  # ':'
            c = buf[colon]
            if c < 0x21 or c > 0x7E:
                return id_ends, seqs, False
            colon += 1
        if colon == a or colon - a > max_id_bytes or b - colon - 1 < 1 or b - colon - 1 > 18:
            return id_ends, seqs, False
        v = 0
        for j in range(colon + 1, b):
            d = buf[j] - 48
            if d < 0 or d > 9:
                return id_ends, seqs, False
            v = v * 10 + d
        id_ends[i], seqs[i] = colon, v
    return id_ends, seqs, True


@nb.njit(cache=True)
def _printable(buf, starts, ends, max_bytes):
    """Whether every piece is 1..max_bytes bytes of printable ASCII without space."""
    for i in range(starts.shape[0]):
        if ends[i] - starts[i] < 1 or ends[i] - starts[i] > max_bytes:
            return False
        for j in range(starts[i], ends[i]):
            if buf[j] < 0x21 or buf[j] > 0x7E:
                return False
    return True


def _crc_table() -> np.ndarray:
    """The table of zlib's CRC-32 (reflected polynomial 0xEDB88320)."""
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC_TABLE = _crc_table()


@nb.njit(cache=True)
def _crc32(buf, starts, ends, table):
    """zlib.crc32 of each piece, as int64."""
    out = np.zeros(starts.shape[0], np.int64)
    for i in range(starts.shape[0]):
        c = np.uint32(0xFFFFFFFF)
        for j in range(starts[i], ends[i]):
            c = table[(c ^ buf[j]) & 0xFF] ^ (c >> np.uint32(8))
        out[i] = np.int64(c ^ np.uint32(0xFFFFFFFF))
    return out


def warm_up() -> None:
    """Compile (or load from cache) the kernels now, not on the first batch."""
    flats = [[b"user_id", b"u", b"type", b"view", b"ts", b"1700000000000", b"event_id", b"e",
              b"producer", b"p:1"]]  # fmt: skip
    parsed_columns([b"1700000000000-0"], flats, 0, 2, 600_000)
