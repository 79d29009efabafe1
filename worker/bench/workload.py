"""The benchmarks' workload: a backlog of events in partition 0's stream, under the default
prefix and consumer group (as the benchmarked worker reads them)."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from worker.common.keys import Keys
from worker.common.settings import Settings

KEYS = Keys()  # the default prefix
STREAM = KEYS.events(0)
SCORES = KEYS.scores(0)
ACTIONS = KEYS.actions(0)
STATE = KEYS.state_prefix(0)  # + user id: a user's state (built per event in the hot loops)
GROUP = Settings.model_fields["group"].default


def entry_fields(
    event: dict, i: int, event_ids: bool = True, fields: Sequence[str] = ()
) -> list[str]:
    """The i-th backlog event's field/value list as the bench publishes it: user_id, type,
    ts, a producer event_id as `publish` sets one (unless event_ids is False), then the
    event's `fields` (declared inputs' values) where it has them."""
    extra = ["event_id", f"bench-{i}"] if event_ids else []
    more = [x for name in fields if name in event for x in (name, event[name])]
    return ["user_id", event["user_id"], "type", event["type"], "ts", str(event["ts"]),
            *extra, *more]  # fmt: skip


def preload(
    r: redis.Redis, events: list[dict], event_ids: bool = True, fields: Sequence[str] = ()
) -> None:
    """Flush the database and XADD the events to partition 0, pipelined, each with the
    fields `entry_fields` gives."""
    r.flushdb()
    pipe = r.pipeline(transaction=False)
    for i, e in enumerate(events):
        pipe.execute_command("XADD", STREAM, "*", *entry_fields(e, i, event_ids, fields))
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()
    r.xgroup_create(STREAM, GROUP, id="0")


def sampled_state_keys(r: redis.Redis, sample: int = 500) -> list[bytes]:
    """Up to `sample` state keys of partition 0 (what the memory figures measure)."""
    keys = []
    for key in r.scan_iter(match=KEYS.state_match(0), count=1000):
        keys.append(key)
        if len(keys) >= sample:
            break
    return keys
