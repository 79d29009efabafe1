"""Kernel and scoring behaviour beyond one forward pass: states, carrying, resets, features.

Scores of every path against the float64 reference, for every cell, are in
test_conformance.py; here the states themselves are checked too (property test).
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.artifact import Model, state_shape
from model.cells.step import step_batch
from model.random_init import random_model
from model.reference import reference_step
from model.scoring import InMemoryScorer, ScoringModel
from tests.golden import GOLDEN_EVENTS, GOLDEN_SCORES, golden_model

TYPES = ["view", "search", "add_to_cart", "coupon", "checkout"]


def batch_scores(sm: ScoringModel, slot, types, feats, reset=None, n_users=None):
    """Scores and final states of a batch through step_batch, states starting at zero."""
    n_users = n_users or int(max(slot)) + 1
    state = np.zeros((n_users, *sm.state_shape), np.float32)
    n = len(slot)
    reset = np.zeros(n, np.bool_) if reset is None else np.asarray(reset, np.bool_)
    scores = np.empty(n, np.float32)
    step_batch(
        sm.weights,
        state,
        np.asarray(slot, np.int64),
        np.asarray(types, np.int64),
        np.ascontiguousarray(feats, np.float32),
        reset,
        scores,
        sm.scratch(n),
    )
    return scores, state


def reference_scores(model: Model, slot, types, feats, reset=None):
    """Scores and final states by the numpy reference, one event at a time."""
    n_users = int(max(slot)) + 1
    h = np.zeros((n_users, *state_shape(model.meta)))
    out = []
    for e in range(len(slot)):
        if reset is not None and reset[e]:
            h[slot[e]] = 0.0
        h[slot[e]], s = reference_step(
            model.arrays, h[slot[e]], types[e], feats[e], model.meta.head
        )
        out.append(s)
    return np.array(out), h


def test_golden_example_state_is_the_seeds():
    sm = ScoringModel(golden_model())
    scores, state = batch_scores(sm, [0, 0, 0], [0, 1, 2], np.zeros((3, 0)))
    np.testing.assert_allclose(scores, GOLDEN_SCORES, atol=1e-4)
    # the seed's h3 = [0.65, 0.70]
    np.testing.assert_allclose(state[0, 0], [0.65, 0.70], atol=6e-3)


def test_order_of_events_changes_the_score():
    scorer = InMemoryScorer(ScoringModel(golden_model()))
    in_order = scorer.score(["a"] * 3, GOLDEN_EVENTS, np.full(3, -1))
    shuffled = scorer.score(["b"] * 3, ["coupon", "view", "add_to_cart"], np.full(3, -1))
    assert abs(in_order[-1] - shuffled[-1]) > 1e-3


def test_interleaved_users_score_as_if_alone():
    model = random_model(TYPES, hidden=16, layers=2, features=["gap"], seed=3)
    sm = ScoringModel(model)
    rng = np.random.default_rng(0)
    users = rng.choice(["ann", "bob", "cy"], 60)
    types = list(rng.choice(TYPES, 60))
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(1_000, 100_000, 60))
    together = InMemoryScorer(sm).score(list(users), types, ts)
    for u in ("ann", "bob", "cy"):
        mask = users == u
        alone = InMemoryScorer(sm).score(
            [u] * int(mask.sum()), [t for t, m in zip(types, mask, strict=True) if m], ts[mask]
        )
        np.testing.assert_allclose(together[mask], alone, atol=1e-6)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_a_score_is_the_same_bits_however_the_events_are_batched(cell, layers):
    """Bit for bit, not within a tolerance: an action's score and reasons must not depend on
    how the worker's reads cut the stream or which users share a batch (live == backtest)."""
    sm = ScoringModel(random_model(TYPES, hidden=64, layers=layers, features=["gap"], seed=4,
                                   cell=cell))  # fmt: skip
    rng = np.random.default_rng(1)
    n = 400
    users = [f"u{k}" for k in rng.integers(0, 150, n)]
    types = list(rng.choice(TYPES, n))
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(1_000, 100_000, n))
    once = InMemoryScorer(sm).score(users, types, ts)
    cut = InMemoryScorer(sm)
    edges = [0, *sorted(rng.choice(np.arange(1, n), 25, replace=False).tolist()), n]
    parts = [cut.score(users[a:b], types[a:b], ts[a:b]) for a, b in pairwise(edges)]
    assert np.array_equal(np.concatenate(parts), once)
    for u in ("u3", "u77"):
        mine = [i for i, x in enumerate(users) if x == u]
        alone = InMemoryScorer(sm).score([u] * len(mine), [types[i] for i in mine], ts[mine])
        assert np.array_equal(alone, once[mine])


def test_state_carries_across_calls_like_one_batch():
    sm = ScoringModel(random_model(TYPES, hidden=8, seed=1))
    types = ["view", "search", "coupon", "checkout"]
    once = InMemoryScorer(sm).score(["u"] * 4, types, np.full(4, -1))
    split = InMemoryScorer(sm)
    parts = [
        split.score(["u"] * 2, types[:2], np.full(2, -1)),
        split.score(["u"] * 2, types[2:], np.full(2, -1)),
    ]
    np.testing.assert_allclose(np.concatenate(parts), once, atol=1e-6)


def test_session_resets_after_the_gap():
    model = random_model(TYPES, hidden=8, seed=2, session_gap_seconds=60)
    scorer = InMemoryScorer(ScoringModel(model))
    t0 = 1_700_000_000_000
    first = scorer.score(["u"], ["view"], np.array([t0]))
    # 30 s later: same session, state carried, so the score differs from a fresh view
    same_session = scorer.score(["u"], ["view"], np.array([t0 + 30_000]))
    # 61 s after that: a new session starts from zero, exactly like the first view
    new_session = scorer.score(["u"], ["view"], np.array([t0 + 91_000]))
    assert abs(same_session[0] - first[0]) > 1e-4
    np.testing.assert_allclose(new_session, first, atol=1e-7)


