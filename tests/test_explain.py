"""The reasons of a score (model/explain.py): leave-one-out deltas recomputed from their
definition with the float64 reference of the cell, one event at a time, on random Elman, GRU
and LSTM models and random sessions (session gaps crossed, duplicated and out-of-order times,
unknown types).

The oracle derives gaps, features and resets itself from docs/contract.md (The model), as
tests/test_conformance.py does, so a mistake in model/features.py cannot hide on both sides.
"""

from __future__ import annotations

import numpy as np
import pytest

from model.artifact import Model, state_shape
from model.explain import Explanation, Reason, Session, leave_one_out, zero_state_score
from model.input_encoding import Stored, stored_values
from model.random_init import random_model
from model.reference import reference_step
from model.scoring import ScoringModel

TYPES = ["view", "search", "add_to_cart", "coupon", "checkout"]
UNKNOWN = "teleport"  # in no model's vocabulary
T0 = 1_700_000_000_000
SESSION_GAP = 60.0  # seconds


def reference_replay(model: Model, prev_ts: int, types: list[str], ts: list[int]) -> float:
    """The score after replaying the events from h = 0 with the clock at prev_ts, in float64;
    with no events, the zero state's score."""
    meta, a = model.meta, model.arrays
    index = {t: i for i, t in enumerate(meta.event_types)}
    h = np.zeros(state_shape(meta))  # an LSTM's: h, then c
    z = float(a["head.b_q"][0])
    score = 1.0 / (1.0 + np.exp(-z)) if meta.head == "sigmoid" else z
    last = prev_ts
    for type_, t in zip(types, ts, strict=True):
        # the gap from the latest time seen; 0 for the first, a timeless or an older event
        gap = (t - last) / 1000.0 if last >= 0 and t > last else 0.0
        if last >= 0 and meta.session_gap_seconds > 0 and gap > meta.session_gap_seconds:
            h[:] = 0.0
        last = max(last, t)
        feats = np.array([np.log1p(gap)] if meta.features else [], np.float64)
        h, score = reference_step(a, h, index.get(type_, len(index)), feats, meta.head, meta.cell)
    return score


def reference_deltas(model: Model, s: Session) -> tuple[float, np.ndarray]:
    types, ts = list(s.types), list(s.ts)
    full = reference_replay(model, s.prev_ts, types, ts)
    without = [
        reference_replay(model, s.prev_ts, types[:j] + types[j + 1 :], ts[:j] + ts[j + 1 :])
        for j in range(len(types))
    ]
    return full, full - np.array(without)


def random_session(rng: np.random.Generator, n: int) -> Session:
    """n events with gaps of 0 (duplicated times), seconds, minutes past the session gap, and
    now and then one older than the one before."""
    steps = rng.choice([0, 2_000, 20_000, 59_000, 61_000, 300_000], size=n)
    ts = (T0 + np.cumsum(steps)).tolist()
    for j in range(1, n):
        if rng.random() < 0.1:
            ts[j] = ts[j - 1] - 5_000  # out of order: gap 0, the clock stays
    types = [UNKNOWN if rng.random() < 0.1 else str(rng.choice(TYPES)) for _ in range(n)]
    prev_ts = int(rng.choice([-1, ts[0] - 30_000, ts[0] - 120_000])) if n else -1
    return Session(prev_ts, types, ts)


MODELS = [  # cell, layers, hidden, gap feature, head, session gap
    ("rnn", 1, 8, True, "sigmoid", SESSION_GAP),
    ("rnn", 2, 5, False, "identity", SESSION_GAP),
    ("rnn", 1, 6, True, "identity", 0.0),
    ("gru", 1, 8, True, "sigmoid", SESSION_GAP),
    ("gru", 2, 4, True, "identity", SESSION_GAP),
    ("gru", 1, 6, False, "sigmoid", 0.0),
    ("lstm", 1, 8, True, "sigmoid", SESSION_GAP),
    ("lstm", 2, 4, True, "identity", SESSION_GAP),
    ("lstm", 1, 6, False, "sigmoid", 0.0),
]


