"""The batch pipeline as a pure function: parsed batch + users' states + model -> a Commit.

No Redis here: `build_commit` decides, for every entry of a batch, its one outcome (scored,
duplicate, deadletter, lost), advances the states of the users it scores with one batched
kernel call, and returns everything the commit writes. adapters/commit.py packs and applies
a Commit atomically; adapters/states.py reads the UserStates it starts from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from operator import gt, itemgetter

import numpy as np

from model.artifact import label_type_of
from model.input_bytes import stored_forms
from model.inputs import Stored
from model.scoring import ScoringModel
from worker.common.dedup import DEFAULT_WINDOW
from worker.engine.compute import actions as act
from worker.engine.compute.actions import Action, ScoredEvents
from worker.engine.compute.batch import Batch, DeadLetter
from worker.engine.compute.histories import extended_histories
from worker.engine.compute.items import memories_of, packed_items
from worker.engine.compute.quality import label_samples
from worker.engine.compute.recent import (
    NUMBER,
    Field,
    Recent,
    absent,
    form_of,
    unpack,
)
from worker.engine.compute.resends import memories_after
from worker.rules.step import RuleTable

NO_HISTORY = b""  # a packed history with no events (compute/recent.py)

OUTCOMES = ("scored", "duplicate", "deadletter", "misrouted", "lost")


@dataclass
class ShadowStates:
    """The shadow model's own states of the batch's users (champion/challenger)."""

    h: np.ndarray  # (U, L', H') float32
    last_ts: np.ndarray  # (U,) int64, a copy: the main model's advance moves its own
    replay: list[int] = field(default_factory=list)  # rows to rebuild from `recent` first
    score: np.ndarray | None = None  # (U,) its last score of each user, NaN = none
    rules: list[bytes] = field(default_factory=list)  # its rule states (`shadow_rules`)


@dataclass
class UserStates:
    """The states of a batch's distinct users, as read (or cached) before the batch."""

    users: list[str]
    h: np.ndarray  # (U, L, H) float32, advanced in place by the pipeline
    last_ts: np.ndarray  # (U,) int64 epoch ms of the last applied event; -1 = none
    last_id: list[tuple[int, int]]  # entry id of the last applied event; (-1, -1) = none
    n: np.ndarray  # (U,) int64 events applied
    event_ids: list[bytes]  # last applied producer event ids, oldest first, space-separated
    seq: bytes  # the partition's commit sequence the states were read at
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (U,) last score, NaN = none
    recent: list[bytes] = field(default_factory=list)  # the users' recent events, packed
    rules: list[bytes] = field(default_factory=list)  # the users' rule states, b"" = none
    items: list[bytes] = field(default_factory=list)  # the users' item memories, b"" = none
    replay: list[int] = field(default_factory=list)  # rows to rebuild from `recent` first
    resets: Counter[str] = field(default_factory=Counter)  # states restarted, by reason
    shadow: ShadowStates | None = None  # when a shadow model scores beside the current
    # rows whose stored hash holds the other layout's fields (docs/contract.md, The lean
    # layout): their commit rewrites the key whole
    rewrite: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, users: list[str], shape: tuple[int, int], seq: bytes = b"") -> UserStates:
        """Fresh states: zero h, no history."""
        n = len(users)
        return cls(
            users=users,
            h=np.zeros((n, *shape), np.float32),
            last_ts=np.full(n, -1, np.int64),
            last_id=[(-1, -1)] * n,
            n=np.zeros(n, np.int64),
            event_ids=[b""] * n,
            seq=seq,
            score=np.full(n, np.nan),
            recent=[NO_HISTORY] * n,
            rules=[b""] * n,
            items=[b""] * n,
        )


