"""An endpoint's consumer group on the actions streams, as one sender (a consumer) uses it:
new entries, its own pending ones, entries left by a dead deliverer, acknowledgements."""

from __future__ import annotations

import redis

from worker.common.connection import Client, is_cluster
from worker.common.keys import Keys
from worker.webhooks.endpoints import Endpoint

# (partition, entry id, fields; None when the entry was trimmed while pending)
Entry = tuple[int, bytes, "dict[bytes, bytes] | None"]


class ActionsGroup:
    """One consumer's view of an endpoint's group on partitions 0..P-1."""

    def __init__(
        self, client: Client, keys: Keys, endpoint: Endpoint, partitions: int, consumer: str
    ) -> None:
        self.client, self.keys, self.endpoint = client, keys, endpoint
        self.consumer = consumer
        self.streams = {keys.actions(p).encode(): p for p in range(partitions)}
        self._claim_from = dict.fromkeys(range(partitions), "0-0")

    def ensure(self) -> None:
        """Create the group where missing, at the endpoint's start (MKSTREAM: the worker's
        first action may come later)."""
        for stream in self.streams:
            try:
                self.client.xgroup_create(
                    stream, self.endpoint.group, self.endpoint.start, mkstream=True
                )
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read(self, count: int, block_ms: int | None) -> list[Entry]:
        """Up to `count` new entries per partition, blocking up to block_ms."""
        return self._read_streams(dict.fromkeys(self.streams, b">"), count, block_ms)

    def read_own(self, count: int, after: dict[int, bytes]) -> list[Entry]:
        """This consumer's pending entries after `after` (partition -> entry id): what it
        read before a restart under the same name, or before a Redis error."""
        starts = {s: after.get(p, b"0-0") for s, p in self.streams.items()}
        return self._read_streams(starts, count, None)

    def _read_streams(self, starts: dict, count: int, block_ms: int | None) -> list[Entry]:
        if is_cluster(self.client):  # a command's keys share a slot: one read per partition
            out: list[Entry] = []
            for stream, start in starts.items():
                out += self._read({stream: start}, count, None)
            return out
        return self._read(starts, count, block_ms)

    def _read(self, streams: dict, count: int, block_ms: int | None) -> list[Entry]:
        reply = self.client.xreadgroup(
            self.endpoint.group, self.consumer, streams, count=count, block=block_ms
        )
        if isinstance(reply, dict):  # RESP3
            reply = [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
        return [
            (self.streams[s], eid, fields or None)
            for s, entries in reply or []
            for eid, fields in entries
        ]

    def claim_abandoned(self, min_idle_ms: int, count: int) -> list[Entry]:
        """Entries another consumer has left pending at least min_idle_ms (a deliverer that
        died), now this consumer's; one XAUTOCLAIM step per partition, resumed next time."""
        out: list[Entry] = []
        for stream, p in self.streams.items():
            reply = self.client.xautoclaim(
                stream,
                self.endpoint.group,
                self.consumer,
                min_idle_ms,
                self._claim_from[p],
                count=count,
            )
            cursor, claimed = reply[0], reply[1]
            deleted = reply[2] if len(reply) > 2 else []
            self._claim_from[p] = cursor
            out += [(p, eid, fields or None) for eid, fields in claimed]
            out += [(p, eid, None) for eid in deleted]
        return out

    def touch(self, ids: dict[int, list[bytes]]) -> None:
        """Reset the idle time of entries this consumer still works on, so no other
        deliverer takes them over (XCLAIM to itself, JUSTID)."""
        pipe = self.client.pipeline(transaction=False)
        for p, entry_ids in ids.items():
            if entry_ids:
                pipe.xclaim(
                    self.keys.actions(p),
                    self.endpoint.group,
                    self.consumer,
                    0,
                    entry_ids,
                    justid=True,
                )
        pipe.execute()

    def ack(self, ids: dict[int, list[bytes]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for p, entry_ids in ids.items():
            if entry_ids:
                pipe.xack(self.keys.actions(p), self.endpoint.group, *entry_ids)
        pipe.execute()

    def oldest_ms(self) -> int | None:
        """The commit time (ms) of the oldest entry not yet delivered, pending or unread, over
        every partition; None when none waits."""
        found: list[int] = []
        for stream in self.streams:
            summary = self.client.xpending(stream, self.endpoint.group)
            if summary.get("pending"):
                found.append(_ms(summary["min"]))
            last = _last_delivered(self.client.xinfo_groups(stream), self.endpoint.group)
            if last is not None:
                unread = self.client.xrange(stream, min=b"(" + last, count=1)
                if unread:
                    found.append(_ms(unread[0][0]))
        return min(found) if found else None


def _ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


def _last_delivered(groups: list[dict], name: str) -> bytes | None:
    for g in groups:
        gname = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
        if gname == name:
            last = g["last-delivered-id"]
            return last if isinstance(last, bytes) else str(last).encode()
    return None
