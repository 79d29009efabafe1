"""Session features: the running counts a model may read beside its hidden state, kept in
extra rows of the user's state (model/features.py); every path's agreement is in
tests/test_conformance.py (its session cases)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model.artifact import load_model, state_shape
from model.feature_names import expand_features, unknown_features
from model.features import advance_memory, feature_matrix, memory_column, memory_width
from model.random_init import random_model
from model.scoring import InMemoryScorer, ScoringModel
from model.training.sessions import DataError
from model.training.train import TrainConfig, train
from tests.conftest import run_cli

TYPES = ["view", "cart", "purchase"]


def test_the_memory_counts_a_session_and_folds_it_into_the_users_history_at_a_reset():
    # one user: view, view (+10 s), cart (+5 s) | new session after 4000 s: purchase, view (+2 s)
    types = np.array([0, 0, 1, 2, 0], np.int64)
    gap = np.array([0.0, 10.0, 5.0, 4000.0, 2.0])
    reset = np.array([False, False, False, True, False])
    memory = np.zeros((1, memory_width(TYPES)), np.float32)
    out = advance_memory(np.zeros(5, np.int64), types, gap, reset, memory)

    def col(name: str) -> np.ndarray:
        return out[:, memory_column(name, TYPES)]

    assert col("session_events").tolist() == [1, 2, 3, 1, 2]
    assert col("session_seconds").tolist() == [0, 10, 15, 0, 2]
    assert col("earlier_sessions").tolist() == [0, 0, 0, 1, 1]
    assert col("gap_before_session").tolist() == [0, 0, 0, 4000, 4000]
    assert col("session_count:view").tolist() == [1, 2, 2, 0, 1]
    assert col("session_count:cart").tolist() == [0, 0, 1, 0, 0]
    assert col("earlier_count:view").tolist() == [0, 0, 0, 2, 2]
    assert col("earlier_count:cart").tolist() == [0, 0, 0, 1, 1]
    assert col("earlier_count:purchase").tolist() == [0, 0, 0, 0, 0]
    np.testing.assert_array_equal(memory[0], out[-1])  # the user's row: after the last event
    x = feature_matrix(["session_events", "gap"], gap, out, TYPES)
    np.testing.assert_allclose(x[:, 0], np.log1p([1, 2, 3, 1, 2]), rtol=1e-6)
    np.testing.assert_allclose(x[:, 1], np.log1p(gap), rtol=1e-6)


def test_session_expands_to_every_feature_once_and_typed_names_need_a_known_type():
    names = expand_features(["gap", "session"], TYPES)
    assert names[:5] == ["gap", "session_events", "session_seconds", "earlier_sessions",
                         "gap_before_session"]  # fmt: skip
    assert names[5:] == [f"{k}:{t}" for k in ("session_count", "earlier_count") for t in TYPES]
    assert unknown_features(names, TYPES) == []
    assert unknown_features(["session_count:coupon", "depth", "session_count"], TYPES) == [
        "session_count:coupon", "depth", "session_count",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown features"):
        random_model(TYPES, hidden=4, layers=1, features=["earlier_count:coupon"])


@pytest.mark.parametrize(
    ("cell", "hidden", "rows"), [("rnn", 4, 3), ("gru", 16, 1), ("lstm", 3, 2)]
)
def test_the_memory_takes_the_state_rows_it_needs_below_the_layers(cell, hidden, rows):
    model = random_model(TYPES, hidden=hidden, layers=2, features=["session_events"], cell=cell)
    width = hidden * (2 if cell == "lstm" else 1)
    assert state_shape(model.meta) == (2 + rows, width)
    assert rows * width >= memory_width(TYPES) > (rows - 1) * width
    plain = random_model(TYPES, hidden=hidden, layers=2, features=["gap"], cell=cell)
    assert state_shape(plain.meta) == (2, width)


def test_scores_depend_on_the_earlier_sessions_and_state_carries_them_across_calls():
    model = random_model(TYPES, hidden=8, layers=1, features=expand_features(["session"], TYPES),
                         session_gap_seconds=60, seed=3)  # fmt: skip
    sm = ScoringModel(model)
    t0 = 1_700_000_000_000
    # the same last session, after a buying session or after none
    with_past = InMemoryScorer(sm)
    with_past.score(["u"] * 3, ["view", "cart", "purchase"], np.array([0, 5, 9]) * 1000 + t0)
    late = t0 + 3_600_000
    after = with_past.score(["u"] * 2, ["view", "cart"], np.array([late, late + 4000]))
    fresh = InMemoryScorer(sm).score(["u"] * 2, ["view", "cart"], np.array([late, late + 4000]))
    assert not np.allclose(after, fresh)
    row = with_past._state["u"]
    earlier = row[1:].reshape(-1)[memory_column("earlier_count:purchase", TYPES)]
    assert earlier == 1.0  # the first session's purchase, in the state's memory row


def test_training_with_session_features_expands_them_for_the_vocabulary(tmp_path):
    from model.data.synthetic import synthetic_events

    events = list(synthetic_events(2500, 150, seed=4))
    config = TrainConfig(hidden=8, epochs=2, features=["session"], test_fraction=0.0)
    result = train(events, config)
    names = result.model.meta.features
    assert "session_events" in names and "earlier_count:purchase" in names
    # the label's session count is 0 on every step training sees: left out
    assert "session_count:purchase" not in names
    others = [t for t in result.model.meta.event_types if t != "purchase"]
    assert {f"session_count:{t}" for t in others} <= set(names)
    with pytest.raises(DataError, match="unknown features"):
        train(events, config.model_copy(update={"features": ["session_count:teleport"]}))


def test_train_refuses_a_typed_feature_of_no_type_in_one_line(tmp_path):
    from model.data.synthetic import synthetic_events

    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in synthetic_events(800, 60, seed=5)))
    out = tmp_path / "m.npz"
    refused = run_cli("train", "--data", str(data), "--epochs", "1", "--features",
                      "gap,session_count:teleport", "--out", str(out))  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "unknown features ['session_count:teleport']" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not out.exists()
    made = run_cli("model", "init", "--event-types", "view,cart", "--hidden", "4",
                   "--features", "session", "--out", str(out))  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "session_count:cart" in load_model(out).meta.features


WARM_CHECK = """
import numba, numpy as np
import model.scoring as S
from model.random_init import random_model
from model.inputs import parse_inputs
inputs = parse_inputs([{"kind": "item", "name": "sku", "buckets": 8, "dim": 2}])
stats = parse_inputs([{"kind": "item", "name": "sku", "buckets": 8, "dim": 2},
                      {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 0.0,
                       "scale": 1.0, "session": True}])
