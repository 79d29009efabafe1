"""Partition ownership: leases, fair share, take-over and release.

A partition has one worker at a time, which keeps each user's events in order. A worker
holds a partition while its lease (`{prefix}:lease:{p}`, value: the consumer name plus a
per-process token) lives; it renews its leases every lease/3. Live workers announce
themselves in a sorted set scored by when the announcement expires; each takes free
partitions up to its fair share, ceil(partitions / live workers), and hands back any beyond
it when another worker joins. A dead worker's partitions fall free after one lease.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from worker.keys import Keys

# Renew the leases this process holds and take free ones, at most ARGV[3] new.
# KEYS: lease keys. ARGV: holder token, ttl ms, how many free leases it may take.
# Returns 1 per key the holder now holds, else 0.
ACQUIRE_SCRIPT = """
local holder, ttl_ms, may_take = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out, taken = {}, 0
for i = 1, #KEYS do
  local owner = redis.pcall('GET', KEYS[i])
  if owner == holder or (owner == false and taken < may_take) then
    if owner == false then taken = taken + 1 end
    redis.call('SET', KEYS[i], holder, 'PX', ttl_ms)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# Release leases this holder holds. KEYS: lease keys. ARGV: holder token.
RELEASE_SCRIPT = """
local n = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
"""


@dataclass
class LeaseChanges:
    """What one renewal changed: partitions gained, lost (expired or taken) and handed
    over to make room for other workers."""

    gained: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    handed_over: list[int] = field(default_factory=list)


class Ownership:
    """The partition leases of one worker process."""

    def __init__(
        self, client: redis.Redis, keys: Keys, holder: str, partitions: int, lease_ms: int
    ) -> None:
        self.r = client
        self.keys = keys
        self.holder = holder
        self.partitions = partitions
        self.lease_ms = lease_ms
        self.owned: set[int] = set()
        self._acquire = client.register_script(ACQUIRE_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)
        self._last_renewal = float("-inf")

    def due(self, now: float) -> bool:
        """Time to renew: every third of a lease."""
        return now - self._last_renewal > self.lease_ms / 3000

    def fair_share(self) -> int:
        """Partitions per live worker, rounded up (announcing this worker as live)."""
        now_ms = int(time.time() * 1000)
        pipe = self.r.pipeline(transaction=True)
        pipe.zadd(self.keys.workers, {self.holder: now_ms + self.lease_ms})
        pipe.zremrangebyscore(self.keys.workers, "-inf", now_ms)
        pipe.zcard(self.keys.workers)
        live = max(1, int(pipe.execute()[-1]))
        return -(-self.partitions // live)

    def renew(self) -> LeaseChanges:
        """Renew held leases, take free ones up to the fair share, hand back any beyond."""
        fair = self.fair_share()
        got = self._acquire(
            keys=[self.keys.lease(p) for p in range(self.partitions)],
            args=[self.holder, self.lease_ms, max(0, fair - len(self.owned))],
        )
        self._last_renewal = time.monotonic()
        held = {p for p, g in enumerate(got) if g}
        changes = LeaseChanges(gained=sorted(held - self.owned), lost=sorted(self.owned - held))
        extra = sorted(held)[fair:]
        if extra:
            # Entries read but not committed stay pending; the next holder claims them and
            # applies them first.
            self._release(keys=[self.keys.lease(p) for p in extra], args=[self.holder])
            changes.handed_over = extra
            held -= set(extra)
            changes.gained = [p for p in changes.gained if p in held]
        self.owned = held
        return changes

    def forget(self, p: int) -> None:
        """This process no longer holds p (a commit found the lease gone)."""
        self.owned.discard(p)
        self._last_renewal = float("-inf")  # renew soon: maybe it is free again

    def release_all(self) -> None:
        """Give every lease back and leave the set of live workers (at shutdown)."""
        if self.owned:
            self._release(keys=[self.keys.lease(p) for p in sorted(self.owned)], args=[self.holder])
        self.r.zrem(self.keys.workers, self.holder)
        self.owned = set()
