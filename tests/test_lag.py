"""The lag gauge is true (adapters/lag.py): on a real redis-server, XINFO GROUPS' lag made wrong
with `XGROUP SETID ... ENTRIESREAD` (the state a promoted replica's stale counter leaves), or
nil after deletions, is not believed; the maintenance tick reports the true count and
corrects Redis's counter; `partitions resize` uses the same rule."""

from __future__ import annotations

import math

import pytest
import redis

from tests.group_stream import GROUP, KEYS, STREAM, fill, group
from worker.common.connection import connect
from worker.common.settings import Settings
from worker.engine.adapters.lag import undelivered
from worker.engine.adapters.maintenance import Maintenance
from worker.engine.adapters.metrics import WorkerMetrics


@pytest.fixture
def r(redis_server):
    client = connect(redis_server.url)
    yield client
    client.close()


def set_entries_read(r: redis.Redis, last: bytes | str, entries_read: int) -> None:
    r.execute_command("XGROUP", "SETID", STREAM, GROUP, last, "ENTRIESREAD", entries_read)


def tick(r: redis.Redis) -> float:
    """One maintenance tick over partition 0; the lag gauge it set."""
    metrics = WorkerMetrics()
    s = Settings(redis_url="redis://x", metrics_port=0, consumer="c", partitions=1)
    Maintenance(r, KEYS, s, metrics).run([0])
    return metrics.registry.get_sample_value("intentstream_lag_entries", {"partition": "0"})


def test_a_phantom_lag_with_everything_delivered_is_zero_and_repaired(r):
    fill(r, 10, read=10)
    set_entries_read(r, "$", 3)  # a counter 7 short, as a promoted replica's may be
    assert group(r)["lag"] == 7  # Redis believes it...
    r.xadd(STREAM, {"user_id": "u", "type": "view"})
    r.xreadgroup(GROUP, "c", {STREAM: ">"})
    assert group(r)["lag"] == 7  # ...and keeps the error as the group reads on
    assert undelivered(r, STREAM, group(r)) == 0
    assert tick(r) == 0
    assert group(r)["lag"] == 0, "the tick should correct the group's entries-read"
    assert group(r)["entries-read"] == 11


def test_a_phantom_lag_that_contradicts_the_stream_is_counted(r):
    ids = fill(r, 10, read=4)
    set_entries_read(r, ids[3], 0)  # Redis says 10 undelivered with 4 delivered
    assert group(r)["lag"] == 10
    assert undelivered(r, STREAM, group(r)) == 6
    assert tick(r) == 6
    assert group(r)["lag"] == 10  # not repaired mid-stream: only a caught-up group is exact


def test_nil_lag_after_deletions_is_counted_and_bounded(r):
    ids = fill(r, 10, read=4)
    r.xdel(STREAM, ids[6])  # a tombstone after last-delivered-id: Redis cannot tell
    assert group(r)["lag"] is None
    assert undelivered(r, STREAM, group(r)) == 5
    assert tick(r) == 5
    assert undelivered(r, STREAM, group(r), cap=3) is None  # too many to count: unknown


def test_exact_ends_and_a_consistent_lag(r):
    ids = fill(r, 10, read=0)
    assert undelivered(r, STREAM, group(r)) == 10  # nothing delivered: every entry
    r.xreadgroup(GROUP, "c", {STREAM: ">"}, count=4)
    assert undelivered(r, STREAM, group(r)) == group(r)["lag"] == 6
    r.xtrim(
        STREAM, minid=ids[5], approximate=False
    )  # the group's last id is now before the first entry
    set_entries_read(r, ids[3], 1)
    assert undelivered(r, STREAM, group(r)) == 5
    r.delete(STREAM)
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    assert undelivered(r, STREAM, group(r)) == 0
    assert tick(r) == 0


def test_an_unknown_lag_is_nan_on_the_gauge(r, monkeypatch):
    ids = fill(r, 10, read=4)
    r.xdel(STREAM, ids[6])
    monkeypatch.setattr("worker.engine.adapters.maintenance.undelivered", lambda *a: None)
    assert math.isnan(tick(r))
    assert r.xinfo_groups(STREAM)[0]["lag"] is None  # nothing repaired on a guess
