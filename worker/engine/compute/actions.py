"""From scores to actions: the intent rules stepped over a batch's scored events, and the
actions they fire, each with its reasons (docs/contract.md, Acting on intent).

Pure, like the rest of compute/: the pipeline calls `decide` after the model has scored the
batch, and the commit writes the actions with the scores and the users' rule states, all or
nothing. Reasons cost only when a rule fires: the firing events' sessions are replayed, each
without one of its events, in one kernel call (model/explain.py).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np

from model.explain import Session, leave_one_out
from model.scoring import ScoringModel
from worker.engine.compute.recent import extended, unpack
from worker.engine.compute.rules import (
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


def rule_states_of(
    table: RuleTable, raw: list[bytes], recent: list[bytes], n: np.ndarray
) -> RuleStates:
    """The users' rule states from their `rules` fields, given their applied-event counts.
    A user without one (no rules were set when they were last written, or the field is
    malformed or stale) has every rule armed, and the events of `recent` as the session's
    count so far."""
    states = RuleStates.fresh(len(raw), len(table))
    counts = n.tolist()
    for row, field in enumerate(raw):
        loaded = bool(field) and parse_rule_state(field, table.names, states, row, counts[row])
        if not loaded and recent[row]:
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
    firings: Firings, events: ScoredEvents, recent: list[bytes], keep: int, gap_ms: float
) -> list[Session]:
    """The session each firing event closes, as the user's `recent` holds it just after that
    event: the same bounded history whether the events came in one batch or many."""
    if keep == 0:
        return [Session(-1, [], []) for _ in firings.event]
    by_user: dict[int, list[int]] = {}
    for e, s in enumerate(events.slot.tolist()):
        by_user.setdefault(s, []).append(e)
    out = []
    for e in firings.event.tolist():
        s = int(events.slot[e])
        mine = [i for i in by_user[s] if i <= e]
        history = extended(unpack(recent[s]), events.ts[mine].tolist(),
                           [events.types[i] for i in mine], keep, gap_ms)  # fmt: skip
        out.append(Session(history.prev_ts, history.types, history.ts))
    return out


def reasons_json(model: ScoringModel, sessions: list[Session]) -> list[bytes]:
    """Each session's reasons, as the `reasons` field: one kernel call for them all."""
    return [
        json.dumps(
            [{"type": r.type, "ts": r.ts, "delta": float(f"{r.delta:.6g}")}
             for r in explanation.top(MAX_REASONS)],
            separators=(",", ":"),
        ).encode()
        for explanation in leave_one_out(model, sessions)
    ]  # fmt: skip


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
