"""The reasons of a score: which events of the session moved it most, by leave-one-out replay.

A session is its events e_1..e_n (types, times, and a format 2 model's declared inputs' values)
and prev_ts, the time of the event before e_1 (-1 = none). Its states are rebuilt as the worker
rebuilds a state from `recent` (worker/engine/compute/pipeline.py): h = 0 and empty item
memories, the last time prev_ts, then the events through `ScoringModel.advance`. So gaps, the
gap feature, session resets and the item flags follow docs/contract.md (The model) in every
replay; an event left out takes its inputs' values with it, and the item flags of the events
after it are those of the sequence without it. An input the session does not hold replays
as absent.

    score_all     = the score after replaying e_1..e_n
    score_without = the score after replaying the events without e_j: the next event's gap is
                    then measured from the latest earlier time (e_{j-1}'s, or prev_ts)
    delta_j       = score_all - score_without_j

With one event, removing it leaves nothing to replay: score_without is then the score of the
zero state, head(b_q), the model's score before any evidence. The reasons are the events with
the largest |delta_j|, ties going to the later event (the one nearer the score); an event with
delta exactly 0 changed nothing and is no reason. An empty session has no score (score_all
NaN) and no reasons.

Every session's variants (n + 1 sequences each) go into one `advance` call, one slot per
variant, so a batch of sessions costs one kernel call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from model.input_encoding import Stored, stored_values
from model.inputs import InputSpec
from model.scoring import ScoringModel

TOP_REASONS = 3
# A session of n events costs n * n replayed events: the reasons look at its last 64 at most
# (4,096 events, about a millisecond), however long the kept history (history-events).
MAX_EVENTS = 64


@dataclass(frozen=True)
class Session:
    """The events to explain, in order, and the time of the event before them (-1 = none);
    `inputs` holds each declared input's values, one per event, raw or `Stored` (as
    ScoringModel.advance takes them; None or an input left out: absent)."""

    prev_ts: int
    types: Sequence[str]
    ts: Sequence[int]
    inputs: Mapping[str, Sequence | Stored] | None = None

    def __post_init__(self) -> None:
        if len(self.types) != len(self.ts):
            raise ValueError(f"a session has {len(self.types)} types and {len(self.ts)} times")
        for name, values in (self.inputs or {}).items():
            if len(values) != len(self.ts):
                raise ValueError(f"input {name!r} has {len(values)} values for {len(self)} events")

    def __len__(self) -> int:
        return len(self.types)

    def tail(self, n: int) -> Session:
        """The session's last n events, after the time of the event before them."""
        if len(self) <= n:
            return self
        last = np.arange(len(self) - n, len(self))
        inputs = {k: _taken(v, last) for k, v in (self.inputs or {}).items()}
        return Session(int(self.ts[-n - 1]), self.types[-n:], self.ts[-n:],
                       inputs if self.inputs is not None else None)  # fmt: skip


def _taken(values: Sequence | Stored, idx: np.ndarray) -> Sequence | Stored:
    """An input's values of the events `idx`, in the form they were given."""
    if isinstance(values, Stored):
        return Stored(values.values[idx])
    return [values[i] for i in idx.tolist()]


@dataclass(frozen=True)
class Reason:
    """One event that moved the score: its 1-based position e_j, type, time and delta_j."""

    position: int
    type: str
    ts: int
    delta: float

    def to_dict(self) -> dict[str, object]:
        """The reason as an action entry lists it (docs/contract.md): type, ts, delta."""
        return {"type": self.type, "ts": self.ts, "delta": self.delta}


@dataclass(frozen=True)
class Explanation:
    """A session's score and, per event e_j (index j - 1), the score without it and the delta."""

    session: Session
    score_all: float
    scores_without: np.ndarray  # (n,) float64
    deltas: np.ndarray  # (n,) float64: score_all - scores_without

    def top(self, k: int = TOP_REASONS) -> list[Reason]:
        """The (at most) k events with the largest |delta|, largest first; ties: later first."""
        n = len(self.deltas)
        size = np.abs(self.deltas)
        # lexsort's last key sorts first: |delta| descending, then position descending
        order = np.lexsort((-np.arange(n), -size))
        picked = [int(j) for j in order if size[j] > 0][:k]
        types, ts = self.session.types, self.session.ts
        return [Reason(j + 1, types[j], int(ts[j]), float(self.deltas[j])) for j in picked]


def zero_state_score(model: ScoringModel) -> float:
    """The score of the zero state: head(0 W_hq + b_q) = head(b_q), in float64."""
    z = float(np.asarray(model.model.arrays["head.b_q"], np.float64)[0])
    return 1.0 / (1.0 + np.exp(-z)) if model.model.meta.head == "sigmoid" else z


@lru_cache(maxsize=MAX_EVENTS + 1)
def _layout(n: int) -> tuple[np.ndarray, np.ndarray]:
    """For a session of n events, the replays' event indices (all n, then each variant
    without one event: variant j is 0..n-1 without j) and each replayed event's slot within
    the session (0 for the full replay, j + 1 for variant j). Cached: sessions repeat
    lengths, and building these was most of an explanation's set-up."""
    keep = ~np.eye(n, dtype=np.bool_)
    variants = np.tile(np.arange(n), (n, 1))[keep].reshape(n, n - 1)
    idx = np.concatenate([np.arange(n), variants.ravel()])
    local = np.concatenate([np.zeros(n, np.int64), np.repeat(np.arange(1, n + 1), n - 1)])
    idx.flags.writeable = local.flags.writeable = False
    return idx, local


