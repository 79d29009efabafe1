"""The rule step kernel against its plain definition (worker/rules/step.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.rules.step import (
    NEVER,
    RuleStates,
    RuleTable,
    pack_rule_states,
    parse_rule_state,
    reference_step,
    step,
)

TYPES = ("view", "add_to_cart", "coupon", "purchase")
MODEL_TYPES = ("view", "add_to_cart", "purchase")  # "coupon" is unknown to the model
GAP_SECONDS = 30.0


@dataclass(frozen=True)
class R:
    name: str
    above: float
    rearm_below: float | None = None
    cooldown_ms: int = 0
    min_events: int = 1
    types: tuple[str, ...] = ()

    @property
    def rearm(self) -> float:
        return self.above if self.rearm_below is None else self.rearm_below


@st.composite
def rules(draw) -> list[R]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        above = draw(st.sampled_from([0.3, 0.5, 0.7]))
        out.append(
            R(
                name=f"r{i}",
                above=above,
                rearm_below=draw(st.sampled_from([None, above - 0.2, above])),
                cooldown_ms=draw(st.sampled_from([0, 5_000, 60_000])),
                min_events=draw(st.integers(1, 4)),
                types=tuple(draw(st.sets(st.sampled_from(TYPES), max_size=2))),
            )
        )
    return out


@st.composite
def streams(draw) -> list[tuple[int, float, str, int]]:
    """Events (user, score, type, ts) in stream order; times jump past the session gap now
    and then, and sometimes go back (out of order) or repeat."""
    n = draw(st.integers(1, 60))
    clock = {u: 1_000_000 for u in range(4)}
    out = []
    for _ in range(n):
        u = draw(st.integers(0, 3))
        clock[u] += draw(st.sampled_from([0, 1_000, 4_000, 20_000, 40_000, -3_000]))
        score = draw(st.sampled_from([0.1, 0.25, 0.35, 0.5, 0.55, 0.7, 0.9]))
        out.append((u, score, draw(st.sampled_from(TYPES)), clock[u]))
    return out


def run_reference(rule_set, events):
    state = {u: {} for u in range(4)}
    last = dict.fromkeys(range(4), -1)
    fired = []
    for e, (u, score, type_, ts) in enumerate(events):
        names, state[u], last[u] = reference_step(
            rule_set, state[u], last[u], GAP_SECONDS, score, type_, ts
        )
        fired += [(e, name) for name in names]
    return fired


def run_kernel(rule_set, events, cuts):
    """The kernel over the events split into batches at `cuts`, the rule states packed and
    parsed between batches as a commit and a read would."""
    table = RuleTable.of(rule_set)
    mask = table.type_mask(MODEL_TYPES)
    index = {t: i for i, t in enumerate(MODEL_TYPES)}
    stored = dict.fromkeys(range(4), b"0 0")
    applied = np.zeros(4, np.int64)  # each user's count of applied events (the state's n)
    last = np.full(4, -1, np.int64)
    fired = []
    bounds = [0, *sorted(set(cuts)), len(events)]
    for lo, hi in itertools.pairwise(bounds):
        batch = events[lo:hi]
        if not batch:
            continue
        states = RuleStates.fresh(4, len(table))
        for u in range(4):
            assert parse_rule_state(stored[u], table.names, states, u, int(applied[u]))
        slot = np.asarray([u for u, *_ in batch], np.int64)
        types = [t for _, _, t, _ in batch]
        type_idx = np.asarray([index.get(t, len(MODEL_TYPES)) for t in types], np.int64)
        ts = np.asarray([t for *_, t in batch], np.int64)
        scores = np.asarray([s for _, s, _, _ in batch], np.float32)
        got = step(table, states, last, GAP_SECONDS, slot, scores, ts,
                   table.allowed(mask, type_idx, types))  # fmt: skip
        fired += [(lo + e, table.names[r]) for e, r in zip(got.event, got.rule, strict=True)]
        applied += np.bincount(slot, minlength=4)
        for u, raw in zip(range(4), pack_rule_states(table.names, states, np.arange(4), applied),
                          strict=True):  # fmt: skip
            stored[u] = raw
        for u, t in zip(slot.tolist(), ts.tolist(), strict=True):
            last[u] = max(last[u], t)
    return fired


@settings(max_examples=300, deadline=None)
@given(rules(), streams(), st.lists(st.integers(0, 60), max_size=4))
def test_kernel_fires_as_the_definition_in_any_batching(rule_set, events, cuts) -> None:
    # scores are float32 in the worker: the definition sees the same rounded values
    events = [(u, float(np.float32(s)), t, ts) for u, s, t, ts in events]
    assert run_kernel(rule_set, events, cuts) == run_reference(rule_set, events)


def test_hysteresis_cooldown_and_min_events() -> None:
    rule = R("coupon", above=0.7, rearm_below=0.4, cooldown_ms=60_000, min_events=2)
    events = [
        (0, 0.9, "view", 0),  # 1st event of the session: too few events
        (0, 0.9, "view", 10_000),  # fires
        (0, 0.8, "view", 20_000),  # disarmed
        (0, 0.5, "view", 30_000),  # below X but not below Y: still disarmed
        (0, 0.3, "view", 40_000),  # re-arms, during the cooldown
        (0, 0.9, "view", 50_000),  # armed, but the cooldown holds it back
        (0, 0.9, "view", 70_000),  # cooldown over (and the same session): fires
    ]
    assert run_reference([rule], events) == [(1, "coupon"), (6, "coupon")]
    assert run_kernel([rule], events, []) == [(1, "coupon"), (6, "coupon")]


def test_a_new_session_rearms_but_the_cooldown_runs_on() -> None:
    rule = R("agent", above=0.5, cooldown_ms=120_000)
    events = [(0, 0.9, "view", 0), (0, 0.9, "view", 31_000 + 31_000), (0, 0.9, "view", 200_000)]
    # the second event starts a session (gap > 30 s): armed again, but within the cooldown
    assert run_kernel([rule], events, []) == [(0, "agent"), (2, "agent")]


def test_types_listed_include_types_the_model_does_not_know() -> None:
    rule = R("c", above=0.5, types=("coupon",))
    events = [(0, 0.9, "view", 0), (0, 0.9, "coupon", 1_000), (1, 0.9, "purchase", 0)]
    assert run_kernel([rule], events, []) == [(1, "c")]


def test_rule_state_field_round_trips_and_rejects_garbage() -> None:
    table = RuleTable.of([R("a", 0.5), R("b", 0.5)])
    states = RuleStates.fresh(2, 2)
    states.session_n[:] = [3, 7]
    states.armed[1, 1] = False
    states.last_fired[1, 1] = 12345
    packed = pack_rule_states(table.names, states, np.arange(2), np.array([10, 20]))
    assert packed == [b"10 3", b"20 7 b:0:12345"]
    again = RuleStates.fresh(2, 2)
    for row, (raw, n) in enumerate(zip(packed, (10, 20), strict=True)):
        assert parse_rule_state(raw, table.names, again, row, n)
    assert again.session_n.tolist() == [3, 7]
    assert again.armed.tolist() == [[True, True], [True, False]]
    assert again.last_fired[1].tolist() == [NEVER, 12345]
    for bad in (b"", b"x", b"10", b"10 -1", b"10 3 a:2:5", b"10 3 a:1", b"10 3 a:1:z", b"\xff"):
        fresh = RuleStates.fresh(1, 2)
        assert not parse_rule_state(bad, table.names, fresh, 0, 10)
        assert fresh.session_n[0] == 0 and fresh.armed.all()
    # a deleted rule's entry is dropped; a new rule starts armed
    only_c = RuleStates.fresh(1, 1)
    assert parse_rule_state(b"20 7 b:0:12345", ("c",), only_c, 0, 20)
    assert only_c.armed[0, 0] and only_c.last_fired[0, 0] == NEVER


def test_a_field_written_at_another_event_count_is_stale() -> None:
    # commits leave the field alone while no rule is set: the events applied meanwhile
    # would be missing from its session count
    table = RuleTable.of([R("a", 0.5)])
    states = RuleStates.fresh(1, 1)
    assert not parse_rule_state(b"2 2 a:0:5", table.names, states, 0, 5)
    assert states.session_n[0] == 0 and states.armed.all()
