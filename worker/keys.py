"""Redis key names of the streams, states and worker coordination (SPEC §3-§4).

The model registry's keys (`{prefix}:model:...`) are named in worker/registry.py.

Every key of partition p carries the hash tag `{p}`, so a partition's stream, states, scores
and dead letters live in one Redis Cluster slot and one Lua script may touch them all.
"""

from __future__ import annotations

import zlib


def partition_of(user_id: str, partitions: int) -> int:
    """The partition of a user: crc32 of the UTF-8 user id, mod the number of partitions."""
    return zlib.crc32(user_id.encode("utf-8")) % partitions


class Keys:
    """Key names under one prefix."""

    def __init__(self, prefix: str = "intentstream") -> None:
        self.prefix = prefix

    def events(self, p: int) -> str:
        return f"{self.prefix}:events:{{{p}}}"

    def scores(self, p: int) -> str:
        return f"{self.prefix}:scores:{{{p}}}"

    def deadletter(self, p: int) -> str:
        return f"{self.prefix}:deadletter:{{{p}}}"

    def state(self, p: int, user_id: str) -> str:
        return f"{self.prefix}:state:{{{p}}}:{user_id}"

    def lease(self, p: int) -> str:
        return f"{self.prefix}:lease:{{{p}}}"

    def acked(self, p: int) -> str:
        return f"{self.prefix}:acked:{{{p}}}"

    def commit_seq(self, p: int) -> str:
        return f"{self.prefix}:seq:{{{p}}}"

    def state_prefix(self, p: int) -> str:
        return f"{self.prefix}:state:{{{p}}}:"

    @property
    def workers(self) -> str:
        """Sorted set of live worker processes (lease holder tokens), scored by expiry."""
        return f"{self.prefix}:workers"
