"""The resize's pure parts: which keys are states and where they go."""

from __future__ import annotations

import zlib

import numpy as np

from worker.common.keys import Keys, parse_state_key, partition_of
from worker.engine.compute.lean_state import packed_states
from worker.partitions.resize import ResizeReport, _later


def test_state_keys_parse_back_to_partition_and_user():
    keys = Keys("shop")
    for user in ["alice", "bob}:x", "名前", "a b"]:
        key = keys.state(7, user).encode()
        assert parse_state_key(keys, key) == (7, user.encode())
        assert zlib.crc32(user.encode()) % 5 == partition_of(user, 5)
    for other in [b"shop:state:{x}:u", b"shop:state:{3}:", b"shop:state:{3}u", b"shop:lease:{3}",
                  b"shopx:state:{3}:u", b"shop:state:state:{3}:u"]:  # fmt: skip
        assert parse_state_key(keys, other) is None


def test_of_two_states_the_later_entry_wins():
    a = {b"last_id": b"1700000000000-5", b"n": b"3"}
    b = {b"last_id": b"1700000000001-0", b"n": b"1"}
    assert _later(a, b) is b and _later(b, a) is b
    assert _later(a, {b"last_id": b"garbage"}) is a


def test_of_two_states_in_either_layout_the_later_entry_wins():
    def lean(last_id: bytes) -> dict:
        columns = [[last_id], [b""], [b""], [b""], [b""]]
        s, _ = packed_states(np.zeros((1, 1, 2), np.float32), np.ones(1), np.ones(1), columns)
        return {b"score": b"0.5", b"model": b"1", b"s": s.tobytes()}

    full = {b"last_id": b"1700000000001-0", b"n": b"1"}
    older, newer = lean(b"1700000000000-9"), lean(b"1700000000002-0")
    assert _later(full, older) is full and _later(older, full) is full
    assert _later(full, newer) is newer and _later(newer, full) is newer


def test_summary_names_what_was_done():
    report = ResizeReport(2, 4, moved=10, finished=3, entries=7, created=[2, 3])
    assert report.summary() == (
        "partitions 2 -> 4: 7 unacknowledged entries and 10 user states moved "
        "(3 finished from an interrupted run), "
        "consumer groups created on partitions: 2, 3"
    )
    assert "kept the later" in ResizeReport(2, 3, conflicts=1).summary()
