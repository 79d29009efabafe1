"""`intentstream partitions resize` on one Redis and on a local Redis Cluster: states follow
their users, workers continue each user's state, refusals, and an interrupted run finished
by a second one."""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import redis

from model.artifact import save_model
from model.data.synthetic import synthetic_events
from model.random_init import random_model
from tests.conftest import console_script, run_cli
from tests.offline import offline_scores
from tests.workers import WorkerProcess, wait_for
from worker.common.connection import Client, connect
from worker.common.keys import Keys, parse_state_key, partition_of
from worker.common.local_redis import LocalRedis
from worker.common.partition_count import PartitionCountError, check_partitions
from worker.partitions.resize import resize, state_keys
from worker.producers.publisher import publish

pytestmark = pytest.mark.integration

KEYS = Keys()
GROUP = "intentstream-workers"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.npz"
    types = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout"]
    save_model(random_model([*types, "purchase"], hidden=16, features=["gap"], seed=3), path)
    return path


@pytest.fixture(params=["redis", "cluster"])
def backend(request):
    """(URL, client, worker flags) of a fresh Redis or of the module's flushed cluster."""
    if request.param == "redis":
        server = LocalRedis().start()
        client = connect(server.url)
        yield server.url, client, ()
        client.close()
        server.close()
        return
    c = request.getfixturevalue("cluster")
    client = connect(c.url, cluster=True)
    for node in client.get_primaries():
        client.get_redis_connection(node).flushall()
    yield c.url, client, ("--cluster",)
    client.close()


@pytest.fixture
def single(redis_server):
    client = connect(redis_server.url)
    yield redis_server.url, client, ()
    client.close()


def shop_events(n: int = 2400, users: int = 300, seed: int = 7) -> list[dict]:
    return [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(n, users, seed=seed))]


def total_scores(client: Client, partitions: int) -> int:
    return sum(client.xlen(KEYS.scores(p)) for p in range(partitions))


def run_worker_until(url, model, log, flags, partitions, client, want_scores) -> None:
    """Run one worker process until the score streams hold `want_scores` entries; stop it."""
    worker = WorkerProcess(
        url, model, log, "--partitions", str(partitions), "--lease-ms", "2000", *flags
    ).start()
    try:
        wait_for(
            lambda: total_scores(client, partitions) >= want_scores,
            timeout=120,
            what=f"{want_scores} scores",
        )
    finally:
        assert worker.terminate() == 0, worker.log()[-2000:]


def states(client: Client) -> dict[bytes, tuple[int, dict]]:
    """Every user's state: user -> (partition, hash); fails on a user with two states."""
    out: dict[bytes, tuple[int, dict]] = {}
    for key in state_keys(client, KEYS):
        p, user = parse_state_key(KEYS, key)
        assert user not in out, f"two states for {user!r}"
        out[user] = (p, client.hgetall(key))
    return out


def scored_phase_one(url, client, flags, model, tmp_path, events) -> dict:
    """Publish with P = 2, score everything with a worker, stop it; the states."""
    publish(client, events, partitions=2)
    run_worker_until(url, model, tmp_path / "w1.log", flags, 2, client, len(events))
    before = states(client)
    assert {p for p, _ in before.values()} == {0, 1}
    return before


def assert_moved(client: Client, before: dict, to: int) -> None:
    after = states(client)
    assert set(after) == set(before)  # nothing lost, nothing duplicated
    for user, (p, state) in after.items():
        assert p == zlib.crc32(user) % to
        assert state == before[user][1]