def test_no_reset_when_session_gap_is_zero():
    model = random_model(TYPES, hidden=8, seed=2, session_gap_seconds=0)
    scorer = InMemoryScorer(ScoringModel(model))
    first = scorer.score(["u"], ["view"], np.array([0]))
    much_later = scorer.score(["u"], ["view"], np.array([10**12]))
    assert abs(much_later[0] - first[0]) > 1e-4


def test_unknown_types_use_the_reserved_row():
    model = random_model(TYPES, hidden=8, seed=4)
    sm = ScoringModel(model)
    assert list(sm.type_indices(["view", "teleport", "checkout", ""])) == [0, 5, 4, 5]
    scores, _ = batch_scores(sm, [0, 1], [5, 5], np.zeros((2, 0)))
    ref, _ = reference_scores(model, [0], [len(TYPES)], np.zeros((1, 0)))
    np.testing.assert_allclose(scores, [ref[0], ref[0]], atol=1e-6)
    other = InMemoryScorer(sm).score(["a", "b"], ["teleport", "warp"], np.full(2, -1))
    assert other[0] == other[1]


def test_gap_feature_is_log1p_seconds_since_previous_event():
    model = random_model(TYPES, hidden=8, features=["gap"], seed=5, session_gap_seconds=0)
    scorer = InMemoryScorer(ScoringModel(model))
    t0 = 1_700_000_000_000
    got = scorer.score(["u", "u"], ["view", "coupon"], np.array([t0, t0 + 90_000]))
    h = np.zeros((1, 8))
    h, s0 = reference_step(model.arrays, h, 0, np.array([0.0]), "sigmoid")
    _, s1 = reference_step(model.arrays, h, 3, np.array([np.log1p(90.0)]), "sigmoid")
    np.testing.assert_allclose(got, [s0, s1], atol=1e-5)


def test_lstm_state_is_h_then_c_and_a_new_session_zeroes_both():
    H, L = 6, 2
    model = random_model(TYPES, hidden=H, layers=L, seed=7, cell="lstm", session_gap_seconds=60)
    sm = ScoringModel(model)
    assert sm.state_shape == (L, 2 * H)
    t0 = 1_700_000_000_000
    scorer = InMemoryScorer(sm)
    types = ["view", "coupon", "add_to_cart"]
    first = scorer.score(["u"] * 3, types, np.array([t0, t0 + 5_000, t0 + 9_000]))
    state = scorer._state["u"]
    h, c = state[:, :H], state[:, H:]
    assert np.abs(c).min() > 0 and np.abs(h).max() < 1  # c is no copy of h
    # h = o ⊙ tanh(c) elementwise, so |h| < |tanh(c)|
    assert np.all(np.abs(h) <= np.abs(np.tanh(c)) + 1e-6)
    ref = np.zeros((L, 2 * H))
    for name in types:
        ref, _ = reference_step(model.arrays, ref, TYPES.index(name), np.zeros(0), "sigmoid")
    np.testing.assert_allclose(state, ref, atol=1e-6)
    # 61 s later: a new session from zero h and zero c, so the same scores as the first time
    again = scorer.score(["u"] * 3, types, np.array([t0 + 70_000, t0 + 75_000, t0 + 79_000]))
    np.testing.assert_allclose(again, first, atol=1e-7)
    # the cell state alone changes the next score: h zeroed, c kept is not the zero state
    kept_c = state.copy()
    kept_c[:, :H] = 0.0
    scores = []
    for start in (np.zeros_like(state), kept_c):
        out = np.empty(1, np.float32)
        one = np.zeros(1, np.int64)
        step_batch(sm.weights, start[None].copy(), one, one, np.zeros((1, 0), np.float32),
                   np.zeros(1, np.bool_), out, sm.scratch(1))  # fmt: skip
        scores.append(out[0])
    assert abs(scores[0] - scores[1]) > 1e-4


@settings(max_examples=40, deadline=None)
@given(
    cell=st.sampled_from(["rnn", "gru", "lstm"]),
    hidden=st.integers(1, 40),
    layers=st.integers(1, 3),
    n_types=st.integers(1, 6),
    use_gap=st.booleans(),
    head=st.sampled_from(["sigmoid", "identity"]),
    seed=st.integers(0, 2**16),
    events=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 6)), min_size=1, max_size=80),
)
def test_property_batched_kernel_matches_reference(
    cell, hidden, layers, n_types, use_gap, head, seed, events
):
    types_names = [f"t{i}" for i in range(n_types)]
    model = random_model(
        types_names,
        hidden=hidden,
        layers=layers,
        features=["gap"] if use_gap else [],
        embedding_dim=min(8, hidden),
        head=head,
        seed=seed,
        cell=cell,
    )
    rng = np.random.default_rng(seed)
    slot = np.array([u for u, _ in events])
    types = np.array([t % (n_types + 1) for _, t in events])
    feats = rng.uniform(0, 6, (len(events), 1 if use_gap else 0))
    scores, state = batch_scores(ScoringModel(model), slot, types, feats, n_users=8)
    ref, ref_state = reference_scores(model, slot, types, feats)
    np.testing.assert_allclose(scores, ref, atol=1e-5)
    np.testing.assert_allclose(state[: ref_state.shape[0]], ref_state, atol=1e-5)
