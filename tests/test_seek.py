"""A partition's position (adapters/streams.py): reads with NOACK resume after the last
commit (`acked`); the seek moves the group back there with its entries-read kept exact, so
the lag KEDA scales on stays true; the maintenance tick counts what was delivered and not
committed, and never trims it."""

from __future__ import annotations

import pytest
import redis

from tests.group_stream import GROUP, KEYS, STREAM, fill, group
from worker.common.connection import connect
from worker.common.settings import Settings
from worker.engine.adapters.lag import undelivered
from worker.engine.adapters.maintenance import Maintenance
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.adapters.streams import Cursor, PositionError, StreamReader


@pytest.fixture
def r(redis_server):
    client = connect(redis_server.url)
    yield client
    client.close()


def reader(r: redis.Redis) -> StreamReader:
    return StreamReader(r, KEYS, GROUP, "c", 1)


def test_the_seek_delivers_again_what_was_not_committed_and_keeps_the_lag_exact(r):
    ids = fill(r, 10, read=6, noack=True)
    r.set(KEYS.acked(0), ids[2])  # committed up to the third entry
    cursor = Cursor(0)
    assert reader(r).seek(cursor) == ids[2] and cursor.after == ids[2]
    g = group(r)
    assert g["last-delivered-id"] == ids[2] and g["entries-read"] == 3 and g["lag"] == 7
    batches = reader(r).read([Cursor(0, after=ids[2])], 100, 10)
    assert batches[0].ids == ids[3:] and batches[0].after == ids[2]
    assert group(r)["lag"] == 0


def test_nothing_delivered_past_the_position_leaves_the_group_alone(r):
    ids = fill(r, 5, read=5, noack=True)
    r.set(KEYS.acked(0), ids[-1])
    before = group(r)
    assert reader(r).seek(Cursor(0)) == ids[-1]
    assert group(r) == before


def test_before_the_first_commit_the_seek_goes_to_the_start(r):
    ids = fill(r, 4, read=2, noack=True)
    assert reader(r).seek(Cursor(0)) == b"0-0"
    assert reader(r).read([Cursor(0, after=b"0-0")], 100, 10)[0].ids == ids


def test_a_group_behind_the_position_is_moved_up_to_it(r):
    ids = fill(r, 6, read=0, noack=True)
    r.set(KEYS.acked(0), ids[3])  # an operator's SETID put the group back
    reader(r).seek(Cursor(0))
    assert group(r)["last-delivered-id"] == ids[3]


def test_a_deleted_acked_seeks_to_the_last_commit_tokens_entry(r):
    """`DEL acked:{p}` (as an old message advised): the position is the entry the partition's
    last commit token records, not the stream's start."""
    ids = fill(r, 6, read=6, noack=True)
    r.set(KEYS.last_commit(0), b"c:0123 " + ids[3])
    assert reader(r).seek(Cursor(0)) == ids[3]
    assert group(r)["last-delivered-id"] == ids[3]


@pytest.mark.parametrize(
    ("set_acked", "reason"),
    [
        (lambda r, ids: r.rpush(KEYS.acked(0), "x"), "wrong_type"),
        (lambda r, ids: r.set(KEYS.acked(0), "yesterday"), "unparsable"),
        (lambda r, ids: r.set(KEYS.acked(0), "18446744073709551616-0"), "unparsable"),
        (lambda r, ids: r.set(KEYS.acked(0), b"9" + ids[-1]), "ahead"),
    ],
)
def test_an_impossible_position_is_refused_by_the_seek(r, set_acked, reason):
    ids = fill(r, 3, read=3, noack=True)
    set_acked(r, ids)
    before = group(r)
    with pytest.raises(PositionError) as refused:
        reader(r).seek(Cursor(0))
    assert refused.value.reason == reason and refused.value.partition == 0
    assert KEYS.acked(0) in refused.value.detail and "script" not in refused.value.detail
    assert group(r) == before  # nothing moved


def test_a_position_past_a_new_empty_stream_is_possible_until_the_clock(r):
    """A deleted stream recreated empty (as the worker does): a position in the past is
    fine (every new entry comes after it); one later than the server's clock is not."""
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    r.set(KEYS.acked(0), "1700000000000-5")
    assert reader(r).seek(Cursor(0)) == b"1700000000000-5"
    r.set(KEYS.acked(0), "18446744073709551615-18446744073709551615")  # an XADD of the max id
    with pytest.raises(PositionError, match="ahead"):
        reader(r).seek(Cursor(0))


