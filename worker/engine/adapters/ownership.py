"""Partition ownership: leases, fair share, take-over and release.

A partition has one worker at a time, which keeps each user's events in order. A worker
holds a partition while its lease (`{prefix}:lease:{p}`, value: the consumer name plus a
per-process token) lives; it renews its leases every lease/3. Live workers announce
themselves in a sorted set scored by when the announcement expires; each takes free
partitions up to its fair share, ceil(partitions / live workers), and hands back any beyond
it when another worker joins. A dead worker's partitions fall free after one lease.

Each lease is its own key in its partition's slot, renewed, taken and released one key per
command, so the same code runs on one Redis and on a Redis Cluster. The held leases renew in
one pipeline per node (adapters/nodes.py), and the leases handed back are released so: a
renewal costs a round trip per node, not per partition. A lease its node did not run the
script on (a redirect, an unloaded script, a lost connection) is sent again through the
client, which follows the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from redis.commands.core import Script

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.engine.adapters.nodes import PartitionNodes

# Renew a lease this holder holds. KEYS: the lease. ARGV: holder token, ttl ms. 1 if held.
RENEW_SCRIPT = """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

# Release a lease this holder holds. KEYS: the lease. ARGV: holder token. 1 if released.
RELEASE_SCRIPT = """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
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
        self, client: Client, keys: Keys, holder: str, partitions: int, lease_ms: int,
        nodes: PartitionNodes | None = None,
    ) -> None:  # fmt: skip
        self.r = client
        self.nodes = nodes or PartitionNodes(client, keys)
        self.keys = keys
        self.holder = holder
        self.partitions = partitions
        self.lease_ms = lease_ms
        self.owned: set[int] = set()
        self._renew = client.register_script(RENEW_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)
        self._last_renewal = float("-inf")

    def due(self, now: float) -> bool:
        """Time to renew: every third of a lease."""
        return now - self._last_renewal > self.lease_ms / 3000

    def lapsing(self, now: float) -> bool:
        """Half a lease or more since the last renewal (a pause, a stalled round): the
        leases may have lapsed, and another worker may hold them by now."""
        return now - self._last_renewal >= self.lease_ms / 2000

    def fair_share(self) -> int:
        """Partitions per live worker, rounded up (announcing this worker as live)."""
        now_ms = int(time.time() * 1000)
        pipe = self.r.pipeline(transaction=True)
        pipe.zadd(self.keys.workers, {self.holder: now_ms + self.lease_ms})
        pipe.zremrangebyscore(self.keys.workers, "-inf", now_ms)
        pipe.zcard(self.keys.workers)
        live = max(1, int(pipe.execute()[-1]))
        return -(-self.partitions // live)

    def renew(self, before_taking: Callable[[], None] | None = None) -> LeaseChanges:
        """Renew held leases, take free ones up to the fair share, hand back any beyond.
        `before_taking` runs once this worker is announced, before any lease is taken: it
        may raise to stop (so a process that announces itself after a check cannot slip
        past it)."""
        fair = self.fair_share()
        if before_taking is not None:
            before_taking()
        held = self._renewed(sorted(self.owned))
        for p in range(self.partitions):
            if len(held) >= fair:
                break
            if p not in held and self.r.set(
                self.keys.lease(p), self.holder, nx=True, px=self.lease_ms
            ):
                held.add(p)
        self._last_renewal = time.monotonic()
        changes = LeaseChanges(gained=sorted(held - self.owned), lost=sorted(self.owned - held))
        extra = sorted(held)[fair:]
        if extra:
            # Entries read but not committed are read again by the next holder, which
            # resumes after the partition's last commit.
            self._release_keys(extra)
            changes.handed_over = extra
            held -= set(extra)
            changes.gained = [p for p in changes.gained if p in held]
        self.owned = held
        return changes

    def _renewed(self, parts: list[int]) -> set[int]:
        """The partitions of `parts` whose lease this holder still held, now renewed."""
        replies = self._on_each_lease(self._renew, parts, self.holder, self.lease_ms)
        return {p for p, reply in replies.items() if reply == 1}

    def _on_each_lease(self, script: Script, parts: list[int], *args: object) -> dict[int, object]:
        """`script`'s reply for each partition's lease (KEYS[1]; ARGV `args`): one pipeline per
        node, then through the client, which follows the cluster and loads the script, for
        each lease a node did not run it on. Both scripts are safe to run twice."""
        replies: dict[int, object] = {}
        for on_node in self.nodes.grouped(parts).values():
            for p, reply in zip(on_node, self._sent_to(script, on_node, args), strict=True):
                if isinstance(reply, Exception):
                    reply = script(keys=[self.keys.lease(p)], args=list(args))
                replies[p] = reply
        return replies

    def _sent_to(self, script: Script, parts: list[int], args: tuple) -> list:
        """`script` run on each lease of `parts`, all held by one node, in one pipeline
        (EVALSHA: the ACL's worker user may not EVAL): its replies, an exception where it did
        not run."""
        try:
            client = self.nodes.client(parts[0])
            replies = self._pipelined(client, script, parts, args)
            if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
                client.script_load(script.script)  # this node's first: load it, send again
                replies = self._pipelined(client, script, parts, args)
            return replies
        except (redis.ConnectionError, redis.TimeoutError) as e:
            return [e] * len(parts)

    def _pipelined(self, client: redis.Redis, script: Script, parts: list[int], args: tuple):
        pipe = client.pipeline(transaction=False)
        for p in parts:
            pipe.evalsha(script.sha, 1, self.keys.lease(p), *args)
        return pipe.execute(raise_on_error=False)

    def forget(self, p: int) -> None:
        """This process no longer holds p (a commit found the lease gone)."""
        self.owned.discard(p)
        self._last_renewal = float("-inf")  # renew soon: maybe it is free again

    def release_all(self) -> None:
        """Give every lease back and leave the set of live workers (at shutdown)."""
        self._release_keys(sorted(self.owned))
        self.r.zrem(self.keys.workers, self.holder)
        self.owned = set()

    def _release_keys(self, partitions: list[int]) -> None:
        self._on_each_lease(self._release, partitions, self.holder)
