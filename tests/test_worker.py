"""The worker against real redis-server processes the tests start (docs/contributing.md,
Tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from model.artifact import save_model
from model.data.synthetic import synthetic_events
from model.random_init import random_model
from tests.consumers import in_process_consumer
from tests.golden import GOLDEN_EVENTS, GOLDEN_SCORES
from tests.offline import offline_scores
from tests.workers import WorkerProcess, all_committed, count_scores, score_entries, wait_for
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.common.local_redis import free_port
from worker.engine.consumer import Consumer
from worker.producers.publisher import publish
from worker.rules.definition import make_rule
from worker.rules.store import set_rule

STREAM0 = "intentstream:events:{0}"
FUTURE_MS = int(time.time() * 1000) + 86_400_000  # a day ahead: past the 10-minute skew


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.npz"
    model = random_model(
        ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout", "purchase"],
        hidden=32,
        layers=2,
        features=["gap"],
        seed=11,
    )
    save_model(model, path)
    return path


def scrape(port: int) -> dict[str, float]:
    """GET /metrics and parse it with prometheus_client's parser: {sample name{labels}: value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def http_status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=30).status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_golden_example_through_redis(redis_server, golden_path, tmp_path):
    r = connect(redis_server.url)
    for t in GOLDEN_EVENTS:  # plain XADD with field/value pairs, as redis-cli would send
        r.execute_command("XADD", STREAM0, "*", "user_id", "alice", "type", t)
    worker = WorkerProcess(redis_server.url, golden_path, tmp_path / "w.log").start()
    try:
        wait_for(lambda: count_scores(r) == 3, what="3 scores")
    finally:
        assert worker.terminate() == 0
    rows = score_entries(r)
    assert [row["type"] for row in rows] == GOLDEN_EVENTS
    np.testing.assert_allclose([float(row["score"]) for row in rows], GOLDEN_SCORES, atol=1e-4)
    state = r.hgetall("intentstream:state:{0}:alice")
    assert state[b"n"] == b"3" and state[b"last_id"] == rows[-1]["event_id"].encode()
    h = np.frombuffer(state[b"h"], "<f4")
    np.testing.assert_allclose(h, [0.65, 0.70], atol=6e-3)


def test_end_to_end_scores_equal_offline_scoring_exactly_once(redis_server, model_path, tmp_path):
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(3000, 300, seed=5))]
    r = connect(redis_server.url)
    publish(r, events, partitions=3)
    port = free_port()
    worker = WorkerProcess(
        redis_server.url, model_path, tmp_path / "w.log",
        "--partitions", "3", "--batch-size", "200", "--metrics-port", str(port),
    ).start()  # fmt: skip
    try:
        wait_for(lambda: count_scores(r, partitions=3) >= len(events), what="all scores")
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200, what="ready")
        metrics = scrape(port)
        assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
    finally:
        assert worker.terminate() == 0
    rows = score_entries(r, partitions=3)
    # a score entry carries the producer's event_id
    by_id = {(row["partition"], row["event_id"]): row for row in rows}
    sent = [(partition_of(e["user_id"], 3), e["event_id"]) for e in events]
    assert len(rows) == len(by_id) == len(events)  # every event scored exactly once
    assert set(by_id) == set(sent)
    assert len({p for p, _ in sent}) == 3
    for e, key in zip(events, sent, strict=True):
        row = by_id[key]
        assert row["user_id"] == e["user_id"] and row["type"] == e["type"]
        assert int(row["ts"]) == e["ts"]
    want = offline_scores(model_path, events)
    got = [float(by_id[key]["score"]) for key in sent]
    np.testing.assert_allclose(got, want, atol=1e-5)

    assert metrics['intentstream_events_total{outcome="scored"}'] == len(events)
    assert metrics["intentstream_event_latency_seconds_count"] == len(events)
    assert metrics['intentstream_event_latency_seconds_bucket{le="+Inf"}'] == len(events)
    assert 'intentstream_event_latency_seconds_bucket{le="0.00025"}' in metrics
    assert 'intentstream_event_latency_seconds_bucket{le="10.0"}' in metrics
    assert metrics['intentstream_batch_seconds_count{stage="commit"}'] >= 1
    assert metrics["intentstream_batch_size_sum"] == len(events)
    assert {f'intentstream_pending_entries{{partition="{p}"}}' for p in range(3)} <= set(metrics)
    assert metrics["intentstream_partitions_owned"] == 3
    assert "intentstream_last_processed_timestamp_seconds" in metrics
    assert "intentstream_model_version" in metrics
    assert metrics["intentstream_redis_errors_total"] == 0


