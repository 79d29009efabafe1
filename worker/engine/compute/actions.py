"""From scores to actions: the intent rules stepped over a batch's scored events, and the
actions they fire, each with its reasons (docs/contract.md, Acting on intent).

Pure, like the rest of compute/: the pipeline calls `decide` after the model has scored the
batch, and the commit writes the actions with the scores and the users' rule states, all or
nothing. Reasons cost only when a rule fires: the firing events' sessions are replayed, each
without one of its events, in one kernel call (model/explain.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from model.explain import Reason, Session, leave_one_out
from model.scoring import ScoringModel
from worker.engine.compute.recent import Field, Recent, extended, unpack
from worker.rules.step import (
    Firings,
    RuleStates,
    RuleTable,
    pack_rule_states,
    parse_rule_state,
    step,
)

MAX_REASONS = 3


@dataclass(frozen=True)
class Action:
    """One rule firing, as the actions stream holds it (the model is the commit's)."""

    user_id: str
    rule: str
    score: float
    event_id: bytes
    ts: int
    reasons: bytes  # JSON list of {"type", "ts", "delta"}, the largest |delta| first
    row: int  # its event's row among the commit's score entries


@dataclass(frozen=True)
class ScoredEvents:
    """A batch's scored events, as the rules see them: user row, type, time, score."""

    slot: np.ndarray  # (E,) int64 row in the batch's users
    types: list[str]
    type_idx: np.ndarray  # (E,) the model's type index of each
    ts: np.ndarray  # (E,) int64
    scores: np.ndarray  # (E,) float32
    ts_before: np.ndarray  # (U,) each user's last event time before the batch, -1 = none
    # the stored values of the scoring models' inputs, one per event (pipeline.stored_columns)
    columns: Mapping[Field, np.ndarray] = field(default_factory=dict)


def rule_states_of(
    table: RuleTable, raw: list[bytes], recent: list[bytes], n: np.ndarray
) -> RuleStates:
    """The users' rule states from their `rules` fields, given their applied-event counts.
    A user without one (no rules were set when they were last written, or the field is
    malformed or stale) has every rule armed, and the events of `recent` as the session's
    count so far."""
    states = RuleStates.fresh(len(raw), len(table))
    names, columns, counts = table.names, table.columns, n.tolist()
    for row, packed in enumerate(raw):
        if packed and parse_rule_state(packed, names, states, row, counts[row], columns):
            continue
        if recent[row]:
            states.session_n[row] = len(unpack(recent[row]))
    return states


def fire(
    table: RuleTable, states: RuleStates, events: ScoredEvents, model: ScoringModel
) -> Firings:
    """Step the rules over the events in order; `states` advance in place."""
    allowed = table.allowed(table.type_mask(model.model.meta.event_types), events.type_idx,
                            events.types)  # fmt: skip
    gap_seconds = model.model.meta.session_gap_seconds
    return step(table, states, events.ts_before, gap_seconds, events.slot, events.scores,
                events.ts, allowed)  # fmt: skip


def sessions_at(
    firings: Firings, events: ScoredEvents, recent: list[bytes], keep: int, gap_ms: float,
    model: ScoringModel,
) -> list[Session]:  # fmt: skip
    """The session each firing event closes, as the user's `recent` holds it just after that
    event (with the model's inputs' values): the same bounded history whether the events
    came in one batch or many."""
    if keep == 0:
        return [Session(-1, [], []) for _ in firings.event]
    slots = events.slot.tolist()
    by_user: dict[int, list[int]] = {slots[e]: [] for e in firings.event.tolist()}
    for e, s in enumerate(slots):
        if s in by_user:
            by_user[s].append(e)
    out = []
    for e in firings.event.tolist():
        s = slots[e]
        mine = [i for i in by_user[s] if i <= e]
        columns = {f: values[mine] for f, values in events.columns.items()}
        history = extended(unpack(recent[s]), events.ts[mine].tolist(),
                           [events.types[i] for i in mine], keep, gap_ms, columns)  # fmt: skip
        out.append(session_of(history, model))
    return out


def session_of(history: Recent, model: ScoringModel) -> Session:
    """A kept history as the model replays it: with its declared inputs' stored values."""
    inputs = history.stored_inputs(model.inputs) if model.input_names else None
    return Session(history.prev_ts, history.types, history.ts, inputs)


@lru_cache(maxsize=4096)
def _json_string(text: str) -> bytes:
    """A type name as a JSON string (a shop has few types)."""
    return json.dumps(text).encode()


def _json_delta(delta: float) -> bytes:
    """A delta as the reasons hold it: 6 significant digits, as json.dumps writes a float."""
    value = float(f"{delta:.6g}")
    return repr(value).encode() if math.isfinite(value) else json.dumps(value).encode()


def reason_json(reasons: list[Reason]) -> bytes:
    """The `reasons` field of an action: a JSON list of {"type", "ts", "delta"}, compact
    (what json.dumps with separators (",", ":") writes, without its per-call setup)."""
    return b"[%b]" % b",".join([b'{"type":%b,"ts":%d,"delta":%b}'
                                % (_json_string(r.type), r.ts, _json_delta(r.delta))
                                for r in reasons])  # fmt: skip


def reasons_json(model: ScoringModel, sessions: list[Session]) -> list[bytes]:
    """Each session's reasons, as the `reasons` field: one kernel call for them all."""
    return [reason_json(e.top(MAX_REASONS)) for e in leave_one_out(model, sessions)]


def actions_of(
    table: RuleTable, firings: Firings, events: ScoredEvents, users: list[str],
    event_ids: list[bytes], reasons: list[bytes],
) -> list[Action]:  # fmt: skip
    """The actions of the firings, in event order."""
    return [
        Action(users[events.slot[e]], table.names[r], float(events.scores[e]), event_ids[e],
               int(events.ts[e]), why, e)
        for e, r, why in zip(firings.event.tolist(), firings.rule.tolist(), reasons, strict=True)
    ]  # fmt: skip


def fired_per_rule(table: RuleTable, firings: Firings) -> Counter[str]:
    """How many times each rule fired."""
    return Counter(table.names[r] for r in firings.rule.tolist())


def packed_rows(
    table: RuleTable, states: RuleStates, rows: np.ndarray, n: np.ndarray
) -> list[bytes]:
    """The `rules` field of each written row, whose applied-event counts are now `n`."""
    return pack_rule_states(table.names, states, rows, n)
