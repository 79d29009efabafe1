"""Numeric event features and session boundaries, computed per batch (docs/contract.md, The
model).

Each user's previous event time is carried in `last_ts` (epoch ms, -1 when unknown), so a
batch that holds several events of one user sees the gaps between them in order. The session
features (everything but `gap`) read a small per-user memory, kept (in float32) in extra rows
of the user's state (model/artifact.py, state_shape), so the worker, replays and training all
see the same running counts:

    [session events, session seconds, earlier sessions, gap before session,
     session count per type row (V + 1), earlier count per type row (V + 1)]
"""

from __future__ import annotations

import numba as nb
import numpy as np

# the names and the memory's layout, kept apart from the kernels (the command line and the
# artifact's checks use them without Numba)
from model.feature_names import KNOWN_FEATURES as KNOWN_FEATURES
from model.feature_names import memory_column as memory_column
from model.feature_names import memory_width as memory_width


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


@nb.njit(cache=True)
def advance_memory(slot, type_idx, gap, reset, memory):
    """Each event's session memory after it (N, M) float32, the users' rows of `memory`
    (U, M) advanced in place, in order. A reset (a new session) folds the session's counts
    into the earlier ones and notes its gap; an event then counts in its session."""
    n, M = slot.shape[0], memory.shape[1]
    V1 = (M - 4) // 2
    out = np.empty((n, M), np.float32)
    for e in range(n):
        m = memory[slot[e]]
        if reset[e]:
            for t in range(V1):
                m[4 + V1 + t] += m[4 + t]
                m[4 + t] = 0.0
            m[0] = 0.0
            m[1] = 0.0
            m[2] += 1.0
            m[3] = gap[e]
        elif m[0] > 0.0:
            m[1] += gap[e]
        m[0] += 1.0
        m[4 + type_idx[e]] += 1.0
        for j in range(M):
            out[e, j] = m[j]
    return out


def feature_matrix(
    names: list[str], gap_seconds: np.ndarray, memory: np.ndarray | None = None,
    event_types: list[str] | None = None,
) -> np.ndarray:  # fmt: skip
    """The (N, F) float32 feature block appended to each event's embedding row; session
    features read `memory`, advance_memory's (N, M) per-event values for `event_types`."""
    columns = []
    for name in names:
        if name == "gap":
            columns.append(np.log1p(gap_seconds))
        elif memory is None or event_types is None:
            raise ValueError(f"feature {name!r} needs the session memory")
        else:
            col = memory_column(name, event_types)
            columns.append(np.log1p(memory[:, col].astype(np.float64)))
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
