"""Live model quality (SPEC §5): how well the scores a model gave predicted the sessions'
outcomes, from the events as they stream by.

A session is positive when its label event (the model's `label_type`, default `purchase`)
arrives: its sample is the last score before the label. It is negative when it ends without
one, i.e. when the user's next event comes after the session gap: its sample is its last
score. The windowed ROC AUC over the latest samples is exported per model role (current,
shadow). What this cannot see: sessions still open, a session whose user never comes back
(it never ends here), labels that never reach the stream, and sessions of a model with no
session gap (they never end, so there are no negatives).
"""

from __future__ import annotations

import threading

import numpy as np

from worker.recent import Recent

WINDOW = 10_000  # samples kept per role for the windowed AUC


def label_samples(
    k_slot: np.ndarray,
    types: list[str],
    ts: np.ndarray,
    scores: np.ndarray,
    last_score: np.ndarray,
    last_ts: np.ndarray,
    recent: list[Recent],
    label_type: str,
    gap_ms: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, label) samples of the sessions this batch labelled or ended, in event order.

    last_score and last_ts hold each row's state before the batch; `recent` tells whether
    the row's current session already had its label.
    """
    prev_score = last_score.astype(np.float64)  # copies: advanced per row below
    prev_ts = last_ts.copy()
    labelled = {r for r, rec in enumerate(recent) if rec.has(label_type)}
    out_scores: list[float] = []
    out_labels: list[bool] = []
    for r, name, t, s in zip(k_slot.tolist(), types, ts.tolist(), scores.tolist(), strict=True):
        if gap_ms > 0 and prev_ts[r] >= 0 and t - prev_ts[r] > gap_ms:  # a session ended
            if r not in labelled and not np.isnan(prev_score[r]):
                out_scores.append(prev_score[r])
                out_labels.append(False)
            labelled.discard(r)
            prev_score[r] = np.nan  # a new session has no score before its first event
        if name == label_type and r not in labelled:
            if not np.isnan(prev_score[r]):
                out_scores.append(prev_score[r])
                out_labels.append(True)
            labelled.add(r)
        prev_score[r] = s
        prev_ts[r] = max(prev_ts[r], t)
    return np.asarray(out_scores, np.float64), np.asarray(out_labels, bool)


class LiveQuality:
    """The latest labelled-session samples per model role, and their ROC AUC."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._samples: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def add(self, role: str, scores: np.ndarray, labels: np.ndarray) -> None:
        if not len(scores):
            return
        with self._lock:
            old_s, old_l = self._samples.get(role, (np.zeros(0), np.zeros(0, bool)))
            self._samples[role] = (
                np.concatenate([old_s, scores])[-self.window :],
                np.concatenate([old_l, labels])[-self.window :],
            )

    def forget(self, role: str) -> None:
        """Drop a role's samples (its model changed)."""
        with self._lock:
            self._samples.pop(role, None)

    def auc(self, role: str) -> float:
        """ROC AUC of the role's window; NaN until it holds both outcomes."""
        from model.evaluate import roc_auc  # scipy.stats: loaded at the first scrape only

        with self._lock:
            scores, labels = self._samples.get(role, (np.zeros(0), np.zeros(0, bool)))
        return roc_auc(labels, scores)
