"""Crashes and outages: kill -9 of the worker, a Redis restart. Nothing lost, nothing twice."""

from __future__ import annotations

import random
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from model.artifact import load_model
from model.data.synthetic import synthetic_events
from model.scoring import InMemoryScorer, ScoringModel
from tests.actions_check import assert_actions_exactly_once, set_firing_rules
from tests.workers import WorkerProcess, all_committed, count_scores, score_entries, wait_for
from worker.common.connection import connect
from worker.common.keys import partition_of
from worker.common.local_redis import free_port
from worker.engine.compute.lean_state import as_fields
from worker.producers.publisher import publish

pytestmark = pytest.mark.integration

PARTITIONS = 2


def uninterrupted(model_path: Path, events: list[dict]):
    """Scores and final states of one uninterrupted in-memory run over the same events."""
    scorer = InMemoryScorer(ScoringModel(load_model(model_path)))
    scores = scorer.score(
        [e["user_id"] for e in events],
        [e["type"] for e in events],
        np.array([e["ts"] for e in events]),
    )
    return scores, scorer._state


def with_event_ids(events) -> list[dict]:
    """Events with producer event ids e0, e1, ...: score entries carry them."""
    return [e | {"event_id": f"e{i}"} for i, e in enumerate(events)]


def assert_exactly_once_and_equal(r, events, model_path, partitions=PARTITIONS):
    rows = score_entries(r, partitions=partitions)
    keys = [(partition_of(e["user_id"], partitions), e["event_id"]) for e in events]
    by_key = {(row["partition"], row["event_id"]): row for row in rows}
    assert len(rows) == len(events), "an event was scored twice or not at all"
    assert set(by_key) == set(keys)
    want_scores, want_states = uninterrupted(model_path, events)
    got = np.array([float(by_key[k]["score"]) for k in keys])
    np.testing.assert_allclose(got, want_scores, atol=1e-5)
    for user, h in want_states.items():
        p = partition_of(user, partitions)
        stored = as_fields(r.hgetall(f"intentstream:state:{{{p}}}:{user}"))[b"h"]  # any layout
        np.testing.assert_allclose(np.frombuffer(stored, "<f4").reshape(h.shape), h, atol=1e-5)
    assert all_committed(r, partitions=partitions)


def test_kill_9_at_random_points_loses_nothing_and_applies_nothing_twice(
    redis_server, model_path, tmp_path
):
    events = with_event_ids(synthetic_events(30000, 1000, seed=9))
    r = connect(redis_server.url)
    rules = set_firing_rules(r, model_path, events)
    publish(r, events, partitions=PARTITIONS)
    rng = random.Random(4)
    log = tmp_path / "w.log"
    common = ["--partitions", str(PARTITIONS), "--batch-size", "50", "--lease-ms", "1000"]
    # Restarts alternate between the same consumer name (its own pending entries come back
    # first) and a new one (which takes the partitions when the dead one's lease runs out),
    # and between the layouts (docs/contract.md, The lean layout): each worker reads the
    # states the other wrote. Each kill comes after a random amount of progress (at most
    # 3,000 of 30,000 events), so all four happen mid-run whatever the machine's speed.
    for round_ in range(4):
        name = "w-a" if round_ % 2 == 0 else f"w-{round_}"
        layout = ("lean", "full")[round_ % 2]
        worker = WorkerProcess(
            redis_server.url, model_path, log, *common, "--consumer", name, "--layout", layout
        ).start()
        target = count_scores(r, partitions=PARTITIONS) + rng.randint(1, 3000)
        wait_for(lambda t=target: count_scores(r, partitions=PARTITIONS) >= t, what="progress")
        worker.kill()
    final = WorkerProcess(
        redis_server.url, model_path, log, *common, "--consumer", "w-final"
    ).start()
    try:
        wait_for(
            lambda: count_scores(r, partitions=PARTITIONS) >= len(events),
            timeout=120,
            what="all scores",
        )
    finally:
        assert final.terminate() == 0  # after exit, nothing more can be written
    assert_exactly_once_and_equal(r, events, model_path)
    assert_actions_exactly_once(r, events, model_path, PARTITIONS, rules)


def ready_status(port: int) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30).status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_redis_restart_mid_run_is_survived(aof_redis_server, model_path, tmp_path):
    events = with_event_ids(synthetic_events(5000, 300, seed=12))
    r = connect(aof_redis_server.url)
    rules = set_firing_rules(r, model_path, events)
    publish(r, events, partitions=PARTITIONS)
    port = free_port()
    worker = WorkerProcess(
        aof_redis_server.url, model_path, tmp_path / "w.log",
        "--partitions", str(PARTITIONS), "--batch-size", "50", "--metrics-port", str(port),
    ).start()  # fmt: skip
    try:
        wait_for(lambda: count_scores(r, partitions=PARTITIONS) > 500, what="first scores")
        aof_redis_server.stop()
        wait_for(lambda: ready_status(port) == 503, timeout=30, what="/readyz to turn 503")
        aof_redis_server.start()
        r = connect(aof_redis_server.url)
        wait_for(
            lambda: count_scores(r, partitions=PARTITIONS) >= len(events),
            timeout=90,
            what="all scores",
        )
        wait_for(lambda: ready_status(port) == 200, timeout=30, what="/readyz back to 200")
    finally:
        assert worker.terminate() == 0
    assert "redis unavailable" in worker.log()
    assert_exactly_once_and_equal(r, events, model_path)
    assert_actions_exactly_once(r, events, model_path, PARTITIONS, rules)


def test_two_workers_share_the_partitions_and_one_takes_over_when_the_other_dies(
    redis_server, model_path, tmp_path
):
    events = with_event_ids(synthetic_events(12_000, 600, seed=21))
    r = connect(redis_server.url)
    rules = set_firing_rules(r, model_path, events)
    publish(r, events[:4000], partitions=4)
    common = ["--partitions", "4", "--batch-size", "50", "--lease-ms", "1000"]
    w1 = WorkerProcess(redis_server.url, model_path, tmp_path / "w1.log", *common,
                       "--consumer", "w1").start()  # fmt: skip
    w2 = WorkerProcess(redis_server.url, model_path, tmp_path / "w2.log", *common,
                       "--consumer", "w2").start()  # fmt: skip

    def holders() -> list[str]:
        return [(r.get(f"intentstream:lease:{{{p}}}") or b"-").decode().split(":")[0]
                for p in range(4)]  # fmt: skip

    try:
        wait_for(lambda: sorted(holders()) == ["w1", "w1", "w2", "w2"], what="two each")
        publish(r, events[4000:8000], partitions=4)
        wait_for(lambda: count_scores(r, partitions=4) >= 8000, what="8000 scores")
        w1.kill()
        publish(r, events[8000:], partitions=4)
        wait_for(lambda: holders() == ["w2"] * 4, what="w2 to take all partitions")
        wait_for(lambda: count_scores(r, partitions=4) >= len(events), what="all scores")
    finally:
        w1.kill()
        assert w2.terminate() == 0
    assert "handed partitions over" in w1.log() + w2.log()
    assert_exactly_once_and_equal(r, events, model_path, partitions=4)
    assert_actions_exactly_once(r, events, model_path, 4, rules)
