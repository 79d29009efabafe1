"""One partition's life in this worker, in one object (quix-streams' assign_partition and
revoke_partition in one place): `assign` when its lease is taken, where its reads resume
(`seek`), the batches read and not yet processed, the batch computed ahead, whether bad
data or an impossible position stopped it (`block`, `stop`), a commit whose reply was lost
(`settle`), and `revoke` when the lease goes. The Redis side of each step is an adapter's
(`PartitionIO`).

`Partition.forget` drops all that was read, computed or cached of it, whenever what this
worker knows of the partition may no longer hold: its lease lost or handed over, newly
taken, bad data, a commit that applied nothing, a Redis outage. Nothing is lost by it: its
next read resumes after its last commit, so its entries are read again, in order.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection, Iterator
from contextlib import suppress
from dataclasses import dataclass
from itertools import count

from model.scoring import ScoringModel
from worker.engine.adapters.commit import CommitResult, Committer
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.adapters.ownership import Ownership
from worker.engine.adapters.parked import ParkedReads
from worker.engine.adapters.streams import Cursor, StreamReader
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import Commit
from worker.engine.compute.state_cache import StateCache
from worker.engine.readahead import Ahead
from worker.rules.step import RuleTable

log = logging.getLogger("intentstream.worker")


@dataclass(frozen=True)
class PartitionIO:
    """The adapters a partition's life calls: its stream and group, its parked read (on a
    cluster), its lease, the commit's last token, its gauges."""

    reader: StreamReader
    parked: ParkedReads
    ownership: Ownership
    committer: Committer
    metrics: WorkerMetrics


class Partition:
    """What this worker holds of one partition, and the one way to forget it."""

    def __init__(self, number: int, cache: StateCache, io: PartitionIO | None = None) -> None:
        self.number = number
        self.io = io
        self.stopped: set[str] = set()  # the reasons an impossible position stopped it
        self.cursor = Cursor(number)
        # (read order across partitions, batch): see Partitions
        self.queued: deque[tuple[int, Batch]] = deque()
        self.ahead: Ahead | None = None  # the batch computed while the commit before it ran
        self.blocked_until = 0.0  # monotonic time: no reads before it
        self._backoff = 0.0
        # a commit whose reply was lost, and its token: counted once Redis shows it applied
        self.unsettled: tuple[bytes, Commit] | None = None
        self._cache = cache  # shared by all partitions (one LRU), a region each

    def forget(self) -> None:
        """Drop what was read, computed ahead or cached of this partition; its next read
        resumes after its last commit. The block and an unsettled commit
        are kept: the bad data is still there, and the commit is counted whenever Redis
        shows it applied, whoever holds the partition by then."""
        self.queued.clear()
        self.ahead = None
        self.cursor.rewind()
        self._cache.drop(self.number)

    # ---- assign and revoke -----------------------------------------------------------------

    def assign(self) -> None:
        """A newly held partition: make sure the group exists and the route key says the
        count in force; its first read resumes after its last commit. What it knew of it is
        forgotten: others may have committed while we did not hold it."""
        assert self.io is not None
        self.forget()
        self.io.reader.ensure_group(self.number)
        self.io.reader.route(self.number)
        log.info("took partition", extra={"partition": self.number})

    def revoke(self) -> None:
        """The lease is gone (lost, handed over): forget the partition, let its parked read
        go, drop its gauges (they are another worker's now)."""
        assert self.io is not None
        p, metrics = self.number, self.io.metrics
        self.io.parked.release(p)
        self.io.ownership.forget(p)
        self.forget()
        for gauge in (metrics.lag, metrics.pending):
            with suppress(KeyError):  # never set: nothing to remove
                gauge.remove(str(p))
        self._unstop()
        metrics.released_partition(p)

    # ---- reads, stops ------------------------------------------------------------------

    def seek(self) -> None:
        """Move the group back to the partition's position; the position is valid again, so
        the partition is no longer reported stopped by it."""
        assert self.io is not None
        self.io.reader.seek(self.cursor)
        self._unstop()

    def stop(self, reason: str, detail: str, now: float) -> None:
        """An impossible position: no reads (retried with the bad-data backoff, so a repair
        takes effect by itself), reported until a seek finds it valid."""
        assert self.io is not None
        p, keys = self.number, self.io.reader.keys
        self.io.metrics.partition_stopped.labels(str(p), reason).set(1)
        self.stopped.add(reason)
        backoff = self.block(now)
        prefix = "" if keys.prefix == "intentstream" else f" --prefix {keys.prefix}"
        log.error(
            "partition stopped: its position is impossible; nothing of it is read until it "
            "is repaired",
            extra={"partition": p, "reason": reason, "key": keys.acked(p), "error": detail,
                   "retry_in_s": backoff,
                   "repair": f"intentstream partitions repair {p}{prefix} --dry-run, "
                             f"then without --dry-run"},
        )  # fmt: skip

    def block_bad_data(self, detail: str, now: float) -> None:
        """Bad data in a partition-wide key: blocked for a while, counted, logged."""
        assert self.io is not None
        backoff = self.block(now)
        self.io.metrics.bad_keys.inc()
        log.error("partition stopped by bad data; retrying later",
                  extra={"partition": self.number, "error": detail,
                         "retry_in_s": backoff})  # fmt: skip

    def _unstop(self) -> None:
        assert self.io is not None
        for reason in self.stopped:
            with suppress(KeyError):
                self.io.metrics.partition_stopped.remove(str(self.number), reason)
        self.stopped.clear()

    def block(self, now: float) -> float:
        """Stop this partition's reads after bad data, for 1 s doubling (at each block) up
        to a minute, and forget it. Returns the wait."""
        self._backoff = min(60.0, max(1.0, self._backoff * 2))
        self.blocked_until = now + self._backoff
        self.forget()
        return self._backoff

    def take_ahead(
        self, batch: Batch, model: ScoringModel, shadow: ScoringModel | None,
        rules: RuleTable | None = None,
    ) -> Ahead | None:  # fmt: skip
        """The batch computed ahead, once, if it is `batch` computed by these models with
        these intent rules (a rule change takes effect from the next batch committed)."""
        ahead, self.ahead = self.ahead, None
        if ahead is None or ahead.batch is not batch or ahead.model is not model:
            return None
        return ahead if ahead.shadow is shadow and ahead.rules is rules else None

    def lost_reply(self, token: bytes, commit: Commit) -> None:
        """A commit was sent and its reply lost: it may have applied."""
        self.unsettled = (token, commit)

    def settle(self) -> Commit | None:
        """The commit whose reply was lost, once Redis shows it applied (the partition's last
        commit token is its own); till then it waits for the partition's next commit."""
        assert self.io is not None
        if self.unsettled is None or not self.io.committer.applied(self.number, self.unsettled[0]):
            return None
        commit, self.unsettled = self.unsettled[1], None
        return commit

    def settled_by(self, result: CommitResult) -> Commit | None:
        """After a commit of this partition, the unsettled one if it applied just before
        (its token is the previous one); otherwise it never will (the checks refuse it)."""
        unsettled, self.unsettled = self.unsettled, None
        if unsettled is not None and not result.resent and result.previous == unsettled[0]:
            return unsettled[1]
        return None


