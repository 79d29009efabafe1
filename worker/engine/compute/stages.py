"""The core stages every batch goes through, in order: resends (which entries apply), cell (a
model's states advanced over them in one kernel call), rows (the state rows written) and
histories (each written user's recent events). A `Run` carries what each stage gives the
next; a `ModelRun` is one scoring model over the batch, the current or the shadow, both run
by the same stages. The optional stages (compute/parts/) read the Run and add a part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from operator import gt

import numpy as np

from model.input_bytes import stored_forms
from model.input_encoding import Stored
from model.scoring import ScoringModel
from worker.common.dedup import ResendWindow
from worker.engine.compute.batch import Batch, seconds_of
from worker.engine.compute.histories import extended_histories
from worker.engine.compute.items import memories_of
from worker.engine.compute.recent import (
    NUMBER,
    Field,
    Recent,
    absent,
    extend_packed,
    form_of,
    names_of,
    unpack,
)
from worker.engine.compute.resends import memories_after
from worker.engine.compute.user_states import NO_HISTORY, UserStates, user_slots
from worker.rules.step import RuleTable


@dataclass
class ModelRun:
    """One scoring model over the batch: the states it reads (advanced in place) and, after
    the cell stage, its score of each applied event."""

    role: str  # "current" or "shadow" (live quality's label)
    model: ScoringModel
    h: np.ndarray  # (U, L, H) float32
    last_ts: np.ndarray  # (U,) int64
    replay: list[int]  # rows rebuilt from `recent` first
    score_before: np.ndarray  # (U,) each user's last score before the batch, NaN = none
    rules: list[bytes]  # its rule states as read, b"" = none
    memory: dict | None = None  # its item memories, by input name (compute/items.py)
    type_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # by event
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    input_counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # (missing, bad)


@dataclass
class Run:
    """A batch on its way through the stages, with what each stage found."""

    batch: Batch
    states: UserStates
    history_events: int
    rules: RuleTable | None
    # resends
    slot: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ts_before: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    remembered: dict = field(default_factory=dict)  # new event-id memories by user row
    overflow: int = 0  # own ids the memories' bound pushed out before their time
    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # applied entries
    picked: list[int] = field(default_factory=list)  # the same, as ints
    every: bool = True  # every entry applies
    k_slot: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # their rows
    types: list[str] = field(default_factory=list)
    ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    columns: dict[Field, np.ndarray] = field(default_factory=dict)  # declared inputs' values
    # rows
    touched: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    touched_list: list[int] = field(default_factory=list)
    last_event: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    row_of_slot: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    applied: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    score_event_ids: list[bytes] = field(default_factory=list)

    def taken(self, values: list) -> list:
        """The values of the applied entries: the list itself when every entry applies."""
        return values if self.every else [values[i] for i in self.picked]

    def n_after(self) -> np.ndarray:
        """Each written row's applied-event count after the batch."""
        return self.states.n[self.touched] + self.applied


def gap_ms(model: ScoringModel) -> float:
    """The model's session gap in ms (0 = sessions never split)."""
    return model.model.meta.session_gap_seconds * 1000.0


# ---- resends --------------------------------------------------------------------------


def resends_stage(run: Run, window: ResendWindow, models: list[ScoringModel]) -> None:
    """Which entries apply: those above their user's last applied id (docs/contract.md, User
    state and scores out) and not resends (`common/dedup.py`'s rules, one kernel call); the
    users' event-id memories after them; the scoring models' inputs' stored values."""
    batch, states = run.batch, run.states
    run.slot = slot = user_slots(batch, states.users)
    run.ts_before = states.last_ts.copy()  # the advances move last_ts
    last = map(states.last_id.__getitem__, slot.tolist())
    keep = np.fromiter(map(gt, batch.entry_keys, last), np.bool_, len(slot))
    seconds = batch.entry_seconds
    if seconds is None:
        seconds = seconds_of(batch.entry_keys)
    run.remembered, run.overflow = memories_after(states.event_ids, slot, keep, batch.event_ids,
                                                  batch.producers, seconds, window)  # fmt: skip
    run.idx = np.flatnonzero(keep)
    run.picked = run.idx.tolist()  # plain ints index lists ~2x faster than numpy's
    run.every = len(run.picked) == len(keep)  # the common case: no resend, none applied
    run.k_slot = slot if run.every else slot[run.idx]
    run.types = run.taken(batch.types)
    run.ts = np.array(run.taken(batch.ts), np.int64)
    run.columns = stored_columns(batch, run.idx, models)


def stored_columns(
    batch: Batch, idx: np.ndarray, models: list[ScoringModel]
) -> dict[Field, np.ndarray]:
    """The stored values (model/input_encoding.py, Stored forms) of the batch's events `idx` of
    every input the scoring models declare, all parsed or hashed in one kernel call; absent for
    an input the batch was not parsed with (a model swapped in since)."""
    keys = _input_keys(tuple(models))
    names = batch.inputs.names if batch.inputs is not None else ()
    held = [(form, name) for form, name in keys if name in names]
    wanted = [(name, form == NUMBER) for form, name in held]
    found = dict(zip(held, stored_forms(batch.inputs, wanted, idx), strict=True)) if held else {}
    return {key: found[key] if key in found else absent(key[0], len(idx)) for key in keys}


@lru_cache(maxsize=8)
def _input_keys(models: tuple[ScoringModel, ...]) -> tuple[Field, ...]:
    """Each (stored form, name) the models declare, once: worked out per set of models, not
    per batch (models are swapped, never changed)."""
    return tuple(dict.fromkeys((form_of(s), s.name) for model in models for s in model.inputs))


# ---- cell -----------------------------------------------------------------------------


