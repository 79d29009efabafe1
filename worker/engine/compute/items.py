"""A user's item memories in the state field `items`: for each item input a model declares,
the session's last items (model/item_memory.py, ItemMemory), committed with the state so the
"same item as before" and "seen in this session" flags survive batches, restarts and
workers (docs/contract.md, User state and scores out).

Layout: for each item input, one byte of its name's length, the name (UTF-8), one byte of
the memory's length and the memory as model/item_memory.py packs it (at most 65 bytes). Memories
are keyed by input name, not by model: an item's hash does not depend on the model's bucket
count, so a new model with the same item input reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba as nb
import numpy as np

from model.item_memory import ITEM_MEMORY, ItemMemory


def memories_of(names: Sequence[str], raw: list[bytes]) -> dict[str, ItemMemory]:
    """Each item input's memories of the users (one row per user), from their `items`
    fields, parsed in one kernel call per input; a field that is malformed, or lacks an
    input, reads as an empty memory."""
    if not names:
        return {}
    buf = np.frombuffer(b"".join(raw), np.uint8)
    try:  # lengths as bytes when all are under 256 (the cheapest to build), else int64
        ends = np.frombuffer(bytes(map(len, raw)), np.uint8).cumsum(dtype=np.int64)
    except ValueError:
        ends = np.fromiter(map(len, raw), np.int64, len(raw)).cumsum()
    return {name: ItemMemory(*_unpack(buf, ends, np.frombuffer(name.encode(), np.uint8),
                                      ITEM_MEMORY)) for name in names}  # fmt: skip


@nb.njit(cache=True)
def _unpack(buf, ends, name, K):
    """The memories (keys (U, K) int64, count (U,)) of input `name` (UTF-8 bytes) in the
    users' fields, buf[ends[u-1]:ends[u]] each. A field whose layout breaks, or whose memory
    has a wrong length, more than K items or a repeated one, reads as empty (the last entry
    of a name repeated counts)."""
    U = ends.shape[0]
    keys = np.zeros((U, K), np.int64)
    count = np.zeros(U, np.int64)
    start = 0
    for u in range(U):
        end = ends[u]
        pos, at, size, ok = start, -1, 0, True
        while pos < end:
            n = buf[pos]
            if pos + 1 + n >= end:  # no room for the memory's length byte
                ok = False
                break
            same = n == name.shape[0]
            for j in range(n if same else 0):
                if buf[pos + 1 + j] != name[j]:
                    same = False
                    break
            pos += 1 + n
            m = buf[pos]
            if pos + 1 + m > end:
                ok = False
                break
            if same:
                at, size = pos + 1, m
            pos += 1 + m
        start = end
        if not ok or at < 0 or size < 1:
            continue
        c = buf[at]
        if c > K or size != 1 + 4 * c:
            continue
        for j in range(c):
            a = at + 1 + 4 * j
            key = np.int64(buf[a]) | (np.int64(buf[a + 1]) << 8)
            keys[u, j] = key | (np.int64(buf[a + 2]) << 16) | (np.int64(buf[a + 3]) << 24)
        unique = True
        for i in range(c):
            for j in range(i):
                if keys[u, i] == keys[u, j]:
                    unique = False
        if unique:
            count[u] = c
        else:
            keys[u, :] = 0
    return keys, count


def packed_items(memory: dict[str, ItemMemory], rows: np.ndarray) -> list[bytes]:
    """The `items` field of each of `rows`: every item input's memory, in name order, all
    packed in one kernel call (`_packed_memories` per input is the definition)."""
    names = sorted(memory)
    raw = [name.encode() for name in names]
    if not len(rows) or max(map(len, raw), default=256) > 255:  # none, or a name too long
        columns = [_packed_memories(name, memory[name], rows) for name in names]
        return [b"".join(parts) for parts in zip(*columns, strict=True)]
    if len(names) == 1:  # the common case: views, no copy (the kernel picks the rows)
        keys, counts = memory[names[0]].keys[None], memory[names[0]].count[None]
    else:
        keys = np.stack([memory[name].keys for name in names])
        counts = np.stack([memory[name].count for name in names])
    name_ends = np.cumsum([len(r) for r in raw], dtype=np.int64)
    data, ends = _pack(np.frombuffer(b"".join(raw), np.uint8), name_ends, keys, counts,
                       np.ascontiguousarray(rows, np.int64), ITEM_MEMORY)  # fmt: skip
    out, bounds = data.tobytes(), ends.tolist()
    return [out[a:b] for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]


def _packed_memories(name: str, memory: ItemMemory, rows: np.ndarray) -> list[bytes]:
    """One input's part of each row's field: its name, the memory's length, the memory (a
    count byte and as many uint32 hashes, model/item_memory.py's pack_items)."""
    raw = name.encode()
    heads = [bytes([len(raw)]) + raw + bytes([1 + 4 * c, c]) for c in range(ITEM_MEMORY + 1)]
    counts = np.clip(memory.count[rows], 0, ITEM_MEMORY).tolist()
    keys = memory.keys[rows].astype("<u4").tobytes()
    width = 4 * memory.keys.shape[1]
    return [heads[c] + keys[i * width : i * width + 4 * c] for i, c in enumerate(counts)]


@nb.njit(cache=True)
def _pack(names, name_ends, keys, counts, rows, K):
    """Each of `rows`' field, concatenated, and their ends: for each input i (names[name_ends],
    keys (n, U, K), counts (n, U) clipped to 0..K), as `_packed_memories` writes its part."""
    n, R = counts.shape[0], rows.shape[0]
    out = np.empty(R * (name_ends[n - 1] + n * (3 + 4 * K)), np.uint8)
    ends = np.empty(R, np.int64)
    pos = 0
    for q in range(R):
        r = rows[q]
        for i in range(n):
            a = name_ends[i - 1] if i else 0
            out[pos] = name_ends[i] - a
            pos += 1
            for j in range(a, name_ends[i]):
                out[pos] = names[j]
                pos += 1
            c = min(max(counts[i, r], 0), K)
            out[pos] = 1 + 4 * c
            out[pos + 1] = c
            pos += 2
            for j in range(c):
                key = keys[i, r, j]
                for b in range(4):
                    out[pos] = (key >> (8 * b)) & 0xFF
                    pos += 1
        ends[q] = pos
    return out[:pos], ends


def warm_up() -> None:
    """Compile (or load from cache) the kernels now, not on a rich model's first batch."""
    packed_items(memories_of(["warm"], [b"\x04warm\x05\x01\x01\x00\x00\x00"]), np.zeros(1, int))
