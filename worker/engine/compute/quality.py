"""Live model quality (docs/contract.md, Model artifacts and the registry): how well the
scores a model gave predicted the sessions' outcomes, from the events as they stream by.

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

from worker.engine.compute.histories import holding

WINDOW = 10_000  # samples kept per role for the windowed AUC


def label_samples(
    k_slot: np.ndarray,
    types: list[str],
    ts: np.ndarray,
    scores: np.ndarray,
    last_score: np.ndarray,
    last_ts: np.ndarray,
    recent: list[bytes],
    label_type: str,
    gap_ms: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, label) samples of the sessions this batch labelled or ended, in event order.

    last_score and last_ts hold each row's state before the batch; `recent` tells whether
    the row's current session already had its label.
    """
    rows = _rows_with_outcomes(k_slot, types, ts, last_ts, label_type, gap_ms)
    if not rows:
        return np.zeros(0), np.zeros(0, bool)
    mine = np.isin(k_slot, np.fromiter(rows, np.int64, len(rows)))
    keep = np.flatnonzero(mine)
    k_slot, ts, scores = k_slot[keep], ts[keep], scores[keep]
    types = [types[i] for i in keep.tolist()]
    # plain lists, advanced per row below: a numpy scalar and np.isnan per event cost more
    # than the rest of the step (x != x is NaN's test)
    prev_score = last_score.astype(np.float64).tolist()
    prev_ts = last_ts.tolist()
    listed = list(rows)
    held = holding([recent[r] for r in listed], label_type)
    labelled = {r for r, yes in zip(listed, held, strict=True) if yes}
    out_scores: list[float] = []
    out_labels: list[bool] = []
    for r, name, t, s in zip(k_slot.tolist(), types, ts.tolist(), scores.tolist(), strict=True):
        before = prev_score[r]
        if gap_ms > 0 and prev_ts[r] >= 0 and t - prev_ts[r] > gap_ms:  # a session ended
            if r not in labelled and before == before:
                out_scores.append(before)
                out_labels.append(False)
            labelled.discard(r)
            before = np.nan  # a new session has no score before its first event
        if name == label_type and r not in labelled:
            if before == before:
                out_scores.append(before)
                out_labels.append(True)
            labelled.add(r)
        prev_score[r] = s
        if t > prev_ts[r]:
            prev_ts[r] = t
    return np.asarray(out_scores, np.float64), np.asarray(out_labels, bool)


def _rows_with_outcomes(
    k_slot: np.ndarray, types: list[str], ts: np.ndarray, last_ts: np.ndarray,
    label_type: str, gap_ms: float,
) -> set[int]:  # fmt: skip
    """The rows with a label event or a session end in the batch (the only ones that can
    give a sample), found without a Python step per event."""
    is_label = np.fromiter(map(label_type.__eq__, types), np.bool_, len(types))
    rows = set(k_slot[is_label].tolist())
    if gap_ms > 0 and len(k_slot):
        order = np.argsort(k_slot, kind="stable")
        slots, times = k_slot[order], ts[order]
        first = np.ones(len(slots), bool)
        first[1:] = slots[1:] != slots[:-1]
        prev = np.empty(len(slots), np.int64)
        prev[1:] = times[:-1]
        prev[first] = last_ts[slots[first]]
        ended = (prev >= 0) & (times - prev > gap_ms)
        rows.update(np.unique(slots[ended]).tolist())
    return rows


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