def test_each_bad_input_is_dead_lettered_and_good_events_around_it_are_scored(
    redis_server, golden_path, tmp_path
):
    r = connect(redis_server.url)
    bad = {
        "missing user_id": {"type": "view"},
        "empty user_id": {"user_id": "", "type": "view"},
        "missing type": {"user_id": "bob"},
        "empty type": {"user_id": "bob", "type": ""},
        "non-integer ts": {"user_id": "bob", "type": "view", "ts": "12.5"},
        "negative ts": {"user_id": "bob", "type": "view", "ts": "-5"},
        "non-UTF-8 user_id": {"user_id": b"\xff\xfe", "type": "view"},
        "non-UTF-8 type": {"user_id": "bob", "type": b"vi\xc3"},
        "over-long user_id": {"user_id": "u" * 257, "type": "view"},
        "over-long type": {"user_id": "bob", "type": "t" * 129},
        "malformed json": {"json": '{"user_id": "bob", '},
        "json not an object": {"json": "[1, 2]"},
        "json missing type": {"json": '{"user_id": "bob"}'},
        "ts in seconds": {"user_id": "bob", "type": "view", "ts": str(int(time.time()))},
        "far-future ts": {"user_id": "bob", "type": "view", "ts": str(FUTURE_MS)},
    }
    expected_error = {
        "missing user_id": "user_id: Field required",
        "empty user_id": "user_id: must be 1-256 bytes",
        "missing type": "type: Field required",
        "empty type": "type: must be 1-128 bytes",
        "non-integer ts": "ts: must be an integer",
        "negative ts": "ts: must be an integer",
        "non-UTF-8 user_id": "user_id: not valid UTF-8",
        "non-UTF-8 type": "type: not valid UTF-8",
        "over-long user_id": "user_id: must be 1-256 bytes of UTF-8, got 257",
        "over-long type": "type: must be 1-128 bytes of UTF-8, got 129",
        "malformed json": "not valid JSON",
        "json not an object": "expected a JSON object",
        "json missing type": "type: Field required",
        "ts in seconds": "before 2000-01-01 (epoch milliseconds expected, not seconds)",
        "far-future ts": "ms ahead of the entry id's time",
    }
    good_ids, bad_ids = [], {}
    for i, (kind, fields) in enumerate(bad.items()):
        t = GOLDEN_EVENTS[i % 3]
        good_ids.append(r.xadd(STREAM0, {"user_id": f"good{i}", "type": t}))
        bad_ids[r.xadd(STREAM0, fields)] = kind
    good_ids.append(r.xadd(STREAM0, {"json": json.dumps({"user_id": "j", "type": "view"})}))
    good_ids.append(r.xadd(STREAM0, {"user_id": "x", "type": "teleport", "extra": "ignored"}))

    consumer = in_process_consumer(redis_server.url, golden_path)
    consumer.tick()
    consumer.tick()
    dead = r.xrange("intentstream:deadletter:{0}")
    assert len(dead) == len(bad)
    for _, fields in dead:
        kind = bad_ids[fields[b"source_id"]]
        assert expected_error[kind] in fields[b"error"].decode(), (kind, fields[b"error"])
        original = bad[kind]
        for k, v in original.items():  # original fields kept, byte for byte
            assert fields[k.encode()] == (v if isinstance(v, bytes) else v.encode())
    rows = score_entries(r)
    assert sorted(row["event_id"] for row in rows) == sorted(i.decode() for i in good_ids)
    assert {row["user_id"] for row in rows} >= {"j", "x"}
    assert all_committed(r)
    m = consumer.metrics
    assert m.count("deadletter") == len(bad)
    assert m.count("scored") == len(good_ids)
    assert m.value("intentstream_unknown_type_events_total") == 1


