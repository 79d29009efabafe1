"""The batch pipeline as a pure function: outcomes, dedup, and the Commit it returns."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from model.scoring import ScoringModel
from tests.golden import GOLDEN_EVENTS, GOLDEN_SCORES, golden_model
from worker.common.dedup import MAX_TIME, ResendWindow
from worker.common.events import MAX_TS_MS
from worker.engine.compute.batch import parse_batch, seconds_of
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.user_states import UserStates, distinct_users


def entries(*events: dict, start: int = 1) -> list:
    """Raw XREADGROUP entries [id, [field, value, ...]] with ids start-0, start+1-0, ..."""
    out = []
    for i, fields in enumerate(events):
        flat = [x for kv in fields.items() for x in (kv[0].encode(), str(kv[1]).encode())]
        out.append([f"{start + i}-0".encode(), flat])
    return out


def commit_of(raw: list, states: UserStates | None = None):
    model = ScoringModel(golden_model(), version="7")
    batch = parse_batch(0, raw)
    states = states or UserStates.empty(distinct_users(batch), model.state_shape, b"42")
    return build_commit(batch, states, model)


def test_golden_scores_and_one_state_row_per_user():
    raw = entries(*({"user_id": "alice", "type": t} for t in GOLDEN_EVENTS))
    c = commit_of(raw)
    np.testing.assert_allclose(c.scores, GOLDEN_SCORES, atol=1e-4)
    assert c.users == ["alice"] and c.n.tolist() == [3] and c.last_ids == [b"3-0"]
    assert c.user_scores[0] == c.scores[-1]
    assert c.score_event_ids == [b"1-0", b"2-0", b"3-0"]  # no producer ids: the entry ids
    assert c.outcomes == {"scored": 3, "duplicate": 0, "deadletter": 0, "misrouted": 0, "lost": 0}
    assert c.seq == b"42" and c.model == "7"


def test_every_entry_has_exactly_one_outcome():
    raw = entries(
        {"user_id": "a", "type": "view"},
        {"user_id": "", "type": "view"},  # dead letter
        {"user_id": "b", "type": "teleport"},  # unknown type: scored
    )
    raw.append([b"9-0", None])  # deleted while pending
    c = commit_of(raw)
    assert c.outcomes == {"scored": 2, "duplicate": 0, "deadletter": 1, "misrouted": 0, "lost": 1}
    assert sum(c.outcomes.values()) == len(c.ack_ids) == 4
    assert c.unknown_types == 1
    assert c.dead[0].source_id == b"2-0" and "user_id" in c.dead[0].error


def test_events_at_or_below_the_last_applied_id_are_duplicates():
    model = ScoringModel(golden_model(), version="7")
    raw = entries(*({"user_id": "alice", "type": t} for t in GOLDEN_EVENTS))
    states = UserStates.empty(["alice"], model.state_shape)
    states.last_id[0] = (2, 0)  # events 1-0 and 2-0 were applied before
    c = build_commit(parse_batch(0, raw), states, model)
    assert c.outcomes["scored"] == 1 and c.outcomes["duplicate"] == 2
    assert c.score_event_ids == [b"3-0"]


def test_a_producer_retry_in_the_same_batch_or_a_later_one_is_a_duplicate():
    model = ScoringModel(golden_model(), version="7")
    raw = entries(
        {"user_id": "alice", "type": "view", "event_id": "e1"},
        {"user_id": "alice", "type": "view", "event_id": "e1"},  # the producer's retry
        {"user_id": "bob", "type": "view", "event_id": "e1"},  # another user's own e1
        {"user_id": "alice", "type": "add_to_cart", "event_id": "e2"},
    )
    c = build_commit(parse_batch(0, raw), UserStates.empty(["alice", "bob"], (1, 2)), model)
    assert c.outcomes["scored"] == 3 and c.outcomes["duplicate"] == 1
    np.testing.assert_allclose(c.scores, [GOLDEN_SCORES[0], GOLDEN_SCORES[0], GOLDEN_SCORES[1]],
                               atol=1e-4)  # fmt: skip
    assert c.score_event_ids == [b"e1", b"e1", b"e2"]
    # each id with its entry's time in seconds (ids 1-0..4-0: 0 s), the next as a delta
    assert dict(zip(c.users, c.event_ids, strict=True)) == {"alice": b"e1 e2\n\n0 0",
                                                            "bob": b"e1\n\n0"}  # fmt: skip

    later = entries({"user_id": "alice", "type": "coupon", "event_id": "e2"}, start=10)
    states = UserStates.empty(["alice"], (1, 2))
    states.event_ids[0] = b"e1 e2\n\n0 0"
    c2 = build_commit(parse_batch(0, later), states, model)
    assert c2.outcomes["duplicate"] == 1 and c2.users == []


def test_recent_event_ids_are_bounded_and_what_the_bound_forgets_early_is_counted():
    model = ScoringModel(golden_model(), version="7")
    raw = entries(*({"user_id": "a", "type": "view", "event_id": f"e{i}"} for i in range(50)))
    batch = parse_batch(0, raw)
    for bound in (1, 8, 32):
        states = UserStates.empty(["a"], (1, 2))
        c = build_commit(batch, states, model, resends=ResendWindow(ids=bound))
        ids = c.event_ids[0].partition(b"\n")[0]
        assert ids.split() == [f"e{i}".encode() for i in range(50 - bound, 50)]
        assert c.resend_overflow == 50 - bound


def test_a_republished_file_is_scored_once_within_the_time_window_and_again_after_it():
    """40 events of one user with their own ids, republished 23 h later (its entry ids'
    times), then 25 h after the first copy: once within the default 24 h, again past it."""
    model = ScoringModel(golden_model(), version="7")
    events = [{"user_id": "a", "type": "view", "event_id": f"order-{i}"} for i in range(40)]
    hour_ms = 3_600_000
    t0 = 1_700_000_000_000

    def at(ms: int):
        return parse_batch(0, [[f"{ms}-{i}".encode(), flat] for i, (_, flat) in
                               enumerate(entries(*events))])  # fmt: skip

    states = UserStates.empty(["a"], (1, 2))
    first = build_commit(at(t0), states, model)
    assert first.outcomes["scored"] == 40 and first.resend_overflow == 0
    memory = first.event_ids[0]
    for hours, scored in ((23, 0), (25, 40)):
        states = UserStates.empty(["a"], (1, 2))
        states.last_id[0], states.event_ids[0] = first.last_keys[0], memory
        again = build_commit(at(t0 + hours * hour_ms), states, model)
        assert again.outcomes["scored"] == scored
        assert again.outcomes["duplicate"] == 40 - scored


def stamped(user: str, seq: int, producer: str = "p1", **extra) -> dict:
    return {"user_id": user, "type": "view", "producer": f"{producer}:{seq}", **extra}


def test_a_resend_of_any_size_is_a_duplicate_by_its_producer_stamps():
    """A user with 50 events in a resent 1,000-event pipeline: none applied twice."""
    model = ScoringModel(golden_model(), version="7")
    users = [f"u{i % 19}" for i in range(950)] + ["busy"] * 50
    sent = [stamped(u, seq) for seq, u in enumerate(users, start=1)]
    first = build_commit(
        parse_batch(0, entries(*sent)),
        UserStates.empty(distinct_users(parse_batch(0, entries(*sent))), (1, 2)),
        model,
    )
    assert first.outcomes["scored"] == 1000
    memory = dict(zip(first.users, first.event_ids, strict=True))
    assert memory["busy"] == b"\np1:1000"  # no ids kept: the stamp says it all
    resend = parse_batch(0, entries(*sent, start=2000))  # the same stamps, later ids
    states = UserStates.empty(distinct_users(resend), (1, 2))
    states.event_ids = [memory[u] for u in states.users]
    again = build_commit(resend, states, model)
    assert again.outcomes == {"scored": 0, "duplicate": 1000, "deadletter": 0, "misrouted": 0,
                              "lost": 0}  # fmt: skip
    # a resend that landed in part, interleaved with the rest of the first copy
    half = parse_batch(0, entries(*sent[:10], *sent[5:], start=5000))
    c = build_commit(half, UserStates.empty(distinct_users(half), (1, 2)), model)
    assert c.outcomes["scored"] == 1000 and c.outcomes["duplicate"] == 5


def test_a_producer_stamp_with_an_own_event_id_checks_both_and_keeps_the_id():
    model = ScoringModel(golden_model(), version="7")
    raw = entries(stamped("a", 1, event_id="mine-1"), stamped("a", 1, "p2", event_id="mine-1"),
                  stamped("a", 2, event_id="p1-2"))  # fmt: skip
    c = build_commit(parse_batch(0, raw), UserStates.empty(["a"], (1, 2)), model)
    # the second is another producer's resend of the same own id; the third's id is a
    # generated one (producer-sequence), which needs no place in the window
    assert c.outcomes["scored"] == 2 and c.event_ids == [b"mine-1\np1:2\n0"]


def test_states_continue_from_what_was_read():
    model = ScoringModel(golden_model(), version="7")
    first = commit_of(entries({"user_id": "alice", "type": "view"}))
    states = UserStates.empty(["alice"], model.state_shape)
    states.h[0], states.last_id[0], states.n[0] = first.h[0], (1, 0), 1
    c = build_commit(parse_batch(0, entries({"user_id": "alice", "type": "add_to_cart"}, start=2)),
                     states, model)  # fmt: skip
    np.testing.assert_allclose(c.scores, [GOLDEN_SCORES[1]], atol=1e-4)
    assert c.n.tolist() == [2]


def test_an_event_of_another_partitions_user_is_dead_lettered_as_misrouted():
    from worker.common.keys import partition_of

    alice = next(f"u{i}" for i in range(100) if partition_of(f"u{i}", 4) == 1)
    raw = entries({"user_id": alice, "type": "view"})
    batch = parse_batch(0, raw, partitions=4)
    assert batch.misrouted == 1 and batch.users == []
    assert "belongs to partition 1 of 4, read from partition 0" in batch.dead[0].error
    model = ScoringModel(golden_model(), version="7")
    c = build_commit(batch, UserStates.empty([], model.state_shape), model)
    assert c.outcomes["misrouted"] == 1 and c.outcomes["deadletter"] == 0


def test_recent_extension_matches_its_definition_on_random_histories():
    """`extended` keeps the events after the last gap a new event opens above the session gap,
    at most `keep` of them (checked against that definition written with numpy)."""
    from worker.engine.compute.recent import Recent, extended

    rng = np.random.default_rng(5)
    for _ in range(500):
        old = np.cumsum(rng.integers(0, 100, rng.integers(0, 6))).tolist()
        new = np.cumsum(rng.integers(0, 100, rng.integers(0, 6))) + (old[-1] if old else 0)
        new = new.tolist()
        keep, gap = int(rng.integers(1, 8)), float(rng.choice([0, 30, 60]))
        got = extended(Recent.of(-1, old, ["o"] * len(old)), new, ["n"] * len(new), keep, gap)
        all_ts, start = old + new, 0
        if gap > 0 and len(all_ts) > 1:
            # gaps that a new event opens (the old part is one session already)
            cuts = [i for i in np.flatnonzero(np.diff(all_ts) > gap) if i + 1 >= len(old)]
            start = int(cuts[-1]) + 1 if cuts else 0
        start = max(start, len(all_ts) - keep)
        assert got.ts == all_ts[start:]
        assert got.prev_ts == (all_ts[start - 1] if start else -1)
        assert got.types == (["o"] * len(old) + ["n"] * len(new))[start:]


FIELD_NAMES = st.sampled_from([b"user_id", b"type", b"ts", b"event_id", b"json", b"x"])
FIELD_VALUES = (
    st.binary(max_size=40)
    | st.sampled_from([b"view", b"add_to_cart", b"alice", b"bob", b"", b"\xff\xfe", b"e 1"])
    | st.integers(-(2**70), 2**70).map(lambda i: str(i).encode())
    | st.integers(0, 2**64 - 1).map(lambda i: str(i).encode())
    | st.just(b'{"user_id": "alice", "type": "view", "ts": 1700000000000}')
)
ENTRY_IDS = st.tuples(
    st.integers(0, 2**64 - 1) | st.sampled_from([0, 2**63 - 1, 2**63, 2**64 - 1]),
    st.integers(0, 2**64 - 1) | st.just(0),
).map(lambda t: b"%d-%d" % t)
ENTRIES = st.lists(
    st.tuples(
        ENTRY_IDS,
        st.none() | st.lists(st.tuples(FIELD_NAMES, FIELD_VALUES), max_size=5),
    ).map(lambda e: [e[0], None if e[1] is None else [x for kv in e[1] for x in kv]]),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(raw=ENTRIES, partitions=st.sampled_from([1, 3]))
def test_any_entry_gets_exactly_one_outcome_and_nothing_raises(raw, partitions):
    """Whatever a stream entry holds (ids at the id space's edges, fields missing, huge,
    non-UTF-8, of the wrong type), parsing and build_commit decide one outcome for it."""
    model = ScoringModel(golden_model(), version="7")
    batch = parse_batch(0, raw, partitions)
    states = UserStates.empty(distinct_users(batch), model.state_shape, b"1")
    c = build_commit(batch, states, model, history_events=8)
    assert sum(c.outcomes.values()) == len(c.ack_ids) == len(raw)
    assert np.isfinite(c.scores).all() and (c.score_ts <= MAX_TS_MS).all()
    assert len(c.dead) == c.outcomes["deadletter"] + c.outcomes["misrouted"]


def test_an_entry_id_at_2_63_ms_without_ts_is_a_dead_letter_beside_normal_events():
    raw = [
        [b"1764000000000-0", [b"user_id", b"a", b"type", b"view"]],
        [b"9223372036854775808-0", [b"user_id", b"m", b"type", b"view"]],
        [b"9223372036854775808-1", [b"user_id", b"m", b"type", b"view", b"ts", b"1764000000000"]],
    ]
    c = commit_of(raw)
    assert c.outcomes["scored"] == 2 and c.outcomes["deadletter"] == 1
    assert "past year 9999" in c.dead[0].error and c.dead[0].source_id == raw[1][0]


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=40))
def test_entry_seconds_of_a_few_entries_are_the_columns_form(keys):
    """seconds_of counts a few entries in Python; the many's numpy form gives the same."""
    ms = np.fromiter((k[0] for k in keys), np.float64, len(keys))
    want = np.minimum(ms // 1000, MAX_TIME).astype(np.int64)
    got = seconds_of(keys)
    assert got.dtype == np.int64 and got.tolist() == want.tolist()
