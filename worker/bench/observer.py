"""The latency a reader of the scores sees, to the µs: a process of its own blocks on the score
streams (XREAD) and takes, for each score of an event whose event_id carries its send time
(`sent_id`), the time from that send to the entry's arrival here.

The bench's other latency, from an event's entry id to its score entry's id, counts whole
ms of Redis's clock: at low traffic, where a round takes one or two ms, it can only say 1 or
2 and reads a p50 between them from their shares. Here both ends are this machine's clock
in µs, and the span is what a shop waiting for the score of the click it just sent waits:
its own send, the worker's round, the reader's wake-up (the same at any partition count).
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import Connection

import hiredis
import numpy as np
import redis

from worker.common.entry_ids import entry_id as entry_id_of

PREFIX = b"seen-"


def sent_id(n: int) -> str:
    """An event_id that carries its send time (now, µs) and a number that makes it unique."""
    return f"seen-{time.time_ns() // 1000}-{n}"


def sent_us(event_id: bytes) -> int | None:
    """The send time a `sent_id` carries, else None."""
    if not event_id.startswith(PREFIX):
        return None
    return int(event_id.split(b"-")[1])


def _observe(url: str, starts: dict[str, bytes], out: Connection) -> None:
    """Read the streams after `starts` until told to stop; send back the latencies, µs."""
    r = redis.Redis.from_url(url)
    last = dict(starts)
    seen: list[int] = []
    out.send("ready")
    while True:
        stopping = out.poll()  # then every score is in: read what is left, without waiting
        got = entries_after(r, last, None if stopping else 100)
        now = time.time_ns() // 1000
        for stream, entries in got:
            for _, fields in entries:
                sent = sent_us(fields.get(b"event_id", b""))
                if sent is not None:
                    seen.append(now - sent)
            last[stream.decode()] = entries[-1][0]
        if stopping and not got:
            break
    out.recv()
    out.send(seen)


def entries_after(r: redis.Redis, last: dict[str, bytes], block_ms: int | None) -> list:
    """The entries after `last`, by stream: a blocking XREAD with a plain one behind it in one
    send, as the worker reads. Why: Redis answers a blocked XREAD with the entries of the first
    stream written alone; the worker's one transaction writes the scores of every partition of
    its round, and a second read after the answer would cost this reader a round trip more
    at more partitions, which is the reader's, not the worker's."""
    streams = [*last.keys(), *last.values()]
    plain = ("XREAD", "STREAMS", *streams)
    commands = [plain] if block_ms is None else [("XREAD", "BLOCK", block_ms, *plain[1:]), plain]
    conn = r.connection_pool.get_connection()
    try:
        conn.send_packed_command([b"".join(hiredis.pack_command(c) for c in commands)])
        replies = [conn.read_response() for _ in commands]
    finally:
        r.connection_pool.release(conn)
    got: dict = {}
    for reply in replies:
        for stream, entries in reply.items() if isinstance(reply, dict) else reply or []:
            known = got.setdefault(stream, [])
            after = known[-1][0] if known else b""
            known.extend(
                (entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))
                for entry_id, flat in entries
                if not after or entry_id_of(entry_id) > entry_id_of(after)
            )
    return list(got.items())


class Observer:
    """The reading process, started before the events are sent, stopped after they scored."""

    def __init__(self, url: str, starts: dict[str, bytes]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_observe, args=(url, starts, theirs), daemon=True)
        self._proc.start()
        theirs.close()
        if not self._conn.poll(60) or self._conn.recv() != "ready":
            raise RuntimeError("the score observer did not start")

    def stop(self) -> np.ndarray:
        """The latencies seen, ms (float)."""
        self._conn.send("stop")
        if not self._conn.poll(60):
            self._proc.kill()
            raise RuntimeError("the score observer did not report")
        seen = self._conn.recv()
        self._proc.join(10)
        return np.asarray(seen, np.float64) / 1000.0
