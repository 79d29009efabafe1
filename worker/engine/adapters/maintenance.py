"""Housekeeping at the worker's maintenance tick: lag and pending gauges (pending: delivered,
not yet committed), Redis memory gauges, trimming of the input history, and forgetting
long-idle consumers.

Input streams are never trimmed past an entry the workers have not committed (after the
partition's position, `acked`), nor one another group has not acknowledged (docs/contract.md,
User state and scores out); the history kept for training is bounded by a retention time
(MINID) and a length cap, whichever trims more.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import deque

import redis

from worker.common.entry_ids import entry_id
from worker.common.keys import Keys
from worker.common.settings import Settings
from worker.engine.adapters.lag import REPAIR_SCRIPT, count_between, uncommitted, undelivered
from worker.engine.adapters.losses import Losses
from worker.engine.adapters.metrics import WorkerMetrics
from worker.producers.append_function import install as install_function

log = logging.getLogger("intentstream.worker")

STALE_CONSUMER_MS = 24 * 3600 * 1000  # a day: restarts leave host-pid consumers behind


def _field(info: dict, name: str):
    """A field of an XINFO reply, whose keys are str or bytes depending on redis-py's parser."""
    return info.get(name, info.get(name.encode()))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Positions:
    """Where entries sit in a stream by count: (entries-read, last-delivered id) samples of
    the group, one per tick. The length cap needs the id of the entry N from the end; Redis
    gives no such lookup short of reading the entries, so the cap trims to the newest
    sample at or before it (keeping at most one tick's entries more than the cap)."""

    def __init__(self, max_samples: int = 10_000) -> None:
        self.samples: deque[tuple[int, tuple[int, int]]] = deque(maxlen=max_samples)

    def add(self, entries_read: int, last_delivered: tuple[int, int]) -> None:
        if not self.samples or entries_read > self.samples[-1][0]:
            self.samples.append((entries_read, last_delivered))

    def id_at_or_before(self, position: int) -> tuple[int, int] | None:
        """The id of the newest sample whose position is at most `position`."""
        k = bisect.bisect_right([s[0] for s in self.samples], position)
        return self.samples[k - 1][1] if k else None


