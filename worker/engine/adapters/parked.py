"""Blocking reads of idle partitions on a Redis Cluster, left in flight while the worker does
other work, and collected once Redis answers (entries, or nil when block-ms passed).

One Redis blocks one XREADGROUP over every partition; on a cluster a command's keys share a
slot, and a partition is a slot, so each idle partition gets a read of its own, on a
connection of its own to its node. A parked partition is read by nothing else. Letting one go
without its reply (a lost lease, a rewind, a stop) disconnects it: what it may have delivered
was not committed, so its cursor is rewound and that is read again, in order, after the
partition's last commit.
"""

from __future__ import annotations

import selectors
from dataclasses import dataclass

import redis

from worker.engine.adapters.streams import Cursor, StreamReader
from worker.engine.compute.batch import Batch


@dataclass
class _Parked:
    """A partition's read in flight, on the connection it holds."""

    cursor: Cursor
    pool: redis.ConnectionPool
    conn: redis.connection.AbstractConnection


class ParkedReads:
    """The partitions with a blocking read in flight, each on its own connection."""

    def __init__(self, reader: StreamReader) -> None:
        self.reader = reader
        self._parked: dict[int, _Parked] = {}

    def __contains__(self, p: int) -> bool:
        return p in self._parked

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, node: redis.Redis, cursor: Cursor, count: int, block_ms: int) -> None:
        """Send a blocking read of new entries of a partition to `node`, which holds it."""
        pool = node.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([self.reader.packed_read([cursor], count, block_ms)])
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        self._parked[cursor.partition] = _Parked(cursor, pool, conn)

    def collect(self, timeout: float, size: int) -> list[Batch]:
        """The batches of the reads Redis answered, waiting up to `timeout` s for one; the
        partitions answered are parked no more."""
        if not self._parked:
            return []
        with selectors.DefaultSelector() as sel:
            for p, parked in self._parked.items():
                sel.register(parked.conn._sock, selectors.EVENT_READ, p)
            ready = sorted(key.data for key, _ in sel.select(timeout))
        batches = []
        for p in ready:
            batches += self._answer(self._parked.pop(p), size)
        return batches

    def _answer(self, parked: _Parked, size: int) -> list[Batch]:
        try:
            reply = parked.conn.read_response()
        except redis.ResponseError:
            parked.pool.release(parked.conn)  # read whole (NOGROUP, MOVED): still usable
            raise
        except BaseException:
            self._drop(parked)
            raise
        parked.pool.release(parked.conn)
        return self.reader.batches(reply, [parked.cursor], size)

    def release(self, p: int) -> None:
        """Let a partition's read go unanswered (see the module's docstring)."""
        parked = self._parked.pop(p, None)
        if parked is not None:
            self._drop(parked)

    def release_all(self) -> None:
        for p in list(self._parked):
            self.release(p)

    @staticmethod
    def _drop(parked: _Parked) -> None:
        parked.conn.disconnect()
        parked.pool.release(parked.conn)
        parked.cursor.rewind()
