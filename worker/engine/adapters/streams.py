"""Reading the partition streams: XREADGROUP (own pending entries first, then new ones),
claiming other consumers' pending entries, and group creation.

A partition's own pending entries are read from id 0 before new ones (cursor ">"): they may
hold a batch whose commit failed, and a user's events must apply in order.

On one Redis a round is one XREADGROUP over every held partition, blocking while all are
idle. On a Redis Cluster the partitions' streams live in different slots, so a round is one
XREADGROUP per partition, each node's packed in one write on its connection (as the
read-ahead sends them; the cluster pipeline for a node not connected yet or that redirects),
sent to all nodes before any reply is read; those reads never block (a blocked read would hold up
the other partitions on its node): a partition they find idle waits in a blocking read of
its own (adapters/parked.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import hiredis
import redis

from worker.common.connection import Client, is_cluster, raw_replies
from worker.common.events import DEFAULT_MAX_TS_SKEW_MS
from worker.engine.adapters.nodes import REDIRECTS, PartitionNodes
from worker.engine.compute.batch import Batch, parse_batch

log = logging.getLogger("intentstream.worker")


@dataclass
class Cursor:
    """Where the next read of a partition starts, and when it last claimed entries."""

    partition: int
    position: bytes = b"0"  # an entry id while re-reading own pending entries; ">" after
    last_claim: float = 0.0

    @property
    def draining(self) -> bool:
        """Still re-reading this consumer's own pending entries."""
        return self.position != b">"

    def rewind(self) -> None:
        self.position = b"0"


