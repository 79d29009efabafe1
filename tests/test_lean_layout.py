"""The lean layout (docs/contract.md, The lean layout): the packed state field `s`, the
commit that writes it, and workers switching layouts over the same states."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.artifact import save_model
from model.data.synthetic import EVENT_TYPES, synthetic_events
from model.random_init import random_model
from model.scoring import ScoringModel
from tests.consumers import in_process_consumer
from tests.golden import GOLDEN_EVENTS, GOLDEN_SCORES, golden_model
from tests.offline import offline_scores
from tests.workers import count_scores, score_entries
from worker.bench.inputs import INPUTS
from worker.commands.explain import read_state
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.engine.adapters.commit import CommitLimits, Committer
from worker.engine.adapters.states import FIELDS, StateReader
from worker.engine.compute.batch import parse_batch
from worker.engine.compute.lean_state import (
    HEADER_BYTES,
    as_fields,
    packed_states,
    unpack_state,
)
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.state_cache import StateCache
from worker.engine.compute.user_states import ShadowStates, UserStates, distinct_users
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish
from worker.rules.definition import make_rule
from worker.rules.step import RuleTable

KEYS = Keys("intentstream")
LEAN_STATE = {b"score", b"model", b"s"}
LEAN_SCORE = {"user_id", "score", "event_id", "model"}

blobs = st.binary(max_size=300)


def split(data: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    ends = np.cumsum(lengths).tolist()
    return [data[a:b].tobytes() for a, b in zip([0, *ends[:-1]], ends, strict=True)]


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 6), size=st.integers(1, 8), data=st.data(),
    ints=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=12, max_size=12),
)  # fmt: skip
def test_packed_states_read_back_as_written(k, size, data, ints):
    h = np.random.default_rng(k).standard_normal((k, 1, size)).astype(np.float32)
    columns = [data.draw(st.lists(blobs, min_size=k, max_size=k)) for _ in range(5)]
    last_ts, n = np.asarray(ints[:k], np.int64), np.asarray(ints[6 : 6 + k], np.int64)
    packed, lengths = packed_states(h, last_ts, n, columns)
    for u, raw in enumerate(split(packed, lengths)):
        state = unpack_state(raw)
        assert state is not None and state.h == h[u].tobytes()
        assert (state.last_id, state.event_ids, state.recent, state.rules, state.items) == tuple(
            c[u] for c in columns
        )
        assert (int(state.last_ts), int(state.n)) == (last_ts[u], n[u])


def test_an_s_that_is_not_one_reads_as_none():
    h = np.zeros((1, 1, 2), np.float32)
    packed, _ = packed_states(h, np.array([1]), np.array([2]), [[b"1-0"], [b""], [b"r"], [b""],
                                                                  [b""]])  # fmt: skip
    good = packed.tobytes()
    assert unpack_state(good) is not None
    for bad in (None, b"", good[:HEADER_BYTES - 1], good[:-1], good + b"x", b"\x02" + good[1:],
                struct.pack("<B6Iqq", 1, 2**31, 0, 0, 0, 0, 0, 0, 0)):  # fmt: skip
        assert unpack_state(bad) is None


def test_as_fields_reads_whichever_layout_holds_the_later_entry():
    h = np.ones((1, 1, 2), np.float32)
    packed, _ = packed_states(h, np.array([7]), np.array([3]), [[b"20-1"], [b"e1"], [b"rec"],
                                                                  [b""], [b""]])  # fmt: skip
    lean = {b"score": b"0.5", b"model": b"2", b"s": packed.tobytes()}
    fields = as_fields(lean)
    assert fields == {
        b"score": b"0.5",
        b"model": b"2",
        b"h": h.tobytes(),
        b"last_id": b"20-1",
        b"last_ts": b"7",
        b"n": b"3",
        b"event_ids": b"e1",
        b"recent": b"rec",
    }
    older = lean | {b"h": b"old", b"last_id": b"19-0", b"n": b"2"}  # a full writer before
    assert as_fields(older)[b"h"] == h.tobytes() and as_fields(older)[b"n"] == b"3"
    newer = lean | {b"h": b"new", b"last_id": b"21-0", b"n": b"4"}  # a full writer after
    assert as_fields(newer) == newer
    assert as_fields({b"h": b"x", b"last_id": b"1-0"}) == {b"h": b"x", b"last_id": b"1-0"}


def reply_row(**fields: bytes | None) -> list:
    """One state's part of the read script's reply: FIELDS' values in order."""
    return [fields.get(name) for name in FIELDS]


