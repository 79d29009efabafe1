"""Whatever data sits in Redis, and whatever replies get lost, the worker commits all or
nothing, keeps every other user and partition going, and counts every entry exactly once."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import redis

from tests.consumers import in_process_consumer
from tests.golden import GOLDEN_SCORES
from tests.test_worker import http_status, scrape
from tests.workers import WorkerProcess, all_committed, count_scores, score_entries, wait_for
from worker.common.connection import connect, packed_replies
from worker.common.keys import Keys, partition_of
from worker.common.local_redis import free_port
from worker.producers import publisher
from worker.producers.append_function import install
from worker.producers.publisher import publish
from worker.rules.definition import make_rule
from worker.rules.store import set_rule

pytestmark = pytest.mark.integration

KEYS = Keys()


def tick_until(consumer, condition, what: str) -> None:
    wait_for(lambda: consumer.tick() or condition(), what=what)


@pytest.mark.parametrize(("cache_users", "n_b"), [(0, b"1"), (1000, b"2")])
def test_a_state_key_of_another_type_resets_that_user_and_the_batch_commits_whole(
    redis_server, golden_path, cache_users, n_b
):
    # Without the state cache, b's state is read, found invalid, and b restarts from zero.
    # With it, the worker still holds the state it committed for b (the cache trusts its own
    # writes while the partition's sequence stands) and goes on from it; either way the key
    # is overwritten, counted, and the batch commits whole.
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path, state_cache_users=cache_users)
    for u in "abc":
        r.xadd(KEYS.events(0), {"user_id": u, "type": "view"})
    tick_until(consumer, lambda: count_scores(r) == 3, "first scores")
    r.set(KEYS.state(0, "b"), "oops")  # an operator's mistake
    pipe = r.pipeline(transaction=True)  # one more event each, in one batch
    for u in "abc":
        pipe.xadd(KEYS.events(0), {"user_id": u, "type": "add_to_cart"})
    pipe.execute()
    tick_until(consumer, lambda: count_scores(r) == 6, "second scores")
    assert all_committed(r)
    n = {u: r.hget(KEYS.state(0, u), "n") for u in "abc"}
    assert n == {"a": b"2", "b": n_b, "c": b"2"}
    scores = {row["user_id"]: float(row["score"]) for row in score_entries(r)[3:]}
    np.testing.assert_allclose([scores["a"], scores["c"]], [GOLDEN_SCORES[1]] * 2, atol=1e-4)
    assert consumer.metrics.value("intentstream_state_resets_total", reason="wrong_type") == 1


def test_bad_data_stops_one_user_or_one_partition_never_the_others(
    redis_server, golden_path, tmp_path
):
    r = connect(redis_server.url)
    users = {p: next(f"u{i}" for i in range(100) if partition_of(f"u{i}", 2) == p) for p in (0, 1)}
    r.set(KEYS.state(0, users[0]), "poison")  # a user's state key of another type
    port = free_port()
    worker = WorkerProcess(
        redis_server.url, golden_path, tmp_path / "w.log",
        "--partitions", "2", "--metrics-port", str(port), "--lease-ms", "1000",
    ).start()  # fmt: skip
    try:
        publish(r, [{"user_id": u, "type": "view"} for u in users.values()], partitions=2)
        wait_for(lambda: count_scores(r, partitions=2) == 2, what="both users scored")
        # A partition-wide key of another type: that partition waits, the other goes on.
        r.set(KEYS.scores(0), "not a stream")
        publish(r, [{"user_id": u, "type": "add_to_cart"} for u in users.values()], partitions=2)
        wait_for(lambda: r.xlen(KEYS.scores(1)) == 2, what="the healthy partition")
        wait_for(lambda: scrape(port).get("intentstream_bad_keys_total", 0) >= 1, what="counted")
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 200  # Redis is fine
        assert scrape(port)["intentstream_redis_errors_total"] == 0
        r.delete(KEYS.scores(0))  # fixed: the partition resumes, nothing was lost
        wait_for(lambda: r.xlen(KEYS.scores(0)) == 1, timeout=120, what="partition 0 resumes")
        metrics = scrape(port)
    finally:
        assert worker.terminate() == 0
    assert metrics['intentstream_state_resets_total{reason="wrong_type"}'] == 1
    assert r.hget(KEYS.state(0, users[0]), "n") == b"2"
    assert f"{KEYS.scores(0)} holds another type" in worker.log()


def test_every_log_line_is_json_even_when_scrapers_hang_up_early(
    redis_server, golden_path, tmp_path
):
    port = free_port()
    worker = WorkerProcess(
        redis_server.url, golden_path, tmp_path / "w.log", "--metrics-port", str(port)
    ).start()
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/healthz") == 200, what="up")
        for _ in range(50):  # request, then reset the connection before the reply
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        assert http_status(f"http://127.0.0.1:{port}/metrics") == 200
    finally:
        assert worker.terminate() == 0
    lines = worker.log().splitlines()
    assert lines
    for line in lines:
        assert isinstance(json.loads(line), dict), line


def test_counters_are_exact_when_commit_replies_are_lost(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path, batch_size=7)
    lost = {"n": 0}

    def losing(send):
        def send_then_lose_the_reply(*args):
            result = send(*args)
            if lost["n"] < 3:
                lost["n"] += 1
                raise redis.ConnectionError("reply lost")
            return result

        return send_then_lose_the_reply

    consumer.committer.run = losing(consumer.committer.run)
    consumer.readahead.exchange = losing(consumer.readahead.exchange)
    # fires at each user's first event, and never re-arms: one action per user, exactly
    set_rule(r, KEYS, make_rule(name="first", above=0.0, rearm_below=0.0))
    publish(r, [{"user_id": f"u{i % 5}", "type": "view"} for i in range(100)])
    for _ in range(3):
        r.xadd(KEYS.events(0), {"user_id": "", "type": "view"})

    def tick() -> None:
        try:
            consumer.tick()
        except redis.ConnectionError:
            consumer.rewind()  # what run() does after an outage

    wait_for(lambda: tick() or consumer.metrics.count("scored") >= 100, what="all counted")
    tick()
    assert lost["n"] == 3
    assert count_scores(r) == 100
    assert consumer.metrics.count("scored") == 100
    assert consumer.metrics.count("deadletter") == 3
    assert consumer.metrics.count("duplicate") == 0
    actions = r.xrange(KEYS.actions(0))
    assert sorted(f[b"user_id"] for _, f in actions) == [f"u{i}".encode() for i in range(5)]
    assert consumer.metrics.value("intentstream_actions_total", rule="first") == 5


STORM_KILLS = 250  # 5 s of kills at most


def test_counters_are_exact_under_a_client_kill_storm(redis_server, tmp_path: Path):
    from model.artifact import save_model
    from model.random_init import random_model

    model = tmp_path / "m.npz"
    save_model(random_model(["view", "add_to_cart", "coupon"], hidden=8, seed=1), model)
    r = connect(redis_server.url)
    events = [{"user_id": f"u{i % 300}", "type": "view", "event_id": f"e{i}"} for i in range(6000)]
    publish(r, events)
    port = free_port()
    worker = WorkerProcess(
        redis_server.url, model, tmp_path / "w.log", "--metrics-port", str(port),
        "--batch-size", "100",
    ).start()  # fmt: skip
    stop = threading.Event()

    def storm() -> None:
        # a bounded storm: on a loaded machine a batch may take longer than the 20 ms between
        # kills, and an endless storm would then starve the worker rather than test it
        killer = redis.Redis.from_url(redis_server.url)
        for _ in range(STORM_KILLS):
            if stop.wait(0.02):
                return
            with contextlib.suppress(redis.RedisError):
                killer.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")

    thread = threading.Thread(target=storm, daemon=True)
    thread.start()
    try:
        wait_for(lambda: count_scores(r) >= len(events), timeout=180, what="all scores")
    finally:
        stop.set()
        thread.join()
    try:
        wait_for(lambda: scrape(port)['intentstream_events_total{outcome="scored"}'] >= len(events),
                 timeout=60, what="the counter to catch up")  # fmt: skip
        metrics = scrape(port)
    finally:
        assert worker.terminate() == 0
    assert count_scores(r) == len(events)
    assert metrics['intentstream_events_total{outcome="scored"}'] == len(events)
    assert metrics['intentstream_events_total{outcome="duplicate"}'] == 0


def test_a_producer_retry_is_acknowledged_as_a_duplicate(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    events = [{"user_id": "alice", "type": t, "event_id": f"order-{t}"} for t in
              ("view", "add_to_cart", "coupon")]  # fmt: skip
    publish(r, events)
    publish(r, events[1:2])  # the producer resends one after a lost reply
    tick_until(consumer, lambda: consumer.metrics.count("duplicate") == 1, "the duplicate")
    rows = score_entries(r)
    assert [row["event_id"] for row in rows] == [e["event_id"] for e in events]
    np.testing.assert_allclose([float(x["score"]) for x in rows], GOLDEN_SCORES, atol=1e-4)
    ids, _, rest = r.hget(KEYS.state(0, "alice"), "event_ids").partition(b"\n")
    producers, _, times = rest.partition(b"\n")
    assert ids.split() == [e["event_id"].encode() for e in events]
    assert len(times.split()) == 3  # each id's entry time
    # the first call's producer, at its third event; the resend (another call) applied nothing
    assert len(producers.split()) == 1 and producers.endswith(b":3")


def lose_first_appending_reply(monkeypatch) -> list:
    """publish()'s first replies without errors (the first send that appended events) are
    read, then lost as a dropped connection would lose them: Redis applied the send."""
    lost: list = []

    def read_and_lose(client, packed, n):
        replies = packed_replies(client, packed, n)
        if not lost and not any(isinstance(x, Exception) for x in replies):
            lost.append(replies)
            raise redis.ConnectionError("reply lost")
        return replies

    monkeypatch.setattr(publisher, "packed_replies", read_and_lose)
    return lost


@pytest.mark.parametrize("through", ["function", "xadd"])
def test_publish_resends_after_a_lost_reply_and_nothing_counts_twice(
    redis_server, golden_path, through, monkeypatch
):
    r = connect(redis_server.url)
    if through == "function":
        install(r)  # as the first worker does
    lost = lose_first_appending_reply(monkeypatch)
    client = redis.Redis.from_url(redis_server.url)
    publish(client, [{"user_id": "alice", "type": t} for t in ("view", "add_to_cart", "coupon")])
    assert len(lost) == 1 and r.xlen(KEYS.events(0)) == 6  # sent twice
    consumer = in_process_consumer(redis_server.url, golden_path)
    tick_until(consumer, lambda: consumer.metrics.count("duplicate") == 3, "the duplicates")
    np.testing.assert_allclose([float(x["score"]) for x in score_entries(r)], GOLDEN_SCORES,
                               atol=1e-4)  # fmt: skip
    assert consumer.metrics.count("scored") == 3
