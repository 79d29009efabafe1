"""A round's reads (adapters/streams.py): their commands for a set of partitions are packed
once, not once a round, and stay what `read_command` gives; an empty reply parses to nothing
without walking the partitions."""

from __future__ import annotations

import hiredis
import redis

from worker.common.keys import Keys
from worker.engine.adapters.streams import Cursor, StreamReader


def reader() -> StreamReader:
    # never connects: commands are only made and replies only parsed here
    return StreamReader(redis.Redis(port=1), Keys("shop"), "workers", "w1", partitions=32)


def test_a_packed_read_is_its_command_packed_and_made_once():
    r = reader()
    cursors = [Cursor(p, b"1-0") for p in (3, 7, 30)]
    for block_ms in (None, 1000):
        packed = r.packed_read(cursors, 1024, block_ms)
        assert packed == hiredis.pack_command(r.read_command(cursors, 1024, block_ms))
        assert r.packed_read(cursors, 1024, block_ms) is packed  # made once
    command = r.read_command(cursors, 1024, 1000)
    assert command[:9] == ("XREADGROUP", "GROUP", "workers", "w1", "COUNT", 1024, "BLOCK", 1000,
                           "NOACK")  # fmt: skip
    assert command[9:] == ("STREAMS", "shop:events:{3}", "shop:events:{7}", "shop:events:{30}",
                           ">", ">", ">")  # fmt: skip
    # another set of partitions, count or block is a command of its own
    assert r.packed_read(cursors[:2], 1024, None) != r.packed_read(cursors, 1024, None)
    assert r.packed_read(cursors, 10, None) != r.packed_read(cursors, 1024, None)


def test_the_packed_reads_kept_stay_bounded_as_partitions_come_and_go():
    r = reader()
    for p in range(1000):
        r.packed_read([Cursor(p, b"0-0")], 10, None)
    assert len(r._packed) <= 256


def test_an_empty_reply_is_no_batch_and_leaves_the_cursors():
    r = reader()
    cursors = [Cursor(p, b"5-0") for p in range(32)]
    for nothing in (None, [], {}):
        assert r.batches(nothing, cursors) == []
    assert all(c.after == b"5-0" for c in cursors)


def test_a_reply_of_one_stream_is_that_partitions_batch():
    r = reader()
    cursors = [Cursor(p, b"5-0") for p in range(32)]
    entry = [b"6-0", [b"user_id", b"alice", b"type", b"view", b"ts", b"6"]]
    batches = r.batches([[b"shop:events:{7}", [entry]]], cursors)
    assert [(b.partition, b.ids, b.after) for b in batches] == [(7, [b"6-0"], b"5-0")]
    assert cursors[7].after == b"6-0" and cursors[6].after == b"5-0"
