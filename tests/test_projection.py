"""A model's table inputs passed through W_fh at load (model/scoring.py, Projection) score as
the embedding columns do, for every cell and with several layers; tables past the size limit
keep the columns."""

from __future__ import annotations

import numpy as np
import pytest

from model import scoring
from model.artifact import random_model
from model.scoring import ScoringModel

TYPES = ["view", "add_to_cart", "coupon", "purchase"]
INPUTS = [
    {"kind": "item", "name": "product", "buckets": 64, "dim": 4},
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 2.0, "scale": 1.5},
    {"kind": "categorical", "name": "brand", "buckets": 32, "dim": 3},
]


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
def test_projected_tables_score_as_the_embedding_columns(cell, layers, monkeypatch):
    m = random_model(TYPES, hidden=8, layers=layers, features=["gap"], seed=3, cell=cell,
                     inputs=INPUTS, session_gap_seconds=600)  # fmt: skip
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


def test_event_rows_are_numpys_gathered_sums_bit_for_bit():
    rng = np.random.default_rng(3)
    type_in = rng.normal(size=(5, 12)).astype(np.float32)
    tables = [rng.normal(size=(b, 12)).astype(np.float32) for b in (7, 3, 11)]
    type_idx = rng.integers(0, 5, 40)
    buckets = np.stack([rng.integers(0, len(t), 40) for t in tables], axis=1)
    want = type_in[type_idx]
    for k, table in enumerate(tables):
        want += table[buckets[:, k]]
    offsets = np.array([0, 7, 10], np.int64)
    got = scoring._event_rows(type_in, np.concatenate(tables), offsets, type_idx, buckets)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
