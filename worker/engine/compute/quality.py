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

import numba as nb
import numpy as np

from worker.engine.compute.histories import holding

WINDOW = 10_000  # samples kept per role for the windowed AUC
# Fewer events find their rows with outcomes one by one: numpy's ten or so calls cost more
FEW_EVENTS = 8


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
    is_label = np.fromiter(map(label_type.__eq__, types), np.bool_, len(types))
    rows = _rows_with_outcomes(k_slot, is_label, ts, last_ts, gap_ms)
    if not rows:
        return np.zeros(0), np.zeros(0, bool)
    labelled = np.zeros(len(last_score), np.bool_)
    listed = list(rows)
    labelled[listed] = holding([recent[r] for r in listed], label_type)
    return _samples(np.ascontiguousarray(k_slot, np.int64), is_label,
                    np.ascontiguousarray(ts, np.int64), np.asarray(scores, np.float64),
                    last_score.astype(np.float64), last_ts.astype(np.int64), labelled,
                    float(gap_ms))  # fmt: skip


@nb.njit(cache=True)
def _samples(k_slot, is_label, ts, scores, prev_score, prev_ts, labelled, gap_ms):
    """The samples of a batch's events in order: each row's session ends (the next event
    comes after the gap) and label events, from its score and time before the batch
    (prev_score, prev_ts, advanced here) and whether its session already had its label.
    Only rows with a label event or a session end in the batch give samples (the caller
    fills `labelled` for those)."""
    n = k_slot.shape[0]
    out_scores = np.empty(2 * n, np.float64)
    out_labels = np.empty(2 * n, np.bool_)
    m = 0
    for e in range(n):
        r, t = k_slot[e], ts[e]
        before = prev_score[r]
        if gap_ms > 0 and prev_ts[r] >= 0 and t - prev_ts[r] > gap_ms:  # a session ended
            if not labelled[r] and before == before:
                out_scores[m], out_labels[m] = before, False
                m += 1
            labelled[r] = False
            before = np.nan  # a new session has no score before its first event
        if is_label[e] and not labelled[r]:
            if before == before:
                out_scores[m], out_labels[m] = before, True
                m += 1
            labelled[r] = True
        prev_score[r] = scores[e]
        if t > prev_ts[r]:
            prev_ts[r] = t
    return out_scores[:m], out_labels[:m]


def _rows_with_outcomes(
    k_slot: np.ndarray, is_label: np.ndarray, ts: np.ndarray, last_ts: np.ndarray,
    gap_ms: float,
) -> set[int]:  # fmt: skip
    """The rows with a label event or a session end in the batch (the only ones that can
    give a sample), found without a Python step per event (a few events: one by one)."""
    if len(k_slot) < FEW_EVENTS:
        return _rows_one_by_one(k_slot, is_label, ts, last_ts, gap_ms)
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


def _rows_one_by_one(
    k_slot: np.ndarray, is_label: np.ndarray, ts: np.ndarray, last_ts: np.ndarray,
    gap_ms: float,
) -> set[int]:  # fmt: skip
    """_rows_with_outcomes a step per event: each event's time against its row's event
    before it in the batch (else the row's last time before the batch)."""
    rows: set[int] = set()
    before: dict[int, int] = {}
    for r, label, t in zip(k_slot.tolist(), is_label.tolist(), ts.tolist(), strict=True):
        prev = before.get(r)
        prev = int(last_ts[r]) if prev is None else prev
        if label or (gap_ms > 0 and prev >= 0 and t - prev > gap_ms):
            rows.add(r)
        before[r] = t
    return rows


def warm_up() -> None:
    """Compile (or load from cache) the samples kernel now, not on the first batch."""
    one = np.zeros(1, np.int64)
    label_samples(one, ["purchase"], one, np.zeros(1), np.zeros(1), one, [b""], "purchase", 1.0)


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
        from model.training.evaluate import roc_auc  # training kernels: at the first scrape

        with self._lock:
            scores, labels = self._samples.get(role, (np.zeros(0), np.zeros(0, bool)))
        return roc_auc(labels, scores)
