"""A batch's way through the worker: compute, commit, settle. Alone, its commit pipelined
with the reads that keep its node's next batch known (readahead.py); at low traffic, with its
node's other batches of the round, their states read and their commits sent together
(adapters/together.py), a cluster's nodes interleaved. A refused commit is recomputed (a
conflict) or its partition forgotten and read again in order; a lost reply leaves the commit
unsettled, counted once Redis shows it applied (partition.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import redis

from worker.common.connection import REDIS_DOWN
from worker.common.settings import Settings
from worker.engine.adapters.commit import (
    CommitRefusedError,
    CommitResult,
    Committer,
    PreparedCommit,
)
from worker.engine.adapters.early_checks import Watched, read_watched
from worker.engine.adapters.group_packing import prepared_group
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.adapters.nodes import REDIRECTS, PartitionNodes
from worker.engine.adapters.ownership import Ownership
from worker.engine.adapters.states import PartitionDataError, StateReader
from worker.engine.adapters.streams import Cursor
from worker.engine.adapters.together import (
    WITHHELD,
    Outcome,
    Packing,
    Steps,
    Together,
)
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import Commit
from worker.engine.compute.state_cache import CachedState, written
from worker.engine.compute.user_states import UserStates, distinct_users
from worker.engine.models import Models
from worker.engine.partition import Partitions
from worker.engine.readahead import Computed, Exchange, ReadAhead
from worker.engine.tally import Tally

log = logging.getLogger("intentstream.worker")

CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class FlowIO:
    """What a batch's way through calls: the partitions, the state reads, the models, the
    commit and its two pipelined forms, the nodes, the leases, the counts."""

    parts: Partitions
    states: StateReader
    models: Models
    committer: Committer
    readahead: ReadAhead
    together: Together
    nodes: PartitionNodes
    ownership: Ownership
    tally: Tally
    metrics: WorkerMetrics


class BatchFlow:
    """Computes, commits and settles one worker's batches."""

    def __init__(
        self, settings: Settings, client: redis.Redis, cluster: bool, io: FlowIO,
        rewind: Callable[[], None], guarded: Callable[..., None],
    ) -> None:  # fmt: skip
        self.s = settings
        self.r = client
        self.cluster = cluster
        self.io = io
        self._rewind = rewind  # the consumer's: every partition resumes after its last commit
        self._guarded = guarded  # the consumer's: bad data stops the partition, not the loop
        # the states the last commit sent ahead writes, made while Redis ran its checks or EXEC
        self._written: tuple[Commit, dict[str, CachedState] | None] | None = None

    def process(
        self, batch: Batch, prefetch_for: list[int] | None = None, upcoming: Batch | None = None
    ) -> None:
        """Score one partition's batch and commit it; recompute on a state conflict. The
        commit reads ahead for the partitions prefetch_for, and computes `upcoming` (the
        next batch to process) while Redis runs it."""
        p = batch.partition
        for attempt in range(CONFLICT_RETRIES):
            try:
                if attempt == 0:
                    self._process_once(batch, prefetch_for, upcoming)
                else:
                    self._process_once(batch, None, None)
                return
            except CommitRefusedError as exc:
                if not self._refused(p, exc, last=attempt == CONFLICT_RETRIES - 1):
                    return

    def _refused(self, p: int, exc: CommitRefusedError, last: bool) -> bool:
        """Act on a refused commit; True when its batch is to be computed and sent again
        (never after the `last` attempt)."""
        self.io.states.cache.drop(p)
        self.io.metrics.commit_retries.labels(exc.reason).inc()
        if self._refusal_retries(p, exc) and not last:
            return True
        # Not applied: the batch, and any newer one read behind it, are read again, in
        # order, after the partition's last commit.
        self.io.parts[p].forget()
        return False

    def _refusal_retries(self, p: int, exc: CommitRefusedError) -> bool:
        """Act on a refused commit; True when the batch should be recomputed at once."""
        reason = exc.reason
        if reason == "conflict":
            log.info("state conflict; recomputing the batch", extra={"partition": p})
            return True
        if reason == "not_owned":
            log.warning("partition lease lost before commit", extra={"partition": p})
            self.io.parts[p].revoke()
        elif reason == "bad_key":
            raise PartitionDataError(p, f"{exc.detail} holds another type; fix or delete it")
        elif reason == "behind":
            log.warning("the group was moved back behind the partition's position (an "
                        "XGROUP SETID?); what it delivered again is not applied again, and "
                        "the group goes back to the position",
                        extra={"partition": p, "position": exc.detail})  # fmt: skip
        else:  # not_next, gap: another commit or reader moved the partition on
            log.info("batch does not follow the partition's last commit; re-reading in order",
                     extra={"partition": p, "reason": reason, "detail": exc.detail})  # fmt: skip
        return False

    def _process_once(
        self, batch: Batch, prefetch_for: list[int] | None, upcoming: Batch | None
    ) -> None:
        """One attempt: compute, commit, settle. With no batch to compute while Redis runs
        the commit (`upcoming`), the commit's checks go early, with the states' read."""
        watch = (prefetch_for or []) if upcoming is None and not self.cluster else None
        computed = self.compute(batch, None, watch)
        t0 = time.perf_counter()
        result = self.commit(computed.commit, prefetch_for, upcoming, computed.prepared,
                             computed.watched)  # fmt: skip
        self._applied(batch, computed, result, time.perf_counter() - t0)

    def compute(
        self, batch: Batch, read: tuple[UserStates, float] | None = None,
        watch: list[int] | None = None,
    ) -> Computed:  # fmt: skip
        """The batch's Commit: as computed while the commit before it ran, if it was and
        still holds (same models and rules), else from its users' states: `read` (states
        read with other batches', and the seconds taken) or read now; with `watch`, behind
        the commit's early checks (adapters/early_checks.py), new entries of the partitions
        `watch` read behind them."""
        models = self.io.models
        ahead = self.io.parts[batch.partition].take_ahead(batch, models.current, models.shadow,
                                                          models.rules)  # fmt: skip
        if ahead is not None:
            return Computed(ahead.states, ahead.commit, ahead.prepared, ahead.seconds, True)
        t1 = time.perf_counter()
        watched = None
        if read is None:
            p, users = batch.partition, distinct_users(batch)
            if watch is not None:
                states, watched = self._read_watched(batch, users, watch)
            else:
                states = self.io.states.read(p, users, *models.spec())
            read = states, time.perf_counter() - t1
        states, state_s = read
        t2 = time.perf_counter()
        try:
            commit = models.build(batch, states)
        except BaseException:
            if watched is not None:
                watched.drop()
                if watched.groups:
                    self._rewind()  # the entries read with the states are read again
            raise
        seconds = (state_s, time.perf_counter() - t2)
        return Computed(states, commit, None, seconds, False, watched)

    def _read_watched(
        self, batch: Batch, users: list[str], parts: list[int]
    ) -> tuple[UserStates, Watched | None]:
        """The batch's states read behind its commit's early checks, and new entries of
        `parts` behind them (a read ahead, as `_commit_with_reads` sends it); a failure
        rewinds: what they read is read again, in order."""
        reads = self.io.readahead.new_entries(*self._reads_ahead(parts))
        try:
            return read_watched(self.io.states, self.io.readahead.early, self.r, batch, users,
                                self.io.models.spec(), reads)  # fmt: skip
        except BaseException:
            if reads[0]:
                self._rewind()
            raise

    def together_on_nodes(self, groups: list[list[Batch]]) -> None:
        """Each node's batches at low traffic together (`_together_steps`), the nodes'
        exchanges interleaved: every node's reads (then checks, then transactions) are sent
        before any waits for its replies, so a cluster's round waits about one node's round
        trips, not their sum. A node's error is raised once the others have settled their
        round (counted)."""
        running, failed = [self._together_steps(batches) for batches in groups], None
        try:
            while running:
                still = []
                for steps in running:
                    try:
                        next(steps)
                        still.append(steps)
                    except StopIteration:
                        pass
                    except Exception as exc:  # raised below, once the others settled
                        failed = failed or exc
                running = still
        finally:
            for steps in running:
                steps.close()  # only on an interrupt: each disconnects what is in flight
        if failed is not None:
            raise failed

    def _together_steps(self, batches: list[Batch]) -> Steps:
        """A node's batches at low traffic (Consumer._low_traffic): their states read in one
        round trip, built as one on one Redis (compute/joint.py), their commits sent in two
        (adapters/together.py), each then settled as if sent alone; one that could not go
        with them is processed alone after. As steps: it yields where it has sent and would
        wait for replies."""
        client = self.io.nodes.node_client(batches[0].partition) if self.cluster else self.r
        alone: list[Batch] = []
        if client is not None:
            t0 = time.perf_counter()
            # on one Redis, `watched` holds the commits' checks, sent with the reads
            states, joined, watched = yield from self.io.together.read_states_steps(
                client, batches, *self.io.models.spec()
            )
            state_s = (time.perf_counter() - t0) / len(batches)
            read = [(b, st) for b, st in zip(batches, states, strict=True) if st is not None]
            alone = [b for b, st in zip(batches, states, strict=True) if st is None]
            # on one Redis the group commits all or none, so it is built as one
            whole = self.io.together.one_transaction and len(read) > 1
            pack = None
            try:
                if whole:
                    ready, pack = self._built_together(read, state_s, joined)
                else:
                    ready = [(b, self.compute(b, (st, state_s))) for b, st in read]
            except BaseException:
                if watched is not None:
                    watched.drop()
                raise
            t1 = time.perf_counter()
            pairs = [(c.commit, c.prepared) for _, c in ready]
            if self.io.together.one_transaction:
                outcomes = self.io.together.commit(client, pairs, whole, pack, watched)
            else:
                outcomes = yield from self.io.together.commit_steps(client, pairs, pack)
            commit_s = time.perf_counter() - t1
            failed: redis.RedisError | None = None
            for (batch, computed), outcome in zip(ready, outcomes, strict=True):
                try:  # every applied commit is counted before an error is raised
                    self._guarded(batch.partition, self._settle_together, batch, computed,
                                  outcome, commit_s, alone)  # fmt: skip
                except redis.RedisError as exc:
                    failed = failed or exc
            if failed is not None:
                raise failed
        for batch in batches if client is None else alone:
            self._guarded(batch.partition, self.process, batch)

    def _built_together(
        self, read: list[tuple[Batch, UserStates]], state_s: float, joined: UserStates | None
    ) -> tuple[list[tuple[Batch, Computed]], Packing | None]:
        """The batches' Commits built as one (compute/joint.py; from `joined`, their states
        as one, when read so), each with its states, and the packing of the group's commits
        at once (adapters/group_packing.py), which Together.commit runs while Redis runs the
        checks; one by one, and no packing, when they cannot be joined."""
        t0 = time.perf_counter()
        group = self.io.models.build_group([b for b, _ in read], [st for _, st in read], joined)
        if group is None:
            return [(b, self.compute(b, (st, state_s))) for b, st in read], None
        model_s = (time.perf_counter() - t0) / len(read)
        ready = [(b, Computed(st, c, None, (state_s, model_s), False))
                 for (b, st), c in zip(read, group.commits, strict=True)]  # fmt: skip
        return ready, partial(prepared_group, self.io.committer, group)

    def _settle_together(
        self, batch: Batch, computed: Computed, outcome: Outcome, commit_s: float,
        alone: list[Batch],
    ) -> None:  # fmt: skip
        """One commit sent with others: settled as `process` would; a batch refused for a
        conflict or redirected goes into `alone`; a lost connection leaves the commit
        unsettled and is raised (the loop backs off and rewinds)."""
        p, commit = batch.partition, computed.commit
        if isinstance(outcome, CommitResult):
            self._applied(batch, computed, outcome, commit_s)
        elif isinstance(outcome, CommitRefusedError):
            if self._refused(p, outcome, last=False):
                alone.append(batch)
        elif isinstance(outcome, REDIRECTS):
            alone.append(batch)  # sent alone, to the slot's node by a fresh slot map
        elif outcome is WITHHELD:
            alone.append(batch)  # another of its group was refused
        else:
            if isinstance(outcome, REDIS_DOWN):
                self.io.parts[p].lost_reply(self.io.committer.token(commit), commit)
            raise outcome

    def commit(
        self, commit: Commit, prefetch_for: list[int] | None = None,
        upcoming: Batch | None = None, prepared: PreparedCommit | None = None,
        watched: Watched | None = None,
    ) -> CommitResult:  # fmt: skip
        """Apply a Commit, pipelined with a read ahead (prefetch_for) and the states of the
        upcoming batch when given; on `watched`, the connection that holds its early checks,
        when they went with its states' read. A reply lost on the way leaves the commit
        unsettled: counted if it applied."""
        try:
            if watched is not None:
                return self._commit_watched(commit, watched, prepared)
            if prefetch_for or upcoming is not None:  # of the commit's node (see _run_batch)
                return self._commit_with_reads(commit, prefetch_for or [], upcoming, prepared)
            return self.io.committer.run(commit, self.io.nodes.node_client(commit.partition))
        except REDIS_DOWN:
            self.io.parts[commit.partition].lost_reply(self.io.committer.token(commit), commit)
            raise

    def _commit_watched(
        self, commit: Commit, watched: Watched, prepared: PreparedCommit | None
    ) -> CommitResult:
        """The commit on the connection of its early checks, the next batch computed while
        Redis runs it from what the reads behind them brought (readahead.py). Any failure
        rewinds: what was read is read again, in order."""
        try:
            sent = self.io.readahead.exchange_watched(
                watched, commit, prepared, self.s.batch_size, self.io.models
            )
        except BaseException:
            self._rewind()
            raise
        return self._settled_exchange(sent)

    def _reads_ahead(self, parts: list[int]) -> tuple[list[Cursor], int]:
        """The cursors of `parts` and how many entries to read of them: enough to keep two
        batches of the node known."""
        cursors = [self.io.parts[p].cursor for p in parts]
        return cursors, self.s.batch_size * (1 if self.io.parts.queued(set(parts)) else 2)

    def _settled_exchange(self, sent: Exchange) -> CommitResult:
        """An exchange's commit settled (CommitRefusedError when it applied nothing): what
        it read queued, the states it wrote kept for `_applied`, the batch computed ahead
        kept with its partition."""
        self._written = (sent.commit, sent.written)
        self.io.parts.enqueue(sent.batches)
        result = sent.settle()
        if sent.ahead is not None:
            self.io.parts[sent.ahead.batch.partition].ahead = sent.ahead
        return result

    def _commit_with_reads(
        self, commit: Commit, parts: list[int], upcoming: Batch | None = None,
        prepared: PreparedCommit | None = None,
    ) -> CommitResult:  # fmt: skip
        """The commit pipelined with a read of new entries of `parts` and of the upcoming
        batch's states, which is computed while Redis runs the commit (readahead.py) and
        kept if it applied. Any failure rewinds: what was read is read again, in order."""
        plan = None
        if upcoming is not None and upcoming.partition in self.io.ownership.owned:
            plan = self.io.readahead.plan(commit, upcoming)
        cursors, count = self._reads_ahead(parts)
        try:
            node = self.io.nodes.client(commit.partition)
            sent = self.io.readahead.exchange(
                node, commit, prepared, plan, cursors, count, self.s.batch_size, self.io.models
            )
        except REDIRECTS as exc:
            # The node no longer serves the commit's slot (a resharding, a failover): the
            # commit did not run. Sent again to the slot's node by a fresh slot map (a slot
            # still migrating is retried after a backoff); what was read is read again.
            log.info("commit redirected; sent to the slot's node",
                     extra={"partition": commit.partition, "error": str(exc)})  # fmt: skip
            self._rewind()
            return self.io.committer.run(commit)
        except BaseException:
            self._rewind()
            raise
        return self._settled_exchange(sent)

    def _applied(
        self, batch: Batch, computed: Computed, result: CommitResult, commit_s: float
    ) -> None:
        """Settle a batch whose commit applied: cache the states it wrote, count the
        commit before it whose reply was lost if this one shows it applied, count it."""
        p, commit = batch.partition, computed.commit
        done, self._written = self._written, None
        kept = done[1] if done is not None and done[0] is commit else None
        entries = kept if kept is not None else written(commit)
        self.io.states.remember(p, result.seq, entries)
        settled = self.io.parts[p].settled_by(result)
        if settled is not None:
            self.io.tally.commit(settled)
        state_s, model_s = computed.seconds
        stages = {"state": state_s, "model": model_s, "commit": commit_s}
        self.io.tally.batch(batch, computed.states, commit, result, stages)
