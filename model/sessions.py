"""Training data: events → per-user sessions → labelled, padded mini-batches (docs/contract.md,
Training data and labels).

A user's events are split into sessions where the gap exceeds `session_gap_seconds`. A session
is positive when it contains the label type (default `purchase`); its inputs stop before the
first label event, so nothing of the future leaks in. Every step's target is the session's
label: "will this session end in a purchase".
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from model.features import event_gaps, feature_matrix


class DataError(ValueError):
    """Training data that cannot be used; the message says why."""


@dataclass(frozen=True)
class Session:
    """One session's inputs (type rows, numeric features) and its label."""

    user_id: str
    types: np.ndarray  # (T,) int64 embedding rows
    features: np.ndarray  # (T, F) float32
    label: float


@dataclass(frozen=True)
class SessionBatch:
    """Sessions padded to one length: the kernels' input."""

    types: np.ndarray  # (B, T) int64
    features: np.ndarray  # (B, T, F)
    mask: np.ndarray  # (B, T) 1.0 on real steps, 0.0 on padding (or per-step loss weights)
    labels: np.ndarray  # (B,)

    @property
    def steps(self) -> int:
        return int(self.mask.sum())


def sessionize(
    events: Iterable[dict],
    event_types: list[str],
    features: list[str],
    session_gap_seconds: float,
    label_type: str = "purchase",
) -> list[Session]:
    """Sessions of the events (dicts with user_id, type, ts), labelled, in user order.

    Types not in `event_types` take the reserved unknown row. Gap features are computed on
    each user's whole timeline, as the worker sees it.
    """
    index = {t: i for i, t in enumerate(event_types)}
    unknown = len(event_types)
    by_user: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for e in events:
        ts = e.get("ts")
        by_user[e["user_id"]].append((-1 if ts is None else int(ts), e["type"]))
    sessions: list[Session] = []
    for user, items in by_user.items():
        items.sort(key=lambda x: x[0])  # stable: untimed events keep their order
        ts = np.array([t for t, _ in items], np.int64)
        gap, has_prev = event_gaps(np.zeros(len(ts), np.int64), ts, np.full(1, -1, np.int64))
        x = feature_matrix(features, gap)
        cut = has_prev & (gap > session_gap_seconds) if session_gap_seconds > 0 else None
        starts = [0, *np.flatnonzero(cut).tolist()] if cut is not None else [0]
        for a, b in zip(starts, [*starts[1:], len(items)], strict=True):
            names = [t for _, t in items[a:b]]
            end = names.index(label_type) if label_type in names else len(names)
            if end == 0:
                continue  # a purchase first: no inputs to score before it
            rows = np.array([index.get(t, unknown) for t in names[:end]], np.int64)
            sessions.append(Session(user, rows, x[a : a + end], float(label_type in names)))
    return sessions


def split_by_user(
    sessions: list[Session], validation_fraction: float, seed: int
) -> tuple[list[Session], list[Session]]:
    """Train and validation sessions; a user's sessions all land on one side."""
    salt = str(seed).encode()
    threshold = validation_fraction * 2**32
    train, valid = [], []
    for s in sessions:
        (valid if zlib.crc32(salt + s.user_id.encode()) < threshold else train).append(s)
    return train, valid


def pad(sessions: list[Session], n_features: int) -> SessionBatch:
    """One padded batch of sessions."""
    B = len(sessions)
    T = max(len(s.types) for s in sessions)
    types = np.zeros((B, T), np.int64)
    feats = np.zeros((B, T, n_features), np.float64)
    mask = np.zeros((B, T), np.float64)
    for i, s in enumerate(sessions):
        n = len(s.types)
        types[i, :n] = s.types
        feats[i, :n] = s.features
        mask[i, :n] = 1.0
    labels = np.array([s.label for s in sessions], np.float64)
    return SessionBatch(types, feats, mask, labels)


def minibatches(
    sessions: list[Session], batch_size: int, n_features: int, rng: np.random.Generator
) -> list[SessionBatch]:
    """Shuffled mini-batches of sessions of similar length (little padding)."""
    order = rng.permutation(len(sessions))
    # sort within chunks of 50 batches by length: random batches, little padding
    chunk = batch_size * 50
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: len(sessions[i].types))
        for b in range(0, len(part), batch_size):
            batches.append(pad([sessions[i] for i in part[b : b + batch_size]], n_features))
    rng.shuffle(batches)
    return batches