def test_an_entry_deleted_before_its_commit_holds_up_nothing(redis_server, golden_path):
    """Delivered, not committed (a read whose reply was lost), then deleted: the partition's
    next read resumes after its last commit, where the entry no longer is; the rest is scored
    once and nothing is counted that did not happen."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    consumer.tick()  # creates the group
    a = r.xadd(STREAM0, {"user_id": "a", "type": "view"})
    r.xreadgroup("intentstream-workers", "c1", {STREAM0: ">"}, noack=True)  # reply "lost"
    r.xdel(STREAM0, a)
    b = r.xadd(STREAM0, {"user_id": "b", "type": "view"})
    consumer.cursors[0].rewind()  # as after a lost read reply
    consumer.tick()
    assert [row["user_id"] for row in score_entries(r)] == ["b"]
    assert consumer.metrics.count("scored") == 1 and consumer.metrics.count("lost") == 0
    assert r.get(consumer.keys.acked(0)) == b


def test_a_commit_sent_twice_applies_once_and_counts_once(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    run = consumer.committer.run
    results = []

    def sent_twice(commit):
        # As after a lost reply: the worker sends the same commit again; the second must be a no-op
        # that says the commit was applied, so the batch is counted once, not zero times.
        results.append(run(commit))
        keys = [consumer.keys.state(0, u) for u in commit.users]
        state_after_first = {k: r.hgetall(k) for k in keys}
        results.append(run(commit))
        assert {k: r.hgetall(k) for k in keys} == state_after_first
        return results[-1]

    consumer.flow.commit = lambda commit, *_: sent_twice(commit)
    set_rule(r, consumer.keys, make_rule(name="first", above=0.0, rearm_below=0.0))
    for t in GOLDEN_EVENTS:
        r.xadd(STREAM0, {"user_id": "alice", "type": t})
    r.xadd(STREAM0, {"user_id": "", "type": "view"})
    consumer.tick()
    consumer.tick()
    assert [x.resent for x in results] == [False, True]
    assert count_scores(r) == 3
    assert r.xlen("intentstream:deadletter:{0}") == 1
    assert r.hget("intentstream:state:{0}:alice", "n") == b"3"
    assert consumer.metrics.count("scored") == 3
    assert consumer.metrics.count("deadletter") == 1
    assert r.xlen("intentstream:actions:{0}") == 1  # the action of alice's first event, once
    assert consumer.metrics.value("intentstream_actions_total", rule="first") == 1


def test_events_at_or_below_last_id_are_acknowledged_without_effect(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    ids = [r.xadd(STREAM0, {"user_id": "alice", "type": t}) for t in GOLDEN_EVENTS]
    consumer.tick()
    consumer.tick()
    assert count_scores(r) == 3
    # The group moved back: entries at or below the position are not applied (nor counted)
    # again; the commit is refused as `behind` and the group moves up to the position.
    r.xgroup_setid(STREAM0, "intentstream-workers", "0")
    consumer.tick()
    consumer.tick()
    assert count_scores(r) == 3 and consumer.metrics.count("duplicate") == 0
    assert consumer.metrics.value("intentstream_commit_retries_total", reason="behind") == 1
    # With the position gone too (`acked` and the last commit token), the stream is read
    # from its start: its entries are at or below each user's last_id, applied before.
    r.delete("intentstream:acked:{0}", "intentstream:lastcommit:{0}")
    r.xgroup_setid(STREAM0, "intentstream-workers", "0")
    consumer.rewind()
    consumer.tick()
    consumer.tick()
    assert count_scores(r) == 3
    assert r.hget("intentstream:state:{0}:alice", "last_id") == ids[-1]
    assert consumer.metrics.count("duplicate") == 3


def test_state_from_redis_is_validated(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    consumer.tick()
    mine = consumer.model.version
    r.hset(
        "intentstream:state:{0}:nan",
        mapping={"h": np.array([np.nan, 0], "<f4").tobytes(), "last_id": "1-0", "model": mine},
    )
    r.hset(
        "intentstream:state:{0}:short", mapping={"h": b"\x00\x00", "last_id": "1-0", "model": mine}
    )
    r.hset("intentstream:state:{0}:garbage", mapping={"h": b"", "last_id": "not-an-id"})
    r.hset(  # a state of another model (no history to rebuild it from)
        "intentstream:state:{0}:other",
        mapping={"h": np.array([0.5, 0.5], "<f4").tobytes(), "last_id": "1-0", "model": "7"},
    )
    for u in ("nan", "short", "garbage", "other"):
        r.xadd(STREAM0, {"user_id": u, "type": "view"})
    consumer.tick()
    consumer.tick()
    rows = score_entries(r)
    assert len(rows) == 4
    np.testing.assert_allclose([float(x["score"]) for x in rows], [GOLDEN_SCORES[0]] * 4, atol=1e-4)
    resets = consumer.metrics.value
    assert resets("intentstream_state_resets_total", reason="invalid") == 3
    assert resets("intentstream_state_resets_total", reason="model") == 1


def test_group_deleted_or_redis_flushed_under_a_running_worker(redis_server, golden_path, tmp_path):
    r = connect(redis_server.url)
    worker = WorkerProcess(
        redis_server.url, golden_path, tmp_path / "w.log", "--lease-ms", "1000"
    ).start()
    try:
        r.xadd(STREAM0, {"user_id": "a", "type": "view"})
        wait_for(lambda: count_scores(r) == 1, what="first score")
        r.xgroup_destroy(STREAM0, "intentstream-workers")
        r.xadd(STREAM0, {"user_id": "b", "type": "view"})
        wait_for(lambda: count_scores(r) == 2, what="score after the group was deleted")
        r.flushall()
        r.xadd(STREAM0, {"user_id": "c", "type": "view"})
        wait_for(lambda: count_scores(r) == 1, what="score after FLUSHALL")
    finally:
        assert worker.terminate() == 0
    assert "consumer group or stream is gone; recreating it" in worker.log()
    assert score_entries(r)[0]["user_id"] == "c"


def test_sigterm_commits_the_batch_in_hand_and_exits_zero(redis_server, model_path, tmp_path):
    r = connect(redis_server.url)
    publish(r, synthetic_events(20000, 2000, seed=2))
    worker = WorkerProcess(
        redis_server.url, model_path, tmp_path / "w.log", "--batch-size", "500"
    ).start()
    wait_for(lambda: count_scores(r) > 0, what="the first scores")
    assert worker.terminate() == 0
    group = r.xinfo_groups(STREAM0)[0]
    # every entry read was committed: the position is the last entry delivered
    assert r.get(Keys("intentstream").acked(0)) == group["last-delivered-id"]
    assert count_scores(r) == group["entries-read"]
    assert '"worker stopped"' in worker.log()
    assert r.get("intentstream:lease:{0}") is None  # released for the next worker


def test_acl_user_with_password(redis_server, golden_path, tmp_path):
    admin = connect(redis_server.url)
    admin.execute_command("ACL", "SETUSER", "scorer", "on", ">s3cret", "~intentstream:*", "+@all")
    url = f"redis://scorer:s3cret@127.0.0.1:{redis_server.port}/0"
    admin.xadd(STREAM0, {"user_id": "alice", "type": "view"})
    consumer = in_process_consumer(url, golden_path)
    consumer.tick()
    consumer.tick()
    assert count_scores(admin) == 1
    with pytest.raises(redis.AuthenticationError):
        connect(f"redis://scorer:wrong@127.0.0.1:{redis_server.port}/0").ping()


def test_state_ttl_and_scores_maxlen(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(
        redis_server.url, golden_path, state_ttl_seconds=100, scores_maxlen=10
    )
    publish(r, [{"user_id": f"u{i}", "type": "view"} for i in range(500)])
    for _ in range(4):
        consumer.tick()
    assert 0 < r.ttl("intentstream:state:{0}:u1") <= 100
    assert r.xlen("intentstream:scores:{0}") < 500  # trimmed approximately


def test_retention_trims_acknowledged_history_only(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(
        redis_server.url, golden_path, retention_seconds=60, batch_size=10
    )
    old = int(time.time() * 1000) - 3_600_000
    for i in range(300):  # an hour old: past retention
        r.xadd(STREAM0, {"user_id": f"u{i}", "type": "view"}, id=f"{old + i}-0")
    consumer.tick()  # creates the group and scores the first 10 only
    consumer.maintenance.run(sorted(consumer.ownership.owned))
    remaining = r.xrange(STREAM0)
    # acknowledged entries were trimmed (approximately); unread ones never are
    assert len(remaining) >= 290
    assert remaining[-1][0] == f"{old + 299}-0".encode()
    for _ in range(40):
        consumer.tick()
    consumer.maintenance.run(sorted(consumer.ownership.owned))
    assert r.xlen(STREAM0) < 300
    assert count_scores(r) == 300


def test_settings_keys_match_spec():
    keys = Keys("shop")
    assert keys.events(3) == "shop:events:{3}"
    assert keys.state(0, "alice") == "shop:state:{0}:alice"
    assert keys.scores(1) == "shop:scores:{1}" and keys.deadletter(1) == "shop:deadletter:{1}"


def make_tls_files(directory: Path) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1, made with the openssl command."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext",
            "-out", "server.crt")  # fmt: skip
    return tuple(str(directory / n) for n in ("server.crt", "server.key", "ca.crt"))


def test_tls_redis_url(tmp_path, golden_path):
    from worker.common.local_redis import LocalRedis

    with LocalRedis(tls=make_tls_files(tmp_path)) as server:
        assert server.url.startswith("rediss://")
        r = connect(server.url)
        for t in GOLDEN_EVENTS:
            r.xadd(STREAM0, {"user_id": "alice", "type": t})
        consumer = in_process_consumer(server.url, golden_path)
        consumer.tick()
        consumer.tick()
        rows = score_entries(r)
        np.testing.assert_allclose([float(x["score"]) for x in rows], GOLDEN_SCORES, atol=1e-4)
        plain = f"redis://127.0.0.1:{server.port}/0"
        with pytest.raises(redis.ConnectionError):
            connect(plain, socket_timeout=1).ping()


def test_an_older_pending_entry_is_applied_before_a_newer_one_of_the_same_user(
    redis_server, golden_path
):
    # A read whose reply was lost (or whose commit failed) leaves an entry delivered and not
    # committed; a newer event of the same user must not commit first, or the older one would
    # look applied.
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    consumer.tick()  # takes the partition, nothing to read
    r.xadd(STREAM0, {"user_id": "alice", "type": "view"})
    r.xreadgroup("intentstream-workers", "c1", {STREAM0: ">"}, noack=True)  # reply "lost"
    r.xadd(STREAM0, {"user_id": "alice", "type": "add_to_cart"})
    ghost_id = r.xadd(STREAM0, {"user_id": "bob", "type": "view"})
    r.xreadgroup("intentstream-workers", "ghost", {STREAM0: ">"}, noack=True)  # an old holder's
    last = r.xadd(STREAM0, {"user_id": "bob", "type": "add_to_cart"})
    for _ in range(4):
        consumer.tick()
    rows = score_entries(r)
    by_user = {u: [x["type"] for x in rows if x["user_id"] == u] for u in ("alice", "bob")}
    assert by_user == {"alice": ["view", "add_to_cart"], "bob": ["view", "add_to_cart"]}
    alice = [float(x["score"]) for x in rows if x["user_id"] == "alice"]
    np.testing.assert_allclose(alice, GOLDEN_SCORES[:2], atol=1e-4)
    assert consumer.metrics.count("duplicate") == 0
    assert consumer.metrics.value("intentstream_commit_retries_total", reason="gap") >= 1
    assert ghost_id.decode() in {x["event_id"] for x in rows}
    assert r.get(consumer.keys.acked(0)) == last


def test_two_processes_with_one_consumer_name_never_both_hold_a_partition(
    redis_server, golden_path
):
    a = in_process_consumer(redis_server.url, golden_path)
    b = in_process_consumer(redis_server.url, golden_path)  # same name "c1"
    a.tick()
    b.tick()
    assert [0 in a.ownership.owned, 0 in b.ownership.owned] == [True, False]


def test_group_recreated_after_the_last_acknowledged_entry(redis_server, golden_path):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    r.xadd(STREAM0, {"user_id": "", "type": "view"})  # a dead letter
    r.xadd(STREAM0, {"user_id": "a", "type": "view"})
    consumer.tick()
    consumer.tick()
    assert int(r.get("intentstream:seq:{0}")) > 10**15  # from the clock: never reused
    r.xgroup_destroy(STREAM0, "intentstream-workers")
    r.xadd(STREAM0, {"user_id": "b", "type": "view"})
    for _ in range(3):
        try:
            consumer.tick()
        except redis.ResponseError as exc:  # recreated in the next round, as run() does
            assert "NOGROUP" in str(exc)
            consumer.recover(exc)
    assert r.xlen("intentstream:deadletter:{0}") == 1  # not replayed
    assert [x["user_id"] for x in score_entries(r)] == ["a", "b"]


def test_long_idle_consumers_are_forgotten(redis_server, golden_path, monkeypatch):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path)
    r.xadd(STREAM0, {"user_id": "z", "type": "view"})
    while not consumer.metrics.count("scored"):  # reads as c1
        consumer.tick()
    r.xreadgroup("intentstream-workers", "host-123", {STREAM0: ">"})  # a restarted worker's
    r.xadd(STREAM0, {"user_id": "a", "type": "view"})
    # a version before NOACK reads: its pending entries mean nothing now
    r.xreadgroup("intentstream-workers", "host-456", {STREAM0: ">"})
    monkeypatch.setattr(
        "worker.engine.adapters.maintenance.STALE_CONSUMER_MS", -1
    )  # any idle time is long
    consumer.maintenance.run(sorted(consumer.ownership.owned))
    names = {c["name"] for c in r.xinfo_consumers(STREAM0, "intentstream-workers")}
    assert names == {b"c1"} or names == {"c1"}


def assert_each_scored_once_as_offline(
    r, consumer: Consumer, model_path: Path, events: list[dict], partitions: int = 1
) -> None:
    """One score entry per event, counted once, each equal to offline scoring."""
    rows = score_entries(r, partitions=partitions)
    assert len(rows) == len(events) and consumer.metrics.count("scored") == len(events)
    by_id = {row["event_id"]: float(row["score"]) for row in rows}
    want = offline_scores(model_path, events)
    np.testing.assert_allclose([by_id[e["event_id"]] for e in events], want, atol=1e-5)


@pytest.mark.parametrize("partitions", [1, 2])
def test_batches_computed_ahead_score_as_offline_when_commits_between_refuse_them(
    redis_server, model_path, partitions
):
    """The loop computes the next batch while Redis runs the commit before it: of the same
    partition (its users' states partly from that commit) or of another. Sequence bumps
    between rounds, as another writer's commit would make, refuse some of those batches, and
    a SCRIPT FLUSH (as after a restart) fails the pipelined state reads: those batches are
    computed again, and every score still equals offline scoring."""
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(2400, 120, seed=9))]
    r = connect(redis_server.url)
    publish(r, events, partitions=partitions)
    consumer = in_process_consumer(
        redis_server.url, model_path, partitions=partitions, batch_size=60
    )
    used = []
    compute = consumer.flow.compute
    consumer.flow.compute = lambda batch, *a: used.append(compute(batch, *a)) or used[-1]
    keys = Keys("intentstream")
    ticks = 0
    while consumer.metrics.count("scored") < len(events):
        consumer.tick()
        ticks += 1
        if ticks % 5 == 0:
            r.incr(keys.commit_seq(ticks % partitions))  # another writer moved it on
        if ticks % 7 == 0:
            r.script_flush()
        assert ticks < 10_000, "stuck"
    assert sum(c.ahead for c in used) > 10  # most batches were computed ahead
    retries = consumer.metrics.value
    assert retries("intentstream_commit_retries_total", reason="conflict") > 0
    assert_each_scored_once_as_offline(r, consumer, model_path, events, partitions)


def test_a_batch_read_with_a_commit_is_computed_while_redis_runs_it(redis_server, model_path):
    """A trickle of events, a few arriving as each batch is processed: its commit's read
    ahead brings them as the one batch queued, whose users' states are known (cached, or
    written by that commit); it is computed while Redis runs the commit and kept only if that
    applied. Sequence bumps between rounds refuse some; every score equals offline scoring."""
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(900, 25, seed=4))]
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path, batch_size=50)
    used, sent = [], [0]
    compute = consumer.flow.compute

    def arrive_then_compute(batch, *read):
        publish(r, events[sent[0] : sent[0] + 12])  # read by this batch's commit
        sent[0] += 12
        used.append(compute(batch, *read))
        return used[-1]

    consumer.flow.compute = arrive_then_compute
    publish(r, events[:12])
    sent[0] = 12
    keys = Keys("intentstream")
    ticks = 0
    while consumer.metrics.count("scored") < len(events):
        consumer.tick()
        ticks += 1
        if ticks % 9 == 0:
            r.incr(keys.commit_seq(0))  # another writer moved it on
        assert ticks < 5_000, "stuck"
    assert sum(c.ahead for c in used) > 10  # computed during the commit before them
    assert consumer.metrics.value("intentstream_commit_retries_total", reason="conflict") > 0
    assert_each_scored_once_as_offline(r, consumer, model_path, events)


def test_a_batch_computed_ahead_is_dropped_when_the_intent_rules_changed_since():
    """A rule set swapped in between a batch's compute ahead and its turn: the batch is
    computed again with the rules in force, so a rule change takes effect from the next
    batch committed, as it does for batches not computed ahead."""
    from worker.engine.compute.batch import Batch
    from worker.engine.partition import Partition
    from worker.engine.readahead import Ahead

    batch, model, old_rules, new_rules = Batch(0), object(), object(), object()

    def computed_ahead(rules) -> Partition:
        part = Partition(0, cache=None)
        part.ahead = Ahead(batch, None, None, None, model, None, (0.0, 0.0), rules)
        return part

    assert computed_ahead(old_rules).take_ahead(batch, model, None, old_rules) is not None
    assert computed_ahead(old_rules).take_ahead(batch, model, None, new_rules) is None
    assert computed_ahead(None).take_ahead(batch, model, None, None) is not None


BLAS_PROBE = """
import json, sys, threadpoolctl
from worker.common.connection import connect
from worker.engine.consumer import Consumer
from worker.engine.adapters.metrics import WorkerMetrics
from worker.lifecycle.model_source import FileModelSource
from worker.common.settings import Settings