def test_resize_moves_every_state_and_workers_continue_them(backend, model_path, tmp_path):
    url, client, flags = backend
    events = shop_events()
    first, rest = events[:1400], events[1400:]
    before = scored_phase_one(url, client, flags, model_path, tmp_path, first)
    ttl_user = next(iter(before))
    client.pexpire(KEYS.state(before[ttl_user][0], ttl_user.decode()), 3_600_000)
    seqs = {p: client.get(KEYS.commit_seq(p)) for p in range(2)}

    result = run_cli("partitions", "resize", "--to", "4", "--redis-url", url, *flags)
    assert result.returncode == 0, result.stderr
    moved = sum(p != zlib.crc32(u) % 4 for u, (p, _) in before.items())
    assert f"{moved} user states moved" in result.stdout
    assert "groups created on partitions: 2, 3" in result.stdout

    assert_moved(client, before, 4)
    assert 0 < client.pttl(KEYS.state(zlib.crc32(ttl_user) % 4, ttl_user.decode())) <= 3_600_000
    assert client.hgetall(KEYS.config) == {b"partitions": b"4"}
    for p in range(4):
        assert [g["name"] for g in client.xinfo_groups(KEYS.events(p))] == [GROUP.encode()]
    for p in range(2):  # states left those partitions: a cache of them must not stay valid
        assert int(client.get(KEYS.commit_seq(p))) == int(seqs[p]) + 1
    with pytest.raises(PartitionCountError, match="have 4 partitions"):
        check_partitions(client, KEYS, 2)  # an old producer now refuses

    publish(client, rest, partitions=4)
    run_worker_until(url, model_path, tmp_path / "w2.log", flags, 4, client, len(events))
    rows = {}
    for p in range(4):
        for _, f in client.xrange(KEYS.scores(p)):
            rows[f[b"event_id"].decode()] = float(f[b"score"])
    assert len(rows) == len(events)  # each event scored once, none twice
    want = offline_scores(model_path, events)  # each user's whole history, in memory
    got = [rows[e["event_id"]] for e in events]
    np.testing.assert_allclose(got[1400:], want[1400:], atol=1e-5)
    for user, (p, state) in states(client).items():
        assert p == zlib.crc32(user) % 4
        assert int(state[b"n"]) == sum(e["user_id"] == user.decode() for e in events)


def test_interrupted_resize_finished_by_a_second_run(backend, model_path, tmp_path, monkeypatch):
    url, client, flags = backend
    before = scored_phase_one(url, client, flags, model_path, tmp_path, shop_events(2000, 600))
    import worker.partitions.resize as resize_module

    # Simulate a crash after the second chunk was copied but before its old keys were
    # deleted (the worst moment: two copies exist): its third pipeline (the DELs) fails.
    monkeypatch.setattr(resize_module, "CHUNK", 50)
    real, calls = resize_module._move_chunk, []

    def crashing(client_, keys, chunk, to, report, changed):
        calls.append(len(chunk))
        if len(calls) == 2:
            pipeline, made = client_.pipeline, []

            def failing_third(*a, **kw):
                made.append(1)
                if len(made) == 3:
                    raise redis.ConnectionError("simulated crash before the old keys go")
                return pipeline(*a, **kw)

            monkeypatch.setattr(client_, "pipeline", failing_third)
        return real(client_, keys, chunk, to, report, changed)

    monkeypatch.setattr(resize_module, "_move_chunk", crashing)
    with pytest.raises(redis.ConnectionError, match="simulated crash"):
        resize(client, KEYS, GROUP, 3)
    monkeypatch.undo()
    to_move = sum(p != zlib.crc32(u) % 3 for u, (p, _) in before.items())
    assert calls == [50, 50] and to_move > 100

    # Half-way: some states moved, some copied twice, the rest not yet moved.
    assert client.hgetall(KEYS.config) == {b"partitions": b"2", b"resize_to": b"3"}
    copies = list(state_keys(client, KEYS))
    assert len(copies) == len(before) + 50  # the chunk whose deletes never ran: two copies
    with pytest.raises(PartitionCountError, match="unfinished"):
        check_partitions(client, KEYS, 3)  # workers refuse to start meanwhile
    refused = WorkerProcess(url, model_path, tmp_path / "w.log", "--partitions", "2", *flags)
    refused.start()
    assert refused.proc.wait(60) == 2
    assert "run `intentstream partitions resize` again" in refused.log()

    result = run_cli("partitions", "resize", "--to", "3", "--redis-url", url, *flags)
    assert result.returncode == 0, result.stderr
    assert f"{to_move - 100} user states moved (50 finished from an interrupted run)" in (
        result.stdout
    )
    assert_moved(client, before, 3)
    assert client.hgetall(KEYS.config) == {b"partitions": b"3"}


