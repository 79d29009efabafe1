"""Seed ensembles folded into one model (model/ensemble.py): its logit is the mean of the
members' logits, event by event, for every cell, with several layers, declared inputs and a
wide head; `train --ensemble K` trains K members on the same users and folds them."""

from __future__ import annotations

import numpy as np
import pytest

from model.ensemble import folded
from model.random_init import random_model
from model.scoring import InMemoryScorer, ScoringModel
from model.training.train import TrainConfig, train
from tests.statistics_weights import with_statistics_weights

TYPES = ["view", "cart", "purchase"]
INPUTS = [
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 2.0, "scale": 1.5,
     "session": True},
    {"kind": "categorical", "name": "brand", "buckets": 7, "dim": 3},
    {"kind": "item", "name": "sku", "buckets": 11, "dim": 2},
]  # fmt: skip


def events(n: int = 120, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    users = [f"u{i}" for i in rng.integers(0, 5, n)]
    types = [str(t) for t in rng.choice([*TYPES, "warp"], n)]
    ts = np.cumsum(rng.integers(1_000, 900_000, n)).astype(np.int64)
    raw = {
        "price": [None if x < 0 else f"{x:.2f}" for x in rng.uniform(-20, 300, n)],
        "brand": [str(rng.choice(["a", "b", "c", ""])) for _ in range(n)],
        "sku": [f"s{int(x)}" for x in rng.integers(0, 6, n)],
    }
    return users, types, ts, raw


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize(
    ("layers", "wide", "head"),
    [(1, False, "identity"), (2, True, "identity"), (1, True, "sigmoid")],
)
def test_the_folded_models_logit_is_the_members_mean(cell, layers, wide, head):
    members = [
        with_statistics_weights(random_model(
            TYPES, hidden=4, layers=layers, features=["gap", "session_events"], embedding_dim=3,
            head=head, session_gap_seconds=1800, seed=seed, cell=cell, inputs=INPUTS,
            wide_head=wide, dtype=np.float64,
        ), seed)
        for seed in (1, 2, 3)
    ]  # fmt: skip
    one = folded(members)
    assert one.meta.hidden == 12 and one.arrays["embedding"].shape[1] == 9
    assert one.arrays["input.brand.embedding"].shape == (7, 9)
    users, types, ts, raw = events()

    def logits(model) -> np.ndarray:
        z = InMemoryScorer(ScoringModel(model, raw=True)).score(users, types, ts, raw)
        return z if head == "identity" else np.log(z / (1 - z))

    want = np.mean([logits(m) for m in members], axis=0)
    np.testing.assert_allclose(logits(one), want, rtol=2e-4, atol=2e-4)


def test_members_of_another_architecture_are_refused():
    a = random_model(TYPES, hidden=4, seed=1)
    b = random_model(TYPES, hidden=5, seed=2)
    with pytest.raises(ValueError, match="share their architecture"):
        folded([a, b])


def shop(users: int = 160, seed: int = 3) -> list[dict]:
    """Buyers view dearer products and cart them; others browse."""
    rng = np.random.default_rng(seed)
    out = []
    for u in range(users):
        buyer, ts = u % 4 == 0, 1_000_000
        for k in range(int(rng.integers(2, 7))):
            ts += 30_000
            kind = "cart" if buyer and k > 1 and rng.random() < 0.5 else "view"
            price = float(rng.uniform(50, 80) if buyer else rng.uniform(5, 60))
            out.append(
                {
                    "user_id": f"u{u}",
                    "type": kind,
                    "ts": ts,
                    "price": price,
                    "sku": f"s{int(rng.integers(0, 5 if buyer else 30))}",
                }
            )
        if buyer:
            out.append({"user_id": f"u{u}", "type": "purchase", "ts": ts + 1_000})
    return out


def test_train_folds_an_ensemble_of_members_trained_from_their_seeds():
    """`--ensemble 3`: three members from seeds 0, 1, 2 on the same users, folded; its first
    member is the model `--ensemble 1` trains, and the wide part is fitted on the fold."""
    price = {"kind": "numeric", "name": "price", "transform": "log1p", "session": True}
    sku = {"kind": "item", "name": "sku", "buckets": 16, "dim": 2}
    config = TrainConfig(hidden=4, epochs=2, test_fraction=0.0, calibrate=False, wide_head=True,
                         min_type_count=1, inputs=[price, sku])  # fmt: skip
    one = train(shop(), config).model
    three = train(shop(), config.model_copy(update={"ensemble": 3}))
    model = three.model
    assert model.meta.hidden == 12
    assert model.arrays["embedding"].shape[1] == 3 * one.arrays["embedding"].shape[1]
    members = three.report["kept_epoch"]["members"]
    assert len(members) == 3 and "an ensemble of 3" in three.report["kept_epoch"]["reason"]
    H = 4  # the first member's units are the single model's (before the wide part's scale)
    np.testing.assert_array_equal(model.arrays["layer0.W_hh"][:H, :H], one.arrays["layer0.W_hh"])
    assert (model.arrays["layer0.W_hh"][H : 2 * H, H : 2 * H] != one.arrays["layer0.W_hh"]).any()
    assert not model.arrays["layer0.W_hh"][:H, H:].any()  # the members read only their own
    assert model.arrays["input.sku.embedding"].shape == (16, 6)
    assert three.report["wide_part"] is not None and model.arrays["head.W_fq"].any()


def test_fine_tuning_refuses_an_ensemble():
    from model.training.sessions import DataError

    config = TrainConfig(hidden=3, epochs=1, test_fraction=0.0, calibrate=False,
                         min_type_count=1)  # fmt: skip
    parent = train(shop(), config).model
    with pytest.raises(DataError, match="--ensemble"):
        train(shop(), config.model_copy(update={"ensemble": 2}), init=parent)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_the_fold_is_computed_block_by_block_to_the_same_bits(cell, layers):
    # the kernels skip the zeros between members' units (model/cells/ops.py, rows_times):
    # the same sums in the same order, so the same bits as the dense product
    members = [
        random_model(TYPES, hidden=4, layers=layers, features=["gap"], embedding_dim=3,
                     session_gap_seconds=1800, seed=seed, cell=cell, inputs=INPUTS)
        for seed in (1, 2, 3)
    ]  # fmt: skip
    blocked = ScoringModel(folded(members))
    assert blocked.weights.block == 4 and blocked.weights.W_h0.shape[0] == 12
    dense = ScoringModel(folded(members))
    dense.kernel_weights = tuple(dense.weights._replace(block=12))
    users, types, ts, raw = events(400, seed=5)
    got = InMemoryScorer(blocked).score(users, types, ts, raw)
    want = InMemoryScorer(dense).score(users, types, ts, raw)
    assert got.tobytes() == want.tobytes()


def test_dense_weights_keep_the_dense_product():
    one = ScoringModel(random_model(TYPES, hidden=12, layers=2, seed=4))
    assert one.weights.block == 12
