"""Issue 44: a partition's position is the truth (docs/contract.md, The position). It only
moves forward: what lies at or below it is never applied again, whatever is done to the
group or to `acked`."""

from __future__ import annotations

import pytest
import redis

from tests.conftest import run_cli
from tests.consumers import in_process_consumer
from tests.workers import all_committed, count_scores
from worker.common.connection import connect
from worker.common.entry_ids import entry_id
from worker.common.keys import Keys
from worker.engine.consumer import Consumer

KEYS = Keys()
STREAM0 = KEYS.events(0)
GROUP = "intentstream-workers"
DEAD0 = KEYS.deadletter(0)


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
    consumer = in_process_consumer(redis_server.url, golden_path, block_ms=50)
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
        consumer = in_process_consumer(redis_server.url, golden_path, block_ms=50)
        watch.consumer = consumer
    bad_and_good(r, 2, 2, tag="later")
    watch.settle()
    assert r.xlen(DEAD0) == 7 and count_scores(r) == 7
    consumer.close()


def stopped(consumer: Consumer, p: int, reason: str) -> float | None:
    return consumer.metrics.registry.get_sample_value(
        "intentstream_partition_stopped", {"partition": str(p), "reason": reason}
    )


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda r: (r.delete(KEYS.acked(0)), r.rpush(KEYS.acked(0), "x")), "wrong_type"),
        (lambda r: r.set(KEYS.acked(0), "not-an-id"), "unparsable"),
        (lambda r: r.set(KEYS.acked(0), "99999999999999-0"), "ahead"),
    ],
)
def test_an_impossible_position_stops_its_partition_only_until_repaired(
    redis_server, golden_path, spoil, reason, caplog
):
    """Partition 0's `acked` spoiled: partition 1 goes on; partition 0 stops, counted in
    intentstream_partition_stopped, logged at error level with the key and the repair; the
    repair command (dry run first) puts it back, and partition 0 resumes by itself."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path, block_ms=50, partitions=2)
    r.xadd(KEYS.events(0), {"user_id": "d", "type": "view"})
    r.xadd(KEYS.events(1), {"user_id": "a", "type": "view"})
    for _ in range(20):
        consumer.tick()
        if all_committed(r, partitions=2):
            break
    assert count_scores(r, partitions=2) == 2
    spoil(r)
    consumer.maintenance.run([0, 1])  # skips partition 0, raises nothing
    consumer.rewind()  # as after an outage: every partition seeks to its position
    r.xadd(KEYS.events(0), {"user_id": "e", "type": "view"})
    r.xadd(KEYS.events(1), {"user_id": "b", "type": "view"})
    with caplog.at_level("ERROR", logger="intentstream.worker"):
        for _ in range(20):
            consumer.tick()
            if r.xlen(KEYS.scores(1)) == 2:
                break
    assert r.xlen(KEYS.scores(1)) == 2 and r.xlen(KEYS.scores(0)) == 1
    assert stopped(consumer, 0, reason) == 1 and stopped(consumer, 1, reason) is None
    line = next(x for x in caplog.records if "position is impossible" in x.getMessage())
    assert line.levelname == "ERROR" and line.key == KEYS.acked(0)
    assert "intentstream partitions repair 0" in line.repair

    dry = run_cli("partitions", "repair", "0", "--dry-run", "--redis-url", redis_server.url)
    assert dry.returncode == 0, dry.stderr
    assert "would run: SET intentstream:acked:{0}" in dry.stdout
    assert r.xlen(KEYS.scores(0)) == 1 and r.type(KEYS.acked(0)) == spoiled_type(reason)
    done = run_cli("partitions", "repair", "0", "--redis-url", redis_server.url)
    assert done.returncode == 0, done.stderr
    assert "did: SET intentstream:acked:{0}" in done.stdout
    for _ in range(400):  # the stopped partition retries after its backoff (1 s)
        consumer.tick()
        if r.xlen(KEYS.scores(0)) == 2:
            break
    assert r.xlen(KEYS.scores(0)) == 2 and stopped(consumer, 0, reason) is None
    assert r.xlen(DEAD0) == 0 and count_scores(r, partitions=2) == 4
    again = run_cli("partitions", "repair", "0", "--redis-url", redis_server.url)
    assert "nothing to do" in again.stdout
    consumer.close()


def spoiled_type(reason: str) -> bytes:
    return b"list" if reason == "wrong_type" else b"string"


def lag(consumer: Consumer, p: int = 0) -> float | None:
    return consumer.metrics.registry.get_sample_value(
        "intentstream_lag_entries", {"partition": str(p)}
    )


def test_entries_skipped_by_the_group_are_read_without_traffic(redis_server, golden_path):
    """`XGROUP SETID ... $` past unread entries of an idle partition: the maintenance tick
    finds the group past this worker's last read, counts the skipped entries in the lag and
    seeks back, so they are scored with no later event to reveal them."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path, block_ms=50)
    watch = Watch(r, consumer)
    bad_and_good(r, 0, 3)
    watch.settle()
    for i in range(7):
        r.xadd(STREAM0, {"user_id": f"late{i}", "type": "view"})
    r.xgroup_setid(STREAM0, GROUP, "$")  # as another reader of the group would leave it
    for _ in range(3):  # idle rounds: nothing is delivered
        consumer.tick()
    assert count_scores(r) == 3
    consumer.tick()
    consumer.maintain()  # the maintenance cadence comes round
    assert lag(consumer) == 7  # undelivered (0) and skipped (7)
    watch.settle()
    assert count_scores(r) == 10
    consumer.tick()
    consumer.maintain()
    assert lag(consumer) == 0
    consumer.close()


