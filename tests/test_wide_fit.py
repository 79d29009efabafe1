"""The wide part's fit (model/training/wide_fit.py): the regression's optimum, its L2 choice,
and the average with the deep logit."""

from __future__ import annotations

import numpy as np

from model.training.wide_fit import (
    L2_GRID,
    averaged,
    chosen_l2,
    cross_validation_steps,
    fit_logistic,
)


def _logistic_rows(n: int, w: np.ndarray, b: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, len(w))) * [1.0, 5.0, 0.2][: len(w)] + 3.0
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ w + b)))).astype(np.float64)
    return X, y


def test_the_regression_recovers_the_weights_of_raw_columns_and_leaves_constant_ones_at_zero():
    true_w, true_b = np.array([1.0, -0.3, 4.0]), -14.0  # logits about 0 on average
    X, y = _logistic_rows(40_000, true_w, true_b)
    X = np.hstack([X, np.zeros((len(X), 1)), np.full((len(X), 1), 7.0)])  # a table's, a constant
    w, b = fit_logistic(X, y, l2=1e-6)
    np.testing.assert_allclose(w[:3], true_w, rtol=0.08)
    assert abs(b - true_b) < 1.0 and w[3] == 0 and w[4] == 0


def test_the_regression_is_at_the_penalised_optimum():
    X, y = _logistic_rows(3_000, np.array([0.5, 0.1, -1.0]), 0.2, seed=1)
    l2 = 0.05
    w, b = fit_logistic(X, y, l2)
    # in standardised columns the gradient of mean cross-entropy + l2/2 |w|^2 is 0
    mean, std = X.mean(axis=0), X.std(axis=0)
    A = (X - mean) / std
    w_std = w * std
    p = 1 / (1 + np.exp(-(X @ w + b)))
    grad = A.T @ (p - y) / len(y) + l2 * w_std
    assert np.abs(grad).max() < 1e-8 and abs(np.mean(p - y)) < 1e-8


def test_cross_validation_chooses_the_strongest_l2_for_columns_of_noise():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(600, 40))
    y = (rng.random(600) < 0.1).astype(np.float64)
    folds = np.arange(600) % 3
    assert chosen_l2(X, y, folds) == max(L2_GRID)
    signal, _ = _logistic_rows(6_000, np.array([2.0, 0.0, 0.0]), -1.0, seed=3)
    y2 = (rng.random(6_000) < 1 / (1 + np.exp(-(2.0 * signal[:, 0] - 7.0)))).astype(np.float64)
    assert chosen_l2(signal, y2, np.arange(6_000) % 3) < max(L2_GRID)


def test_the_average_of_the_two_logits_is_scaled_and_shifted_to_the_labels():
    rng = np.random.default_rng(4)
    deep, wide = rng.normal(size=20_000), rng.normal(size=20_000)
    y = (rng.random(20_000) < 1 / (1 + np.exp(-(0.6 * (deep + wide) - 2)))).astype(float)
    s, c = averaged(deep, wide, y)
    assert abs(s - 1.2) < 0.1 and abs(c + 2) < 0.1
    s, c = averaged(-deep, -wide, y)  # an average that ranks backwards keeps the base rate
    assert s == 0.0 and abs(1 / (1 + np.exp(-c)) - y.mean()) < 1e-6


def test_a_large_training_set_chooses_its_l2_on_whole_users_steps_about_the_limit():
    rng = np.random.default_rng(5)
    hashes = np.repeat(rng.integers(0, 2**32, 5_000), 40)  # 5,000 users of 40 steps
    assert cross_validation_steps(hashes, limit=300_000).all()
    kept = cross_validation_steps(hashes, limit=50_000)
    assert 35_000 < kept.sum() < 65_000
    by_user = {h: set(kept[hashes == h]) for h in np.unique(hashes)[:200]}
    assert all(len(v) == 1 for v in by_user.values())  # a user's steps all in or all out
