"""Each delivery waiting for a retry, kept in Redis: its failures so far and when it is due
(`{prefix}:webhooks:retry:<name>:{p}`, a hash by entry id), so that a deliverer restarted, or
one taking over a dead one's entries, goes on with the backoff instead of starting it again."""

from __future__ import annotations

import re

from worker.common.connection import Client
from worker.common.keys import Keys

# "<failures>:<due ms>", as written below; anything else read back is ignored
RECORD = re.compile(rb"(\d{1,6}):(\d{1,15})")

# (partition, entry id) -> (failures, due in epoch seconds)
Records = dict[tuple[int, bytes], tuple[int, float]]


class RetryBook:
    """One sender's changes to its endpoint's retry records, written by `queue` on the
    pipeline that precedes the acknowledgements."""

    def __init__(self, keys: Keys, name: str) -> None:
        self.keys, self.name = keys, name
        self.changes: dict[tuple[int, bytes], bytes | None] = {}  # None: delete

    def failed(self, p: int, eid: bytes, failures: int, due: float) -> None:
        self.changes[(p, eid)] = b"%d:%d" % (failures, int(due * 1000))

    def settled(self, p: int, eid: bytes) -> None:
        """Delivered or dead-lettered after a failure: its record goes (before the XACK: a
        crash between the two retries it from the first wait, never keeps a stale record)."""
        self.changes[(p, eid)] = None

    def queue(self, pipe) -> bool:
        """Queue the changes on a pipeline; whether there were any."""
        for (p, eid), value in self.changes.items():
            key = self.keys.webhook_retries(self.name, p)
            if value is None:
                pipe.hdel(key, eid)
            else:
                pipe.hset(key, eid, value)
        had = bool(self.changes)
        self.changes = {}
        return had

    def load(self, client: Client, entries: list[tuple[int, bytes]]) -> Records:
        """The records of entries read again (pending before: a restart, a take-over)."""
        by_p: dict[int, list[bytes]] = {}
        for p, eid in entries:
            by_p.setdefault(p, []).append(eid)
        if not by_p:
            return {}
        pipe = client.pipeline(transaction=False)
        for p, ids in by_p.items():
            pipe.hmget(self.keys.webhook_retries(self.name, p), ids)
        found: Records = {}
        for (p, ids), values in zip(by_p.items(), pipe.execute(), strict=True):
            for eid, raw in zip(ids, values, strict=True):
                match = RECORD.fullmatch(raw) if raw else None
                if match and int(match[1]) > 0:
                    found[(p, eid)] = (int(match[1]), int(match[2]) / 1000)
        return found