for model in (random_model(["view", "cart"], 8, 1, ["gap", "session_events"], 4, seed=1),
              random_model(["view", "cart"], 8, 1, ["gap", "session_events"], 4, seed=1,
                           inputs=inputs),
              random_model(["view", "cart"], 8, 1, ["gap"], 4, seed=1, inputs=stats)):
    sm = S.ScoringModel(model)
    sm.warm_up()
    kernels = [v for v in vars(S).values() if isinstance(v, numba.core.registry.CPUDispatcher)]
    before = {k.__name__: len(k.signatures) for k in kernels}
    state = np.zeros((3, *sm.state_shape), np.float32)
    raw = {"sku": ["a", "b", "a", "c"], "price": ["3", None, "1.5", "2"]}
    extra = (({n: raw[n] for n in sm.input_names}, sm.empty_memory(3)) if sm.input_names else ())
    sm.advance(state, np.full(3, -1, np.int64), np.array([0, 1, 2, 0]), np.zeros(4, np.int64),
               np.arange(4, dtype=np.int64) * 1000, *extra)
    after = {k.__name__: len(k.signatures) for k in kernels}
    assert before == after, (before, after)
print("ok")
"""


@pytest.mark.integration
def test_the_warm_up_compiles_what_a_batch_of_several_users_needs():
    """A model with session memory rows (session features, or a numeric input's session
    statistics) slices the state, C-contiguous for one user only: the warm-up compiles both
    layouts, so a worker's first batch of several users compiles nothing (a fresh process:
    the suite's other tests compile kernels too)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", WARM_CHECK], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
