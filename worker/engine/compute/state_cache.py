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
from itertools import islice

import numpy as np

from worker.engine.compute.pipeline import Commit
from worker.engine.compute.user_states import UserStates

# One user's state as last committed: h (its L x H float32, little-endian bytes), last_ts
# ms, last_id (ms, seq), n, recent producer event ids, recent events (packed,
# compute/recent.py), last score, the shadow model's h bytes and last score (None and NaN
# without one), the rule states and the shadow's, the item memories (b"" = none), commit time
# (monotonic; always last). Plain tuples of atoms: thousands are made per batch, and the
# garbage collector stops tracking tuples of atoms (see `written`); h as bytes, not a view of
# the batch's array: a bytes slice costs less to make, keep and free than an ndarray, and a
# batch's rows come back in one join.
CachedState = tuple[
    bytes,
    int,
    tuple[int, int],
    int,
    bytes,
    bytes,
    float,
    bytes | None,
    float,
    bytes,
    bytes,
    bytes,
    float,
]


class StateCache:
    """LRU of committed user states, one region per partition, each tied to a sequence; the
    order is kept from half the bound on (`store`)."""

    def __init__(self, max_users: int, ttl_seconds: float = 0.0) -> None:
        self.max_users = max_users
        self.max_age = ttl_seconds / 2 if ttl_seconds else float("inf")
        self._seq: dict[int, bytes] = {}
        # Plain dicts in least recently stored order: a store takes its users out and puts
        # them back at the end (2.4x cheaper than OrderedDict's update and move_to_end).
        self._users: dict[int, dict[str, CachedState]] = {}

    def seq(self, p: int) -> bytes | None:
        """The commit sequence the partition's cached states belong to, or None."""
        return self._seq.get(p)

    def lookup(self, p: int, users: list[str]) -> list[CachedState | None]:
        """Cached states of these users (None for a miss)."""
        region = self._users.get(p)
        if not region or self.max_users == 0:
            return [None] * len(users)
        hits = list(map(region.get, users))
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
        region = self._users.setdefault(p, {})
        self._seq[p] = seq
        if 2 * (self._count() + len(entries)) > self.max_users:
            # From half the bound on, a store moves its users to the end, so a user stored
            # since is never evicted before one of its partition that was not. Below it they
            # are updated in place: nothing is evicted before the bound, and the moves were
            # most of a backlog's store (a 1,000-user batch 163-267 µs against 45, EPYC).
            for u in entries:
                region.pop(u, None)
        region.update(entries)
        over = self._count() - self.max_users
        if over > 0:  # the least recently stored users of this partition go
            for u in list(islice(region, min(over, len(region)))):
                del region[u]

    def _count(self) -> int:
        """The users cached, every partition's."""
        return sum(map(len, self._users.values()))

    def drop(self, p: int | None = None) -> None:
        """Forget one partition's states (or all)."""
        for q in [p] if p is not None else list(self._users):
            self._users.pop(q, None)
            self._seq.pop(q, None)


def copy_known(states: UserStates, rows: list[int], known: list[CachedState]) -> None:
    """Copy known states into their rows, a column at a time (and the shadow model's, when
    `states.shadow` is set)."""
    h, last_ts, last_id, n, event_ids, recent, score, sh_h, sh_score, rules, sh_rules, items, _ = (
        zip(*known, strict=True)
    )
    idx = np.asarray(rows)
    states.h[idx] = _stacked(h, states.h.shape[1:])
    states.last_ts[idx] = last_ts
    states.n[idx] = n
    states.score[idx] = score
    for i, lid, eids, rec, rul, it in zip(rows, last_id, event_ids, recent, rules, items,
                                          strict=True):  # fmt: skip
        states.last_id[i], states.event_ids[i], states.recent[i] = lid, eids, rec
        states.rules[i], states.items[i] = rul, it
    shadow = states.shadow
    if shadow is None:
        return
    shadow.last_ts[idx] = last_ts
    for i, rul in zip(rows, sh_rules, strict=True):
        shadow.rules[i] = rul
    size = 4 * int(np.prod(shadow.h.shape[1:]))
    have = [k for k, x in enumerate(sh_h) if x is not None and len(x) == size]
    if have:
        shadow.h[idx[have]] = _stacked([sh_h[k] for k in have], shadow.h.shape[1:])
        shadow.score[idx[have]] = [sh_score[k] for k in have]
    kept = set(have)
    # written without the shadow (it started since): rebuilt from the recent events
    shadow.replay += [i for k, i in enumerate(rows) if k not in kept and states.recent[i]]


def _stacked(rows: tuple[bytes, ...] | list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    """States' h bytes as one (len(rows), *shape) float32 array."""
    return np.frombuffer(b"".join(rows), "<f4").reshape(len(rows), *shape)


def _row_bytes(h: np.ndarray) -> list[bytes]:
    """Each row of h (one per state) as its little-endian float32 bytes."""
    blob = np.ascontiguousarray(h, "<f4").tobytes()
    size = len(blob) // len(h) if len(h) else 0
    return [blob[i : i + size] for i in range(0, len(blob), size)] if size else [b""] * len(h)


def written(commit: Commit) -> dict[str, CachedState]:
    """The states a commit writes, as the cache holds them.

    Entries hold only tuples, numbers, bytes and str, which the garbage
    collector stops tracking: a cache of lists and dataclasses made every full collection
    walk ~6 objects per cached user (measured: 31% of the worker's time, pauses of 0.2 s at
    50,000 users)."""
    stamp = time.monotonic()
    k = len(commit.users)
    if commit.shadow_h is not None and commit.shadow_user_scores is not None:
        sh_h, sh_scores = _row_bytes(commit.shadow_h), commit.shadow_user_scores.tolist()
    else:
        sh_h, sh_scores = [None] * k, [float("nan")] * k
    rules = commit.rules if commit.rules is not None else [b""] * k
    sh_rules = commit.shadow_rules if commit.shadow_rules is not None else [b""] * k
    items = commit.items if commit.items is not None else [b""] * k
    return {
        u: (h, lts, key, n, eids, recent, score, shh, shs, rul, shr, it, stamp)
        for u, h, lts, key, n, eids, recent, score, shh, shs, rul, shr, it in zip(
            commit.users, _row_bytes(commit.h), commit.last_ts.tolist(), commit.last_keys,
            commit.n.tolist(), commit.event_ids, commit.recent, commit.user_scores.tolist(),
            sh_h, sh_scores, rules, sh_rules, items, strict=True,
        )
    }  # fmt: skip
