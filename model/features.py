"""Numeric event features and session boundaries, computed per batch (docs/contract.md, The
model).

Each user's previous event time is carried in `last_ts` (epoch ms, -1 when unknown), so a
batch that holds several events of one user sees the gaps between them in order.
"""

from __future__ import annotations

import numba as nb
import numpy as np

# the names, kept apart from the kernels (the command line lists them without Numba)
from model.feature_names import KNOWN_FEATURES as KNOWN_FEATURES


@nb.njit(cache=True)
def event_gaps(slot, ts_ms, last_ts):
    """Seconds since each event's previous event of the same user, and whether there was one.

    ts_ms[e] < 0 means the event has no time: gap 0, and it does not move the clock.
    last_ts (one per slot, -1 = none) is advanced in place to the latest time seen; an event
    older than its user's latest (out of order) gets gap 0.
    """
    n = slot.shape[0]
    gap = np.zeros(n, np.float64)
    has_prev = np.zeros(n, np.bool_)
    for e in range(n):
        s = slot[e]
        t = ts_ms[e]
        prev = last_ts[s]
        if prev >= 0:
            has_prev[e] = True
            if t > prev:
                gap[e] = (t - prev) / 1000.0
        if t > prev:
            last_ts[s] = t
    return gap, has_prev


def feature_matrix(names: list[str], gap_seconds: np.ndarray) -> np.ndarray:
    """The (N, F) float32 feature block appended to each event's embedding row."""
    columns = []
    for name in names:
        if name == "gap":
            columns.append(np.log1p(gap_seconds))
        else:
            raise ValueError(f"unknown feature {name!r}; known: {list(KNOWN_FEATURES)}")
    if not columns:
        return np.zeros((gap_seconds.shape[0], 0), np.float32)
    return np.ascontiguousarray(np.stack(columns, axis=1), dtype=np.float32)


def session_resets(
    gap_seconds: np.ndarray, has_prev: np.ndarray, session_gap_seconds: float
) -> np.ndarray:
    """True where an event starts a new session: its gap exceeds the model's session gap."""
    if session_gap_seconds <= 0:
        return np.zeros(gap_seconds.shape[0], np.bool_)
    return has_prev & (gap_seconds > session_gap_seconds)