def test_a_group_behind_the_position_gets_its_entries_read_exact(r):
    """An operator's `SETID ... 0 ENTRIESREAD 0`: the seek moves the group up to the position
    and forward by the entries between, so the lag KEDA reads stays exact."""
    ids = fill(r, 8, read=8, noack=True)
    r.set(KEYS.acked(0), ids[4])
    r.xgroup_setid(STREAM, GROUP, "0", entries_read=0)
    reader(r).seek(Cursor(0))
    g = group(r)
    assert g["last-delivered-id"] == ids[4] and g["entries-read"] == 5 and g["lag"] == 3


def test_a_far_seek_walks_no_more_than_its_cap(r, monkeypatch):
    """Past the walk cap (a seek's cost stays a few ms at any distance) the group's
    entries-read comes from the stream's counters where they tell (the position before the
    first entry, at the last, or within a quarter of the cap of an end with no XDEL between),
    else
    it is left unknown and the lag is counted outside."""
    monkeypatch.setattr("worker.engine.adapters.streams.SEEK_WALK_CAP", 10)  # the ends': 2
    ids = fill(r, 60, read=60, noack=True)
    r.set(KEYS.acked(0), ids[29])  # 30 back, 30 from the first: more than the cap, unknown
    reader(r).seek(Cursor(0))
    g = group(r)
    assert g["last-delivered-id"] == ids[29] and g["lag"] is None
    assert undelivered(r, STREAM, g) == 30
    r.set(KEYS.acked(0), ids[1])  # 58 back, but 2 from the first: the removed + 2
    r.xgroup_setid(STREAM, GROUP, ids[-1], entries_read=60)
    reader(r).seek(Cursor(0))
    assert group(r)["entries-read"] == 2 and group(r)["lag"] == 58
    r.set(KEYS.acked(0), ids[57])  # 2 from the end: entries-added minus those 2
    r.xgroup_setid(STREAM, GROUP, ids[0], entries_read=1)
    reader(r).seek(Cursor(0))
    assert group(r)["entries-read"] == 58 and group(r)["lag"] == 2
    r.set(KEYS.acked(0), ids[9])
    r.xtrim(STREAM, minid=ids[20], approximate=False)  # the position is now before the first entry
    r.xgroup_setid(STREAM, GROUP, ids[-1], entries_read=60)
    reader(r).seek(Cursor(0))
    g = group(r)
    assert g["entries-read"] == 60 - 40 and g["lag"] == 40  # entries-added minus length
    r.set(KEYS.acked(0), ids[-1])  # the group 50 behind the last entry, the position at it
    r.xgroup_setid(STREAM, GROUP, ids[9], entries_read=10)
    reader(r).seek(Cursor(0))
    assert group(r)["entries-read"] == 60 and group(r)["lag"] == 0
    r.set(KEYS.acked(0), ids[51])
    r.xdel(STREAM, ids[55])  # an XDEL after the position, and inside the stream: unknown
    r.xgroup_setid(STREAM, GROUP, ids[21], entries_read=22)
    reader(r).seek(Cursor(0))
    g = group(r)
    assert g["last-delivered-id"] == ids[51] and g["lag"] is None
    assert undelivered(r, STREAM, g) == 7


def test_a_missing_stream_or_group_is_nogroup(r):
    with pytest.raises(redis.ResponseError, match="NOGROUP"):
        reader(r).seek(Cursor(0))
    r.xadd(STREAM, {"user_id": "a", "type": "view"})
    with pytest.raises(redis.ResponseError, match="NOGROUP"):
        reader(r).seek(Cursor(0))


def test_maintenance_counts_delivered_uncommitted_entries_and_never_trims_them(r):
    """Entries long past a retention of a second: the trim's bound is the position (the
    entry after it), not the group's last-delivered id."""
    old = 1_790_000_000_000
    ids = [r.xadd(STREAM, {"user_id": f"u{i}", "type": "view"}, id=f"{old}-{i}") for i in range(10)]
    r.xgroup_create(STREAM, GROUP, id="0")
    r.xreadgroup(GROUP, "c", {STREAM: ">"}, count=8, noack=True)
    r.set(KEYS.acked(0), ids[1])
    metrics = WorkerMetrics()
    s = Settings(redis_url="redis://x", metrics_port=0, consumer="c", partitions=1,
                 retention_seconds=1)  # fmt: skip
    Maintenance(r, KEYS, s, metrics).run([0])
    assert (
        metrics.registry.get_sample_value("intentstream_pending_entries", {"partition": "0"}) == 6
    )
    assert set(ids[2:]) <= {i for i, _ in r.xrange(STREAM)}  # all after the position kept
