"""Producer side: put events on the right partition stream, pipelined (docs/contract.md,
Events in), through
the producers' function where a worker installed it (worker/common/append_function.py).

Every event is stamped `producer: <id>:<seq>`, an id per publish() call and a sequence
rising in send order, and gets an `event_id` (the caller's own when given, else
`<id>-<seq>`). A pipeline resent after a lost reply or a dropped connection repeats the
stamps, so the worker recognises every copy, whatever the resend's size (worker/common/dedup.py).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import redis

from worker.common.append_function import call_args, unavailable
from worker.common.events import Event, event_from_mapping
from worker.common.keys import Keys, partition_of
from worker.common.partitions import check_partitions

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


# What each client has learned under each prefix: the partition count in force (told by a
# refusal), whether the producers' function is loaded, and when the count was last checked
# without it. A producer calling publish() per event must not pay more round trips per call.
_LEARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
RECHECK_SECONDS = 10.0
RESIZE_WAIT_SECONDS = 600.0  # how long a write waits out `partitions resize`


@dataclass
class _Route:
    partitions: int | None = None  # the count in force, once a refusal named it
    function: bool = True  # the producers' function answers (else plain XADD)
    checked: float = 0.0  # when it last found no function (and checked the count instead)
    reached: bool = False  # Redis answered this client once: later failures are retried


class PublishError(Exception):
    """A write that cannot go through (a resize that does not finish)."""


def _route_of(client: redis.Redis, prefix: str) -> _Route:
    return _LEARNED.setdefault(client, {}).setdefault(prefix, _Route())


def publish(
    client: redis.Redis,
    events: Iterable[Event | Mapping],
    prefix: str = "intentstream",
    partitions: int = 1,
    pipeline_size: int = 1000,
    retries: int = 5,
) -> list[bytes]:
    """Append each event to its user's partition stream; return the entry ids in order.

    Events are validated first (EventError names a bad one), stamped with this call's
    producer id and sequence, and given an event_id when they have none; sends go in
    pipelines of `pipeline_size` events, one round trip each, through the producers'
    function (worker/common/append_function.py), one call per partition. A write routed with a
    stale partition count is refused there and re-routed with the count in force; during a
    resize it waits. Without the function (no worker has installed it yet) events go by
    XADD, and the count is checked every 10 s. A pipeline that fails on a connection error
    is sent again (up to `retries` times, with backoff): the worker drops every copy it
    already applied, by the stamps. Concurrent calls use different producer ids, so they
    may share a client.
    """
    keys = Keys(prefix)
    route = _route_of(client, prefix)
    if not route.reached:  # an unreachable Redis at the start is an error, not a retry
        client.ping()
        route.reached = True
    fresh = stamps()
    ids: list[bytes] = []
    chunk: list[tuple[str, dict]] = []
    for item in events:
        event = item if isinstance(item, Event) else event_from_mapping(dict(item))
        stamp, generated = next(fresh)
        own_id = event.event_id or generated
        event = event.model_copy(update={"producer": stamp, "event_id": own_id})
        chunk.append((event.user_id, entry_fields(event)))
        if len(chunk) >= pipeline_size:
            ids.extend(_send(client, keys, route, partitions, chunk, retries))
            chunk = []
    if chunk:
        ids.extend(_send(client, keys, route, partitions, chunk, retries))
    return ids


def _by_partition(chunk: list[tuple[str, dict]], todo: list[int], count: int) -> dict:
    """The events still to send, grouped by their partition under `count`, in order."""
    groups: dict[int, list[int]] = {}
    for i in todo:
        groups.setdefault(partition_of(chunk[i][0], count), []).append(i)
    return groups


def _send(
    client: redis.Redis, keys: Keys, route: _Route, partitions: int,
    chunk: list[tuple[str, dict]], retries: int,
) -> list[bytes]:  # fmt: skip
    """Append a chunk, re-routing what a stale count sent astray and sending everything
    not answered again after connection errors; the entry ids in order."""
    out: list = [None] * len(chunk)
    todo = list(range(len(chunk)))
    failures, waited = 0, 0.0
    while todo:
        count = route.partitions or partitions
        if not route.function and time.monotonic() - route.checked >= RECHECK_SECONDS:
            route.function = True  # a worker may have installed it since: try it again
        groups = _by_partition(chunk, todo, count)
        pipe = client.pipeline(transaction=False)
        for p, rows in groups.items():
            if route.function:
                pipe.execute_command(
                    "FCALL", *call_args(keys, p, count, [chunk[i][1] for i in rows])
                )
            else:
                for i in rows:
                    pipe.xadd(keys.events(p), chunk[i][1])
        try:
            replies = pipe.execute(raise_on_error=False)
        except RETRY_ERRORS as exc:
            failures += 1
            if failures > retries:
                raise
            delay = min(2.0, 0.05 * 2 ** (failures - 1))
            log.warning("publish failed; sending again", extra={"error": str(exc),
                                                                "retry_in_s": delay})  # fmt: skip
            time.sleep(delay)
            continue
        if not route.function:
            for i, reply in zip(
                (i for rows in groups.values() for i in rows), replies, strict=True
            ):
                if isinstance(reply, Exception):
                    raise reply
                out[i] = reply
            return out
        todo, resizing = [], False
        for (_, rows), reply in zip(groups.items(), replies, strict=True):
            if not isinstance(reply, Exception):
                for i, entry_id in zip(rows, reply, strict=True):
                    out[i] = entry_id
                continue
            message = str(reply)
            if message.startswith("STALE "):
                route.partitions = int(message.split()[1])
            elif message.startswith("RESIZING"):
                resizing = True
            elif unavailable(reply):
                if route.function:  # from now on XADD, checking the count now and then
                    check_partitions(client, keys, count, record=False)
                    route.function, route.checked = False, time.monotonic()
            else:
                raise reply
            todo += rows
        if resizing and todo:
            if waited >= RESIZE_WAIT_SECONDS:
                raise PublishError(
                    f"the partition count under prefix {keys.prefix!r} has been changing for "
                    f"{waited:.0f} s: finish `intentstream partitions resize`"
                )
            time.sleep(0.2)
            waited += 0.2
        todo.sort()
    return out
