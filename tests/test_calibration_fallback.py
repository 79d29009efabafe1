"""Below the sessions an isotonic map needs, training may fall back to Platt scaling
(--calibration-fallback platt): two numbers fitted on the validation users, sampled as knots
every scoring path applies, shipped only when cross-fitted it lowers both the ECE and the log
loss over all steps; the note says which map and why."""

from __future__ import annotations

import numpy as np
import pytest

from model.calibration import Calibration, calibration_of, fit_platt
from model.data.rich_shop import rich_shop
from model.training.train import TrainConfig, train


def _logit(p):
    return np.log(p / (1 - p))


def test_platt_recovers_a_temperature_and_a_shift() -> None:
    rng = np.random.default_rng(0)
    raw = 1 / (1 + np.exp(-rng.normal(0, 2, 200_000)))
    truth = 1 / (1 + np.exp(-(0.5 * _logit(raw) - 1.0)))
    labels = (rng.random(raw.shape) < truth).astype(float)
    cal = fit_platt(raw, labels)
    assert cal is not None and cal.method == "platt"
    Calibration.model_validate(cal.model_dump())  # what an artifact's meta holds
    probe = np.array([0.05, 0.2, 0.5, 0.8, 0.95])
    want = 1 / (1 + np.exp(-(0.5 * _logit(probe) - 1.0)))
    np.testing.assert_allclose(cal.apply(probe), want, atol=0.01)
    assert np.all(np.diff(cal.y) > 0)  # strictly increasing: no ties, the AUC unchanged


@pytest.mark.parametrize(
    ("raw", "labels"),
    [
        (np.full(100, 0.3), np.r_[np.zeros(50), np.ones(50)]),  # scores that do not vary
        (np.linspace(0.1, 0.9, 100), np.r_[np.ones(50), np.zeros(50)]),  # a falling relation
        (np.linspace(0.1, 0.9, 100), np.zeros(100)),  # one class
    ],
)
def test_platt_refuses_what_it_cannot_map(raw, labels) -> None:
    assert fit_platt(raw, labels) is None


@pytest.mark.integration  # trains for a few seconds
def test_a_small_validation_set_gets_platt_or_says_why_not() -> None:
    events, _ = rich_shop(300, seed=4)
    config = TrainConfig(hidden=8, epochs=2, seed=1)  # ~60 validation sessions, under 1000
    off = train(events, config)  # the fallback is asked for, not the default
    assert off.report["calibration"] is None
    assert "--calibration-fallback platt" in off.report["calibration_note"]
    config = config.model_copy(update={"calibration_fallback": "platt"})
    result = train(events, config)
    note = result.report["calibration_note"]
    assert "Platt scaling" in note and "fewer than the 1000" in note
    cal = calibration_of(result.model.meta.model_extra)
    if cal is None:
        assert note.startswith("not applied") and "log loss" in note
    else:
        assert cal.method == "platt" and note.startswith("platt,")
        assert "cross-fitted ECE over all steps" in note
    big_enough = train(events, config.model_copy(update={"calibration_min_sessions": 20}))
    assert "Platt" not in big_enough.report["calibration_note"]