@pytest.mark.parametrize("layout", ["full", "lean"])
def test_the_reader_takes_the_later_layout_and_marks_the_other_for_rewriting(layout):
    model = ScoringModel(golden_model(), version="1")
    h_lean, h_full = np.float32([[0.25, 0.5]]), np.float32([[0.75, 1.0]])
    packed = [packed_states(h_lean[None], np.array([t]), np.array([2]),
                            [[lid], [b""], [b""], [b""], [b""]])[0].tobytes()
              for t, lid in ((5000, b"5000-0"), (9000, b"9000-0"))]  # fmt: skip
    full = {"h": h_full.tobytes(), "last_id": b"7000-0", "last_ts": b"7000", "n": b"5",
            "model": b"1", "score": b"0.5"}  # fmt: skip
    rows = {
        "lean only": reply_row(s=packed[0], model=b"1", score=b"0.5"),
        "full only": reply_row(**full),
        "lean later": reply_row(**full, s=packed[1]),
        "full later": reply_row(**full, s=packed[0]),
        "broken s": reply_row(s=b"not a state", model=b"1", score=b"0.5"),
    }
    reader = StateReader(connect("redis://127.0.0.1:1/0"), KEYS, StateCache(0), lambda v: v,
                         layout)  # fmt: skip
    request = reader.request(0, list(rows))
    flat = [b"1"] + [x for row in rows.values() for x in row]
    states = reader.complete(request, flat, model.state_shape, "1")
    assert states.h[0].tolist() == h_lean.tolist() and states.n[0] == 2
    assert states.h[1].tolist() == h_full.tolist() and states.n[1] == 5
    assert states.h[2].tolist() == h_lean.tolist() and states.last_id[2] == (9000, 0)
    assert states.h[3].tolist() == h_full.tolist() and states.last_id[3] == (7000, 0)
    assert states.last_id[4] == (-1, -1) and states.resets["invalid"] == 1
    # the rows holding the other layout's fields are rewritten whole by the commit
    other = {"lean": [1, 2, 3], "full": [0, 2, 3, 4]}[layout]
    assert states.rewrite == other


LIMITS = CommitLimits(1000, 1000, 64, 0)


def pending_batch(r, events: list[dict], input_names: tuple[str, ...] = ()):
    """Partition 0 with its lease "holder"'s and the events read by consumer "c" of group
    "g" (NOACK, as the worker reads them), parsed as a batch: the partition's first."""
    stream = KEYS.events(0)
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    r.set(KEYS.lease(0), "holder")
    for fields in events:
        r.xadd(stream, fields)
    entries = [[i, [x for kv in f.items() for x in kv]] for i, f in
               r.xreadgroup("g", "c", {stream: ">"}, noack=True)[0][1]]  # fmt: skip
    return parse_batch(0, entries, input_names=input_names)


def committer(r, layout: str = "lean") -> Committer:
    """The commit script of consumer "c" holding partition 0 (pending_batch)."""
    return Committer(r, KEYS, "holder", LIMITS, layout)