def model_run(role: str, model: ScoringModel, states: UserStates) -> ModelRun:
    """A model over the batch from the users' states (the current model's)."""
    memory = memories_of(model.item_inputs, states.items) if model.item_inputs else None
    return ModelRun(role, model, states.h, states.last_ts, states.replay, states.score,
                    states.rules, memory)  # fmt: skip


def cell_stage(run: Run, m: ModelRun) -> None:
    """Advance the model's states over the applied events in one kernel call; its scores."""
    m.type_idx = m.model.type_indices(run.types)
    m.scores = advance(m.model, m.h, m.last_ts, run.states.recent, m.replay, run.k_slot,
                       m.type_idx, run.ts, run.columns, m.memory)  # fmt: skip
    m.input_counts = {n: (c.missing, c.bad) for n, c in m.model.input_counts.items()}


def advance(
    model: ScoringModel, h: np.ndarray, last_ts: np.ndarray, recent: list[bytes],
    replay: list[int], slot: np.ndarray, type_idx: np.ndarray, ts: np.ndarray,
    columns: dict[Field, np.ndarray] | None = None, memory: dict | None = None,
) -> np.ndarray:  # fmt: skip
    """Advance the states h (and last_ts) over the events in one kernel call; return their
    scores. Rows in `replay` first restart from zero (their item memories empty) at the time
    before their recent events and replay them, with the inputs' values the history holds
    (their scores are not returned). A model's declared inputs take their values from
    `columns` (stored values, one per event) and its item memories from `memory`."""
    rows = [r for r in replay if recent[r]]
    histories = [unpack(recent[r]) for r in rows]
    r_slot: list[int] = []
    if rows:
        r_types: list[str] = []
        r_ts: list[int] = []
        for r, events in zip(rows, histories, strict=True):
            h[r] = 0.0
            last_ts[r] = events.prev_ts
            r_slot += [r] * len(events)
            r_types += events.types
            r_ts += events.ts
        for mem in (memory or {}).values():
            mem.count[rows] = 0  # rebuilt by the replay, as h is
        slot = np.concatenate([np.asarray(r_slot, np.int64), slot])
        type_idx = np.concatenate([model.type_indices(r_types), type_idx])
        ts = np.concatenate([np.asarray(r_ts, np.int64), ts])
    if not model.input_names:
        return model.advance(h, last_ts, slot, type_idx, ts)[len(r_slot) :]
    inputs = model_inputs(model, columns or {}, histories, len(ts) - len(r_slot))
    scores = model.advance(h, last_ts, slot, type_idx, ts, inputs, memory, len(r_slot))
    return scores[len(r_slot) :]


def model_inputs(
    model: ScoringModel, columns: dict[Field, np.ndarray], histories: list[Recent], n: int
) -> dict[str, Stored]:
    """Each declared input's stored values for one advance: the replayed histories' events
    (absent where a history lacks the input), then the n scored events' (`columns`)."""
    out = {}
    for spec in model.inputs:
        form = form_of(spec)
        live = columns.get((form, spec.name))
        parts = [events.stored_inputs([spec])[spec.name].values for events in histories]
        parts.append(live if live is not None else absent(form, n))
        out[spec.name] = Stored(np.concatenate(parts) if len(parts) > 1 else parts[0])
    return out


# ---- rows and histories ---------------------------------------------------------------


def rows_stage(run: Run) -> None:
    """The state rows written: the users with at least one applied event, each taking the
    values of its last one."""
    users, k_slot = len(run.states.users), run.k_slot
    applied_to = np.bincount(k_slot, minlength=users)  # events per row
    run.touched = touched = np.flatnonzero(applied_to)  # np.unique's, ~10x faster here
    run.last_event = np.full(users, -1, np.int64)
    np.maximum.at(run.last_event, k_slot, np.arange(len(run.idx)))
    run.row_of_slot = np.zeros(users, np.int64)
    run.row_of_slot[touched] = np.arange(len(touched))
    run.applied = applied_to[touched]
    run.touched_list = touched.tolist()
    batch = run.batch
    run.score_event_ids = [batch.event_ids[i] or batch.entry_ids[i] for i in run.picked]


# Fewer events (of a type-only model) extend their users' histories one user at a time, by
# the kernel's definition (recent.extend_packed): ~4 µs a user against the kernel's ~30 fixed
HISTORIES_KERNEL_FROM = 8


def _extended_one_by_one(
    old: list[bytes], slot: np.ndarray, run: Run, session_gap_ms: float
) -> list[bytes]:
    """histories_stage's histories for events without inputs, a user at a time."""
    ts: list[list[int]] = [[] for _ in old]
    names: list[list[bytes]] = [[] for _ in old]
    for row, t, name in zip(slot.tolist(), run.ts.tolist(), names_of(run.types), strict=True):
        ts[row].append(t)
        names[row].append(name)
    return [extend_packed(raw, t, n, run.history_events, session_gap_ms)
            for raw, t, n in zip(old, ts, names, strict=True)]  # fmt: skip


def histories_stage(run: Run, model: ScoringModel) -> list[bytes]:
    """The packed `recent` of each written row: its history plus this batch's events (and
    their stored input values), all extended in one kernel call."""
    rows = run.touched_list
    if run.history_events == 0:
        return [NO_HISTORY] * len(rows)
    old = run.states.recent
    slot = np.searchsorted(np.asarray(rows, np.int64), run.k_slot)  # the event's written row
    if len(slot) < HISTORIES_KERNEL_FROM and not run.columns:
        return _extended_one_by_one([old[r] for r in rows], slot, run, gap_ms(model))
    return extended_histories([old[r] for r in rows], slot, run.ts, run.types,
                              run.history_events, gap_ms(model), run.columns)  # fmt: skip