def leave_one_out(model: ScoringModel, sessions: Sequence[Session]) -> list[Explanation]:
    """Each session's score and its leave-one-out deltas (module docstring), with one kernel
    call for all the sessions; a session longer than MAX_EVENTS is explained by its tail."""
    sessions = [s.tail(MAX_EVENTS) for s in sessions]
    slots: list[np.ndarray] = []  # per session: the slot of each replayed event
    events: list[np.ndarray] = []  # per session: the index of each replayed event in it
    prev: list[np.ndarray] = []  # per slot: the time before its first event
    first_slot = np.zeros(len(sessions) + 1, np.int64)  # session i: slots [first, first + n]
    for i, s in enumerate(sessions):
        n = len(s)
        n_slots = n + 1 if n else 0  # the full replay, then one per removed event
        first_slot[i + 1] = first_slot[i] + n_slots
        if not n:
            continue
        idx, local = _layout(n)
        slots.append(first_slot[i] + local)
        events.append(idx)
        prev.append(np.full(n_slots, s.prev_ts, np.int64))
    scores = _last_scores(model, sessions, slots, events, prev, int(first_slot[-1]))
    empty = zero_state_score(model)
    out = []
    for i, s in enumerate(sessions):
        n = len(s)
        if not n:
            out.append(Explanation(s, float("nan"), np.zeros(0), np.zeros(0)))
            continue
        row = scores[first_slot[i] : first_slot[i + 1]]
        without = row[1:] if n > 1 else np.array([empty])
        score_all = float(row[0])
        out.append(Explanation(s, score_all, without, score_all - without))
    return out


def scores_after_each(model: ScoringModel, session: Session) -> np.ndarray:
    """The score after each event of a session (its tail of MAX_EVENTS), replayed from the
    zero state in one `advance`: the timeline the console draws."""
    s = session.tail(MAX_EVENTS)
    n = len(s)
    if not n:
        return np.zeros(0)
    slot = np.zeros(n, np.int64)
    state = np.zeros((1, *model.state_shape), np.float32)
    last_ts = np.array([s.prev_ts], np.int64)
    type_idx = model.type_indices(list(s.types))
    ts = np.fromiter(s.ts, np.int64, n)
    if not model.input_names:
        return np.asarray(model.advance(state, last_ts, slot, type_idx, ts), np.float64)
    gather = np.arange(n)
    inputs = {spec.name: _replayed([s], spec, gather) for spec in model.inputs}
    scores = model.advance(state, last_ts, slot, type_idx, ts, inputs, model.empty_memory(1), n)
    return np.asarray(scores, np.float64)


def _replayed(sessions: Sequence[Session], spec: InputSpec, gather: np.ndarray) -> Stored:
    """One input's stored values of every replayed event: the sessions' values (absent where
    a session lacks the input), each brought to stored form, gathered as the events are."""
    columns = []
    for s in sessions:
        values = (s.inputs or {}).get(spec.name)
        if values is None:
            values = [None] * len(s)
        columns.append(values.values if isinstance(values, Stored) else stored_values(spec, values))
    return Stored(np.concatenate(columns)[gather])


def _last_scores(
    model: ScoringModel, sessions: Sequence[Session], slots: list[np.ndarray],
    events: list[np.ndarray], prev: list[np.ndarray], n_slots: int,
) -> np.ndarray:  # fmt: skip
    """Replay every variant from the zero state in one `advance`; return each slot's score
    after its last event (NaN for a slot without events)."""
    out = np.full(n_slots, np.nan)
    if not slots:
        return out
    slot = np.concatenate(slots)
    present = [s for s in sessions if len(s)]
    # every session's events in one array, then each replay's events gathered from it
    starts = np.cumsum([0, *(len(s) for s in present[:-1])])
    gather = np.concatenate([start + e for start, e in zip(starts, events, strict=True)])
    type_idx = model.type_indices([t for s in present for t in s.types])[gather]
    ts = np.fromiter((t for s in present for t in s.ts), np.int64)[gather]
    state = np.zeros((n_slots, *model.state_shape), np.float32)
    last_ts = np.concatenate(prev)
    if model.input_names:
        inputs = {spec.name: _replayed(present, spec, gather) for spec in model.inputs}
        # every event here is a replay: none counts in the model's input_counts
        scores = model.advance(state, last_ts, slot, type_idx, ts, inputs,
                               model.empty_memory(n_slots), len(slot))  # fmt: skip
    else:
        scores = model.advance(state, last_ts, slot, type_idx, ts)
    # a slot's events are contiguous and in order: its score is that of its last event
    last = np.full(n_slots, -1, np.int64)
    np.maximum.at(last, slot, np.arange(slot.shape[0]))
    has = last >= 0
    out[has] = scores[last[has]]
    return out
