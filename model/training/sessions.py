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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from model.feature_names import is_stateful
from model.features import advance_memory, event_gaps, feature_matrix, memory_width
from model.input_encoding import empty_session_stats, input_parts
from model.inputs import Inputs, InputSpec
from model.item_memory import ItemMemory


class DataError(ValueError):
    """Training data that cannot be used; the message says why."""


@dataclass(frozen=True)
class Session:
    """One session's inputs (type rows, numeric features) and its label.

    With declared inputs (model/inputs.py), features holds F + input_width columns: the
    features, then the inputs' block with its numeric and flag columns and 0 in the embedding
    columns, and buckets the bucket of each categorical and item input's value (in
    declaration order): the forward pass looks the rows up in the tables being fitted."""

    user_id: str
    types: np.ndarray  # (T,) int64 embedding rows
    features: np.ndarray  # (T, F [+ input_width]) float32
    label: float
    buckets: np.ndarray | None = None  # (T, K) int64; None: no input tables


@dataclass(frozen=True)
class SessionBatch:
    """Sessions padded to one length: the kernels' input."""

    types: np.ndarray  # (B, T) int64
    features: np.ndarray  # (B, T, F [+ input_width])
    mask: np.ndarray  # (B, T) 1.0 on real steps, 0.0 on padding (or per-step loss weights)
    labels: np.ndarray  # (B,)
    buckets: np.ndarray | None = None  # (B, T, K) int64 input table rows, 0 on padding

    @property
    def steps(self) -> int:
        return int(self.mask.sum())


def sessionize(
    events: Iterable[dict],
    event_types: list[str],
    features: list[str],
    session_gap_seconds: float,
    label_type: str = "purchase",
    inputs: Inputs | Sequence[InputSpec] | None = None,
) -> list[Session]:
    """Sessions of the events (dicts with user_id, type, ts), labelled, in user order.

    Types not in `event_types` take the reserved unknown row. Gap features are computed on
    each user's whole timeline, as the worker sees it; so are the declared `inputs` (each
    read from the event's field of its name), as scoring encodes them (model/inputs.py,
    input_parts): each user's item memory and session statistics start empty and restart at
    each session start.
    """
    index = {t: i for i, t in enumerate(event_types)}
    unknown = len(event_types)
    specs = list(inputs or [])
    by_user: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for e in events:
        ts = e.get("ts")
        by_user[e["user_id"]].append((-1 if ts is None else int(ts), e))
    timelines = []
    for user, items in by_user.items():
        items.sort(key=lambda x: x[0])  # stable: untimed events keep their order
        ts = np.array([t for t, _ in items], np.int64)
        slot = np.zeros(len(ts), np.int64)
        gap, has_prev = event_gaps(slot, ts, np.full(1, -1, np.int64))
        cut = (has_prev & (gap > session_gap_seconds) if session_gap_seconds > 0
               else np.zeros(len(ts), np.bool_))  # fmt: skip
        memory = None
        if is_stateful(features):  # the worker's running session memory, from empty
            rows = np.array([index.get(e["type"], unknown) for _, e in items], np.int64)
            empty = np.zeros((1, memory_width(event_types)), np.float32)
            memory = advance_memory(slot, rows, gap, cut, empty)
        x = feature_matrix(features, gap, memory, event_types)
        timelines.append((user, [e for _, e in items], x, cut))
    fixed = buckets = None
    if specs:
        timeline = [e for _, evs, _, _ in timelines for e in evs]
        slot = np.repeat(np.arange(len(timelines)), [len(evs) for _, evs, _, _ in timelines])
        cuts = np.concatenate([c for *_, c in timelines]) if timelines else np.zeros(0, bool)
        raw = {s.name: [e.get(s.name) for e in timeline] for s in specs}
        memory = {s.name: ItemMemory.empty(len(timelines)) for s in specs if s.kind == "item"}
        stats = empty_session_stats(specs, len(timelines))
        fixed, buckets, _ = input_parts(specs, raw, slot, cuts, memory, stats=stats)
    sessions: list[Session] = []
    at = 0
    for user, evs, x, cut in timelines:
        if fixed is not None:
            x = np.concatenate([x, fixed[at : at + len(evs)]], axis=1)
            user_buckets = buckets[at : at + len(evs)]
        at += len(evs)
        starts = [0, *np.flatnonzero(cut).tolist()]
        for a, b in zip(starts, [*starts[1:], len(evs)], strict=True):
            names = [e["type"] for e in evs[a:b]]
            end = names.index(label_type) if label_type in names else len(names)
            if end == 0:
                continue  # a purchase first: no inputs to score before it
            rows = np.array([index.get(t, unknown) for t in names[:end]], np.int64)
            sessions.append(Session(
                user, rows, x[a : a + end], float(label_type in names),
                user_buckets[a : a + end] if fixed is not None else None,
            ))  # fmt: skip
    return sessions


def split_by_user(
    sessions: list[Session], validation_fraction: float, seed: int, test_fraction: float = 0.0
) -> tuple[list[Session], list[Session]]:
    """Train and validation sessions; a user's sessions all land on one side; the test users
    (`is_test_user`) on neither."""
    train, valid = [], []
    for s in sessions:
        if test_fraction and is_test_user(s.user_id, test_fraction, seed):
            continue
        (valid if is_validation_user(s.user_id, validation_fraction, seed) else train).append(s)
    return train, valid


def is_validation_user(user_id: str, validation_fraction: float, seed: int) -> bool:
    """Whether split_by_user puts the user's sessions on the validation side."""
    return zlib.crc32(str(seed).encode() + user_id.encode()) < validation_fraction * 2**32


def is_test_user(user_id: str, test_fraction: float, seed: int) -> bool:
    """Whether training holds the user out as a test user, whom no choice sees (a hash of its
    own, independent of the validation split's)."""
    return zlib.crc32(f"test:{seed}:".encode() + user_id.encode()) < test_fraction * 2**32


def pad(sessions: list[Session], n_features: int) -> SessionBatch:
    """One padded batch of sessions (n_features: their feature columns, inputs included, as
    their features hold them)."""
    B = len(sessions)
    T = max(len(s.types) for s in sessions)
    F = sessions[0].features.shape[1] if sessions[0].features.ndim == 2 else n_features
    K = 0 if sessions[0].buckets is None else sessions[0].buckets.shape[1]
    types = np.zeros((B, T), np.int64)
    feats = np.zeros((B, T, F), np.float64)
    mask = np.zeros((B, T), np.float64)
    buckets = np.zeros((B, T, K), np.int64)
    for i, s in enumerate(sessions):
        n = len(s.types)
        types[i, :n] = s.types
        feats[i, :n] = s.features
        mask[i, :n] = 1.0
        if K:
            buckets[i, :n] = s.buckets
    labels = np.array([s.label for s in sessions], np.float64)
    return SessionBatch(types, feats, mask, labels, buckets)


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
