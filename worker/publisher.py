"""Producer side: put events on the right partition stream, pipelined (SPEC §3)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import redis

from worker.events import Event, event_from_mapping
from worker.keys import Keys, partition_of


def entry_fields(event: Event) -> dict[str, str | int]:
    """The stream entry fields of an event: user_id, type and ts when known."""
    fields: dict[str, str | int] = {"user_id": event.user_id, "type": event.type}
    if event.ts is not None:
        fields["ts"] = event.ts
    return fields


def publish(
    client: redis.Redis,
    events: Iterable[Event | Mapping],
    prefix: str = "intentstream",
    partitions: int = 1,
    pipeline_size: int = 1000,
) -> list[bytes]:
    """XADD each event to its user's partition stream; return the entry ids in order.

    Events are validated first (EventError names a bad one); sends go in pipelines of
    `pipeline_size` commands, one round trip each.
    """
    keys = Keys(prefix)
    ids: list[bytes] = []
    pipe = client.pipeline(transaction=False)
    for item in events:
        event = item if isinstance(item, Event) else event_from_mapping(dict(item))
        pipe.xadd(keys.events(partition_of(event.user_id, partitions)), entry_fields(event))
        if len(pipe) >= pipeline_size:
            ids.extend(pipe.execute())
    if len(pipe):
        ids.extend(pipe.execute())
    return ids
