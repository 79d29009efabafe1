"""A write-through cache of the user states this worker committed, per partition.

A partition has one writer at a time (its lease holder) and every write bumps the
partition's commit sequence. So after a commit that took the sequence to s, the states this
worker wrote are exactly what Redis holds for as long as the sequence stays s, and the next
commit checks just that. Hits skip the state read; a commit refused for a moved sequence
drops the partition's cache, and its states are read again.

Not seen by the sequence: a state key deleted or expired behind the worker's back. Expiry is
handled by treating entries older than half the state TTL as misses; to reset a user by hand,
DEL the state key and INCR the partition's `{prefix}:seq:{p}` (docs/operators.md, State cache).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

# One user's state as last committed: h (L, H) float32 (a view of the batch's state array,
# which nothing writes after its commit), last_ts ms, last_id (ms, seq), n, recent producer
# event ids, recent events (packed, compute/recent.py), last score, the shadow model's h and
# last score (None and NaN without one), commit time (monotonic; always last). Plain tuples:
# thousands are made per batch, and the garbage collector stops tracking tuples of atoms
# (see adapters/states.py: written).
CachedState = tuple[
    np.ndarray, int, tuple[int, int], int, bytes, bytes, float, np.ndarray | None, float, float
]


class StateCache:
    """LRU of committed user states, one region per partition, each tied to a sequence."""

    def __init__(self, max_users: int, ttl_seconds: float = 0.0) -> None:
        self.max_users = max_users
        self.max_age = ttl_seconds / 2 if ttl_seconds else float("inf")
        self._seq: dict[int, bytes] = {}
        self._users: dict[int, OrderedDict[str, CachedState]] = {}

    def seq(self, p: int) -> bytes | None:
        """The commit sequence the partition's cached states belong to, or None."""
        return self._seq.get(p)

    def lookup(self, p: int, users: list[str]) -> list[CachedState | None]:
        """Cached states of these users (None for a miss)."""
        region = self._users.get(p)
        if not region or self.max_users == 0:
            return [None] * len(users)
        hits = [region.get(u) for u in users]
        if self.max_age != float("inf"):
            oldest = time.monotonic() - self.max_age
            hits = [h if h is not None and h[-1] > oldest else None for h in hits]
        # no move to the end here: `store` moves the users a commit writes, and only those
        # stay in use (a user read but not written had only repeated events)
        return hits

    def store(self, p: int, seq: bytes, entries: dict[str, CachedState]) -> None:
        """Record the states committed at sequence `seq` (the cache moves to it)."""
        if self.max_users == 0:
            return
        region = self._users.setdefault(p, OrderedDict())
        self._seq[p] = seq
        region.update(entries)
        for u in entries:
            region.move_to_end(u)
        total = sum(len(r) for r in self._users.values())
        while total > self.max_users and region:
            region.popitem(last=False)
            total -= 1

    def drop(self, p: int | None = None) -> None:
        """Forget one partition's states (or all)."""
        for q in [p] if p is not None else list(self._users):
            self._users.pop(q, None)
            self._seq.pop(q, None)
