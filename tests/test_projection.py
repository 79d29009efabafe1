"""A model's table inputs passed through W_fh at load (model/scoring.py, Projection) score as
the embedding columns do, for every cell and with several layers; tables past the size limit
keep the columns."""

from __future__ import annotations

import numpy as np
import pytest

from model import scoring
from model.input_encoding import empty_session_stats, input_parts
from model.random_init import random_model
from model.scoring import ScoringModel
from tests.statistics_weights import with_statistics_weights

TYPES = ["view", "add_to_cart", "coupon", "purchase"]
INPUTS = [
    {"kind": "item", "name": "product", "buckets": 64, "dim": 4},
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 2.0, "scale": 1.5},
    {"kind": "categorical", "name": "brand", "buckets": 32, "dim": 3},
]
# the same with the price's session statistics (three more columns, kept in the state)
WITH_STATS = [INPUTS[0], INPUTS[1] | {"session": True}, INPUTS[2]]


def batch(n: int, users: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    slot = rng.integers(0, users, n)
    types = rng.integers(0, len(TYPES) + 1, n)  # the last: an unknown type
    ts = np.cumsum(rng.integers(0, 120_000, n)).astype(np.int64)
    inputs = {
        "product": [None if x < 0 else str(x).encode() for x in rng.integers(-3, 40, n)],
        "price": [None if x < 0 else f"{x:.2f}".encode() for x in rng.uniform(-5, 200, n)],
        "brand": [rng.choice([b"acme", b"zeta", None, b"", b"q" * 300]) for _ in range(n)],
    }
    return slot, types, ts, inputs


def scores_of(model: ScoringModel, users: int, slot, types, ts, inputs) -> tuple:
    state = np.zeros((users, *model.state_shape), np.float32)
    last_ts = np.full(users, -1, np.int64)
    memory = model.empty_memory(users)
    scores = model.advance(state, last_ts, slot, types, ts, inputs, memory)
    return scores, state, memory["product"].keys.copy()


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("inputs", [INPUTS, WITH_STATS], ids=["plain", "stats"])
def test_projected_tables_score_as_the_embedding_columns(cell, layers, inputs, monkeypatch):
    m = random_model(TYPES, hidden=8, layers=layers, features=["gap"], seed=3, cell=cell,
                     inputs=inputs, session_gap_seconds=600)  # fmt: skip
    m = with_statistics_weights(m)
    projected = ScoringModel(m)
    monkeypatch.setattr(scoring, "PROJECTED_MAX_BYTES", 0)
    columns = ScoringModel(m)
    assert projected.projection is not None and columns.projection is None
    users = 7
    for seed in range(3):
        case = batch(300, users, seed)
        got, got_state, got_items = scores_of(projected, users, *case)
        want, want_state, want_items = scores_of(columns, users, *case)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_state, want_state, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got_items, want_items)
        assert projected.input_counts == columns.input_counts


def test_a_model_with_only_numeric_inputs_has_nothing_to_project():
    numeric = [INPUTS[1]]
    m = random_model(TYPES, hidden=4, features=["gap"], seed=1, inputs=numeric)
    assert ScoringModel(m).projection is None


@pytest.mark.parametrize("replayed", [0, 17])
@pytest.mark.parametrize("declared", [INPUTS, WITH_STATS], ids=["plain", "stats"])
def test_projected_inputs_are_input_parts_and_numpys_gathers_bit_for_bit(replayed, declared):
    """The one-pass kernel against its definition: input_parts's block (its kept columns
    after the features) and each event's type row plus its tables' projected rows, summed
    in declaration order by numpy; the counts, item memories and statistics the same."""
    m = random_model(TYPES, hidden=8, features=["gap"], seed=5, inputs=declared,
                     session_gap_seconds=600)  # fmt: skip
    model = ScoringModel(m)
    proj = model.projection
    users = 9
    for seed in range(4):
        slot, types, _, inputs = batch(200, users, seed)
        bad = [b"-3", b"x", b"inf", b"1e400"]  # present, not finite after log1p
        inputs["price"][::7] = [bad[k % 4] for k in range(len(inputs["price"][::7]))]
        x_feat = np.random.default_rng(seed).normal(size=(200, 1)).astype(np.float32)
        reset = np.random.default_rng(seed + 1).random(200) < 0.1
        got_memory, want_memory = model.empty_memory(users), model.empty_memory(users)
        got_stats = empty_session_stats(model.inputs, users)
        want_stats = empty_session_stats(model.inputs, users)
        weights, _, x = model._projected(types, x_feat, slot, reset, inputs, got_memory,
                                         replayed, got_stats)  # fmt: skip
        fixed, buckets, counts = input_parts(model.inputs, inputs, slot, reset, want_memory,
                                             replayed, want_stats)  # fmt: skip
        want_x = np.concatenate([x_feat, fixed[:, proj.kept]], axis=1)
        want_rows = model.weights.type_in[types].copy()
        for k, (start, end) in enumerate(zip(proj.offsets, [*proj.offsets[1:], None], strict=True)):
            want_rows += proj.tables[start:end][buckets[:, k]]
        np.testing.assert_array_equal(x.view(np.int32), want_x.view(np.int32))
        np.testing.assert_array_equal(weights[2].view(np.int32), want_rows.view(np.int32))
        assert model.input_counts == counts and counts["price"].bad > 0
        for name in model.item_inputs:
            np.testing.assert_array_equal(got_memory[name].keys, want_memory[name].keys)
            np.testing.assert_array_equal(got_memory[name].count, want_memory[name].count)
        assert got_stats.keys() == want_stats.keys() == ({"price"} if declared is WITH_STATS
                                                         else set())  # fmt: skip
        for name, stats in got_stats.items():
            np.testing.assert_array_equal(stats, want_stats[name])
