"""Calibrated scores (model/calibration.py): the Platt fit, its fold into the head, the
measures, the artifact's validation, and the goal on a shop with an exact posterior."""

from __future__ import annotations

import numpy as np
import pytest

from model.artifact import ArtifactError, Model, random_model, validate_model
from model.calibration import (
    Calibration,
    brier_score,
    expected_calibration_error,
    fit_platt,
    fold_into_head,
    reliability,
)
from model.calibration_bench import figures, scored_steps
from model.posterior import posterior_after, posterior_shop
from model.scoring import InMemoryScorer, ScoringModel
from model.train import TrainConfig, train


def test_the_fit_recovers_a_known_map() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, 200_000)
    raw = 1 / (1 + np.exp(-z))
    labels = rng.random(z.size) < 1 / (1 + np.exp(-(1.8 * z - 0.7)))
    cal = fit_platt(raw, labels)
    assert cal.a == pytest.approx(1.8, abs=0.03) and cal.b == pytest.approx(-0.7, abs=0.03)
    assert expected_calibration_error(labels, cal.apply(raw)) < 0.01
    assert expected_calibration_error(labels, raw) > 0.05


def test_the_map_folded_into_the_head_scores_as_applied_to_the_raw_score() -> None:
    model = random_model(["view", "add_to_cart"], hidden=8, features=["gap"], seed=2)
    cal = Calibration(a=1.4, b=-0.3)
    events = (["u1", "u2", "u1", "u1", "u2"], ["view", "add_to_cart", "view", "x", "view"],
              np.array([1_000, 2_000, 3_000, 64_000, 90_000]))  # fmt: skip
    raw = InMemoryScorer(ScoringModel(model)).score(*events)
    folded = Model(model.meta, fold_into_head(model.arrays, cal))
    got = InMemoryScorer(ScoringModel(folded)).score(*events)
    np.testing.assert_allclose(got, cal.apply(raw), atol=2e-6)
    # monotone: the order of users never changes
    assert (np.argsort(got) == np.argsort(raw)).all()


def test_measures_on_hand_made_cases() -> None:
    y = np.array([0, 0, 1, 1], float)
    assert expected_calibration_error(y, np.array([0.0, 0.0, 1.0, 1.0])) == 0.0
    # one bin holds all four at 0.5, observed rate 0.5: calibrated
    assert expected_calibration_error(y, np.full(4, 0.5)) == 0.0
    assert expected_calibration_error(y, np.full(4, 0.9)) == pytest.approx(0.4)
    assert brier_score(y, np.full(4, 0.5)) == pytest.approx(0.25)
    mean_p, rate, count = reliability(y, np.array([0.05, 0.05, 0.95, 0.95]), bins=10)
    assert count[0] == 2 and count[9] == 2 and np.isnan(mean_p[5])
    assert rate[0] == 0.0 and rate[9] == 1.0


@pytest.mark.parametrize(
    ("calibration", "head", "error"),
    [
        ({"method": "platt", "a": 0.0, "b": 0.0}, "sigmoid", "calibration"),
        ({"method": "platt", "a": float("nan"), "b": 0.0}, "sigmoid", "calibration"),
        ({"method": "isotonic", "a": 1.0, "b": 0.0}, "sigmoid", "calibration"),
        ({"method": "platt", "a": 1.0}, "sigmoid", "calibration"),
        ("platt", "sigmoid", "calibration"),
        ({"method": "platt", "a": 1.0, "b": 0.0}, "identity", "sigmoid head"),
    ],
)
def test_an_artifact_with_a_bad_calibration_is_refused(calibration, head, error) -> None:
    model = random_model(["view"], hidden=4, head=head, seed=1)
    meta = model.meta.model_validate(model.meta.model_dump() | {"calibration": calibration})
    with pytest.raises(ArtifactError, match=error):
        validate_model(meta, model.arrays)


def test_the_posterior_shop_knows_its_posterior() -> None:
    # a cart after a coupon is evidence for the intent; the posterior moves with it
    view, cart, coupon = 0, 2, 4
    assert posterior_after([coupon, cart])[-1] > posterior_after([view, view])[-1]
    events, posterior = posterior_shop(50, seed=3)
    assert len(posterior) == sum(e["type"] != "purchase" for e in events)
    assert all(0.0 < p < 1.0 for p in posterior.values())


@pytest.fixture(scope="module")
def shop():
    train_events, _ = posterior_shop(5000, seed=11)
    test_events, posterior = posterior_shop(4000, seed=12)
    return train_events, test_events, posterior


@pytest.mark.parametrize(
    "overrides", [{}, {"seed": 7, "lr": 0.02}, {"cell": "gru", "epochs": 4}], ids=str
)
def test_calibrated_scores_meet_the_goal_on_users_no_run_saw(shop, overrides) -> None:
    """ECE <= 0.02 at the last event and over all steps, on held-out users, for training
    runs of different settings; and the share above 0.6 near the true one."""
    train_events, test_events, posterior = shop
    model = train(train_events, TrainConfig(hidden=32, **overrides)).model
    gap_ms = model.meta.session_gap_seconds * 1000
    got = figures(scored_steps(model, test_events, posterior, gap_ms))
    truth = figures(scored_steps(None, test_events, posterior, gap_ms))
    print(overrides, got)
    assert got["ece_last"] <= 0.02 and got["ece_all"] <= 0.02, got
    assert abs(got["share_0.6"] - truth["share_0.6"]) <= 0.06, (got, truth)
