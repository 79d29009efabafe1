"""A round's reads: which partitions to read (on a cluster, the nodes with no batch queued),
the seeks back to a position first, one XREADGROUP, and on a cluster the idle partitions'
blocking reads of their own (adapters/parked.py), collected when Redis answers.

The policy of what to do with a partition a read finds broken (stop it, back off) is the
consumer's: it hands in `guarded` and `block`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from worker.common.settings import Settings
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.adapters.nodes import PartitionNodes
from worker.engine.adapters.parked import ParkedReads
from worker.engine.adapters.streams import StreamReader
from worker.engine.compute.batch import Batch
from worker.engine.partition import Partitions

# guarded(p, action, *args): run a per-partition action, bad data stopping that partition
Guarded = Callable[..., None]


class Reads:
    """One worker's reads of its partitions, round after round."""

    def __init__(
        self, settings: Settings, reader: StreamReader, parked: ParkedReads, parts: Partitions,
        nodes: PartitionNodes, metrics: WorkerMetrics, cluster: bool,
    ) -> None:  # fmt: skip
        self.s = settings
        self.reader = reader
        self.parked = parked
        self.parts = parts
        self.nodes = nodes
        self.metrics = metrics
        self.cluster = cluster

    def unfed(self, parts: list[int]) -> list[int]:
        """The partitions to read this round: those of the nodes with no batch queued (a
        node with batches queued is read ahead, with their commits)."""
        fed = {self.nodes.name(p) for p in parts if self.parts[p].queued}
        return [p for p in parts if self.nodes.name(p) not in fed] if fed else parts

    def by_node(self, batches: list[Batch]) -> list[Batch]:
        """Batches of one node next to each other (each partition's in order), so that each
        commit but a node's last can compute the next batch while Redis runs it."""
        if not self.cluster:
            return batches
        return sorted(batches, key=lambda b: self.nodes.name(b.partition))

    def read(
        self, parts: list[int], guarded: Guarded, block: Callable[[int, str], None]
    ) -> list[Batch]:
        """One XREADGROUP over the partitions, blocking up to block-ms (those
        seeking back to their position seek first, each alone: an impossible position stops
        its partition only); a partition whose stream key holds another type is found and
        stopped alone."""
        t0 = time.perf_counter()
        seeking = [p for p in parts if self.parts[p].cursor.seeking]
        for p in seeking:
            guarded(p, self.parts[p].seek)
        parts = [p for p in parts if not self.parts[p].cursor.seeking]
        if not parts:
            return []
        block_ms = None if seeking else self.s.block_ms
        try:
            batches = self.reader.read([self.parts[p].cursor for p in parts], self.s.batch_size,
                                       block_ms)  # fmt: skip
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            for p, kind in self.reader.not_streams(parts).items():
                block(p, f"{self.reader.keys.events(p)} holds a {kind}, not a stream")
            return []
        self.metrics.batch_seconds.labels("read").observe(time.perf_counter() - t0)
        return batches

    def park(self, read: list[int], batches: list[Batch]) -> None:
        """Cluster: give each partition this round's read found idle a blocking read of its
        own, answered as soon as an entry comes."""
        if not self.cluster:
            return  # there the round's one read blocks while all are idle
        got = {b.partition for b in batches}
        for p in read:
            cursor = self.parts[p].cursor
            if p not in got and not cursor.seeking:
                self.parked.park(self.nodes.client(p), cursor, self.s.batch_size, self.s.block_ms)

    def unpark(self, parts: list[int]) -> None:
        """Let go the parked reads of partitions not readable or seeking back to their last
        commit (taken over, refused): those are read in order, by plain reads."""
        keep = {p for p in parts if not self.parts[p].cursor.seeking}
        for part in self.parts:
            if part.number in self.parked and part.number not in keep:
                self.parked.release(part.number)

    def collect_parked(self, parts: list[int], stopping: bool) -> None:
        """Queue what the parked reads answered; when there is nothing else to do (every
        readable partition parked), wait for the first answer, up to block-ms (and the
        time for Redis's nil to come once it passed)."""
        if not len(self.parked):
            return
        idle = not self.parts.queued() and all(p in self.parked for p in parts)
        timeout = self.s.block_ms / 1000 + 0.05 if idle and not stopping else 0.0
        self.parts.enqueue(self.by_node(self.parked.collect(timeout, self.s.batch_size)))