@dataclass
class Commit:
    """Everything one partition batch writes, all or nothing (adapters/commit.py)."""

    partition: int
    model: str  # version that computed the states and scores
    seq: bytes  # the commit sequence the states were read at
    ack_ids: list[bytes]  # every entry of the batch, in stream order (the last: the new position)
    # one row per user state written (users with at least one scored event)
    users: list[str]
    h: np.ndarray  # (K, L, H) float32
    user_scores: np.ndarray  # (K,) float32: the score of the user's last event
    last_scored: np.ndarray  # (K,) int64: that event's index in the score rows below
    last_ids: list[bytes]  # entry id of the user's last applied event
    last_keys: list[tuple[int, int]]  # the same as (ms, seq)
    last_ts: np.ndarray  # (K,) int64
    n: np.ndarray  # (K,) int64
    event_ids: list[bytes]  # the user's last applied producer event ids, space-separated
    recent: list[bytes]  # the user's recent session events, packed (compute/recent.py)
    shadow_h: np.ndarray | None  # (K, L', H') the shadow model's states, when one runs
    # one row per score entry, in stream order
    score_user: np.ndarray  # (S,) int64 index into the state rows above
    score_types: list[str]
    scores: np.ndarray  # (S,) float32
    score_ts: np.ndarray  # (S,) int64
    score_event_ids: list[bytes]  # the producer's event id, else the entry id
    arrival_ms: np.ndarray  # (S,) float64 entry id time of each scored event
    shadow_model: str  # the shadow model's version ("" = none)
    shadow_scores: np.ndarray | None  # (S,) float32
    shadow_user_scores: np.ndarray | None  # (K,) the shadow's score of each user's last event
    dead: list[DeadLetter]
    outcomes: dict[str, int]  # entries per outcome; they sum to len(ack_ids)
    unknown_types: int  # scored events of types the model does not know
    # labelled-session samples (score, label) per model role, for live quality
    quality: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # with intent rules set: each state row's rule states (None = no rules), the actions
    # fired (the current model's), and the firings the shadow model's scores would make
    rules: list[bytes] | None = None
    shadow_rules: list[bytes] | None = None
    # each state row's item memories (compute/items.py), written when `write_items` (the model
    # declares item inputs), else carried as read, so the cache holds what Redis does
    items: list[bytes] | None = None
    write_items: bool = False
    # per declared input: (missing, bad) values of the batch's scored events
    input_counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    shadow_actions: Counter[str] = field(default_factory=Counter)
    rewrite: list[int] = field(default_factory=list)  # state rows to rewrite whole (UserStates)
    after: bytes = b"0-0"  # the entry the batch follows: the partition's last commit, or refused


def user_slots(batch: Batch, users: list[str]) -> np.ndarray:
    """For each valid event of the batch, the row of its user in `users`."""
    row = dict(zip(users, range(len(users)), strict=True))
    return np.fromiter(map(row.__getitem__, batch.users), np.int64, len(batch.users))


def distinct_users(batch: Batch) -> list[str]:
    """The batch's users, each once, in order of first appearance."""
    return list(dict.fromkeys(batch.users))


def _taken(values: list, picked: list[int], every: bool) -> list:
    """The values at `picked`: the list itself when `every` (it picks them all)."""
    return values if every else [values[i] for i in picked]


def _applied_before(batch: Batch, states: UserStates, slot: np.ndarray) -> np.ndarray:
    """Events whose entry id is above their user's last applied id (docs/contract.md, User
    state and scores out)."""
    last = map(states.last_id.__getitem__, slot.tolist())
    return np.fromiter(map(gt, batch.entry_keys, last), np.bool_, len(slot))


