"""Actions through the pipeline (compute/actions.py, compute/replay.py): the firings the rule
step makes from the model's scores, their reasons, and replays that agree in any batching."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from model.data.synthetic import synthetic_events
from model.random_init import random_model
from model.scoring import ScoringModel
from tests.test_explain import reference_replay
from worker.common.keys import partition_of
from worker.engine.compute.batch import parse_batch
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.recent import extended, unpack
from worker.engine.compute.replay import replay
from worker.engine.compute.user_states import ShadowStates, UserStates, distinct_users
from worker.rules.definition import Rule
from worker.rules.step import RuleTable

TYPES = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout", "purchase"]
HISTORY = 8


@pytest.fixture(scope="module")
def model() -> ScoringModel:
    m = random_model(TYPES, hidden=16, features=["gap"], seed=3, session_gap_seconds=1800.0)
    return ScoringModel(m, version="5")


@pytest.fixture(scope="module")
def events() -> list[dict]:
    return [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(3000, 80, seed=2))]


def entries_of(events: list[dict], start: int = 1) -> list:
    """XREADGROUP-like entries with ids start-0, start+1-0, ... and the events' fields."""
    return [
        [f"{start + i}-0".encode(),
         [x for k, v in e.items() for x in (k.encode(), str(v).encode())]]
        for i, e in enumerate(events)
    ]  # fmt: skip


def batches(events: list[dict], partitions: int, size: int) -> list:
    """The events as each partition's stream would hold them, cut into batches of `size`."""
    streams: dict[int, list] = {p: [] for p in range(partitions)}
    for e in events:
        streams[partition_of(e["user_id"], partitions)].append(e)
    out = []
    for p, mine in streams.items():
        entries = entries_of(mine)
        out += [
            parse_batch(p, entries[i : i + size], partitions, max_skew_ms=2**62)
            for i in range(0, len(entries), size)
        ]
    return out


def rule_table(model: ScoringModel, events: list[dict]) -> RuleTable:
    """Three rules at thresholds the model's scores cross now and then."""
    scores = replay(batches(events, 1, 500), model, RuleTable.of([]), 0).scores
    q90, q75, q50 = np.quantile(scores, [0.9, 0.75, 0.5]).tolist()
    return RuleTable.of(
        [
            Rule(name="hot", above=q90, rearm_below=q50),
            Rule(name="cart", above=q75, types=("add_to_cart", "checkout"), cooldown_ms=600_000),
            Rule(name="late", above=q50, min_events=5),
        ],
        version=3,
    )


def test_no_rules_leave_the_commit_as_it_was(model, events) -> None:
    batch = batches(events[:50], 1, 50)[0]
    states = UserStates.empty(distinct_users(batch), model.state_shape)
    commit = build_commit(batch, states, model, HISTORY)
    assert commit.rules is None and commit.actions == [] and not commit.shadow_actions


def test_actions_are_the_same_in_any_batching_and_partitioning(model, events) -> None:
    rules = rule_table(model, events)
    runs = [
        replay(batches(events, partitions, size), model, rules, HISTORY)
        for partitions, size in ((1, 5000), (1, 7), (3, 64))
    ]
    key = [
        sorted((a.user_id, a.rule, a.event_id, a.ts, a.score, a.reasons) for a in run.actions)
        for run in runs
    ]
    assert len(key[0]) > 30, "the rules should fire"
    assert {name for _, name, *_ in key[0]} == {"hot", "cart", "late"}
    assert key[0] == key[1] == key[2]


def test_each_action_scores_its_event_and_obeys_its_rule(model, events) -> None:
    rules = rule_table(model, events)
    run = replay(batches(events, 1, 100), model, rules, HISTORY)
    by_name = dict(zip(rules.names, range(len(rules)), strict=True))
    for action, e in zip(run.actions, run.action_events, strict=True):
        r = by_name[action.rule]
        assert run.users[e] == action.user_id and run.ts[e] == action.ts
        assert action.score == run.scores[e] >= rules.above[r]
        if rules.types[r] is not None:
            assert run.types[e] in rules.types[r]
    # one firing per user, rule and event at most
    keys = [(a.user_id, a.rule, a.event_id) for a in run.actions]
    assert len(keys) == len(set(keys))


