"""The worker loop, as policy: the round, leases, retries, when to read ahead, model swaps.

One round (`tick`) reads as a story: upkeep (recreate missing groups, renew leases
(adapters/ownership.py), follow the model source (models.py) and the intent rules, settle
commits whose reply was lost), poll (a batch per held partition, reads.py), run what is
queued, and maintenance when due. Each batch is computed, committed and settled by the
flow (flow.py): its users' states read (adapters/states.py), its Commit built with one
kernel call (compute/pipeline.py), applied atomically and conditionally
(adapters/commit.py), counted once (tally.py). Two batches are kept known: a commit goes out
behind the read of the next batch's states and a read of new entries, and while Redis runs
it the worker computes the next batch, used only if the commit applied (readahead.py). At
low traffic a node's short batches of several partitions commit together instead, in two
round trips for all (adapters/together.py), so the latency does not grow with the
partitions held. On a Redis Cluster all that is per node (adapters/nodes.py): queued
batches are grouped by node, a node is read when none of its batches is queued, and idle
partitions wait in blocking reads of their own (adapters/parked.py). All the worker holds
of a partition is a Partition (partition.py), forgotten in one call when it may no longer
hold.

A commit that applied nothing never loses an entry: the partition's next read resumes after
its last commit (adapters/streams.py), so its entries are read again, in order. Redis
outages back off and retry (`recover`); bad data in one partition-wide key stops that
partition only (it backs off, the log names the key); bad data in a user's state resets
that user only.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import redis

from model.scoring import ScoringModel
from worker.common.connection import REDIS_DOWN, is_cluster, refresh_topology
from worker.common.keys import Keys
from worker.common.partition_count import PartitionCountError, check_partitions
from worker.common.settings import Settings
from worker.engine.adapters.commit import CommitLimits, Committer
from worker.engine.adapters.early_checks import EarlyChecks
from worker.engine.adapters.maintenance import Maintenance
from worker.engine.adapters.metrics import Health, WorkerMetrics
from worker.engine.adapters.nodes import PartitionNodes
from worker.engine.adapters.ownership import Ownership
from worker.engine.adapters.parked import ParkedReads
from worker.engine.adapters.states import PartitionDataError, StateReader
from worker.engine.adapters.streams import Cursor, PositionError, StreamReader
from worker.engine.adapters.together import Together
from worker.engine.compute.batch import Batch
from worker.engine.compute.quality import LiveQuality
from worker.engine.compute.state_cache import StateCache
from worker.engine.flow import BatchFlow, FlowIO
from worker.engine.models import Models, tune_gc
from worker.engine.models import pin_blas as pin_blas  # the bench tunes as run() does
from worker.engine.partition import PartitionIO, Partitions
from worker.engine.readahead import ReadAhead
from worker.engine.reads import Reads
from worker.engine.rulebook import Rulebook
from worker.engine.tally import Tally
from worker.lifecycle.model_source import FileModelSource, RegistryModelSource
from worker.rules.source import RuleSource

log = logging.getLogger("intentstream.worker")

MAINTENANCE_SECONDS = 10.0


class _PartitionCountChangedError(Exception):
    """Raised inside a round to leave the loop at once (see _check_partition_count)."""


class Consumer:
    """One worker process's consumer of the event streams."""

    def __init__(
        self, settings: Settings, client: redis.Redis,
        model_source: FileModelSource | RegistryModelSource, metrics: WorkerMetrics | None = None,
        health: Health | None = None, stop_event: threading.Event | None = None,
    ) -> None:  # fmt: skip
        s = self.s = settings
        self.r = client
        self.keys = Keys(s.prefix)
        self.source = model_source
        self.metrics = metrics or WorkerMetrics()
        self.health = health or Health()
        self._stop = stop_event or threading.Event()
        self.exit_code = 0  # 2 when it stopped because the partition count changed
        # The lease value: the consumer name plus a token of this process, so two processes
        # started with the same --consumer never both hold a partition.
        self.holder = f"{s.consumer}:{secrets.token_hex(6)}"
        self.nodes = PartitionNodes(client, self.keys)
        self.ownership = Ownership(client, self.keys, self.holder, s.partitions, s.lease_ms,
                                   self.nodes)  # fmt: skip
        self.reader = StreamReader(client, self.keys, s.group, s.consumer, s.partitions,
                                   s.max_ts_skew_ms, self.nodes)  # fmt: skip
        self.cluster = is_cluster(client)
        self.parked = ParkedReads(self.reader)  # idle partitions' blocking reads (cluster)
        self.cache = StateCache(s.state_cache_users, s.state_ttl_seconds)
        self.quality = LiveQuality()
        self.models = Models(model_source, client, s, self.metrics, self.quality, self.cache)
        self.states = StateReader(client, self.keys, self.cache, self.models.space_of, s.layout,
                                  self.nodes)  # fmt: skip
        self.rulebook = Rulebook(RuleSource(client, self.keys, s.model_poll_seconds),
                                 self.metrics)  # fmt: skip
        limits = CommitLimits(s.scores_maxlen, s.deadletter_maxlen,
                              s.deadletter_max_value_bytes, s.state_ttl_seconds * 1000)  # fmt: skip
        self.committer = Committer(client, self.keys, self.holder, limits,
                                   s.layout, self.nodes)  # fmt: skip
        early = EarlyChecks(self.committer)  # commit checks sent with the states' reads
        self.readahead = ReadAhead(self.keys, self.states, self.reader, self.committer, early)
        self.together = Together(self.states, self.committer, not self.cluster, early)
        self.maintenance = Maintenance(client, self.keys, s, self.metrics)
        self.metrics.partitions.set(s.partitions)
        self.tally = Tally(self.metrics, self.quality)
        io = PartitionIO(self.reader, self.parked, self.ownership, self.committer, self.metrics)
        self.parts = Partitions(s.partitions, self.cache, io)  # all it holds of each partition
        self.reads = Reads(s, self.reader, self.parked, self.parts, self.nodes, self.metrics,
                           self.cluster)  # fmt: skip
        flow = FlowIO(self.parts, self.states, self.models, self.committer, self.readahead,
                      self.together, self.nodes, self.ownership, self.tally,
                      self.metrics)  # fmt: skip
        self.flow = BatchFlow(s, client, self.cluster, flow, self.rewind, self._guarded)
        self._groups_missing = False  # a read found a group gone (NOGROUP)
        self._last_maintenance = 0.0
        self._backoff = 0.0

    @property
    def model(self) -> ScoringModel:
        """The model scoring now."""
        return self.models.current

    @property
    def shadow(self) -> ScoringModel | None:
        """The shadow model scoring beside it, if one runs."""
        return self.models.shadow

    @property
    def cursors(self) -> dict[int, Cursor]:
        """Where each partition's next read starts (read-only view)."""
        return {part.number: part.cursor for part in self.parts}

    # ---- lifecycle -------------------------------------------------------------------

    def stop(self, *_: object) -> None:
        """Ask the loop to finish the batch in hand and return."""
        self._stop.set()

    def close(self) -> None:
        """Stop following the registry and the rules (their threads poll Redis for as long as
        they live); `run` ends with it, a caller that only ticks calls it."""
        self.rulebook.close()
        self.models.source.close()

    def run(self, max_seconds: float | None = None, deadline: float | None = None) -> None:
        """Consume until stopped (or for max_seconds, or until `deadline` on
        time.monotonic()'s clock), surviving Redis outages."""
        self.models.warm_up()
        self._run(max_seconds, deadline)

    def _run(self, max_seconds: float | None, deadline: float | None = None) -> None:
        self.health.model_ok = True
        self.models.set_metrics()
        tune_gc()
        if max_seconds is not None:
            end = time.monotonic() + max_seconds
            deadline = end if deadline is None else min(deadline, end)
        log.info(
            "worker started",
            extra={"consumer": self.s.consumer, "partitions": self.s.partitions,
                   "model": self.model.version},
        )  # fmt: skip
        while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
            self.health.beat()
            try:
                self.tick()
                self._backoff = 0.0
                self.health.redis_ok = True
            except _PartitionCountChangedError:
                break
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                self.recover(exc)
        self.shutdown()

    def recover(self, exc: redis.RedisError | redis.exceptions.RedisClusterException) -> None:
        """What the loop does after a round failed on `exc`: a group found gone is recreated
        in the next round; anything else (an outage, a failover, a refused login) backs off
        and retries."""
        if isinstance(exc, redis.ResponseError) and "NOGROUP" in str(exc):
            log.warning("consumer group or stream is gone; recreating it",
                        extra={"error": str(exc)})  # fmt: skip
            self.health.group_ok = False
            self._groups_missing = True  # recreated in the next round, retried
        elif isinstance(exc, REDIS_DOWN):
            self._redis_trouble(f"redis unavailable: {exc}")
        elif isinstance(exc, redis.ResponseError):
            self._redis_trouble(f"unexpected redis reply: {exc}")
        else:  # a cluster failing over or resharding, a refused login, ...: retried
            self._redis_trouble(f"redis error: {type(exc).__name__}: {exc}")

    def _redis_trouble(self, message: str) -> None:
        self.metrics.redis_errors.inc()
        self.maintenance.server_may_have_changed()
        self.health.redis_ok = False
        self._backoff = min(5.0, max(0.05, self._backoff * 2))
        log.warning(message + f"; retrying in {self._backoff:.2f} s")
        self.rewind()
        self._stop.wait(self._backoff)
        # Cluster: the next round must reach the nodes that hold the slots now. redis-py
        # re-reads its slot map after a plain command's connection error, but not after a
        # transaction's (the lease renewal's) or a pipeline's write: after kill -9 of a
        # master those would dial it forever, past its replica's promotion (see
        # worker/common/connection.py). After the wait, so the map read is the newest.
        refresh_topology(self.r)

    def rewind(self) -> None:
        """Resume every partition after its last commit: what was read may not have
        committed."""
        self.parked.release_all()
        for part in self.parts:
            part.forget()

    def shutdown(self) -> None:
        """Commit the batches already read (no new reads), then release the leases."""
        try:
            self._process_queued()
            self._settle()
        except (redis.RedisError, PartitionDataError) as exc:
            log.warning("read entries left uncommitted at stop", extra={"error": str(exc)})
        self.parked.release_all()  # what they delivered is read again by the next holder
        try:
            self.ownership.release_all()
        except redis.RedisError as exc:
            log.warning("could not release leases", extra={"error": str(exc)})
        self.close()
        log.info("worker stopped", extra={"consumer": self.s.consumer})

    # ---- one round of the loop ---------------------------------------------------------

    def tick(self) -> None:
        """One round, as a story: upkeep (groups, leases, models, rules, lost replies), poll
        (the reads), run what they queued (each batch computed, committed, settled), and
        maintenance when due."""
        now = time.monotonic()
        self._upkeep(now)
        parts = self._readable()
        if not parts:
            self._stop.wait(min(1.0, self.s.lease_ms / 3000))
            return
        self._poll(parts)
        groups = self._low_traffic()
        if groups:
            self.flow.together_on_nodes(groups)
        self._run_queued()
        if now - self._last_maintenance > MAINTENANCE_SECONDS:
            self.maintain(now)

    def _upkeep(self, now: float) -> None:
        """What a round does before it reads: recreate missing groups, install the
        producers' function, renew the leases when due, follow the model and the rules,
        settle commits whose reply was lost."""
        if self._groups_missing:
            self._recreate_groups()
            self._groups_missing = False
        self.maintenance.ensure_function()
        if self.ownership.due(now):
            # On time, the leases are renewed with the batches read ahead left queued: they
            # commit in their turn, each computed beside the commit before it (draining
            # them first made every renewal round commit them cold and read the next ones
            # cold). After a pause they are committed first: their commit checks the lease
            # itself, so a late one is refused (not_owned), never applied; renewing first
            # would only drop them unseen.
            if self.ownership.lapsing(now):
                self._process_queued()
            self._renew_leases()
        self._follow()
        self._settle()

    def _follow(self) -> None:
        """Swap in the model and the intent rules now in force (between batches)."""
        self.models.follow()
        self.reader.input_names = self.models.input_names()
        self.rulebook.follow()
        self.models.rules = self.rulebook.table

    def _poll(self, parts: list[int]) -> None:
        """Read the readable partitions `parts` (those of nodes with nothing queued; on a
        cluster idle ones park) and queue what came."""
        self.parts.keep_only(parts)
        self.reads.unpark(parts)
        unfed = self.reads.unfed([p for p in parts if p not in self.parked])
        if unfed:
            batches = self.reads.read(unfed, self._guarded, self._block)
            self.parts.enqueue(self.reads.by_node(batches))
            self.reads.park(unfed, batches)
        self.reads.collect_parked(parts, self._stop.is_set())

    def _low_traffic(self) -> list[list[Batch]]:
        """The queued batches that commit together, by node, taken off the queue: a node's
        when it has two or more queued, all short of a full read, each its partition's only
        one, none computed ahead (a backlog keeps computing ahead, one batch at a time)."""
        groups = []
        for numbers in self.nodes.grouped(sorted(self.parts.busy())).values():
            parts = [self.parts[p] for p in numbers]
            if len(parts) >= 2 and all(
                len(part.queued) == 1 and len(part.queued[0][1]) < self.s.batch_size
                and part.ahead is None and not part.cursor.seeking for part in parts
            ):  # fmt: skip
                groups.append([self.parts.take(part.number) for part in parts])
        return groups

    def _run_queued(self) -> None:
        """Process what is queued now, in order (batches read ahead meanwhile wait a round)."""
        for _ in range(self.parts.queued()):
            batch = self.parts.pop()
            if batch is None:
                break  # a failure dropped the rest
            self._run_batch(batch)

    def _run_batch(self, batch: Batch) -> None:
        """Process one queued batch, its commit carrying what its node reads next."""
        on_node = self.nodes.on_node(self.nodes.name(batch.partition), self._readable())
        still = [p for p in on_node if p not in self.parked]
        # A commit travels with a read ahead of its node's partitions while at most one
        # batch of them is queued (and none has to seek back to its last commit first).
        read_ahead = (
            self.parts.queued(set(still)) <= 1
            and bool(still)
            and not any(self.parts[p].cursor.seeking for p in still)
        )
        # The node's next queued batch is computed while Redis runs the commit, even when
        # another node's comes first in the queue (a node's last batch of a round, its read
        # ahead queued behind the other nodes'): nothing of its partition commits before
        # it, so the states read with this commit still hold.
        upcoming = self.parts.peek(set(on_node) if self.cluster else None)
        self._guarded(batch.partition, self.flow.process, batch,
                      still if read_ahead else None, upcoming)  # fmt: skip

    def maintain(self, now: float | None = None) -> None:
        """The maintenance step (every MAINTENANCE_SECONDS of rounds); an idle partition
        whose group was moved past what this worker read (entries skipped, which no later
        traffic may come to reveal) seeks back to its position."""
        readable = self._readable()
        for p in self.maintenance.run(readable, self.parts.idle(readable)):
            self.parts[p].forget()
        self._last_maintenance = time.monotonic() if now is None else now

    def _readable(self) -> list[int]:
        """Held partitions not backing off after bad data."""
        now = time.monotonic()
        return [p for p in sorted(self.ownership.owned) if self.parts[p].blocked_until <= now]

    def _guarded(self, p: int, action, *args) -> None:
        """Run a per-partition action; bad data in a partition-wide key stops that
        partition for a while (doubling up to a minute), not the loop."""
        try:
            action(*args)
        except PositionError as exc:  # stopped until repaired, reported until then
            self.parts[p].stop(exc.reason, exc.detail, time.monotonic())
        except PartitionDataError as exc:
            self._block(p, str(exc))
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            self._block(p, f"partition {p}: {exc}")

    def _block(self, p: int, detail: str) -> None:
        self.parts[p].block_bad_data(detail, time.monotonic())

    def _process_queued(self) -> None:
        """Process the queued batches of readable partitions, in order, reading no more."""
        while (batch := self.parts.pop()) is not None:
            if batch.partition in self._readable():
                self._guarded(batch.partition, self.flow.process, batch)

    # ---- ownership ---------------------------------------------------------------------

    def _renew_leases(self) -> None:
        changes = self.ownership.renew(before_taking=self._check_partition_count)
        for p in changes.lost:
            log.warning("lost the lease of a partition", extra={"partition": p})
            self.parts[p].revoke()
        for p in changes.handed_over:
            self.parts[p].revoke()
        if changes.handed_over:
            log.info("handed partitions over", extra={"partitions": changes.handed_over})
        for p in changes.gained:
            self._guarded(p, self._assign, p)
        self.metrics.partitions_owned.set(len(self.ownership.owned))

    def _check_partition_count(self) -> None:
        """Stop when the partition count in force changed or a resize began since start
        (`intentstream partitions resize` refuses while workers are announced, and marks
        its run before checking: one of the two always sees the other)."""
        try:
            check_partitions(self.r, self.keys, self.s.partitions)
        except PartitionCountError as exc:
            log.error("stopping: the partition count changed", extra={"error": str(exc)})
            self.exit_code = 2
            self._stop.set()
            raise _PartitionCountChangedError from None

    def _assign(self, p: int) -> None:
        self.parts[p].assign()
        self.health.group_ok = True

    def _recreate_groups(self) -> None:
        for p in self.ownership.owned:
            self._guarded(p, self.reader.ensure_group, p)
        self.health.group_ok = True
        self.rewind()

    # ---- commits whose reply was lost --------------------------------------------------

    def _settle(self) -> None:
        """Count unsettled commits that Redis shows applied (the partition's last commit
        token is theirs). Those not shown yet wait for the partition's next commit."""
        for part in self.parts:
            commit = part.settle()
            if commit is not None:
                self.tally.commit(commit)
