"""Scores as probabilities: the calibration map training fits on held-out users, and the
measures of how well a score means what it says (docs/models.md, What a score means).

The map is isotonic regression of the outcome on the raw score, fitted by pool-adjacent-
violators on every held-out step, and read as the piecewise-linear curve through its blocks'
centres (at most MAX_KNOTS of them), with (0, 0) and (1, 1) at the ends. Isotonic, not Platt
scaling: a recurrent net's miscalibration is not always a temperature and a shift (measured
on model/data/posterior.py: a model whose best Platt map, fitted on the test users themselves,
still left an ECE of 0.025 over all steps, is brought to 0.016 by the isotonic map fitted on
its validation users), and the pooled blocks follow whatever shape the raw scores have. The
fitted probabilities are kept strictly increasing and inside [1e-4, 1 - 1e-4], so the map is
strictly increasing: it never ties or reorders two users, the AUC is unchanged and rules
compare thresholds on the same order.

It is applied to the kernels' raw scores in the same batched call (`ScoringModel.advance`:
one vectorised interpolation, ~10 ns an event), so every path that scores with the artifact
(`intentstream score`, the worker, replays, shadow scoring, `model evaluate`) gives the
calibrated probability. The artifact records it in its meta (`calibration`); the raw score
stays available (`ScoringModel(..., raw=True)`), and an artifact without the key scores as
before.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

ECE_BINS = 15
MAX_KNOTS = 128
# A session's steps share its label: the evidence is counted in sessions, and a knot needs
# about this many of them, or the pooled blocks follow the validation set's noise.
SESSIONS_PER_KNOT = 100
EDGE = 1e-4  # fitted probabilities stay in [EDGE, 1 - EDGE]: the ends (0, 0), (1, 1) stay apart


class Calibration(BaseModel):
    """The map from a raw score to a probability: linear through the knots (x, y)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # isotonic, or platt (a logistic curve on the raw logit, sampled as knots): the fallback
    # for validation sets too small for isotonic blocks
    method: str = Field("isotonic", pattern="^(isotonic|platt)$")
    x: list[float] = Field(min_length=1, max_length=1024)  # raw scores, strictly increasing
    y: list[float] = Field(min_length=1, max_length=1024)  # probabilities, non-decreasing

    @model_validator(mode="after")
    def _monotone(self) -> Calibration:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} knots and y {len(self.y)}")
        if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in self.x + self.y):
            raise ValueError("knots must be finite numbers in [0, 1]")
        if any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)):
            raise ValueError("x must be strictly increasing")
        if any(b < a for a, b in zip(self.y, self.y[1:], strict=False)):
            raise ValueError("y must not decrease")
        return self

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """Calibrated probabilities of raw scores (float64)."""
        return through_knots(raw, np.asarray(self.x), np.asarray(self.y))