class Maintenance:
    """The maintenance tick of one worker process."""

    def __init__(
        self, client: redis.Redis, keys: Keys, settings: Settings, metrics: WorkerMetrics
    ) -> None:
        self.r = client
        self.keys = keys
        self.s = settings
        self.metrics = metrics
        self.positions: dict[int, Positions] = {}
        self._repair = client.register_script(REPAIR_SCRIPT)
        self.losses = Losses(client, keys, settings.group)
        self._function_checked = False  # on the server this round talks to
        self._may_install = True  # not refused yet (an ACL without FUNCTION LOAD)

    def ensure_function(self) -> None:
        """Install the producers' function (producers/append_function.py) once per server:
        a flushed or new one has none. Not tried again once refused."""
        if not self._function_checked:
            if self._may_install:
                self._may_install = install_function(self.r)
            self._function_checked = True

    def server_may_have_changed(self) -> None:
        """After a Redis error: a restarted server may have lost the function."""
        self._function_checked = False

    def run(self, partitions: list[int], read_to: dict[int, bytes] | None = None) -> list[int]:
        """One tick over the partitions this worker holds. `read_to`: the last entry this
        worker read of each idle partition (nothing of it queued or in flight). Returns the
        partitions whose group was moved past that entry (`XGROUP SETID ... $`, another
        reader of the group): entries were skipped, never delivered to this worker, and the
        caller seeks back to the position."""
        self._memory_gauges()
        skipped: list[int] = []
        for p in partitions:
            stream = self.keys.events(p)
            try:
                bound = self._unacked_bound(p, stream, (read_to or {}).get(p), skipped)
            except (redis.ResponseError, ValueError) as exc:  # a key of another type, a bad
                # position: the partition's seek stops it (consumer.py); nothing trimmed here
                detail = {"partition": p, "error": str(exc)}
                log.warning("maintenance skipped a partition", extra=detail)
                continue
            self._count_losses(p)
            cut = self._history_cut(p, stream, bound)
            if cut is not None:
                self.r.xtrim(stream, minid=f"{cut[0]}-{cut[1]}", approximate=True)
            self._forget_idle_consumers(stream)
        return skipped

    def _count_losses(self, p: int) -> None:
        """Count the entries of p removed before they were applied since the last look."""
        loss = self.losses.look(p)
        if loss is None:
            return
        self.metrics.events_lost.labels(str(p), loss.cause).inc(loss.count)
        log.error(
            "entries removed from the stream before they were applied: never scored",
            extra={"partition": p, "cause": loss.cause, "lost": loss.count,
                   "after": loss.after, "first_entry": loss.first,
                   "max_deleted_entry_id": loss.max_deleted},
        )  # fmt: skip

    def _memory_gauges(self) -> None:
        info = self.r.info("memory")
        self.metrics.redis_memory_used.set(int(info.get("used_memory", 0)))
        self.metrics.redis_maxmemory.set(int(info.get("maxmemory", 0)))

    def _unacked_bound(
        self, p: int, stream: str, read_to: bytes | None = None, skipped: list | None = None
    ) -> tuple[int, int] | None:
        """The oldest entry some group still needs: the workers' group every entry after the
        partition's last commit (`acked`), another group its pending or undelivered ones;
        sets the gauges. When the workers' group was delivered past `read_to` (this
        worker's last read of an idle partition), p goes into `skipped` and the lag counts
        the entries between the two besides the undelivered."""
        bound: tuple[int, int] | None = None
        for g in self.r.xinfo_groups(stream):
            name = _text(_field(g, "name"))
            pending = int(_field(g, "pending") or 0)
            last = entry_id(_text(_field(g, "last-delivered-id") or "0-0").encode())
            if name == self.s.group:
                lag = undelivered(self.r, stream, g)
                if read_to is not None and last > entry_id(read_to):
                    n = count_between(self.r, stream, read_to, last)
                    log.warning(
                        "the group was moved past entries this worker never read (XGROUP "
                        "SETID, or another reader of the group); seeking back to the position",
                        extra={"partition": p, "read_to": read_to.decode(),
                               "group_at": f"{last[0]}-{last[1]}", "skipped": n},
                    )  # fmt: skip
                    if skipped is not None:
                        skipped.append(p)
                    lag = None if lag is None or n is None else lag + n
                self.metrics.lag.labels(str(p)).set(math.nan if lag is None else lag)
                self.metrics.held_partition(p)  # its loss counters and stopped gauge, from 0
                acked = entry_id(self.r.get(self.keys.acked(p)) or b"0-0")
                self.metrics.pending.labels(str(p)).set(uncommitted(self.r, stream, acked, g))
                if lag == 0 and _field(g, "lag") not in (0, None):
                    self._repair_counter(p, stream, _field(g, "lag"))
                read = _field(g, "entries-read")
                if read is not None:
                    self.positions.setdefault(p, Positions()).add(int(read), last)
                keep_from = (acked[0], acked[1] + 1)  # committed up to acked
            else:
                keep_from = (last[0], last[1] + 1)  # delivered and acked up to last-delivered
                if pending:
                    keep_from = min(keep_from, entry_id(self.r.xpending(stream, name)["min"]))
            bound = keep_from if bound is None else min(bound, keep_from)
        return bound

    def _repair_counter(self, p: int, stream: str, said: int) -> None:
        """Nothing is undelivered but Redis counts `said` entries of lag: the group's
        entries-read is wrong (a promoted replica's stale counter). Correct it, for KEDA and
        anyone else reading XINFO GROUPS (see adapters/lag.py)."""
        if self._repair(keys=[stream], args=[self.s.group]):
            log.warning(
                "corrected the group's entries-read (Redis counted a lag with nothing undelivered)",
                extra={"partition": p, "lag_said": int(said)},
            )

    def _history_cut(
        self, p: int, stream: str, bound: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """The MINID to trim to (whichever of retention time and length cap trims more,
        never past `bound`), or None for no trim."""
        if bound is None:
            return None
        cuts = []
        if self.s.retention_seconds:
            now_ms = int(time.time() * 1000)
            cuts.append((now_ms - self.s.retention_seconds * 1000, 0))
        if self.s.retention_max_entries and p in self.positions:
            added = _field(self.r.xinfo_stream(stream), "entries-added")
            if added is not None:
                at = self.positions[p].id_at_or_before(int(added) - self.s.retention_max_entries)
                if at is not None:
                    cuts.append((at[0], at[1] + 1))
        if not cuts:
            return None
        cut = min(max(cuts), bound)
        return cut if cut[0] > 0 else None

    def _forget_idle_consumers(self, stream: str) -> None:
        """Each restart under the default name (host and pid) leaves a consumer behind in the
        group; drop those idle for a day. Their pending entries, if any (read by a version
        before reads were NOACK), mean nothing now: the position is the last commit."""
        for c in self.r.xinfo_consumers(stream, self.s.group):
            name = _text(_field(c, "name"))
            idle = int(_field(c, "idle") or 0)
            if name != self.s.consumer and idle > STALE_CONSUMER_MS:
                self.r.xgroup_delconsumer(stream, self.s.group, name)
                log.info("removed an idle consumer", extra={"consumer_removed": name})