@pytest.mark.integration
def test_a_lean_commit_writes_three_state_fields_and_four_score_fields(redis_server):
    r = connect(redis_server.url)
    events = [{"user_id": "alice", "type": t, "event_id": f"e-{t}"} for t in GOLDEN_EVENTS]
    batch = pending_batch(r, [*events, {"type": "no user"}])
    script = committer(r)
    model = ScoringModel(golden_model(), version="1")
    commit = build_commit(batch, UserStates.empty(distinct_users(batch), model.state_shape),
                          model, history_events=32)  # fmt: skip
    result = script.run(commit)
    assert not result.resent and script.run(commit).resent  # a resend applies nothing
    state = r.hgetall(KEYS.state(0, "alice"))
    assert set(state) == LEAN_STATE and state[b"model"] == b"1"
    packed = unpack_state(state[b"s"])
    assert packed is not None and packed.n == b"3" and packed.last_id == batch.ids[2]
    np.testing.assert_allclose(np.frombuffer(packed.h, "<f4"), [0.65, 0.70], atol=6e-3)
    rows = score_entries(r)
    assert [set(row) - {"id", "partition"} for row in rows] == [LEAN_SCORE] * 3
    assert [row["event_id"] for row in rows] == [f"e-{t}" for t in GOLDEN_EVENTS]
    np.testing.assert_allclose([float(row["score"]) for row in rows], GOLDEN_SCORES, atol=1e-4)
    assert float(state[b"score"]) == pytest.approx(GOLDEN_SCORES[-1], abs=1e-4)
    assert r.xlen(KEYS.deadletter(0)) == 1 and r.get(KEYS.acked(0)) == batch.ids[-1]
    kept = read_state(Registry(r), "alice")  # what `intentstream explain` reads
    assert (
        kept is not None
        and kept.model == "1"
        and kept.recent.names == tuple(bytes([len(t)]) + t.encode() for t in GOLDEN_EVENTS)
    )


@pytest.mark.integration
def test_a_lean_commit_replaces_a_state_key_of_another_type(redis_server):
    r = connect(redis_server.url)
    r.set(KEYS.state(0, "alice"), "an operator's string")
    batch = pending_batch(r, [{"user_id": "alice", "type": "view"}])
    model = ScoringModel(golden_model(), version="1")
    commit = build_commit(batch, UserStates.empty(["alice"], model.state_shape), model)
    assert committer(r).run(commit).replaced == 1
    assert set(r.hgetall(KEYS.state(0, "alice"))) == LEAN_STATE


@pytest.mark.integration
def test_workers_switching_layouts_carry_every_state_and_score_as_offline(redis_server, tmp_path):
    """Lean, then full, then lean again over one stream, each a new worker process's
    consumer (nothing cached): each reads the states the other layout wrote, rewrites them
    in its own, and every score equals offline scoring of the whole sequence."""
    model_path = tmp_path / "model.npz"
    save_model(random_model([*EVENT_TYPES, "purchase"], hidden=16, features=["gap"], seed=4),
               model_path)  # fmt: skip
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(2400, 150, seed=3))]
    r = connect(redis_server.url)
    done = 0
    for layout, part in zip(("lean", "full", "lean"), np.array_split(np.arange(2400), 3),
                            strict=True):  # fmt: skip
        publish(r, [events[i] for i in part], partitions=2)
        done += len(part)
        consumer = in_process_consumer(redis_server.url, model_path, partitions=2,
                                       batch_size=100, layout=layout)  # fmt: skip
        for _ in range(200):
            if count_scores(r, partitions=2) >= done:
                break
            consumer.tick()
        consumer.shutdown()  # commits what it read and releases the leases
        assert count_scores(r, partitions=2) == done
        users = {events[i]["user_id"] for i in part}  # the users this worker wrote
        states = [r.hgetall(KEYS.state(partition_of(u, 2), u)) for u in users]
        if layout == "lean":
            assert all(set(s) == LEAN_STATE for s in states)
        else:
            assert all(b"s" not in s and b"h" in s for s in states)
    rows = score_entries(r, partitions=2)
    by_id = {row["event_id"]: float(row["score"]) for row in rows}
    assert len(rows) == len(by_id) == len(events)
    want = offline_scores(model_path, events)
    np.testing.assert_allclose([by_id[e["event_id"]] for e in events], want, atol=1e-5)