def a_model(cell, layers, hidden, gap, head, session_gap, seed) -> Model:
    return random_model(
        TYPES, hidden=hidden, layers=layers, features=["gap"] if gap else [],
        embedding_dim=min(8, hidden), head=head, session_gap_seconds=session_gap, seed=seed,
        cell=cell,
    )  # fmt: skip


def separated_prefix(size: np.ndarray, margin: float = 1e-4) -> int:
    """How many of the top |delta|s (at most 3) each stand clear of the next by `margin`: the
    reasons whose order float32 rounding cannot change."""
    v = np.append(np.sort(size)[::-1], 0.0)
    k = 0
    while k < min(3, len(size)) and v[k] - v[k + 1] > margin:
        k += 1
    return k


@pytest.mark.parametrize("shape", MODELS, ids=lambda s: f"{s[0]}-L{s[1]}-H{s[2]}-{s[4]}")
def test_deltas_and_reasons_equal_the_definition(shape):
    seed = MODELS.index(shape)
    model = a_model(*shape, seed=seed)
    rng = np.random.default_rng(100 + seed)
    sessions = [random_session(rng, int(n)) for n in [0, 1, 2, 3, 7, 12, 5, 1, 9, 4]]
    explained = leave_one_out(ScoringModel(model), sessions)
    assert len(explained) == len(sessions)
    checked = 0
    for s, ex in zip(sessions, explained, strict=True):
        if not len(s):
            assert ex.top() == [] and ex.deltas.shape == (0,)
            continue
        full, deltas = reference_deltas(model, s)
        assert ex.score_all == pytest.approx(full, abs=1e-5)
        np.testing.assert_allclose(ex.deltas, deltas, atol=1e-5)
        np.testing.assert_allclose(ex.scores_without, full - deltas, atol=1e-5)
        k = separated_prefix(np.abs(deltas))
        want = [int(j) + 1 for j in np.argsort(-np.abs(deltas), kind="stable")[:k]]
        got = ex.top()
        assert [r.position for r in got[:k]] == want
        assert len(got) == min(3, int((ex.deltas != 0).sum()))
        for r in got:
            assert (r.type, r.ts) == (s.types[r.position - 1], s.ts[r.position - 1])
            assert r.delta == ex.deltas[r.position - 1]
        checked += k
    assert checked >= 10  # the reasons were compared, not only skipped as near ties


def test_all_sessions_go_into_one_kernel_call(monkeypatch):
    scoring = ScoringModel(a_model(*MODELS[0], seed=1))
    calls = []
    advance = ScoringModel.advance

    def counted(self, state, *rest):
        calls.append(state.shape[0])
        return advance(self, state, *rest)

    monkeypatch.setattr(ScoringModel, "advance", counted)
    rng = np.random.default_rng(7)
    sessions = [random_session(rng, n) for n in (4, 0, 1, 6)]
    leave_one_out(scoring, sessions)
    assert calls == [(4 + 1) + 0 + (1 + 1) + (6 + 1)]  # one slot per variant sequence
    calls.clear()
    assert leave_one_out(scoring, [Session(-1, [], [])])[0].top() == []
    assert calls == []  # nothing to replay: no kernel call


def test_one_event_is_measured_against_the_zero_state():
    for head in ("sigmoid", "identity"):
        model = a_model("gru", 1, 4, True, head, SESSION_GAP, seed=3)
        scoring = ScoringModel(model)
        (ex,) = leave_one_out(scoring, [Session(T0 - 1000, ["coupon"], [T0])])
        z = float(model.arrays["head.b_q"][0])
        zero = 1.0 / (1.0 + np.exp(-z)) if head == "sigmoid" else z
        assert zero_state_score(scoring) == pytest.approx(zero)
        assert ex.scores_without.tolist() == [pytest.approx(zero)]
        assert ex.deltas[0] == pytest.approx(ex.score_all - zero)
        assert [r.position for r in ex.top()] == [1]


