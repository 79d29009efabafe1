"""Scores as probabilities: the calibration map training fits on held-out users, and the
measures of how well a score means what it says (docs/models.md, What a score means).

The map is Platt scaling on the head's logit, p = sigmoid(a * z + b) with z = h W_hq + b_q:
monotone (a > 0), so it never reorders users and the AUC is unchanged, two numbers fitted by
Newton's method on every held-out step, and it folds into the head itself
(W_hq' = a W_hq, b_q' = a b_q + b), so every path that scores with the artifact's head (the
kernels, `intentstream score`, the worker, replays, shadow scoring) applies it at no cost per
event. Isotonic regression would bend further, but its steps tie users that the model tells
apart (an AUC loss where rules compare thresholds) and need a table lookup per event; a
BCE-trained recurrent net's miscalibration is mostly a temperature and a shift, which the
two numbers take out.

The artifact keeps the raw head and records the map in its meta (`calibration`), so the raw
score stays available (`scoring_arrays(model, raw=True)`) and an artifact without the key
scores as before.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

ECE_BINS = 15
_EPS = 1e-7


class Calibration(BaseModel):
    """The map from the head's logit z to a probability: sigmoid(a * z + b)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field("platt", pattern="^platt$")
    a: float = Field(gt=0)
    b: float

    @field_validator("a", "b")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """Calibrated probabilities of raw sigmoid scores (float64)."""
        return _sigmoid(self.a * _logit(raw) + self.b)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow warning for large |z|


def calibration_of(meta_extra: dict | None) -> Calibration | None:
    """The map recorded in an artifact's meta (`calibration`), or None."""
    raw = (meta_extra or {}).get("calibration")
    return Calibration.model_validate(raw) if raw is not None else None


def scoring_arrays(
    arrays: dict[str, np.ndarray], meta_extra: dict | None, raw: bool = False
) -> dict[str, np.ndarray]:
    """The arrays a model scores with: its calibration folded into the head, unless `raw`
    (or it has none)."""
    cal = calibration_of(meta_extra)
    return arrays if raw or cal is None else fold_into_head(arrays, cal)


def fold_into_head(arrays: dict[str, np.ndarray], cal: Calibration) -> dict[str, np.ndarray]:
    """The artifact's arrays with the map folded into the head: the same probabilities as
    `cal.apply` of the raw scores, computed by the head itself."""
    out = dict(arrays)
    w, b = arrays["head.W_hq"], arrays["head.b_q"]
    out["head.W_hq"] = (w.astype(np.float64) * cal.a).astype(w.dtype)
    out["head.b_q"] = (b.astype(np.float64) * cal.a + cal.b).astype(b.dtype)
    return out


def fit_platt(raw: np.ndarray, labels: np.ndarray, iterations: int = 50) -> Calibration:
    """The Platt map that minimises the log loss of held-out raw scores against their
    labels (Newton's method; a tiny ridge keeps it defined on separable data)."""
    z = _logit(raw)
    y = np.asarray(labels, np.float64)
    a, b = 1.0, 0.0
    for _ in range(iterations):
        p = _sigmoid(a * z + b)
        r = p - y
        w = np.maximum(p * (1 - p), 1e-12)
        g = np.array([r @ z + 1e-6 * (a - 1.0), r.sum()])
        H = np.array([[w @ (z * z) + 1e-6, w @ z], [w @ z, w.sum() + 1e-6]])
        step = np.linalg.solve(H, g)
        a, b = a - step[0], b - step[1]
        if not (math.isfinite(a) and math.isfinite(b)) or a <= 0:
            return Calibration(a=1.0, b=0.0)  # the raw scores already order nothing better
        if np.abs(step).max() < 1e-10:
            break
    return Calibration(a=float(a), b=float(b))


def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS) -> float:
    """ECE: the mean |observed rate - mean score| over equal-width score bins, weighted by
    the share of scores in each bin."""
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    if not len(p):
        return float("nan")
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
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(which, p, bins) / count
        rate = np.bincount(which, y, bins) / count
    return mean_p, rate, count
