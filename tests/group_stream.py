"""Partition 0's event stream with the workers' group on a test Redis: the entries and the
group state the lag and seek tests start from."""

from __future__ import annotations

import redis

from worker.common.keys import Keys

KEYS = Keys()
STREAM = KEYS.events(0)
GROUP = "intentstream-workers"


def fill(r: redis.Redis, n: int, read: int, noack: bool = False) -> list[bytes]:
    """n entries, the group created at 0 and `read` of them delivered to consumer "c"
    (pending, or not when `noack`)."""
    ids = [r.xadd(STREAM, {"user_id": f"u{i}", "type": "view"}) for i in range(n)]
    r.xgroup_create(STREAM, GROUP, id="0")
    if read:
        r.xreadgroup(GROUP, "c", {STREAM: ">"}, count=read, noack=noack)
    return ids


def group(r: redis.Redis) -> dict:
    """The workers' group's XINFO GROUPS entry."""
    return next(g for g in r.xinfo_groups(STREAM) if g["name"] == GROUP.encode())