def test_events_before_a_session_reset_are_no_reasons():
    """Without the gap feature, events before a reset change nothing, removed or not."""
    model = a_model("rnn", 1, 6, False, "sigmoid", SESSION_GAP, seed=4)
    s = Session(-1, ["view", "search", "coupon", "checkout"],
                [T0, T0 + 1000, T0 + 3_600_000, T0 + 3_601_000])  # fmt: skip
    (ex,) = leave_one_out(ScoringModel(model), [s])
    assert ex.deltas[:2].tolist() == [0.0, 0.0]
    assert [r.position for r in ex.top()] == sorted([3, 4], key=lambda j: -abs(ex.deltas[j - 1]))


def test_ties_go_to_the_later_event_and_top_is_bounded():
    s = Session(-1, ["a", "b", "c", "d", "e"], [1, 2, 3, 4, 5])
    deltas = np.array([0.2, -0.5, 0.5, 0.0, -0.2])
    ex = Explanation(s, 0.9, 0.9 - deltas, deltas)
    assert [r.position for r in ex.top()] == [3, 2, 5]
    assert [r.position for r in ex.top(k=5)] == [3, 2, 5, 1]  # delta 0: no reason
    assert ex.top(k=1) == [Reason(3, "c", 3, 0.5)]
    assert ex.top(k=1)[0].to_dict() == {"type": "c", "ts": 3, "delta": 0.5}


def test_a_session_needs_a_time_per_type():
    with pytest.raises(ValueError, match="2 types and 1 times"):
        Session(-1, ["a", "b"], [1])


def test_a_long_session_is_explained_by_its_last_max_events():
    from model.explain import MAX_EVENTS

    model = ScoringModel(a_model("rnn", 1, 8, True, "sigmoid", 0.0, seed=4))
    rng = np.random.default_rng(8)
    long = random_session(rng, MAX_EVENTS + 6)
    (ex,) = leave_one_out(model, [long])
    tail = Session(long.ts[5], long.types[6:], long.ts[6:])
    (want,) = leave_one_out(model, [tail])
    assert len(ex.deltas) == MAX_EVENTS and ex.session == tail
    np.testing.assert_array_equal(ex.deltas, want.deltas)


def test_a_model_with_declared_inputs_replays_each_events_inputs():
    """Leaving an event out leaves its inputs out, and the item flags of the events after it
    are those of the sequence without it: the float64 definition, raw or stored values."""
    from tests.test_pipeline_inputs import reference_replay as rich_replay

    price = {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 3.0, "scale": 1.0}
    inputs = [price, {"kind": "item", "name": "product_id", "buckets": 16, "dim": 2}]
    model = ScoringModel(random_model(TYPES, hidden=6, features=["gap"], seed=2, inputs=inputs,
                                      session_gap_seconds=SESSION_GAP))  # fmt: skip
    rng = np.random.default_rng(3)
    session = random_session(rng, 8)
    values = {"price": [None, "12", "abc", "3.5", "", "40", "7", "1"],
              "product_id": ["a", "b", "a", None, "a", "c", "b", "b"]}  # fmt: skip
    raw = Session(session.prev_ts, session.types, session.ts, values)
    forms = {s.name: Stored(stored_values(s, values[s.name])) for s in model.inputs}
    stored = Session(session.prev_ts, session.types, session.ts, forms)
    (ex,), (ex_stored,), (blind,) = (leave_one_out(model, [s]) for s in (raw, stored, session))
    events = [
        {"type": session.types[j], "ts": session.ts[j]} | {k: v[j] for k, v in values.items()}
        for j in range(len(session))
    ]
    full = rich_replay(model.model, session.prev_ts, events)
    want = [full - rich_replay(model.model, session.prev_ts, events[:j] + events[j + 1 :])
            for j in range(len(events))]  # fmt: skip
    assert ex.score_all == pytest.approx(full, abs=1e-5)
    np.testing.assert_allclose(ex.deltas, want, atol=1e-5)
    np.testing.assert_array_equal(ex_stored.deltas, ex.deltas)
    assert np.abs(blind.deltas - ex.deltas).max() > 1e-3  # without them: another explanation
    assert raw.tail(3).inputs == {k: v[-3:] for k, v in values.items()}