def through_knots(raw: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The map of knots x, y (float64 arrays, without the ends) applied to raw scores:
    linear through (0, 0), the knots and (1, 1), vectorised."""
    xs, ys = with_ends(x, y)
    return np.interp(np.asarray(raw, np.float64), xs, ys)


def with_ends(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The knots with (0, 0) and (1, 1) added: what np.interp reads."""
    return np.r_[0.0, x, 1.0], np.r_[0.0, y, 1.0]


def calibration_of(meta_extra: dict | None) -> Calibration | None:
    """The map recorded in an artifact's meta (`calibration`), or None."""
    raw = (meta_extra or {}).get("calibration")
    return Calibration.model_validate(raw) if raw is not None else None


def knots_for(sessions: int) -> int:
    """How many knots a map fitted on this many held-out sessions can carry."""
    return max(2, min(MAX_KNOTS, sessions // SESSIONS_PER_KNOT))


def fit_isotonic(raw: np.ndarray, labels: np.ndarray, max_knots: int = MAX_KNOTS) -> Calibration:
    """The isotonic map of held-out labels on their raw scores (pool-adjacent-violators),
    as at most `max_knots` block centres."""
    x, y, w = _pool_adjacent_violators(np.asarray(raw, np.float64), np.asarray(labels, float))
    x, y = _at_most(max_knots, x, y, w)
    keep = (np.concatenate([[True], np.diff(x) > 0])) & (x > 0) & (x < 1)
    x, y = x[keep], np.clip(y[keep], EDGE, 1 - EDGE)
    if not len(x):  # every score at 0 or 1: nothing to map
        return Calibration(x=[0.5], y=[0.5])
    # strictly increasing (blocks clipped to the same edge get apart by a hair)
    y = np.maximum.accumulate(y + 1e-9 * np.arange(len(y)))
    return Calibration(x=x.tolist(), y=np.minimum(y, 1 - EDGE / 2).tolist())


def _pool_adjacent_violators(
    raw: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks of the sorted scores whose mean labels increase: (mean score, mean label,
    weight) of each."""
    order = np.argsort(raw, kind="stable")
    xs, ys = raw[order], labels[order]
    # equal scores pool first (they cannot be told apart)
    starts = np.flatnonzero(np.concatenate([[True], np.diff(xs) > 0]))
    w = np.diff(np.append(starts, len(xs))).astype(np.float64)
    sx, sy = np.add.reduceat(xs, starts), np.add.reduceat(ys, starts)
    bx, by, bw = [], [], []
    for px, py, pw in zip(sx.tolist(), sy.tolist(), w.tolist(), strict=True):
        bx.append(px)
        by.append(py)
        bw.append(pw)
        while len(bw) > 1 and by[-2] * bw[-1] >= by[-1] * bw[-2]:
            x1, y1, w1 = bx.pop(), by.pop(), bw.pop()
            bx[-1] += x1
            by[-1] += y1
            bw[-1] += w1
    weight = np.asarray(bw)
    return np.asarray(bx) / weight, np.asarray(by) / weight, weight


def _at_most(k: int, x: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Adjacent blocks merged (weighted) into at most k of about equal weight."""
    if len(x) <= k:
        return x, y
    edges = np.searchsorted(np.cumsum(w), np.linspace(0, w.sum(), k + 1)[1:-1])
    groups = np.split(np.arange(len(x)), np.unique(edges))
    gx = np.array([np.average(x[g], weights=w[g]) for g in groups if len(g)])
    gy = np.array([np.average(y[g], weights=w[g]) for g in groups if len(g)])
    return gx, gy


def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS) -> float:
    """ECE: the mean |observed rate - mean score| over equal-width score bins, weighted by
    the share of scores in each bin."""
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    if not len(p) or not (p.min() >= 0.0 and p.max() <= 1.0):
        return float("nan")  # no scores, or scores that are not probabilities (identity head)
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins)
    gap = np.abs(np.bincount(which, y, bins) - np.bincount(which, p, bins))
    return float(gap.sum() / count.sum())


def brier_score(y: np.ndarray, p: np.ndarray) -> float:
    """The mean squared difference between score and outcome."""
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    return float(np.mean((p - y) ** 2)) if len(p) else float("nan")


def reliability(
    y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin: the mean score, the observed rate, and the count (NaN where a bin
    is empty): the points of a reliability diagram."""
    y, p = np.asarray(y, np.float64), np.clip(np.asarray(p, np.float64), 0.0, 1.0)
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(which, p, bins) / count
        rate = np.bincount(which, y, bins) / count
    return mean_p, rate, count


def reliability_record(y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS) -> dict:
    """`reliability` as the model's meta keeps it (plain lists, empty bins left out): the
    points of its reliability diagram on the validation users."""
    mean_p, rate, count = reliability(y, p, bins)
    kept = count > 0
    return {
        "bins": bins,
        "mean_score": [round(float(v), 6) for v in mean_p[kept]],
        "observed": [round(float(v), 6) for v in rate[kept]],
        "count": [int(v) for v in count[kept]],
    }


PLATT_KNOTS = 64


def fit_platt(raw: np.ndarray, labels: np.ndarray) -> Calibration | None:
    """Platt scaling: sigmoid(a * logit(raw) + b) fitted by Newton's method on held-out
    labels, sampled as PLATT_KNOTS knots evenly in logit over the raw scores' range (the
    piecewise-linear form every scoring path applies); None when the fit does not increase
    (a <= 0) or the scores do not vary."""
    p = np.clip(np.asarray(raw, np.float64), EDGE, 1 - EDGE)
    y = np.asarray(labels, np.float64)
    z = np.log(p / (1 - p))
    if z.max() - z.min() < 1e-9 or y.min() == y.max():
        return None
    X = np.c_[z, np.ones_like(z)]
    w = np.zeros(2)
    for _ in range(50):  # Newton (IRLS) with a hair of ridge for separable data
        q = 1 / (1 + np.exp(-(X @ w)))
        grad = X.T @ (q - y) + 1e-6 * w
        hess = (X * (q * (1 - q))[:, None]).T @ X + 1e-6 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    if not (np.all(np.isfinite(w)) and w[0] > 0):
        return None
    grid = np.linspace(z.min(), z.max(), PLATT_KNOTS)
    x = 1 / (1 + np.exp(-grid))
    fitted = np.clip(1 / (1 + np.exp(-(w[0] * grid + w[1]))), EDGE, 1 - EDGE)
    keep = np.concatenate([[True], np.diff(x) > 0]) & (x > 0) & (x < 1)
    x, fitted = x[keep], np.maximum.accumulate(fitted[keep] + 1e-9 * np.arange(keep.sum()))
    return Calibration(method="platt", x=x.tolist(), y=np.minimum(fitted, 1 - EDGE / 2).tolist())