class Partitions:
    """A Partition for every partition number, and their queued batches in read order."""

    def __init__(self, count_: int, cache: StateCache, io: PartitionIO | None = None) -> None:
        self._all = {p: Partition(p, cache, io) for p in range(count_)}
        self._order = count()
        # the partitions given batches since last seen with none: the queue's operations
        # look at these only (a worker may hold thousands of partitions)
        self._busy: dict[int, Partition] = {}

    def __getitem__(self, p: int) -> Partition:
        return self._all[p]

    def __iter__(self) -> Iterator[Partition]:
        return iter(self._all.values())

    def enqueue(self, batches: list[Batch]) -> None:
        """Queue batches after those queued already (of every partition)."""
        for batch in batches:
            part = self._all[batch.partition]
            part.queued.append((next(self._order), batch))
            self._busy[part.number] = part

    def _queueing(self, among: Collection[int] | None = None) -> list[Partition]:
        """The partitions with batches queued (a forgotten one has none), all or those
        `among`."""
        for p in [p for p, part in self._busy.items() if not part.queued]:
            del self._busy[p]
        parts = list(self._busy.values())
        return parts if among is None else [part for part in parts if part.number in among]

    def queued(self, among: Collection[int] | None = None) -> int:
        """How many batches are queued, over all partitions or those `among`."""
        return sum(len(part.queued) for part in self._queueing(among))

    def _first(self, among: Collection[int] | None = None) -> Partition | None:
        parts = self._queueing(among)
        return min(parts, key=lambda part: part.queued[0][0]) if parts else None

    def peek(self, among: Collection[int] | None = None) -> Batch | None:
        """The batch queued first (of the partitions `among`, when given), left queued."""
        first = self._first(among)
        return first.queued[0][1] if first is not None else None

    def pop(self) -> Batch | None:
        """The batch queued first, taken off the queue."""
        first = self._first()
        return first.queued.popleft()[1] if first is not None else None

    def take(self, p: int) -> Batch:
        """Partition p's first queued batch, taken off the queue."""
        return self._all[p].queued.popleft()[1]

    def busy(self) -> list[int]:
        """The partitions with batches queued."""
        return [part.number for part in self._queueing()]

    def idle(self, among: list[int]) -> dict[int, bytes]:
        """The partitions `among` with nothing queued or computed ahead that have read an
        entry, and the entry each read last."""
        return {p: part.cursor.after for p in among
                if not (part := self._all[p]).queued and part.ahead is None
                and part.cursor.after is not None}  # fmt: skip

    def keep_only(self, parts: list[int]) -> None:
        """Drop the queued batches of partitions not in `parts`."""
        keep = set(parts)
        for part in self._queueing():
            if part.number not in keep:
                part.queued.clear()