@pytest.mark.integration
def test_a_state_rewritten_in_the_full_layout_keeps_its_item_memories(redis_server):
    """A model without item inputs writes no `items` field, but a lean state rewritten in
    the full layout (its key replaced) keeps the memories it carried."""
    r = connect(redis_server.url)
    r.hset(KEYS.state(0, "alice"), mapping={"score": "0.5", "model": "1", "s": b"lean"})
    batch = pending_batch(r, [{"user_id": "alice", "type": "view"}])
    model = ScoringModel(golden_model(), version="1")
    states = UserStates.empty(["alice"], model.state_shape)
    states.items, states.rewrite = [b"\x07memory"], [0]
    commit = build_commit(batch, states, model)
    assert not commit.write_items and commit.rewrite == [0]
    committer(r, "full").run(commit)
    state = r.hgetall(KEYS.state(0, "alice"))
    assert b"s" not in state and state[b"items"] == b"\x07memory" and state[b"n"] == b"1"


@pytest.mark.integration
def test_a_lean_state_carries_its_item_memories_and_rule_states(redis_server):
    """What `s` holds beyond h comes back as the full layout would store it: the item
    memories of a model with an item input, and the rule states."""
    r = connect(redis_server.url)
    model = ScoringModel(random_model([*EVENT_TYPES, "purchase"], hidden=4, seed=1,
                                      inputs=INPUTS), version="1")  # fmt: skip
    events = [{"user_id": "alice", "type": "view", "product_id": product, "category_code": "c",
               "brand": "b", "price": "9.5"} for product in ("p1", "p2", "p1")]  # fmt: skip
    batch = pending_batch(r, events, tuple(model.input_names))
    rules = RuleTable.of([make_rule(name="any", above=0.0)])
    commit = build_commit(batch, UserStates.empty(["alice"], model.state_shape), model, 32,
                          rules=rules)  # fmt: skip
    assert commit.items[0] and commit.rules[0]  # something to carry
    committer(r).run(commit)
    packed = unpack_state(r.hget(KEYS.state(0, "alice"), "s"))
    assert (packed.items, packed.rules) == (commit.items[0], commit.rules[0])
    reader = StateReader(r, KEYS, StateCache(0), lambda v: v, "lean")
    states = reader.read(0, ["alice"], model.state_shape, "1")
    assert (states.items, states.rules, states.rewrite) == ([commit.items[0]], [commit.rules[0]],
                                                            [])  # fmt: skip
    assert states.recent == [commit.recent[0]] and states.n[0] == 3


@pytest.mark.integration
def test_a_lean_commit_with_a_shadow_model_writes_and_reads_back_its_fields(redis_server):
    r = connect(redis_server.url)
    batch = pending_batch(r, [{"user_id": "alice", "type": t} for t in GOLDEN_EVENTS])
    model = ScoringModel(golden_model(), version="1")
    shadow = ScoringModel(random_model(GOLDEN_EVENTS, hidden=3, seed=2), version="2")
    states = UserStates.empty(["alice"], model.state_shape)
    states.shadow = ShadowStates(np.zeros((1, *shadow.state_shape), np.float32),
                                 states.last_ts.copy(), score=np.full(1, np.nan),
                                 rules=[b""])  # fmt: skip
    commit = build_commit(batch, states, model, 32, shadow)
    committer(r).run(commit)
    state = r.hgetall(KEYS.state(0, "alice"))
    assert set(state) == LEAN_STATE | {b"shadow_h", b"shadow_score", b"shadow_model"}
    assert state[b"shadow_h"] == commit.shadow_h[0].tobytes() and state[b"shadow_model"] == b"2"
    rows = score_entries(r)
    assert [set(row) - {"id", "partition"} for row in rows] == [
        LEAN_SCORE | {"shadow_score", "shadow_model"}] * 3  # fmt: skip
    np.testing.assert_allclose([float(row["shadow_score"]) for row in rows],
                               commit.shadow_scores, rtol=1e-6)  # fmt: skip
    reader = StateReader(r, KEYS, StateCache(0), lambda v: v, "lean")
    read = reader.read(0, ["alice"], model.state_shape, "1", (shadow.state_shape, "2"))
    np.testing.assert_array_equal(read.h, commit.h)
    np.testing.assert_array_equal(read.shadow.h, commit.shadow_h)