def test_reasons_are_the_leave_one_out_deltas_recomputed_in_float64(model, events) -> None:
    rules = rule_table(model, events)
    run = replay(batches(events, 1, 100), model, rules, HISTORY)
    gap_ms = model.model.meta.session_gap_seconds * 1000
    checked = 0
    for action, e in list(zip(run.actions, run.action_events, strict=True))[:40]:
        mine = [i for i in range(e + 1) if run.users[i] == action.user_id]
        session = extended(unpack(b""), [run.ts[i] for i in mine], [run.types[i] for i in mine],
                           HISTORY, gap_ms)  # fmt: skip
        types, ts = session.types, session.ts
        full = reference_replay(model.model, session.prev_ts, types, ts)
        deltas = np.array([
            full - reference_replay(model.model, session.prev_ts, types[:j] + types[j + 1 :],
                                    ts[:j] + ts[j + 1 :])
            for j in range(len(types))
        ])  # fmt: skip
        reasons = json.loads(action.reasons)
        assert 1 <= len(reasons) <= 3
        order = np.argsort(-np.abs(deltas), kind="stable")
        for reason, j in zip(reasons, order, strict=False):
            # each reason is an event of the session, with its delta to 1e-5
            matches = [
                k for k in range(len(types))
                if (ts[k], types[k]) == (reason["ts"], reason["type"])
                and abs(deltas[k] - reason["delta"]) < 1e-5
            ]  # fmt: skip
            assert matches, (reason, deltas)
            assert abs(abs(reason["delta"]) - abs(deltas[j])) < 1e-5  # and the largest first
        checked += 1
    assert checked >= 20


def test_reasons_are_empty_without_history(model, events) -> None:
    rules = rule_table(model, events)
    run = replay(batches(events, 1, 100), model, rules, 0)
    assert run.actions and all(a.reasons == b"[]" for a in run.actions)


def test_a_shadow_model_counts_its_would_be_firings_and_writes_none(model, events) -> None:
    shadow = ScoringModel(random_model(TYPES, hidden=8, features=["gap"], seed=9), version="6")
    rules = rule_table(shadow, events)  # thresholds the shadow's scores cross
    batch = batches(events[:400], 1, 400)[0]
    states = UserStates.empty(distinct_users(batch), model.state_shape)
    n = len(states.users)
    states.shadow = ShadowStates(np.zeros((n, 1, 8), np.float32), states.last_ts.copy(),
                                 score=np.full(n, np.nan), rules=[b""] * n)  # fmt: skip
    commit = build_commit(batch, states, model, HISTORY, shadow, rules=rules)
    alone = build_commit(batch, UserStates.empty(distinct_users(batch), model.state_shape),
                         model, HISTORY, rules=rules)  # fmt: skip
    assert [a.event_id for a in commit.actions] == [a.event_id for a in alone.actions]
    assert commit.shadow_rules is not None and len(commit.shadow_rules) == len(commit.users)
    # the shadow's would-be firings are those it would make as the current model
    as_current = build_commit(batch, UserStates.empty(distinct_users(batch), (1, 8)), shadow,
                              HISTORY, rules=rules)  # fmt: skip
    assert sum(commit.shadow_actions.values()) > 0
    assert commit.shadow_actions == Counter(a.rule for a in as_current.actions)


def test_a_rule_state_left_stale_while_no_rule_was_set_is_not_read(model) -> None:
    """While no rule is set, commits leave the `rules` field alone; when rules come back,
    the stored field (of fewer events) must not count the session short: the same firing
    whether the states come from the cache or, after a restart, from Redis."""
    rule = RuleTable.of([Rule(name="probe", above=0.0, min_events=4)], version=1)
    t0 = 1_700_000_000_000
    raw = entries_of([{"user_id": "carol", "type": "view", "ts": t0 + 1000 * i} for i in range(6)])
    states = UserStates.empty(["carol"], model.state_shape)
    first = build_commit(parse_batch(0, raw[:2], 1, 2**62), states, model, HISTORY, rules=rule)
    assert first.rules == [b"2 2"] and not first.actions  # 2 events: too few for min_events 4

    # no rules for three events: the field stays as it was in Redis
    states = UserStates.empty(["carol"], model.state_shape)
    states.h[0], states.last_ts[0], states.n[0] = first.h[0], first.last_ts[0], 2
    states.last_id[0], states.recent[0], states.rules[0] = (2, 0), first.recent[0], b"2 2"
    middle = build_commit(parse_batch(0, raw[2:5], 1, 2**62), states, model, HISTORY)
    assert middle.rules is None

    # rules again; the state as Redis holds it after a restart: n = 5, rules still "2 2"
    states = UserStates.empty(["carol"], model.state_shape)
    states.h[0], states.last_ts[0], states.n[0] = middle.h[0], middle.last_ts[0], 5
    states.last_id[0], states.recent[0], states.rules[0] = (5, 0), middle.recent[0], b"2 2"
    last = build_commit(parse_batch(0, raw[5:], 1, 2**62), states, model, HISTORY, rules=rule)
    assert [a.rule for a in last.actions] == ["probe"]  # the session's 6th event fires it
    assert last.rules == [b"6 6 probe:0:%d" % (t0 + 5000)]
