"""Issue 44: a partition's position is the truth (docs/contract.md, The position). It only
moves forward: what lies at or below it is never applied again, whatever is done to the
group or to `acked`."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.workers import all_committed, count_scores
from worker.common.connection import connect
from worker.common.keys import Keys
from worker.common.settings import Settings
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.adapters.model_source import FileModelSource
from worker.engine.compute.batch import entry_id
from worker.engine.consumer import Consumer

KEYS = Keys()
STREAM0 = KEYS.events(0)
GROUP = "intentstream-workers"
DEAD0 = KEYS.deadletter(0)


def consumer_on(url: str, model: Path, **settings) -> Consumer:
    s = Settings(redis_url=url, model=model, metrics_port=0, block_ms=50, consumer="c1",
                 **settings)  # fmt: skip
    consumer = Consumer(s, connect(url), FileModelSource(model), WorkerMetrics())
    consumer.model.warm_up()
    return consumer


class Watch:
    """Ticks a consumer until every entry is committed, checking after each tick that the
    position never moved backwards."""

    def __init__(self, r: redis.Redis, consumer: Consumer) -> None:
        self.r, self.consumer = r, consumer
        self.highest = (0, 0)

    def position(self) -> tuple[int, int]:
        """`acked` (the highest seen while a test deleted it)."""
        acked = self.r.get(KEYS.acked(0))
        return self.highest if acked is None else entry_id(acked)

    def settle(self, ticks: int = 40) -> None:
        for _ in range(ticks):
            self.consumer.tick()
            at = self.position()
            assert at >= self.highest, f"acked moved back from {self.highest} to {at}"
            self.highest = at
            if all_committed(self.r) and not self.consumer.parts.queued():
                return
        raise AssertionError("not all committed")


def bad_and_good(r: redis.Redis, bad: int, good: int, tag: str = "") -> None:
    for i in range(bad):
        r.xadd(STREAM0, {"user_id": "", "type": "view", "n": f"{tag}{i}"})  # dead letters
    for i in range(good):
        r.xadd(STREAM0, {"user_id": f"u{tag}{i}", "type": "view"})


@pytest.mark.parametrize("how", ["setid-0", "del-acked", "del-acked-new-worker"])
def test_the_position_only_moves_forward(redis_server, golden_path, how):
    """The group moved back (`XGROUP SETID ... 0`) or `acked` deleted under a running worker
    (or before the next one starts): nothing at or below the position is applied again (no
    dead letter twice), and `acked` never moves backwards."""
    r = connect(redis_server.url)
    consumer = consumer_on(redis_server.url, golden_path)
    watch = Watch(r, consumer)
    bad_and_good(r, 5, 5)
    watch.settle()
    assert r.xlen(DEAD0) == 5 and count_scores(r) == 5
    if how == "setid-0":
        r.xgroup_setid(STREAM0, GROUP, "0")
    else:
        r.delete(KEYS.acked(0))
    if how == "del-acked-new-worker":
        consumer.ownership.release_all()
        consumer.close()
        consumer = consumer_on(redis_server.url, golden_path)
        watch.consumer = consumer
    bad_and_good(r, 2, 2, tag="later")
    watch.settle()
    assert r.xlen(DEAD0) == 7 and count_scores(r) == 7
    consumer.close()
