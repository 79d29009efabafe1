"""Reading users' states (SPEC §4): from the write-through cache, else one packed Lua read,
validated into the pipeline's UserStates.

Any data may sit where a state should: a hash of another model's shape, non-finite values,
an unparseable field, or a key of another type (an operator's SET). Each is an invalid state:
that user restarts from zero, counted by reason, and nothing else is affected. Only a
partition-wide key in a bad way (the commit sequence) stops that partition's reads
(PartitionDataError), never the other partitions.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import redis

from worker.batch import entry_id
from worker.keys import Keys
from worker.pipeline import RECENT_EVENT_IDS, UserStates
from worker.state_cache import StateCache

FIELDS = ("h", "last_id", "last_ts", "model", "n", "event_ids")

# KEYS: 1 the partition's commit sequence, 2.. state keys. Returns the sequence (nil before
# the first commit), then the FIELDS of each state key (nil when absent; h = -1 when the key
# holds another type). pcall: one bad key must not fail the read of the others.
READ_STATES_SCRIPT = """
local seq = redis.pcall('GET', KEYS[1])
if type(seq) == 'table' or (seq and not string.match(seq, '^%d+$')) then
  return redis.error_reply('BADKEY ' .. KEYS[1])
end
local out = {seq}
for i = 2, #KEYS do
  local v = redis.pcall('HMGET', KEYS[i], 'h', 'last_id', 'last_ts', 'model', 'n', 'event_ids')
  if v.err then
    out[#out + 1] = -1
    for _ = 2, 6 do out[#out + 1] = false end
  else
    for j = 1, 6 do out[#out + 1] = v[j] end
  end
end
return out
"""


class PartitionDataError(Exception):
    """A partition-wide key holds data the worker cannot use; the message names it."""

    def __init__(self, partition: int, detail: str) -> None:
        super().__init__(f"partition {partition}: {detail}")
        self.partition = partition


ShapeOf = Callable[[str], "tuple[int, int] | None"]


class StateReader:
    """Reads a batch's user states for one worker process."""

    def __init__(
        self, client: redis.Redis, keys: Keys, cache: StateCache, shape_of: ShapeOf
    ) -> None:
        self.script = client.register_script(READ_STATES_SCRIPT)
        self.keys = keys
        self.cache = cache
        self.shape_of = shape_of  # state shape of the model version that wrote a state

    def read(self, p: int, users: list[str], shape: tuple[int, int]) -> UserStates:
        """The states of `users` of partition p for a model of state shape `shape`."""
        states = UserStates.empty(users, shape)
        seq = self.cache.seq(p)
        cached = self.cache.lookup(p, users) if seq is not None else [None] * len(users)
        misses = [i for i, c in enumerate(cached) if c is None]
        if misses or seq is None:
            flat = self._read(p, [users[i] for i in misses])
            if seq is not None and (flat[0] or b"") != seq:
                # another commit landed since ours: nothing cached for this partition holds
                self.cache.drop(p)
                return self.read(p, users, shape)
            seq = flat[0] or b""
            self._fill(states, misses, flat, shape)
        for i, c in enumerate(cached):
            if c is not None:
                states.h[i], states.last_ts[i], states.last_id[i], states.n[i] = c[:4]
                states.event_ids[i] = c[4]
        states.seq = seq
        return states

    def _read(self, p: int, users: list[str]) -> list:
        keys = [self.keys.commit_seq(p), *(self.keys.state(p, u) for u in users)]
        try:
            return self.script(keys=keys)
        except redis.ResponseError as exc:
            if str(exc).startswith(("BADKEY", "WRONGTYPE")):
                raise PartitionDataError(p, f"{exc}; fix or delete that key") from None
            raise

    def _fill(self, states: UserStates, rows: list[int], flat: list, shape) -> None:
        """Validate the script's reply (after the sequence) into `states`."""
        L, H = shape
        size = L * H * 4
        good, blobs = [], []
        width = len(FIELDS)
        for k, i in enumerate(rows):
            h, lid, lts, written_by, cnt, eids = flat[1 + width * k : 1 + width * (k + 1)]
            if isinstance(h, int):
                states.resets["wrong_type"] += 1
                continue
            if lid is None:
                continue  # a new user
            try:
                states.last_id[i] = entry_id(lid)
                states.n[i] = int(cnt or 0)
                states.last_ts[i] = int(lts) if lts is not None else -1
            except ValueError:
                states.last_id[i], states.n[i], states.last_ts[i] = (-1, -1), 0, -1
                states.resets["invalid"] += 1
                continue
            if eids:
                states.event_ids[i] = eids.split()[-RECENT_EVENT_IDS:]
            other = self.shape_of(written_by.decode(errors="replace")) if written_by else None
            if h is None or len(h) != size or (other is not None and other != shape):
                states.resets["shape"] += 1
                continue
            good.append(i)
            blobs.append(h)
        if good:
            loaded = np.frombuffer(b"".join(blobs), "<f4").reshape(len(good), L, H)
            finite = np.isfinite(loaded).all(axis=(1, 2))
            states.h[np.asarray(good)[finite]] = loaded[finite]
            if not finite.all():
                states.resets["invalid"] += int((~finite).sum())

    def remember(self, p: int, seq: bytes, commit) -> None:
        """Cache the states a commit wrote (at the sequence it moved the partition to)."""
        stamp = time.monotonic()
        self.cache.store(
            p,
            seq,
            {
                u: (h, lts, key, n, eids, stamp)
                for u, h, lts, key, n, eids in zip(
                    commit.users, commit.h, commit.last_ts.tolist(), commit.last_keys,
                    commit.n.tolist(), commit.event_ids, strict=True,
                )
            },
        )  # fmt: skip
