"""Evaluation (docs/contract.md, Training data and labels): ROC AUC, log loss, calibration
error and Brier score, at the last step of each session and over all steps, for the RNN and
for a bag-of-event-types logistic regression on the same split."""

from __future__ import annotations

import numpy as np

from model.artifact import Model
from model.calibration import brier_score, calibration_of, expected_calibration_error
from model.params import pack
from model.training.bptt import predict
from model.training.sessions import Session, pad


def roc_auc(y: np.ndarray, p: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties averaged); nan with one class."""
    y = np.asarray(y, bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return float("nan")
    ranks = average_ranks(p)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def average_ranks(p: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their mean rank, all NaN if any is (scipy.stats.rankdata's;
    not imported: scipy.stats costs every command that trains or evaluates ~0.5 s to load)."""
    p = np.asarray(p, dtype=np.float64)
    if np.isnan(p).any():
        return np.full(p.shape, np.nan)
    order = np.argsort(p, kind="stable")
    ordered = p[order]
    first = np.concatenate([[True], ordered[1:] != ordered[:-1]])  # each tie group's start
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, len(p)))
    ranks = np.empty(len(p))
    ranks[order] = np.repeat(starts + (counts + 1) / 2, counts)
    return ranks


def roc_curve(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) at every threshold, for plotting."""
    order = np.argsort(-np.asarray(p), kind="stable")
    y = np.asarray(y, bool)[order]
    tpr = np.concatenate([[0.0], np.cumsum(y) / max(1, y.sum())])
    fpr = np.concatenate([[0.0], np.cumsum(~y) / max(1, (~y).sum())])
    return fpr, tpr


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """Mean binary cross-entropy."""
    p = np.clip(np.asarray(p, np.float64), 1e-12, 1 - 1e-12)
    y = np.asarray(y, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def step_scores(
    params: dict[str, np.ndarray], sessions: list[Session], n_features: int,
    head: str = "sigmoid",
):  # fmt: skip
    """Per-step (labels, scores) over all steps, and per-session at the last step (`head`
    "identity": the logits)."""
    all_y, all_p, last_y, last_p = [], [], [], []
    for start in range(0, len(sessions), 512):
        chunk = sessions[start : start + 512]
        batch = pad(chunk, n_features)
        P = predict(params, batch, head)
        for i, s in enumerate(chunk):
            n = len(s.types)
            all_y.append(np.full(n, s.label))
            all_p.append(P[i, :n])
            last_y.append(s.label)
            last_p.append(P[i, n - 1])
    return (np.concatenate(all_y), np.concatenate(all_p), np.array(last_y), np.array(last_p))


def metrics_of(all_y, all_p, last_y, last_p) -> dict[str, float]:
    """AUC, log loss, calibration error (ECE) and Brier score, at the last step and over all
    steps."""
    return {
        "auc_last": roc_auc(last_y, last_p),
        "auc_all": roc_auc(all_y, all_p),
        "logloss_last": log_loss(last_y, last_p),
        "logloss_all": log_loss(all_y, all_p),
        "ece_last": expected_calibration_error(last_y, last_p),
        "ece_all": expected_calibration_error(all_y, all_p),
        "brier_last": brier_score(last_y, last_p),
        "brier_all": brier_score(all_y, all_p),
    }


def model_step_scores(model: Model, sessions: list[Session], raw: bool = False):
    """`step_scores` of a model as it scores (calibrated, unless `raw`)."""
    params = pack(model.arrays, model.meta.cell, np.float64, model.inputs)
    all_y, all_p, last_y, last_p = step_scores(params, sessions, len(model.meta.features))
    cal = None if raw else calibration_of(model.meta.model_extra)
    if cal is not None:
        all_p, last_p = cal.apply(all_p), cal.apply(last_p)
    return all_y, all_p, last_y, last_p


def evaluate_model(model: Model, sessions: list[Session], raw: bool = False) -> dict[str, float]:
    """Metrics of a model on sessions built with its own vocabulary and features, as it
    scores (calibrated, unless `raw`)."""
    return metrics_of(*model_step_scores(model, sessions, raw))


class BagOfTypes:
    """Logistic regression on log1p(counts of each event type so far): the order-blind
    baseline. Fitted by Newton's method (IRLS) with a small L2 penalty."""

    def __init__(self, n_types: int, l2: float = 1e-3) -> None:
        self.n_types = n_types
        self.l2 = l2
        self.w = np.zeros(n_types + 1)

    def _design(self, sessions: list[Session]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows: every step's prefix counts (+ bias); labels; index of each session's last row."""
        rows, labels, last = [], [], []
        for s in sessions:
            onehot = np.zeros((len(s.types), self.n_types))
            onehot[np.arange(len(s.types)), s.types] = 1.0
            rows.append(np.log1p(np.cumsum(onehot, axis=0)))
            labels.append(np.full(len(s.types), s.label))
            last.append(len(s.types))
        X = np.concatenate(rows)
        X = np.hstack([X, np.ones((len(X), 1))])
        return X, np.concatenate(labels), np.cumsum(last) - 1

    def fit(self, sessions: list[Session], iterations: int = 25) -> BagOfTypes:
        X, y, _ = self._design(sessions)
        for _ in range(iterations):
            p = 1 / (1 + np.exp(-(X @ self.w)))
            g = X.T @ (p - y) / len(y) + self.l2 * self.w
            Hm = (X * (p * (1 - p))[:, None]).T @ X / len(y) + self.l2 * np.eye(len(self.w))
            self.w -= np.linalg.solve(Hm, g)
        return self

    def step_scores(self, sessions: list[Session]):
        X, y, last = self._design(sessions)
        p = 1 / (1 + np.exp(-(X @ self.w)))
        return y, p, y[last], p[last]
