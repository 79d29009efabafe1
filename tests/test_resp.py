"""adapters/resp.py frames every kind of argument column exactly as hiredis packs the plain
arguments, commands laid out from columns as hiredis packs each, and a commit's transaction
is the commands it means, each argument as hiredis packs it."""

from __future__ import annotations

import hiredis
import numpy as np
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from model.scoring import ScoringModel
from tests.golden import GOLDEN_EVENTS, golden_model
from worker.common.keys import Keys
from worker.engine.adapters.commit import CommitLimits, Committer, decimals
from worker.engine.adapters.commit_commands import PartitionCommands
from worker.engine.adapters.resp import (
    FEW_ROWS,
    Joined,
    as_arguments,
    bulk,
    command_head,
    packed_command,
    resp_column,
    resp_commands,
)
from worker.engine.compute.batch import parse_batch
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.user_states import UserStates, distinct_users


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


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.text(max_size=20),
                          st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=30),
       st.data())  # fmt: skip
def test_commands_from_columns_pack_as_hiredis_does(rows, data):
    blobs, texts, ints = (list(x) for x in zip(*rows, strict=True))
    order = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=40))
    template = ["XADD", "k", "*", "a", blobs, "b", texts, "c", np.asarray(ints, np.int64), "m"]
    want = b"".join(hiredis.pack_command(("XADD", "k", "*", "a", blobs[i], "b", texts[i], "c",
                                          ints[i], "m")) for i in order)  # fmt: skip
    assert resp_commands(template, np.asarray(order, np.int64)) == want


def golden_commit(seq: bytes = b"7"):
    model = ScoringModel(golden_model(), version="1")
    start = 1_790_000_000_000  # epoch ms: entry ids at the events' times
    events = [(user, t, start + 1000 * i) for i, t in enumerate(GOLDEN_EVENTS) for user in "ab"]
    entries = [[f"{ts}-{k}".encode(), [b"user_id", u.encode(), b"type", t.encode(), b"ts",
                str(ts).encode(), *([b"event_id", f"e{k}".encode()] if u == "a" else [])]]
               for k, (u, t, ts) in enumerate(events)]  # fmt: skip
    batch = parse_batch(0, entries)
    states = UserStates.empty(distinct_users(batch), model.state_shape, seq)
    return build_commit(batch, states, model, history_events=8)


def commands_of(packed: bytes) -> list[list[bytes]]:
    reader = hiredis.Reader()
    reader.feed(packed)
    return list(iter(reader.gets, False))


def test_a_commit_transaction_is_the_commands_it_means():
    """The full layout's transaction, framed from columns, against the same commands built
    one argument at a time: a state without producer event ids has no event_ids field."""
    keys = Keys()
    committer = Committer(redis.Redis(), keys, "holder", CommitLimits(100, 100, 64, 0))
    c = golden_commit()
    chunks, n = committer.transaction(c, seed=b"123", entries=40)
    commands = commands_of(b"".join(chunks))
    assert len(commands) == n  # each gets a reply: MULTI, QUEUED each, EXEC
    text = decimals(c.scores)
    users = [c.users[i] for i in c.score_user.tolist()]
    want = [["MULTI"]] + [
        ["XADD", keys.scores(0), "*", "user_id", users[i], "score", text[i], "event_id",
         c.score_event_ids[i], "type", c.score_types[i], "ts", int(c.score_ts[i]), "model", "1"]
        for i in range(len(c.scores))
    ] + [
        ["XTRIM", keys.scores(0), "MAXLEN", "~", 100],
        ["SET", keys.acked(0), c.ack_ids[-1]], ["GET", keys.last_commit(0)],
        ["SET", keys.last_commit(0), b"holder " + c.ack_ids[-1]],
    ]  # fmt: skip
    for i, user in enumerate(c.users):
        fields = ["h", c.h[i].astype("<f4").tobytes(), "score", text[int(c.last_scored[i])],
                  "last_id", c.last_ids[i], "last_ts", int(c.last_ts[i]), "model", "1",
                  "n", int(c.n[i]), "recent", c.recent[i]]  # fmt: skip
        fields += ["event_ids", c.event_ids[i]] if c.event_ids[i] else []
        want.append(["HSET", keys.state(0, user), *fields])
    want += [
        ["SET", keys.committed(0), 40 + len(c.ack_ids)],  # the partition's count
        ["SET", keys.commit_seq(0), "123"],
        ["INCR", keys.commit_seq(0)],
        ["EXEC"],
    ]
    assert c.event_ids[0] and not c.event_ids[1]  # one state of each kind
    assert commands == [[x if isinstance(x, bytes) else str(x).encode() for x in command]
                        for command in want]  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=30))
def test_a_script_call_with_its_keys_packs_as_hiredis_does(keys):
    command = ("EVALSHA", "f" * 40, len(keys), *keys)
    assert packed_command(command, 3) == hiredis.pack_command(command)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.text(max_size=20),
                          st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=FEW_ROWS),
       st.data())  # fmt: skip
def test_a_few_rows_pack_as_the_framers_do(rows, data):
    """A few rows go through hiredis, more through the framers: the same bytes, for every
    kind of column (bytes, strings, int64 to its extremes, float rows, values laid end to
    end)."""
    blobs, texts, ints = (list(x) for x in zip(*rows, strict=True))
    h = np.random.default_rng(len(rows)).standard_normal((len(rows), 3)).astype(np.float32)
    joined = Joined(np.frombuffer(b"".join(blobs), np.uint8).copy(),
                    np.asarray(list(map(len, blobs)), np.int64))  # fmt: skip
    template = ["HSET", texts, "b", blobs, "i", np.asarray(ints, np.int64), "h", h, "j", joined,
                "m", 7]  # fmt: skip
    order = data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=FEW_ROWS))
    few = bytes(resp_commands(template, np.asarray(order, np.int64)))
    many = resp_commands(template, np.asarray(order * (FEW_ROWS + 1), np.int64))
    assert many == few * (FEW_ROWS + 1)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40), st.integers(0, 10**6))
def test_the_checks_xrange_framed_packs_as_hiredis_does(after, first, p):
    """A commit's XRANGE between its position and its first entry, framed from the
    partition's head packed once: hiredis's bytes, for any ids and partition."""
    between = PartitionCommands.of(Keys(), p, (), 1000).between(after, first)
    want = ("XRANGE", Keys().events(p), b"(" + after, b"(" + first, "COUNT", 1)
    assert between == hiredis.pack_command(want)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30), st.binary(max_size=40))
def test_a_set_framed_from_its_head_packs_as_hiredis_does(key, value):
    """A commit's SETs of its partition's keys: the head packed once, the value framed."""
    assert command_head(3, "SET", key) + bulk(value) == hiredis.pack_command(("SET", key, value))