def _advance(
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


def stored_columns(
    batch: Batch, idx: np.ndarray, models: list[ScoringModel]
) -> dict[Field, np.ndarray]:
    """The stored values (model/inputs.py, Stored forms) of the batch's events `idx` of every
    input the scoring models declare, all parsed or hashed in one kernel call; absent for an
    input the batch was not parsed with (a model swapped in since)."""
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


def _recent_after(
    states: UserStates, rows: list[int], k_slot: np.ndarray, types: list[str],
    ts: np.ndarray, keep: int, session_gap_ms: float, columns: dict[Field, np.ndarray],
) -> list[bytes]:  # fmt: skip
    """The packed `recent` of each written row (`rows`, ascending): its history plus this
    batch's events (and their stored input values), all extended in one kernel call."""
    if keep == 0:
        return [NO_HISTORY] * len(rows)
    old = states.recent
    slot = np.searchsorted(np.asarray(rows, np.int64), k_slot)  # the event's written row
    return extended_histories([old[r] for r in rows], slot, ts, types, keep, session_gap_ms,
                              columns)  # fmt: skip


def gap_ms(model: ScoringModel) -> float:
    """The model's session gap in ms (0 = sessions never split)."""
    return model.model.meta.session_gap_seconds * 1000.0


def _act(
    rules: RuleTable, model: ScoringModel, states: UserStates, events: ScoredEvents,
    event_ids: list[bytes], touched: np.ndarray, n_after: np.ndarray, history_events: int,
    shadow: tuple[ScoringModel, ShadowStates, np.ndarray] | None,
) -> dict:  # fmt: skip
    """The Commit's rule fields: each written row's rule states, the actions the current
    model's scores fire (with reasons), and the firings the shadow's scores would make."""
    rule_states = act.rule_states_of(rules, states.rules, states.recent, states.n)
    firings = act.fire(rules, rule_states, events, model)
    out: dict = {"rules": act.packed_rows(rules, rule_states, touched, n_after)}
    if len(firings.event):
        sessions = act.sessions_at(firings, events, states.recent, history_events, gap_ms(model),
                                   model)  # fmt: skip
        reasons = act.reasons_json(model, sessions)
        out["actions"] = act.actions_of(rules, firings, events, states.users, event_ids, reasons)
    if shadow is not None:
        shadow_model, sh, shadow_scores = shadow
        sh_states = act.rule_states_of(rules, sh.rules or [b""] * len(states.users),
                                       states.recent, states.n)  # fmt: skip
        sh_events = ScoredEvents(events.slot, events.types, shadow_model.type_indices(events.types),
                                 events.ts, shadow_scores, events.ts_before)  # fmt: skip
        sh_firings = act.fire(rules, sh_states, sh_events, shadow_model)
        out["shadow_rules"] = act.packed_rows(rules, sh_states, touched, n_after)
        out["shadow_actions"] = act.fired_per_rule(rules, sh_firings)
    return out


def _rewritten(rows: list[int], touched: list[int], row_of_slot: np.ndarray) -> list[int]:
    """The commit rows of the state rows to rewrite whole that the commit writes."""
    if not rows:
        return []
    written = set(touched)
    return [int(row_of_slot[s]) for s in rows if s in written]


def build_commit(
    batch: Batch,
    states: UserStates,
    model: ScoringModel,
    history_events: int = 0,
    shadow: ScoringModel | None = None,
    event_id_window: int = DEFAULT_WINDOW,
    rules: RuleTable | None = None,
) -> Commit:
    """Decide every entry's outcome, advance the states, and return what to commit.

    `states` must hold the batch's distinct users (see `distinct_users`); their h and
    last_ts are advanced in place. Rows in `states.replay` are rebuilt first from their
    recent events (no score entries for those steps). Each written state keeps its last
    `history_events` events of the current session (0 = none), and remembers its last
    `event_id_window` producer event ids. A shadow model (with `states.shadow`) scores the
    same events from its own states. With `rules` (not empty), the rules step over the
    scores and the Commit carries the actions they fire and the users' rule states.
    """
    slot = user_slots(batch, states.users)
    ts_before = states.last_ts.copy()  # the advances move last_ts
    keep = _applied_before(batch, states, slot)
    remembered = memories_after(states.event_ids, slot, keep, batch.event_ids, batch.producers,
                                event_id_window)  # fmt: skip
    idx = np.flatnonzero(keep)
    picked = idx.tolist()  # plain ints index lists ~2x faster than numpy's
    every = len(picked) == len(keep)  # the common case: no resend, nothing applied before
    k_slot = slot if every else slot[idx]
    types = _taken(batch.types, picked, every)
    ts = np.array(_taken(batch.ts, picked, every), np.int64)
    type_idx = model.type_indices(types)
    memory = memories_of(model.item_inputs, states.items) if model.item_inputs else None
    sh = states.shadow if shadow is not None else None
    columns = stored_columns(batch, idx, [model] if sh is None else [model, shadow])
    scores = _advance(model, states.h, states.last_ts, states.recent, states.replay,
                      k_slot, type_idx, ts, columns, memory)  # fmt: skip
    input_counts = {n: (c.missing, c.bad) for n, c in model.input_counts.items()}
    quality = {
        "current": label_samples(
            k_slot,
            types,
            ts,
            scores,
            states.score,
            ts_before,
            states.recent,
            label_type_of(model.model),
            gap_ms(model),
        )
    }
    sh_memory = None
    if sh is not None:
        # its item flags from the stored memories as they were before this batch
        sh_memory = memories_of(shadow.item_inputs, states.items) if shadow.item_inputs else None
        shadow_scores = _advance(shadow, sh.h, sh.last_ts, states.recent, sh.replay, k_slot,
                                 shadow.type_indices(types), ts, columns, sh_memory)  # fmt: skip
        quality["shadow"] = label_samples(
            k_slot, types, ts, shadow_scores,
            sh.score if sh.score is not None else np.full(len(states.users), np.nan),
            ts_before, states.recent, label_type_of(shadow.model), gap_ms(shadow),
        )  # fmt: skip

    # The users written are those with at least one scored event; each state row takes the
    # values of the user's last scored event.
    applied_to = np.bincount(k_slot, minlength=len(states.users))  # events per row
    touched = np.flatnonzero(applied_to)  # np.unique's rows, ~10x faster for small ints
    last_event = np.full(len(states.users), -1, np.int64)
    np.maximum.at(last_event, k_slot, np.arange(len(idx)))
    last_of_user = idx[last_event[touched]]
    row_of_slot = np.zeros(len(states.users), np.int64)
    row_of_slot[touched] = np.arange(len(touched))
    applied = applied_to[touched]
    touched_list = touched.tolist()
    score_event_ids = [batch.event_ids[i] or batch.entry_ids[i] for i in picked]
    acted: dict = {}
    if rules is not None and len(rules):
        events = ScoredEvents(k_slot, types, type_idx, ts, scores, ts_before, columns)
        acted = _act(rules, model, states, events, score_event_ids, touched,
                     states.n[touched] + applied, history_events,
                     (shadow, sh, shadow_scores) if sh is not None else None)  # fmt: skip
    outcomes = {
        "scored": len(idx),
        "duplicate": len(batch.users) - len(idx),
        "deadletter": len(batch.dead) - batch.misrouted,
        "misrouted": batch.misrouted,
        "lost": batch.lost,
    }
    # The shadow's item memories are kept too (under their input names, the current model's
    # first where both declare one), so its flags survive batches before its promotion.
    kept = {**(sh_memory or {}), **(memory or {})}
    if len(touched_list) == len(states.users):  # the common case: every user is written
        written_users = list(states.users)
    else:
        written_users = [states.users[s] for s in touched_list]
    arrival_ms = np.fromiter(map(itemgetter(0), _taken(batch.entry_keys, picked, every)),
                             np.float64, len(picked))  # fmt: skip
    return Commit(
        partition=batch.partition,
        model=model.version,
        seq=states.seq,
        ack_ids=batch.ids,
        users=written_users,
        h=states.h[touched],
        user_scores=scores[last_event[touched]],
        last_scored=last_event[touched],
        last_ids=[batch.entry_ids[i] for i in last_of_user.tolist()],
        last_keys=[batch.entry_keys[i] for i in last_of_user.tolist()],
        last_ts=states.last_ts[touched],
        n=states.n[touched] + applied,
        event_ids=[remembered.get(s, states.event_ids[s]) for s in touched_list],
        recent=_recent_after(
            states,
            touched_list,
            k_slot,
            types,
            ts,
            history_events,
            gap_ms(model),
            columns,
        ),
        score_user=row_of_slot[k_slot],
        score_types=types,
        scores=scores,
        score_ts=ts,
        score_event_ids=score_event_ids,
        arrival_ms=arrival_ms,
        dead=batch.dead,
        outcomes=outcomes,
        unknown_types=int((type_idx == model.unknown_index).sum()),
        shadow_model=shadow.version if sh is not None else "",
        shadow_h=sh.h[touched] if sh is not None else None,
        shadow_scores=shadow_scores if sh is not None else None,
        shadow_user_scores=shadow_scores[last_event[touched]] if sh is not None else None,
        quality=quality,
        items=packed_items(kept, touched) if kept else [states.items[s] for s in touched_list],
        write_items=bool(kept),
        input_counts=input_counts,
        rewrite=_rewritten(states.rewrite, touched_list, row_of_slot),
        after=batch.after,
        **acted,
    )
