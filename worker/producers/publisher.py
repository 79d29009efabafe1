"""Producer side: put events on the right partition stream, pipelined (docs/contract.md,
Events in), through
the producers' function where a worker installed it (worker/producers/append_function.py).

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

import hiredis
import redis

from worker.common.connection import REDIS_DOWN, packed_replies
from worker.common.events import (
    EVENT_FIELDS,
    MAX_INPUT_BYTES,
    Event,
    EventError,
    EventFields,
    event_from_mapping,
    fast_event,
    input_text,
)
from worker.common.keys import Keys, partition_of
from worker.common.partition_count import ResizeUnfinishedError, check_partitions
from worker.producers.append_function import (
    LIBRARY,
    call_args,
    install,
    many_args,
    unavailable,
)

log = logging.getLogger("intentstream.publish")


def entry_fields(
    event: Event, extra: Mapping[str, bytes] | None = None, stamp: tuple[str, str] | None = None
) -> dict:
    """The stream entry fields of an event: user_id, type, ts when known, event_id, the
    producer's stamp, then its other fields (`other_fields`), which models may declare as
    inputs. `stamp`: publish()'s (producer stamp, generated event id), in place of the
    event's own producer and beside its event_id (the generated one when it has none)."""
    return fields_of(_own_fields(event), extra, stamp)


def fields_of(
    own: EventFields, extra: Mapping[str, bytes] | None = None,
    stamp: tuple[str, str] | None = None,
) -> dict:  # fmt: skip
    """`entry_fields` of an event's own fields (user_id, type, ts, event_id, producer)."""
    user_id, type_, ts, event_id, producer = own
    fields: dict = {"user_id": user_id, "type": type_}
    if ts is not None:
        fields["ts"] = ts
    if stamp is not None:  # not a model_copy: ~8 µs an event, most of a small publish's Python
        producer, event_id = stamp[0], event_id or stamp[1]
    if event_id is not None:
        fields["event_id"] = event_id
    if producer is not None:
        fields["producer"] = producer
    if extra:
        fields.update(extra)
    return fields


def _own_fields(event: Event) -> EventFields:
    return event.user_id, event.type, event.ts, event.event_id, event.producer


MAX_OTHER_FIELDS = 64  # an event's fields beyond its own: a shop's few, not a document


def other_fields(doc: Mapping) -> dict[str, bytes]:
    """An event mapping's fields beyond the event's own, as entry values (`input_text`: what
    the worker, `score` and training read alike); null, empty, an object, a list or a value
    over MAX_INPUT_BYTES is left out, as the worker would read it as absent. EventError for
    a name that is not text and for more than MAX_OTHER_FIELDS of them."""
    out: dict[str, bytes] = {}
    for name, value in doc.items():
        if not isinstance(name, str):
            raise EventError(f"field name {name!r}: not text")
        if name in EVENT_FIELDS:
            continue
        text = (value or None) if isinstance(value, bytes) else input_text(value)
        if text is not None and len(text) <= MAX_INPUT_BYTES:
            out[name] = text
    if len(out) > MAX_OTHER_FIELDS:
        raise EventError(f"{len(out)} fields beyond the event's own; at most {MAX_OTHER_FIELDS}")
    return out


def stamps() -> Iterator[tuple[str, str]]:
    """(producer stamp, generated event id) pairs: a random producer id per call, then a
    rising sequence (cheaper than uuid4)."""
    producer = secrets.token_hex(8)
    return ((f"{producer}:{n}", f"{producer}-{n}") for n in itertools.count(1))


# What each client has learned under each prefix: the partition count in force (told by a
# refusal), whether the producers' function is loaded, and when the count was last checked
# without it. A producer calling publish() per event must not pay more round trips per call.
_LEARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
RECHECK_SECONDS = 10.0  # a Redis without functions (before 7.0): how often to try again
RESIZE_WAIT_SECONDS = 600.0  # how long a write waits out `partitions resize`


@dataclass
class _Route:
    partitions: int | None = None  # the count in force, once a refusal named it
    function: bool = True  # the producers' function answers (else plain XADD)
    checked: float = 0.0  # when it last found no FUNCTION command (Redis before 7.0)
    no_functions: bool = False  # Redis has no functions at all: tried every RECHECK_SECONDS
    warned: bool = False  # the fallback's warning was logged (once per client and prefix)
    reached: bool = False  # Redis answered this client once: later failures are retried
    many_failed: float = -RECHECK_SECONDS  # when the one-call function was last not found

    def one_call(self, client: redis.Redis | redis.RedisCluster, partitions: int) -> bool:
        """Whether a pipeline's events of several partitions go in one FCALL: through the
        function, on one Redis (a cluster's call holds one slot), unless that function was
        not found in the last RECHECK_SECONDS (a worker of an older version loaded its
        library: one call a partition then)."""
        return (
            self.function and partitions > 1 and isinstance(client, redis.Redis)
            and time.monotonic() - self.many_failed >= RECHECK_SECONDS
        )  # fmt: skip


class PublishError(Exception):
    """A write that cannot go through (a resize that does not finish)."""


