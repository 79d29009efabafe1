"""Which Redis node holds a partition, and a client of that node alone.

A partition's keys share its hash tag, so on a Redis Cluster they all live in one slot, on
the primary that serves it; on one Redis every partition is on the one server. The read-ahead
(engine/readahead.py) pipelines a commit with reads on one connection, so it may only read
the partitions of the commit's node.

The node is the one of the client's slot map as last read: after a resharding or a failover
it may be stale, and a command sent there is answered MOVED (or ASK, TRYAGAIN) or fails to
connect; the caller falls back to the cluster client, which follows them.
"""

from __future__ import annotations

import redis

from worker.common.connection import Client, is_cluster
from worker.common.keys import Keys

ONE_REDIS = ""  # the node name of every partition on one Redis

# Replies that say a cluster node does not serve the command's slot (now): the command did
# not run, and its reply was read whole. MovedError is an AskError.
REDIRECTS = (redis.exceptions.AskError, redis.exceptions.TryAgainError)


class PartitionNodes:
    """The node of each partition, by the client's slot map, and a client of it."""

    def __init__(self, client: Client, keys: Keys) -> None:
        self.r = client
        self.keys = keys
        self.cluster = is_cluster(client)

    def name(self, p: int) -> str:
        """The node that holds partition p ("host:port"; ONE_REDIS on one Redis)."""
        return self._node(p).name if self.cluster else ONE_REDIS

    def client(self, p: int) -> redis.Redis:
        """A client of the node that holds partition p only (the client on one Redis)."""
        if not self.cluster:
            return self.r
        node = self._node(p)
        if node.redis_connection is None:  # a node the map lists but never connected
            raise redis.ConnectionError(f"no connection to cluster node {node.name}")
        return node.redis_connection

    def node_client(self, p: int) -> redis.Redis | None:
        """`client(p)` on a cluster; None on one Redis, or when the slot map names a node
        not connected yet (the cluster client then reaches it)."""
        if not self.cluster:
            return None
        try:
            return self.client(p)
        except redis.ConnectionError:
            return None

    def grouped(self, parts: list[int]) -> dict[str, list[int]]:
        """`parts` by the node that holds them, each node's in their order."""
        out: dict[str, list[int]] = {}
        for p in parts:
            out.setdefault(self.name(p), []).append(p)
        return out

    def on_node(self, node: str, parts: list[int]) -> list[int]:
        """The partitions of `parts` held by `node`, in their order."""
        if not self.cluster:
            return list(parts)
        return [p for p in parts if self.name(p) == node]

    def _node(self, p: int):
        return self.r.get_node_from_key(self.keys.events(p))