def test_refuses_while_a_worker_runs(single, model_path, tmp_path):
    url, client, _ = single
    publish(client, shop_events(200, 20), partitions=2)
    worker = WorkerProcess(url, model_path, tmp_path / "w.log", "--partitions", "2").start()
    try:
        wait_for(lambda: client.exists(KEYS.lease(0), KEYS.lease(1)) == 2, what="leases")
        result = run_cli("partitions", "resize", "--to", "4", "--redis-url", url)
    finally:
        assert worker.terminate() == 0
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert "workers are running" in result.stderr and "[0, 1]" in result.stderr
    assert client.hgetall(KEYS.config) == {b"partitions": b"2"}  # nothing recorded


def unacked(client: Client, p: int) -> list[tuple[bytes, dict]]:
    """The entries of partition p after its last acknowledged one."""
    acked = client.get(KEYS.acked(p))
    return client.xrange(KEYS.events(p), "(" + acked.decode() if acked else "-", "+")


def test_undelivered_and_pending_entries_move_with_their_users(single, model_path, tmp_path):
    url, client, _ = single
    events = shop_events(300, 30)
    publish(client, events, partitions=2)
    check_partitions(client, KEYS, 2)
    # a group that read 5 entries of partition 1 and acknowledged none (a killed worker)
    for p in range(2):
        client.xgroup_create(KEYS.events(p), GROUP, id="0")
    client.xreadgroup(GROUP, "c", {KEYS.events(1): ">"}, count=5)
    result = run_cli("partitions", "resize", "--to", "3", "--redis-url", url)
    assert result.returncode == 0, result.stderr
    staying = sum(partition_of(e["user_id"], 3) == partition_of(e["user_id"], 2) for e in events)
    assert f"{len(events) - staying} unacknowledged entries and" in result.stdout
    for q in range(3):
        for _, fields in unacked(client, q):
            assert partition_of(fields[b"user_id"].decode(), 3) == q
    assert sum(len(unacked(client, q)) for q in range(3)) == len(events)
    # each entry once, all scored by a worker with the new count, none dead-lettered
    run_worker_until(url, model_path, tmp_path / "w.log", (), 3, client, len(events))
    rows = [f for q in range(3) for _, f in client.xrange(KEYS.scores(q))]
    assert sorted(f[b"event_id"].decode() for f in rows) == sorted(e["event_id"] for e in events)
    assert not any(client.xlen(KEYS.deadletter(q)) for q in range(3))
    # the moved entries kept their time: each score's ts is the event's
    ts = {e["event_id"]: e["ts"] for e in events}
    assert all(int(f[b"ts"]) == ts[f[b"event_id"].decode()] for f in rows)