def _load_function(client: redis.Redis, keys: Keys, reply: Exception, warn: bool) -> bool:
    """The producers' function is not loaded (no worker has run yet, or functions were
    flushed): load it, so this write and every later one are checked against the partition
    count in force. False on a Redis without functions (before 7.0) and for a named ACL
    user (the shipped `producer` may not load it): plain XADD then, as before the first
    worker, with a warning, since events sent by it across a resize may land on the wrong
    partition (dead-lettered `misrouted` by the worker)."""
    if "unknown command" in str(reply):
        return False
    # A named ACL user (the shipped `producer`) is not tried: it may not load functions, and
    # a refusal would land in Redis's ACL LOG; the default user (no ACLs in use) is.
    if not _named_user(client) and install(client):
        log.info("loaded the producers' function (no worker had yet)")
        return True
    if warn:
        log.warning(
            f"the producers' function {LIBRARY} is not loaded under prefix {keys.prefix!r} "
            "and this user does not load it (a named ACL user, or one refused): writing by "
            "plain XADD until a worker or a resize loads it (tried first on every pipeline, "
            "so the writes take the checked path from the first pipeline after)"
        )
    return False


def _named_user(client: redis.Redis) -> bool:
    """Whether the client logs in as a named ACL user."""
    try:
        return bool(client.get_connection_kwargs().get("username"))
    except AttributeError:  # a client without connection kwargs: as a named user
        return True


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
    producer id and sequence, and given an event_id when they have none; a mapping's other
    fields (a product, a price: what models declare as inputs) travel with it as
    `other_fields` writes them. Sends go in
    pipelines of `pipeline_size` events, one round trip each, through the producers'
    function (worker/producers/append_function.py), one call per partition. A write routed with a
    stale partition count is refused there and re-routed with the count in force; during a
    resize it waits. A function not loaded yet (no worker has run) is loaded here; where it
    cannot be (a user who may not, a Redis before 7.0) events go by XADD, the count is
    checked and the function tried again every 10 s. A pipeline that fails on a connection error
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
        if isinstance(item, Event):
            own, extra = _own_fields(item), None
        else:
            doc = dict(item)
            own = fast_event(doc) or _own_fields(event_from_mapping(doc))
            extra = other_fields(doc)
        chunk.append((own[0], fields_of(own, extra, next(fresh))))
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
    not answered again after connection errors; the entry ids in order. Each chunk tries
    the producers' function first (a worker or a resize may have loaded it since the last)."""
    out: list = [None] * len(chunk)
    todo = list(range(len(chunk)))
    failures, waited = 0, 0.0
    if not route.function and (
        not route.no_functions or time.monotonic() - route.checked >= RECHECK_SECONDS
    ):
        # a worker or a resize may have loaded it since: every pipeline tries it first,
        # so none goes by XADD once a resize has begun (it loads the function first)
        route.function = True
    while todo:
        count = route.partitions or partitions
        groups = _by_partition(chunk, todo, count)
        one_call = route.one_call(client, len(groups))
        try:
            replies = _executed(client, _commands(keys, route, count, chunk, groups, one_call))
        except REDIS_DOWN as exc:
            failures += 1
            if failures > retries:
                raise
            delay = min(2.0, 0.05 * 2 ** (failures - 1))
            log.warning("publish failed; sending again", extra={"error": str(exc),
                                                                "retry_in_s": delay})  # fmt: skip
            time.sleep(delay)
            continue
        if one_call:
            reply = replies[0]
            if isinstance(reply, redis.ResponseError) and unavailable(reply):
                route.many_failed = time.monotonic()  # sent again, a call a partition
                continue
            # refused whole (a stale count, a resize) or applied whole: its ids by partition
            replies = reply if isinstance(reply, list) else [reply] * len(groups)
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
                if route.function:
                    loaded = _load_function(client, keys, reply, not route.warned)
                    # no worker has run: the count recorded (or a key of another type) is
                    # checked here, whether the function now holds or not
                    try:
                        check_partitions(client, keys, count, record=False)
                    except ResizeUnfinishedError:
                        # a resize has begun (it loads the function): wait, then FCALL. One
                        # read decides, so a resize beginning between two reads is seen too
                        resizing = True
                        todo += rows
                        continue
                    if not loaded:  # this pipeline by XADD; the next tries the function
                        route.function, route.warned = False, True
                        route.no_functions = "unknown command" in message
                        route.checked = time.monotonic()
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


def _commands(
    keys: Keys, route: _Route, count: int, chunk: list[tuple[str, dict]],
    groups: dict[int, list[int]], one_call: bool,
) -> list[tuple]:  # fmt: skip
    """The commands that append the events of `groups` (rows of `chunk` by partition): one
    FCALL for all (`one_call`), an FCALL a partition, or (no function) an XADD an event."""
    if one_call:
        mine = {p: [chunk[i][1] for i in rows] for p, rows in groups.items()}
        return [("FCALL", *many_args(keys, count, mine))]
    if route.function:
        return [("FCALL", *call_args(keys, p, count, [chunk[i][1] for i in rows]))
                for p, rows in groups.items()]  # fmt: skip
    return [("XADD", keys.events(p), "*", *_flat(chunk[i][1]))
            for p, rows in groups.items() for i in rows]  # fmt: skip


def _flat(fields: dict) -> list:
    """An entry's fields as XADD's name, value, name, value, ... arguments."""
    return [x for pair in fields.items() for x in pair]


def _executed(client: redis.Redis | redis.RedisCluster, commands: list[tuple]) -> list:
    """Each command's reply, an error reply as its exception (not raised), in one round trip.
    On one Redis they are packed by hiredis and sent on one connection: redis-py's pipeline
    first encodes each argument in Python, which was about half of a small publish's time. A
    cluster's pipeline routes each command to its slot's node."""
    if not isinstance(client, redis.Redis):
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute(raise_on_error=False)
    packed = b"".join(hiredis.pack_command(command) for command in commands)
    return packed_replies(client, packed, len(commands))
