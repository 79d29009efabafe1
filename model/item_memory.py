"""A user's item memory: the session's last distinct item hashes, kept in the user's state so
an item input can say whether the event's item was seen before in the session
(model/inputs.py, the `item` kind)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numba as nb
import numpy as np

ITEM_MEMORY = 16  # K: distinct items remembered per user and session
ITEM_MEMORY_BYTES = 1 + 4 * ITEM_MEMORY  # the packed memory's upper bound (65)


@dataclass
class ItemMemory:
    """Per user slot, the session's last ITEM_MEMORY distinct item hashes (oldest first,
    `count` of them valid), as the item_flags kernel reads and updates them."""

    keys: np.ndarray  # (U, K) int64
    count: np.ndarray  # (U,) int64

    @classmethod
    def empty(cls, n_users: int) -> ItemMemory:
        return cls(np.zeros((n_users, ITEM_MEMORY), np.int64), np.zeros(n_users, np.int64))

    @classmethod
    def of(cls, packed: Sequence[bytes | None]) -> ItemMemory:
        """Slots 0..U-1 from their packed fields (None or malformed = empty)."""
        mem = cls.empty(len(packed))
        for u, raw in enumerate(packed):
            mem.keys[u], mem.count[u] = unpack_items(raw)
        return mem

    def pack(self, u: int) -> bytes:
        """Slot u's memory as stored in the user's state."""
        return pack_items(self.keys[u], int(self.count[u]))


_COUNT = struct.Struct("<B")


def pack_items(keys: np.ndarray, count: int) -> bytes:
    """A user's item memory as bytes: uint8 count, then count uint32 hashes (little-endian),
    oldest first: at most ITEM_MEMORY_BYTES (65)."""
    n = min(max(int(count), 0), ITEM_MEMORY)
    return _COUNT.pack(n) + np.asarray(keys[:n], "<u4").tobytes()


def unpack_items(raw: bytes | None) -> tuple[np.ndarray, int]:
    """A packed item memory as (keys (K,) int64, count); None or malformed reads as empty
    (a wrong length, a count above ITEM_MEMORY, a repeated hash)."""
    keys = np.zeros(ITEM_MEMORY, np.int64)
    if not raw:
        return keys, 0
    n = raw[0]
    if n > ITEM_MEMORY or len(raw) != 1 + 4 * n:
        return keys, 0
    vals = np.frombuffer(raw, "<u4", count=n, offset=1).astype(np.int64)
    if np.unique(vals).shape[0] != n:
        return keys, 0
    keys[:n] = vals
    return keys, int(n)


@nb.njit(cache=True)
def item_flags(slot, item_key, new_session, memory, count):
    """same_as_previous and seen_in_session (N, 2) float32 of each event of a batch, in order.

    Event e belongs to user slot[e]; item_key[e] is its item's 32-bit hash (-1 = missing);
    new_session[e] is True where a session starts (the memory is cleared first): the model's
    resets, model/features.py `session_resets`; a user's first event may be marked too, but
    need not be, as a user without state unpacks to an empty memory (marking every event
    without a previous timed one would also clear it between a new user's events without
    `ts`, which the model's own session does not split). memory (U, K) int64 holds each
    slot's session items, oldest first, count (U,) how many; both are updated in place: a
    present item moves to (or is appended at) the end, the oldest dropped when K are kept. A
    missing item gets flags 0 and changes nothing.
    """
    flags = np.zeros((slot.shape[0], 2), np.float32)
    write_item_flags(flags, slot, item_key, new_session, memory, count)
    return flags


@nb.njit(cache=True)
def write_item_flags(flags, slot, item_key, new_session, memory, count):
    """item_flags written into flags (N, 2), a zeroed block of a larger array (the flags are
    set, never cleared)."""
    K = memory.shape[1]
    for e in range(slot.shape[0]):
        s = slot[e]
        if new_session[e]:
            count[s] = 0
        key = item_key[e]
        if key < 0:
            continue
        c = count[s]
        at = -1
        for j in range(c):
            if memory[s, j] == key:
                at = j
                break
        if at >= 0:
            flags[e, 1] = 1.0
            if at == c - 1:
                flags[e, 0] = 1.0
            for j in range(at, c - 1):  # move it to the end
                memory[s, j] = memory[s, j + 1]
            memory[s, c - 1] = key
        elif c < K:
            memory[s, c] = key
            count[s] = c + 1
        else:
            for j in range(K - 1):  # drop the oldest
                memory[s, j] = memory[s, j + 1]
            memory[s, K - 1] = key
