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


def preload(
    r: redis.Redis, events: list[dict], event_ids: bool = True, fields: Sequence[str] = ()
) -> None:
    """Flush the database and XADD the events to partition 0, pipelined, each with a
    producer event_id as `publish` sets one (unless event_ids is False) and then the
    events' `fields` (declared inputs' values) where they have them."""
    r.flushdb()
    pipe = r.pipeline(transaction=False)
    for i, e in enumerate(events):
        extra = ("event_id", f"bench-{i}") if event_ids else ()
        more = [x for name in fields if name in e for x in (name, e[name])]
        pipe.execute_command("XADD", STREAM, "*", "user_id", e["user_id"], "type", e["type"],
                             "ts", e["ts"], *extra, *more)  # fmt: skip
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
