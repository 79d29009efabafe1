"""Training with declared inputs (issue 22): sessions carry the inputs' columns and table
rows as scoring encodes them, and BPTT fits the input tables."""

from __future__ import annotations

import numpy as np
import pytest

from model.artifact import random_model
from model.bptt import loss_and_gradients, predict
from model.inputs import parse_inputs
from model.scoring import InMemoryScorer, ScoringModel
from model.sessions import pad, sessionize

TYPES = ["view", "cart", "purchase"]
INPUTS = parse_inputs([
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 3.0, "scale": 1.5},
    {"kind": "categorical", "name": "brand", "buckets": 5, "dim": 2},
    {"kind": "item", "name": "product_id", "buckets": 4, "dim": 2},
])  # fmt: skip


def shop_events(users: int = 5, per_user: int = 9, seed: int = 0, purchases: bool = True):
    """Events with price (some missing or bad), brand (some missing) and repeated products,
    gaps sometimes above the session gap."""
    rng = np.random.default_rng(seed)
    events = []
    for u in range(users):
        ts = 1_000_000
        for _ in range(per_user):
            ts += int(rng.choice([5_000, 60_000, 4_000_000]))
            kinds = TYPES if purchases else TYPES[:2]
            e = {"user_id": f"u{u}", "type": str(rng.choice(kinds, p=None)), "ts": ts}
            r = rng.random()
            if r < 0.7:
                e["price"] = float(np.round(rng.uniform(1, 200), 2))
            elif r < 0.8:
                e["price"] = "n/a"  # bad
            if rng.random() < 0.8:
                e["brand"] = str(rng.choice(["acme", "zeta", "nova"]))
            if rng.random() < 0.85:
                e["product_id"] = int(rng.choice([11, 12, 13]))
            events.append(e)
    return events


def float64_model(cell: str, layers: int = 1, seed: int = 1):
    return random_model(TYPES, hidden=3, layers=layers, features=["gap"], embedding_dim=2,
                        seed=seed, dtype=np.float64, cell=cell, inputs=INPUTS)  # fmt: skip


def test_sessions_hold_the_inputs_columns_and_buckets():
    sessions = sessionize(shop_events(), TYPES, ["gap"], 1800, "purchase", INPUTS)
    assert sessions
    for s in sessions:
        assert s.features.shape == (len(s.types), 1 + 2 + 2 + 4)
        assert s.buckets.shape == (len(s.types), 2)
        assert np.all(s.features[:, 3:5] == 0) and np.all(s.features[:, 5:7] == 0)
    batch = pad(sessions, 1)
    assert batch.buckets.shape == (*batch.types.shape, 2)
    flags = np.concatenate([s.features[:, 7:] for s in sessions])
    assert flags[:, 0].any() and flags[:, 1].any()  # repeats are seen


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_training_scores_are_the_scoring_paths(cell):
    # no purchase: the sessions tile each user's timeline, so each step is one scored event
    events = shop_events(purchases=False, seed=2)
    model = float64_model(cell)
    sessions = sessionize(events, TYPES, ["gap"], 1800, "purchase", INPUTS)
    P = predict(model.arrays, pad(sessions, 1), inputs=INPUTS)
    ours: dict[str, list[float]] = {}
    for i, s in enumerate(sessions):
        ours.setdefault(s.user_id, []).extend(P[i, : len(s.types)])
    scorer = InMemoryScorer(ScoringModel(model))
    names = [s.name for s in INPUTS]
    scored = scorer.score(
        [e["user_id"] for e in events], [e["type"] for e in events],
        np.array([e["ts"] for e in events]), {n: [e.get(n) for e in events] for n in names},
    )  # fmt: skip
    for user, mine in ours.items():
        theirs = [p for e, p in zip(events, scored, strict=True) if e["user_id"] == user]
        np.testing.assert_allclose(mine, theirs, atol=2e-5)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_input_table_gradients_equal_central_differences(cell, layers):
    model = float64_model(cell, layers)
    params = {k: v.copy() for k, v in model.arrays.items()}
    sessions = sessionize(shop_events(users=4, per_user=6), TYPES, ["gap"], 1800, "purchase",
                          INPUTS)  # fmt: skip
    batch = pad(sessions, 1)
    _, grads = loss_and_gradients(params, batch, bptt=50, inputs=INPUTS)
    assert set(grads) == set(params)
    assert np.abs(grads["input.brand.embedding"]).max() > 0
    assert np.abs(grads["input.product_id.embedding"]).max() > 0
    eps = 1e-5  # some recurrent gradients are ~1e-5: at 1e-6 rounding takes their digits
    for name, p in params.items():
        numeric = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + eps
            up, _ = loss_and_gradients(params, batch, bptt=50, inputs=INPUTS)
            p[idx] = old - eps
            down, _ = loss_and_gradients(params, batch, bptt=50, inputs=INPUTS)
            p[idx] = old
            numeric[idx] = (up - down) / (2 * eps)
        scale = max(np.abs(numeric).max(), np.abs(grads[name]).max(), 1e-12)
        assert np.abs(numeric - grads[name]).max() / scale < 1e-6, name


def test_a_batch_without_the_models_tables_is_refused():
    model = float64_model("rnn")
    sessions = sessionize(shop_events(), TYPES, ["gap"], 1800, "purchase")
    with pytest.raises(ValueError, match="input table"):
        loss_and_gradients(model.arrays, pad(sessions, 1), inputs=INPUTS)
