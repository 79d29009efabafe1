"""Producer side: put events on the right partition stream, pipelined (SPEC §3).

Every event is stamped `producer: <id>:<seq>`, an id per publish() call and a sequence
rising in send order, and gets an `event_id` (the caller's own when given, else
`<id>-<seq>`). A pipeline resent after a lost reply or a dropped connection repeats the
stamps, so the worker recognises every copy, whatever the resend's size (worker/dedup.py).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping

import redis

from worker.events import Event, event_from_mapping
from worker.keys import Keys, partition_of
from worker.partitions import check_partitions

log = logging.getLogger("intentstream.publish")

RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def entry_fields(event: Event) -> dict[str, str | int]:
    """The stream entry fields of an event: user_id, type, ts when known, event_id."""
    fields: dict[str, str | int] = {"user_id": event.user_id, "type": event.type}
    if event.ts is not None:
        fields["ts"] = event.ts
    if event.event_id is not None:
        fields["event_id"] = event.event_id
    if event.producer is not None:
        fields["producer"] = event.producer
    return fields


def stamps() -> Iterator[tuple[str, str]]:
    """(producer stamp, generated event id) pairs: a random producer id per call, then a
    rising sequence (cheaper than uuid4)."""
    producer = secrets.token_hex(8)
    return ((f"{producer}:{n}", f"{producer}-{n}") for n in itertools.count(1))


# When each client last found the partition count in force: a producer calling publish() per
# event must not pay two more round trips per call, yet must notice a resize soon.
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
RECHECK_SECONDS = 10.0


def _check_partitions_now_and_then(client: redis.Redis, keys: Keys, partitions: int) -> None:
    """check_partitions, at most once per RECHECK_SECONDS per client, prefix and count."""
    seen = _CHECKED.setdefault(client, {})
    now = time.monotonic()
    if now - seen.get((keys.prefix, partitions), -RECHECK_SECONDS) >= RECHECK_SECONDS:
        check_partitions(client, keys, partitions, record=False)
        seen[(keys.prefix, partitions)] = now


def publish(
    client: redis.Redis,
    events: Iterable[Event | Mapping],
    prefix: str = "intentstream",
    partitions: int = 1,
    pipeline_size: int = 1000,
    retries: int = 5,
) -> list[bytes]:
    """XADD each event to its user's partition stream; return the entry ids in order.

    Events are validated first (EventError names a bad one), stamped with this call's
    producer id and sequence, and given an event_id when they have none; sends go in
    pipelines of `pipeline_size` commands, one round trip each. A pipeline that fails on a
    connection error is sent again (up to `retries` times, with backoff): the worker drops
    every copy it already applied, by the stamps. Concurrent calls use different producer
    ids, so they may share a client.
    """
    keys = Keys(prefix)
    _check_partitions_now_and_then(client, keys, partitions)
    fresh = stamps()
    ids: list[bytes] = []
    chunk: list[tuple[str, dict]] = []
    for item in events:
        event = item if isinstance(item, Event) else event_from_mapping(dict(item))
        stamp, generated = next(fresh)
        event = event.model_copy(
            update={"producer": stamp, "event_id": event.event_id or generated}
        )
        chunk.append((keys.events(partition_of(event.user_id, partitions)), entry_fields(event)))
        if len(chunk) >= pipeline_size:
            ids.extend(_send(client, chunk, retries))
            chunk = []
    if chunk:
        ids.extend(_send(client, chunk, retries))
    return ids


def _send(client: redis.Redis, chunk: list[tuple[str, dict]], retries: int) -> list[bytes]:
    """XADD a chunk in one pipeline, sending it again after connection errors."""
    for attempt in range(retries + 1):
        pipe = client.pipeline(transaction=False)
        for stream, fields in chunk:
            pipe.xadd(stream, fields)
        try:
            return pipe.execute()
        except RETRY_ERRORS as exc:
            if attempt == retries:
                raise
            delay = min(2.0, 0.05 * 2**attempt)
            log.warning("publish failed; sending again", extra={"error": str(exc),
                                                                "retry_in_s": delay})  # fmt: skip
            time.sleep(delay)
    raise AssertionError("unreachable")
