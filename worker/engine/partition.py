"""One partition's life in this worker, in one object (quix-streams' assign_partition and
revoke_partition in one place): where its reads resume, the batches read and not yet
processed, the batch computed ahead, whether bad data stopped it, and a commit whose reply
was lost.

`Partition.forget` drops all that was read, computed or cached of it, whenever what this
worker knows of the partition may no longer hold: its lease lost or handed over, newly
taken, bad data, a commit that applied nothing, a Redis outage. Nothing is lost by it: its
next read resumes after its last commit, so its entries are read again, in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator
from itertools import count

from model.scoring import ScoringModel
from worker.engine.adapters.commit import CommitResult
from worker.engine.adapters.streams import Cursor
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import Commit
from worker.engine.compute.state_cache import StateCache
from worker.engine.readahead import Ahead
from worker.rules.step import RuleTable


class Partition:
    """What this worker holds of one partition, and the one way to forget it."""

    def __init__(self, number: int, cache: StateCache) -> None:
        self.number = number
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

    def settled_by(self, result: CommitResult) -> Commit | None:
        """After a commit of this partition, the unsettled one if it applied just before
        (its token is the previous one); otherwise it never will (the checks refuse it)."""
        unsettled, self.unsettled = self.unsettled, None
        if unsettled is not None and not result.resent and result.previous == unsettled[0]:
            return unsettled[1]
        return None


class Partitions:
    """A Partition for every partition number, and their queued batches in read order."""

    def __init__(self, count_: int, cache: StateCache) -> None:
        self._all = {p: Partition(p, cache) for p in range(count_)}
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

    def keep_only(self, parts: list[int]) -> None:
        """Drop the queued batches of partitions not in `parts`."""
        keep = set(parts)
        for part in self._queueing():
            if part.number not in keep:
                part.queued.clear()
