"""Producer side: put events on the right partition stream, pipelined (SPEC §3).

Every event gets an `event_id` (the producer's own when given, else a fresh one), so a send
retried after a lost reply or a dropped connection is recognised by the worker as a
duplicate and never counted twice.
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
    return fields


def event_ids() -> Iterator[str]:
    """Unique event ids: a random prefix per call, then a counter (cheaper than uuid4)."""
    prefix = secrets.token_hex(8)
    return (f"{prefix}-{n}" for n in itertools.count())


# When each client last found the partition count in force: a producer calling publish() per
# event must not pay two more round trips per call, yet must notice a resize soon.
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
RECHECK_SECONDS = 10.0


def _check_partitions_now_and_then(client: redis.Redis, keys: Keys, partitions: int) -> None:
    """check_partitions, at most once per RECHECK_SECONDS per client, prefix and count."""
    seen = _CHECKED.setdefault(client, {})
    now = time.monotonic()
    if now - seen.get((keys.prefix, partitions), -RECHECK_SECONDS) >= RECHECK_SECONDS:
        check_partitions(client, keys, partitions)
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

    Events are validated first (EventError names a bad one) and given an event_id when they
    have none; sends go in pipelines of `pipeline_size` commands, one round trip each. A
    pipeline that fails on a connection error is sent again (up to `retries` times, with
    backoff): the worker drops the copies whose event_id it already applied.
    """
    keys = Keys(prefix)
    _check_partitions_now_and_then(client, keys, partitions)
    fresh = event_ids()
    ids: list[bytes] = []
    chunk: list[tuple[str, dict]] = []
    for item in events:
        event = item if isinstance(item, Event) else event_from_mapping(dict(item))
        if event.event_id is None:
            event = event.model_copy(update={"event_id": next(fresh)})
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
