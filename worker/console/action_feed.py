"""The newest actions of every partition (one XREVRANGE each, pipelined), merged newest
first, with their reasons."""

from __future__ import annotations

import json

from worker.common.connection import Client
from worker.common.entry_ids import entry_id
from worker.common.keys import Keys
from worker.common.partition_count import recorded_partitions

FIELDS = ("user_id", "rule", "score", "event_id", "ts", "model")


def entry_order(entry: str) -> tuple[int, int]:
    """An entry id's (ms, seq), as a sort key."""
    return entry_id(entry.encode())


def newest_actions(client: Client, keys: Keys, count: int = 50, after: str = "") -> list[dict]:
    """Up to `count` newest actions over all partitions, newest first; with `after` (an
    entry id), only those newer than it (the feed's poll)."""
    partitions = recorded_partitions(client, keys) or 1
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xrevrange(keys.actions(p), "+", f"({after}" if after else "-", count=count)
    rows = []
    for p, entries in enumerate(pipe.execute()):
        for raw_id, fields in entries:
            row = {k: fields.get(k.encode(), b"").decode(errors="replace") for k in FIELDS}
            try:
                reasons = json.loads(fields.get(b"reasons", b"[]"))
            except ValueError:
                reasons = []
            rows.append(row | {"id": raw_id.decode(), "partition": p, "reasons": reasons})
    rows.sort(key=lambda r: entry_order(r["id"]), reverse=True)
    return rows[:count]
