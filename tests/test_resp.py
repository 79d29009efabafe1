"""adapters/resp.py frames every kind of argument column exactly as hiredis packs the plain
arguments, and a commit's prepared EVALSHA is the command redis-py would send."""

from __future__ import annotations

import hiredis
import numpy as np
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from model.scoring import ScoringModel
from tests.golden import GOLDEN_EVENTS, golden_model
from worker.common.keys import Keys
from worker.engine.adapters.commit import CommitLimits, CommitScript
from worker.engine.adapters.resp import as_arguments, packed_command, resp_column
from worker.engine.compute.batch import parse_batch
from worker.engine.compute.pipeline import UserStates, build_commit, distinct_users


def hiredis_framed(arguments: list) -> bytes:
    """The arguments as hiredis packs them, without the array header."""
    packed = hiredis.pack_command(("X", *arguments))
    return packed[packed.index(b"$1\r\nX\r\n") + 7 :]


def assert_framed_as_hiredis(column) -> None:
    assert resp_column(column) == (hiredis_framed(as_arguments(column)) if len(column) else b"")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=40))
def test_byte_strings(values):
    assert_framed_as_hiredis(values)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=40))
def test_strings_ascii_or_not(values):
    assert_framed_as_hiredis(values)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_int64_arrays_to_their_extremes(values):
    assert_framed_as_hiredis(np.asarray(values, np.int64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=20), st.text(max_size=20),
                          st.integers(-(10**6), 10**6)), min_size=1, max_size=20))  # fmt: skip
def test_mixed_columns_go_through_hiredis(values):
    assert_framed_as_hiredis(values)


def test_float_rows_are_their_little_endian_bytes():
    h = np.random.default_rng(0).standard_normal((5, 2, 8)).astype(np.float32)
    assert_framed_as_hiredis(h)
    assert as_arguments(h)[1] == h[1].astype("<f4").tobytes()


def test_a_prepared_commit_is_the_evalsha_redis_py_sends():
    client = redis.Redis()  # never connected: a script's sha is computed locally
    script = CommitScript(client, Keys(), "g", "c", "holder", CommitLimits(100, 100, 64, 0))
    model = ScoringModel(golden_model(), version="1")
    events = [(user, t, 1000 * (i + 1)) for i, t in enumerate(GOLDEN_EVENTS) for user in "ab"]
    entries = [[f"{k + 1}-0".encode(), [b"user_id", u.encode(), b"type", t.encode(), b"ts",
                str(ts).encode(), b"event_id", f"e{k}".encode()]]
               for k, (u, t, ts) in enumerate(events)]  # fmt: skip
    batch = parse_batch(0, entries)
    states = UserStates.empty(distinct_users(batch), model.state_shape, b"7")
    commit = build_commit(batch, states, model, history_events=8)
    keys, args = script.pack(commit)
    assert script.command(commit) == hiredis.pack_command(
        ("EVALSHA", script.sha, len(keys), *keys, *args)
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=30))
def test_a_script_call_with_its_keys_packs_as_hiredis_does(keys):
    command = ("EVALSHA", "f" * 40, len(keys), *keys)
    assert packed_command(command, 3) == hiredis.pack_command(command)
