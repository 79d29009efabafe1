"""The wide part of a wide head (`train --wide-head`), fitted after the deep part.

The deep part trains with the wide part held at 0. Then a logistic regression on x's numeric
columns is fitted over every training step (its L2 strength chosen by cross-validation over
users), averaged with the deep logit, the average scaled and shifted by two numbers fitted on
the validation users, and the regression refitted on training and validation users together:

    logit_t = s ((h_t W_hq + b_q) + (f_t w + w_0)) / 2 + c

folded into the artifact's own head (W_hq, b_q, W_fq), so every scoring path reads it as
before. Equal weights, not fitted ones: with a few dozen buying validation sessions, weights
fitted on them followed their noise (on REES46's held-out users they kept the deep part alone
in most folds and lost 0.025 of AUC at the last event against the plain average;
docs/experiments.md). A convex fit for the wide part for the same reason: fitted jointly by
backpropagation, early stopping chose it on validation noise.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from model.training.evaluate import step_scores
from model.training.sessions import Session

L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)  # per-step L2 strengths tried, on standardised columns
CV_FOLDS = 3
# Past this many steps the L2 strength matters little: it is chosen on the steps of a subset
# of users (by hash) instead (1M steps: 75 s of cross-validation otherwise, 2-core VM).
CV_MAX_STEPS = 200_000
SCALE_L2 = 1e-4  # two numbers: a whisper of L2 only keeps Newton finite


@dataclass(frozen=True)
class WidePart:
    """How the wide part was fitted: its L2 strength, the average's scale and offset, and
    the columns it reads."""

    l2: float
    scale: float
    offset: float
    columns_used: int

    def note(self) -> str:
        """One line for the training report."""
        return (
            f"wide part: a logistic regression on {self.columns_used} numeric columns (L2 "
            f"{self.l2:g}, chosen over {CV_FOLDS} folds of training users), averaged with the "
            f"deep logit (scaled by {self.scale:.3f}), refitted on every user training read"
        )


def step_rows(sessions: list[Session]) -> tuple[np.ndarray, np.ndarray]:
    """Every step's x columns after the embedding (N, F + inputs) float64 and its label."""
    X = np.concatenate([s.features for s in sessions]).astype(np.float64)
    y = np.concatenate([np.full(len(s.types), s.label) for s in sessions])
    return X, y


def _loss(Z: np.ndarray, y: np.ndarray) -> float:
    # mean binary cross-entropy of logits, stable for large |z|
    return float(np.mean(np.logaddexp(0.0, Z) - y * Z))


def _base_logit(y: np.ndarray) -> float:
    """The logit of the labels' base rate."""
    return float(np.log((y.mean() + 1e-9) / (1 - y.mean() + 1e-9)))


def _newton(A: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
    """Weights (last entry the unpenalised intercept) minimising the mean cross-entropy of
    A's rows plus l2/2 of the squared weights; Newton's method with step halving."""
    n, k = A.shape
    A1 = np.hstack([A, np.ones((n, 1))])
    pen = np.full(k + 1, l2)
    pen[-1] = 0.0
    beta = np.zeros(k + 1)
    beta[-1] = _base_logit(y)

    def objective(b: np.ndarray) -> float:
        return _loss(A1 @ b, y) + 0.5 * float(np.sum(pen * b * b))

    current = objective(beta)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(A1 @ beta)))
        grad = A1.T @ (p - y) / n + pen * beta
        hess = (A1.T * (p * (1 - p))) @ A1 / n + np.diag(pen) + 1e-10 * np.eye(k + 1)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-6:
            trial = beta - t * step
            value = objective(trial)
            if value <= current:
                break
            t /= 2
        else:
            break
        beta, done = trial, current - value < 1e-12
        current = value
        if done:
            break
    return beta


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """(weights per column, intercept) of an L2 logistic regression on standardised columns,
    returned for the raw columns; a constant column (an input table's, always 0) gets 0."""
    mean, std = X.mean(axis=0), X.std(axis=0)
    used = std > 1e-12
    beta = _newton((X[:, used] - mean[used]) / std[used], y, l2)
    w = np.zeros(X.shape[1])
    w[used] = beta[:-1] / std[used]
    return w, float(beta[-1] - np.dot(w[used], mean[used]))


def user_hashes(sessions: list[Session]) -> np.ndarray:
    """Each step's user hash (crc32 of the user id): a user's steps stay together."""
    return np.concatenate([np.full(len(s.types), zlib.crc32(s.user_id.encode()))
                           for s in sessions])  # fmt: skip


def cross_validation_steps(hashes: np.ndarray, limit: int = CV_MAX_STEPS) -> np.ndarray:
    """The steps the L2 strength is chosen on: all, or those of about `limit` steps' worth of
    users."""
    share = int(np.ceil(len(hashes) / limit))
    return np.ones(len(hashes), bool) if share <= 1 else (hashes // CV_FOLDS) % share == 0


def chosen_l2(X: np.ndarray, y: np.ndarray, folds: np.ndarray) -> float:
    """The L2 strength of L2_GRID with the lowest held-out log loss over the user folds."""
    losses = {}
    for l2 in L2_GRID:
        total = 0.0
        for k in np.unique(folds):
            out = folds == k
            if len(np.unique(y[~out])) < 2:
                continue
            w, b = fit_logistic(X[~out], y[~out], l2)
            total += _loss(X[out] @ w + b, y[out]) * out.sum()
        losses[l2] = total
    return min(losses, key=losses.get)


def averaged(deep: np.ndarray, wide: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(s, c) of logit = s (deep + wide) / 2 + c fitted on the validation steps (s >= 0)."""
    s, c = _newton(((deep + wide) / 2)[:, None], y, SCALE_L2)
    if s < 0:  # an average that ranks backwards: keep only the base rate
        return 0.0, _base_logit(y)
    return float(s), float(c)


def with_wide_part(
    arrays: dict[str, np.ndarray], params, train: list[Session], valid: list[Session],
    n_features: int,
) -> tuple[dict[str, np.ndarray], WidePart]:  # fmt: skip
    """The kept arrays (their wide part at 0) with the wide part fitted and averaged in, and
    how; `params` are those arrays packed (float64), for the deep logits."""
    X_train, y_train = step_rows(train)
    hashes = user_hashes(train)
    cv = cross_validation_steps(hashes)
    l2 = chosen_l2(X_train[cv], y_train[cv], hashes[cv] % CV_FOLDS)
    w, w0 = fit_logistic(X_train, y_train, l2)
    X_valid, y_valid = step_rows(valid)
    deep = step_scores(params, valid, n_features, head="identity")[1]
    scale, c = averaged(deep, X_valid @ w + w0, y_valid)
    a = b = scale / 2
    w, w0 = fit_logistic(np.vstack([X_train, X_valid]), np.concatenate([y_train, y_valid]), l2)
    out = dict(arrays)
    dt = arrays["head.W_hq"].dtype
    out["head.W_hq"] = (a * arrays["head.W_hq"].astype(np.float64)).astype(dt)
    out["head.b_q"] = (a * arrays["head.b_q"].astype(np.float64) + b * w0 + c).astype(dt)
    out["head.W_fq"] = (b * w)[:, None].astype(dt)
    return out, WidePart(l2, scale, c, int(np.count_nonzero(w)))