def lost(consumer: Consumer, cause: str, p: int = 0) -> float:
    return consumer.metrics.value("intentstream_events_lost_total", partition=str(p), cause=cause)


def test_unread_entries_trimmed_or_deleted_are_counted_exactly(redis_server, golden_path, caplog):
    """Entries removed before the worker applied them (a producer's XTRIM or XADD MAXLEN, an
    XDEL) are counted in intentstream_events_lost_total{partition,cause} and logged, each
    once; the worker's own retention trim and removals of committed entries count nothing."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path, block_ms=50)
    watch = Watch(r, consumer)
    bad_and_good(r, 1, 3)
    watch.settle()
    consumer.maintenance.run([0])  # the first look: nothing missing
    for i in range(10):
        r.xadd(STREAM0, {"user_id": f"t{i}", "type": "view"})
    r.xtrim(STREAM0, maxlen=4, approximate=False)  # 4 committed and 6 unread entries go
    with caplog.at_level("ERROR", logger="intentstream.worker"):
        consumer.maintenance.run([0])
        consumer.maintenance.run([0])  # counted once
    assert lost(consumer, "trimmed") == 6 and lost(consumer, "deleted") == 0
    line = next(x for x in caplog.records if "before they were applied" in x.getMessage())
    assert line.lost == 6 and line.cause == "trimmed" and line.partition == 0
    watch.settle()
    assert count_scores(r) == 7
    ids = [r.xadd(STREAM0, {"user_id": f"d{i}", "type": "view"}) for i in range(5)]
    r.xdel(STREAM0, ids[1], ids[3])
    r.xdel(STREAM0, r.xrange(STREAM0, count=1)[0][0])  # a committed entry: no loss
    consumer.maintenance.run([0])
    assert lost(consumer, "deleted") == 2 and lost(consumer, "trimmed") == 6
    watch.settle()
    assert count_scores(r) == 10
    r.xadd(STREAM0, {"user_id": "m", "type": "view"}, maxlen=1, approximate=False)  # MAXLEN
    consumer.maintenance.run([0])
    assert lost(consumer, "trimmed") == 6  # it trimmed committed entries only
    consumer.close()


def test_entries_trimmed_while_no_worker_runs_are_counted_by_the_next(redis_server, golden_path):
    """The count lives in Redis: entries trimmed unread while the partition's worker was
    down are counted by the worker that takes the partition next, once."""
    r = connect(redis_server.url)
    first = in_process_consumer(redis_server.url, golden_path, block_ms=50)
    bad_and_good(r, 0, 3)
    Watch(r, first).settle()
    first.maintenance.run([0])
    first.ownership.release_all()
    first.close()
    for i in range(10):
        r.xadd(STREAM0, {"user_id": f"t{i}", "type": "view"}, maxlen=5, approximate=False)
    second = in_process_consumer(redis_server.url, golden_path, block_ms=50)
    Watch(r, second).settle()
    second.tick()
    second.maintain()
    second.tick()
    second.maintain()
    assert lost(second, "trimmed") == 5 and count_scores(r) == 8
    second.close()


def test_a_deleted_committed_count_or_stream_counts_no_loss(redis_server, golden_path):
    """Counts that go back (the committed count deleted by an operator, the stream deleted
    and recreated) move the base: no phantom loss."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path, block_ms=50)
    bad_and_good(r, 0, 5)
    Watch(r, consumer).settle()
    consumer.maintenance.run([0])
    r.delete(KEYS.committed(0))
    consumer.maintenance.run([0])
    r.delete(STREAM0)
    r.xgroup_create(STREAM0, GROUP, id="0", mkstream=True)
    r.xadd(STREAM0, {"user_id": "new", "type": "view"})
    consumer.maintenance.run([0])
    Watch(r, consumer).settle()
    consumer.maintenance.run([0])
    assert lost(consumer, "trimmed") == 0 and lost(consumer, "deleted") == 0
    consumer.close()


def test_commits_of_an_earlier_release_count_no_loss(redis_server, golden_path):
    """A rolling upgrade: a worker of a release before the committed count commits (acked
    and the sequence move, the count does not): no phantom loss."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, golden_path, block_ms=50)
    bad_and_good(r, 0, 3)
    Watch(r, consumer).settle()
    consumer.maintenance.run([0])
    ids = [r.xadd(STREAM0, {"user_id": f"o{i}", "type": "view"}) for i in range(4)]
    r.set(KEYS.acked(0), ids[-1])  # as that worker's commit writes, without the count
    r.incr(KEYS.commit_seq(0))
    r.xgroup_setid(STREAM0, GROUP, ids[-1])
    consumer.maintenance.run([0])
    assert lost(consumer, "trimmed") == 0 and lost(consumer, "deleted") == 0
    for i in range(3):  # and a real loss after it still counts
        r.xadd(STREAM0, {"user_id": f"t{i}", "type": "view"})
    r.xtrim(STREAM0, maxlen=1, approximate=False)
    consumer.maintenance.run([0])
    assert lost(consumer, "trimmed") == 2
    consumer.close()