s = Settings(redis_url=sys.argv[1], model=sys.argv[2], metrics_port=0, block_ms=10)
consumer = Consumer(s, connect(sys.argv[1]), FileModelSource(s.model), WorkerMetrics())
seen = []

def tick():
    seen.extend(threadpoolctl.threadpool_info())
    consumer.stop()

consumer.tick = tick
consumer.run()
print(json.dumps([(i["internal_api"], i["filepath"], i["num_threads"]) for i in seen
                  if i["user_api"] == "blas"]))
"""


def test_the_running_loop_has_one_blas_thread_in_every_blas_library(redis_server, model_path):
    """A fresh process: the kernels load SciPy's OpenBLAS at their first call (the warm-up),
    so a limit set before it would miss that library, whose spinning thread took a core."""
    # without the tests' one-thread settings (conftest.py): the worker must pin BLAS itself
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", BLAS_PROBE, redis_server.url, str(model_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    libraries = json.loads(result.stdout.splitlines()[-1])
    assert any("scipy" in path for _, path, _ in libraries), libraries  # the kernels' BLAS
    assert {threads for _, _, threads in libraries} == {1}, libraries


def test_a_real_worker_dead_letters_an_entry_at_2_63_ms_and_scores_the_rest(
    redis_server, golden_path, tmp_path
):
    """The entry that crash-looped partitions (an id at 2^63 ms, no ts): one dead letter,
    the worker goes on, the events beside it are scored."""
    r = connect(redis_server.url)
    before = [r.xadd(STREAM0, {"user_id": f"u{i}", "type": "view"}) for i in range(5)]
    poison = r.execute_command("XADD", STREAM0, "9223372036854775808-0", "user_id", "m",
                               "type", "view")  # fmt: skip
    # every later id is above it: an event with its own ts is scored, one without is not
    after = r.xadd(STREAM0, {"user_id": "m", "type": "view", "ts": str(int(time.time() * 1000))})
    bare = r.xadd(STREAM0, {"user_id": "m", "type": "add_to_cart"})
    worker = WorkerProcess(redis_server.url, golden_path, tmp_path / "w.log").start()
    try:
        wait_for(lambda: count_scores(r) == 6 and r.xlen("intentstream:deadletter:{0}") == 2,
                 what="6 scores and 2 dead letters")  # fmt: skip
        dead = {f[b"source_id"]: f[b"error"].decode() for _, f in
                r.xrange("intentstream:deadletter:{0}")}  # fmt: skip
        assert set(dead) == {poison, bare}
        assert "past year 9999 and no ts is given" in dead[poison]
        scored = {row["event_id"] for row in score_entries(r)}
        assert scored == {i.decode() for i in [*before, after]}
        wait_for(lambda: all_committed(r),
                 what="everything acknowledged")  # fmt: skip
        assert worker.proc.poll() is None, worker.log()
    finally:
        assert worker.terminate() == 0, worker.log()