def test_a_producer_publishing_across_a_resize_loses_nothing(backend, model_path, tmp_path):
    """`intentstream publish` runs the whole time: before, during and after the resize.
    Every event is scored exactly once and none is dead-lettered (misrouted)."""
    url, client, flags = backend
    check_partitions(client, KEYS, 2)
    worker = WorkerProcess(url, model_path, tmp_path / "w1.log", "--partitions", "2",
                           "--lease-ms", "2000", *flags).start()  # fmt: skip
    wait_for(lambda: client.exists(KEYS.lease(0), KEYS.lease(1)) == 2, what="leases")
    # 10 s of publishing: the worker's stop and the resize (two command starts) fit inside
    # it on a slow machine under the suite's load (at 300/s the producer once ended first)
    producer = subprocess.Popen(
        [console_script(), "publish", "--synthetic", "1500", "--users", "300", "--rate", "150",
         "--partitions", "2", "--redis-url", url, *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: total_scores(client, 2) >= 300, 60, "scores before the resize")
        assert worker.terminate() == 0, worker.log()[-2000:]
        result = run_cli("partitions", "resize", "--to", "3", "--redis-url", url, *flags)
        assert result.returncode == 0, result.stderr
        assert producer.poll() is None, "the producer should still be running"
        run_worker_until(url, model_path, tmp_path / "w2.log", flags, 3, client, 1500)
        _, err = producer.communicate(timeout=60)
    finally:
        if producer.poll() is None:
            producer.kill()
    assert producer.returncode == 0, err
    rows = [f for q in range(3) for _, f in client.xrange(KEYS.scores(q))]
    ids = [f[b"event_id"] for f in rows]
    assert len(ids) == len(set(ids)) == 1500
    assert not any(client.xlen(KEYS.deadletter(q)) for q in range(3))
    for _, fields in unacked(client, 0) + unacked(client, 1) + unacked(client, 2):
        raise AssertionError(f"left unscored: {fields}")
    # partition 2 got both: entries the resize moved (it dates them: `ts` added) and entries
    # the producer re-routed there itself after its stale count was refused (no `ts`)
    new = [f for _, f in client.xrange(KEYS.events(2))]
    assert any(b"ts" in f for f in new) and any(b"ts" not in f for f in new)


def test_refuses_without_a_recorded_count_and_a_same_count_is_a_no_op(single):
    url, client, _ = single
    result = run_cli("partitions", "resize", "--to", "3", "--redis-url", url)
    assert result.returncode == 2
    assert "no partition count is recorded" in result.stderr
    check_partitions(client, KEYS, 3)
    result = run_cli("partitions", "resize", "--to", "3", "--redis-url", url)
    assert result.returncode == 0, result.stderr
    assert "0 user states moved" in result.stdout


def test_shrinking_keeps_the_history_of_the_dropped_partitions(single, model_path, tmp_path):
    url, client, _ = single
    events = shop_events(800, 100)
    publish(client, events, partitions=4)
    run_worker_until(url, model_path, tmp_path / "w.log", (), 4, client, len(events))
    before = states(client)
    history = {p: client.xlen(KEYS.events(p)) for p in (2, 3)}

    result = run_cli("partitions", "resize", "--to", "2", "--redis-url", url)
    assert result.returncode == 0, result.stderr
    assert "groups created on partitions: none" in result.stdout
    assert_moved(client, before, 2)
    assert {p for p, _ in states(client).values()} == {0, 1}
    # partitions 2 and 3 keep their streams and group (training reads only the first 2)
    assert {p: client.xlen(KEYS.events(p)) for p in (2, 3)} == history
    assert client.xinfo_groups(KEYS.events(3))[0]["name"] == GROUP.encode()
    assert client.hgetall(KEYS.config) == {b"partitions": b"2"}


def test_a_user_with_two_states_keeps_the_later_and_other_types_stay(single):
    url, client, _ = single
    check_partitions(client, KEYS, 2)
    user = next(f"u{i}" for i in range(100) if zlib.crc32(f"u{i}".encode()) % 3 == 2)
    older = {b"h": b"\0" * 8, b"last_id": b"1700000000000-0", b"n": b"1"}
    newer = {b"h": b"\1" * 8, b"last_id": b"1700000000500-0", b"n": b"2"}
    client.hset(KEYS.state(0, user), mapping=newer)  # e.g. an old misrouted producer
    client.hset(KEYS.state(1, user), mapping=older)
    client.set(KEYS.state(0, "operator"), "not a hash")

    result = run_cli("partitions", "resize", "--to", "3", "--redis-url", url)
    assert result.returncode == 0, result.stderr
    assert "1 users had states in two partitions (kept the later)" in result.stdout
    assert client.hgetall(KEYS.state(2, user)) == newer
    assert not client.exists(KEYS.state(0, user), KEYS.state(1, user))
    assert client.get(KEYS.state(0, "operator")) == b"not a hash"
    assert "1 keys of another type left in place" in result.stdout


def test_a_running_worker_stops_when_a_resize_begins(redis_server, tmp_path):
    """A worker paused past its lease (or starting) when a resize runs must not come back
    with the old count: at its next renewal it sees the change and exits 2."""
    import signal as _signal

    from model.artifact import save_model
    from model.random_init import random_model
    from tests.workers import WorkerProcess, wait_for
    from worker.common.connection import connect

    model = tmp_path / "m.npz"
    save_model(random_model(["view"], hidden=4, seed=1), model)
    r = connect(redis_server.url)
    r.hset("intentstream:config", "partitions", 2)
    worker = WorkerProcess(redis_server.url, model, tmp_path / "w.log", "--partitions", "2",
                           "--lease-ms", "300").start()  # fmt: skip
    try:
        wait_for(lambda: r.exists("intentstream:lease:{0}"), what="the worker's leases")
        r.hset("intentstream:config", "resize_to", 3)  # what resize does first
        assert worker.proc.wait(60) == 2
    finally:
        if worker.proc.poll() is None:
            worker.proc.send_signal(_signal.SIGKILL)
    assert "the partition count changed" in worker.log()
    assert not r.exists("intentstream:lease:{0}") and not r.exists("intentstream:lease:{1}")