class StreamReader:
    """Reads and claims one consumer's entries of the partition streams."""

    def __init__(
        self, client: Client, keys, group: str, consumer: str, partitions: int,
        max_skew_ms: int = DEFAULT_MAX_TS_SKEW_MS, nodes: PartitionNodes | None = None,
    ) -> None:  # fmt: skip
        self.r = client
        self.nodes = nodes  # on a cluster, who holds each partition
        self.keys = keys
        self.group = group
        self.consumer = consumer
        self.partitions = partitions  # the count in force: an entry of another is misrouted
        self.max_skew_ms = max_skew_ms  # the timestamp rule's allowance (worker/common/events.py)
        # the fields the running models declare as inputs (set as models swap: engine/models.py)
        self.input_names: tuple[str, ...] = ()
        self.cluster = is_cluster(client)
        self._raw()

    def _raw(self) -> None:
        # Raw replies: redis-py's XAUTOCLAIM JUSTID parser drops the cursor and the deleted
        # ids, which we need; its XREADGROUP parser builds a dict per entry (~2 µs), which
        # parse_flat_entry does without.
        raw_replies(self.r, "XAUTOCLAIM", "XREADGROUP")

    def read_command(self, cursors: list[Cursor], count: int, block_ms: int | None) -> tuple:
        """The XREADGROUP command for these partitions (BLOCK only when none is draining)."""
        names = [self.keys.events(c.partition) for c in cursors]
        block = () if block_ms is None else ("BLOCK", block_ms)
        return ("XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count, *block,
                "STREAMS", *names, *(c.position for c in cursors))  # fmt: skip

    def read_groups(self, cursors: list[Cursor]) -> list[list[Cursor]]:
        """The cursors one XREADGROUP each may read together: all of them on one Redis, one
        partition each on a cluster (a command's keys must share a slot)."""
        if not cursors:
            return []
        return [[c] for c in cursors] if self.cluster else [list(cursors)]

    def read(self, cursors: list[Cursor], count: int, block_ms: int) -> list[Batch]:
        """One read over the partitions: a Batch per partition that returned entries."""
        if self.cluster:
            return self._read_per_partition(cursors, count)
        draining = any(c.draining for c in cursors)
        command = self.read_command(cursors, count, None if draining else block_ms)
        return self.batches(self.r.execute_command(*command), cursors)

    def _read_per_partition(self, cursors: list[Cursor], count: int) -> list[Batch]:
        """A cluster round's reads: each node's in one packed write on its connection (with
        `nodes`), every node's sent before any reply is read; the partitions of a node not
        connected yet, or that answered a redirect, through the cluster pipeline."""
        self._raw()  # nodes may have changed since the last round
        groups = self.read_groups(cursors)
        replies: dict[int, object] = {}
        rest = self._read_on_nodes(groups, count, replies) if self.nodes else range(len(groups))
        if rest:
            pipe = self.r.pipeline(transaction=False)
            for i in rest:
                pipe.execute_command(*self.read_command(groups[i], count, None))
            replies.update(zip(rest, pipe.execute(), strict=True))
        batches = []
        for i, group in enumerate(groups):
            batches += self.batches(replies[i], group)
        return batches

    def _read_on_nodes(self, groups: list[list[Cursor]], count: int, replies: dict) -> list[int]:
        """Read `groups` on their nodes' connections into `replies` (by group index); the
        indices left to the cluster client. A redirect means the read did not run."""
        assert self.nodes is not None
        by_node: dict[int, tuple[redis.Redis, list[int]]] = {}
        rest: list[int] = []
        for i, group in enumerate(groups):
            client = self.nodes.node_client(group[0].partition)
            if client is None:
                rest.append(i)
            else:
                by_node.setdefault(id(client), (client, []))[1].append(i)
        sent = []
        try:
            for client, idx in by_node.values():
                conn = client.connection_pool.get_connection()
                sent.append((client, conn))
                reads = (hiredis.pack_command(self.read_command(groups[i], count, None))
                         for i in idx)  # fmt: skip
                conn.send_packed_command([b"".join(reads)])
            for (_, conn), (_, idx) in zip(sent, by_node.values(), strict=True):
                for i in idx:
                    try:
                        replies[i] = conn.read_response()
                    except REDIRECTS:
                        rest.append(i)
        except BaseException:
            for _, conn in sent:
                conn.disconnect()  # replies may still be in flight on it
            raise
        finally:
            for client, conn in sent:
                client.connection_pool.release(conn)
        return rest

    def batches(self, reply, cursors: list[Cursor], size: int | None = None) -> list[Batch]:
        """Parse an XREADGROUP reply into Batches of at most `size` entries (one per
        partition that has entries when None), and move the draining cursors past what it
        returned."""
        # RESP3 (redis-py 8's default) answers a map, RESP2 a list of [stream, entries]
        pairs = reply.items() if isinstance(reply, dict) else reply or []
        by_stream = {name.decode(): entries for name, entries in pairs}
        out = []
        for c in cursors:
            entries = by_stream.get(self.keys.events(c.partition), [])
            if c.draining:
                c.position = entries[-1][0] if entries else b">"
            step = size or len(entries) or 1
            for i in range(0, len(entries), step):
                batch = entries[i : i + step]
                out.append(parse_batch(c.partition, batch, self.partitions, self.max_skew_ms,
                                       self.input_names))  # fmt: skip
        return out

    def claim(self, cursor: Cursor, min_idle_ms: int) -> int:
        """Move other consumers' pending entries of this partition idle at least
        min_idle_ms to us (ids only); rewind if any came. Returns how many entries were
        deleted while pending (never readable again)."""
        stream, start, deleted = self.keys.events(cursor.partition), "0-0", 0
        self._raw()
        while True:
            reply = self.r.execute_command(
                "XAUTOCLAIM", stream, self.group, self.consumer, min_idle_ms, start,
                "COUNT", 1000, "JUSTID",
            )  # fmt: skip
            start = reply[0].decode()
            deleted += len(reply[2]) if len(reply) > 2 else 0
            if reply[1]:
                cursor.rewind()
            if start == "0-0":
                break
        cursor.last_claim = time.monotonic()
        return deleted

    def ensure_group(self, p: int) -> bool:
        """Create the group if missing; True if it was created. It starts after the last
        acknowledged entry when Redis still records one (a deleted group), else from the
        start, so entries published before the first worker are scored too."""
        start = (self.r.get(self.keys.acked(p)) or b"0").decode()
        try:
            self.r.xgroup_create(self.keys.events(p), self.group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        log.info("created consumer group", extra={"partition": p, "group": self.group,
                                                  "from": start})  # fmt: skip
        return True
