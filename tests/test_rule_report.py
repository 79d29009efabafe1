"""The backtest's figures per rule (worker/rules/report.py): hand-built cases of
each definition, and random cases against a plain loop that follows the definitions."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.rules.report import DAY_MS, RuleFigures, rule_report

M = 60_000  # a minute in ms
GAP = 30 * M


def report(events, actions, gap=GAP, rules=()) -> dict[str, RuleFigures]:
    """events: (user, type, ts) rows; actions: (rule, event index) pairs, ts taken from it."""
    users = [e[0] for e in events]
    types = [e[1] for e in events]
    ts = np.array([e[2] for e in events], dtype=np.int64)
    acts = [(users[i], rule, int(ts[i]), i) for rule, i in actions]
    return {f.rule: f for f in rule_report(users, types, ts, acts, "purchase", gap, rules)}


def test_two_users_three_sessions():
    events = [
        ("a", "view", 0), ("a", "cart", 1 * M), ("b", "view", 2 * M), ("a", "purchase", 3 * M),
        ("b", "view", 4 * M), ("a", "view", 100 * M), ("a", "purchase", 101 * M),
    ]  # fmt: skip
    f = report(events, [("r", 1), ("r", 2), ("r", 5)])["r"]
    assert f == RuleFigures(
        rule="r", actions=3, actions_per_day=3 * 1440 / 101, actioned_sessions=3,
        converted_sessions=2,
        purchasing_sessions=2, anticipated_sessions=2, precision=2 / 3, recall=1.0,
        median_lead_seconds=90.0,  # 120 s and 60 s; 3 actions over 101 minutes
    )  # fmt: skip


def test_a_rule_that_never_acted_is_reported_when_named():
    events = [("a", "view", 0), ("a", "purchase", M)]
    f = report(events, [], rules=["quiet"])["quiet"]
    assert (f.actions, f.actions_per_day, f.precision, f.recall, f.median_lead_seconds) == (
        0, 0.0, None, 0.0, None)  # fmt: skip
    assert report(events, []) == {}
    none = rule_report([], [], np.zeros(0, np.int64), [], "purchase", GAP, ["x"])[0]
    assert (none.actions, none.precision, none.recall, none.purchasing_sessions) == (
        0,
        None,
        None,
        0,
    )


def test_rules_are_kept_apart_and_sorted_by_name():
    events = [("a", "view", 0), ("a", "view", M), ("a", "purchase", 2 * M)]
    out = rule_report(
        ["a"] * 3, [e[1] for e in events], np.array([0, M, 2 * M]),
        [("a", "late", M, 1), ("a", "early", 0, 0), ("a", "late", M, 1)], "purchase", GAP,
    )  # fmt: skip
    assert [f.rule for f in out] == ["early", "late"]
    assert out[0].median_lead_seconds == 120.0 and out[1].median_lead_seconds == 60.0
    assert out[1].actions == 2 and out[1].actioned_sessions == 1  # leads 60 s, 60 s


def test_an_action_at_a_purchase_is_not_followed_by_it_nor_before_it():
    events = [("a", "view", 0), ("a", "purchase", M)]
    f = report(events, [("r", 1)])["r"]
    assert (f.precision, f.recall, f.median_lead_seconds) == (0.0, 0.0, None)
    events.append(("a", "purchase", 5 * M))  # a second purchase follows it
    f = report(events, [("r", 1)])["r"]
    assert (f.precision, f.recall, f.median_lead_seconds) == (1.0, 0.0, 240.0)


def test_an_action_between_two_purchases_counts_for_precision_not_recall():
    events = [("a", "purchase", 0), ("a", "view", M), ("a", "purchase", 3 * M)]
    f = report(events, [("r", 1)])["r"]
    assert (f.precision, f.recall, f.anticipated_sessions, f.median_lead_seconds) == (
        1.0, 0.0, 0, 120.0)  # fmt: skip


def test_the_lead_is_to_the_next_purchase_of_the_same_session_only():
    events = [
        ("a", "view", 0), ("a", "purchase", 10 * M), ("a", "purchase", 20 * M),
        ("a", "view", 100 * M), ("a", "purchase", 101 * M),  # a new session: gap 80 min
        ("b", "purchase", 1 * M),  # another user's purchase, earlier in the stream
    ]  # fmt: skip
    f = report(events, [("r", 0), ("r", 3)])["r"]
    assert f.median_lead_seconds == (600 + 60) / 2
    assert (f.purchasing_sessions, f.anticipated_sessions, f.recall) == (3, 2, 2 / 3)
    assert (f.actioned_sessions, f.converted_sessions) == (2, 2)


def test_sessions_split_as_the_worker_splits_them():
    # a gap of exactly the session gap does not split; one ms more does
    events = [("a", "view", 0), ("a", "purchase", GAP)]
    assert report(events, [("r", 0)])["r"].precision == 1.0
    events = [("a", "view", 0), ("a", "purchase", GAP + 1)]
    assert report(events, [("r", 0)])["r"].precision == 0.0
    assert report(events, [("r", 0)], gap=0)["r"].precision == 1.0  # 0: never split
    # the gap is to the user's latest earlier event time: an event out of order moves nothing
    events = [("a", "view", 50 * M), ("a", "view", 10 * M), ("a", "purchase", 70 * M)]
    assert report(events, [("r", 0)])["r"].precision == 1.0  # 20 min after 50, not 60 after 10
    events = [("a", "view", 50 * M), ("a", "view", 10 * M), ("a", "purchase", 81 * M)]
    assert report(events, [("r", 1)])["r"].precision == 0.0  # 31 min after 50: a new session


def test_users_interleaved_in_any_order_keep_their_own_sessions():
    events = [
        ("b", "view", 0), ("a", "view", 0), ("b", "view", M), ("a", "purchase", 2 * M),
        ("b", "purchase", 3 * M), ("a", "view", 4 * M),
    ]  # fmt: skip
    out = report(events, [("r", 0), ("r", 5)])["r"]  # b before its purchase; a after its own
    assert (out.actioned_sessions, out.converted_sessions, out.precision) == (2, 1, 0.5)
    assert (out.purchasing_sessions, out.anticipated_sessions) == (2, 1)
    assert out.median_lead_seconds == 180.0


def test_actions_per_day_over_the_actual_span():
    one_hour = [("a", "view", 0), ("a", "view", 60 * M)]
    assert report(one_hour, [("r", 0), ("r", 1)])["r"].actions_per_day == 48.0  # not floored
    four_days = [("a", "view", 0), ("b", "view", 4 * DAY_MS)]
    assert report(four_days, [("r", 0), ("r", 1)])["r"].actions_per_day == 0.5
    # the case: 35 actions over 1.4 h are 600 a day, not 35
    events = [(f"u{i}", "view", i * 84 * M // 35) for i in range(35)] + [("z", "view", 84 * M)]
    out = report(events, [("r", i) for i in range(35)])["r"]
    assert out.actions == 35 and out.actions_per_day == pytest.approx(600.0)
    instant = [("a", "view", 5), ("b", "view", 5)]  # no time passed: no rate
    assert report(instant, [("r", 0)])["r"].actions_per_day is None


def test_bad_input_is_refused():
    ts = np.array([0, M])
    with pytest.raises(ValueError, match="no such event 2"):
        rule_report(["a", "a"], ["v", "v"], ts, [("a", "r", 0, 2)], "purchase", GAP)
    with pytest.raises(ValueError, match="for 'b': no such event 0"):
        rule_report(["a", "a"], ["v", "v"], ts, [("b", "r", 0, 0)], "purchase", GAP)
    with pytest.raises(ValueError, match="unequal length"):
        rule_report(["a"], ["v", "v"], ts, [], "purchase", GAP)


def reference(users, types, ts, actions, gap) -> dict[str, tuple]:
    """The definitions as a plain loop: (precision, recall, median lead, actioned sessions)."""
    session, latest, current, count = [], {}, {}, 0
    for u, t in zip(users, ts, strict=True):
        prev = latest.get(u, -1)
        if u not in current or (gap > 0 and prev >= 0 and t - prev > gap):
            count += 1
            current[u] = count
        session.append(current[u])
        latest[u] = max(prev, t)
    n = len(users)
    purchases = {i for i in range(n) if types[i] == "purchase"}
    buying = {session[i] for i in purchases}
    first_buy = {s: min(i for i in purchases if session[i] == s) for s in buying}
    out = {}
    for rule in sorted({a[1] for a in actions}):
        mine = [a for a in actions if a[1] == rule]
        acted = {session[i] for _, _, _, i in mine}
        leads, converted, anticipated = [], set(), set()
        for _, _, t, i in mine:
            later = [j for j in purchases if j > i and session[j] == session[i]]
            if later:
                converted.add(session[i])
                leads.append((ts[min(later)] - t) / 1000)
            if session[i] in first_buy and i < first_buy[session[i]]:
                anticipated.add(session[i])
        out[rule] = (
            len(converted) / len(acted),
            len(anticipated) / len(buying) if buying else None,
            statistics.median(leads) if leads else None,
            len(acted),
        )
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from(["view", "purchase"]),
                  st.integers(0, 120)),
        min_size=1, max_size=30,
    ),
    st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 29)), max_size=10),
    st.sampled_from([0, 10 * M, 30 * M]),
)  # fmt: skip
def test_random_cases_follow_the_definitions(rows, picks, gap):
    users = [r[0] for r in rows]
    types = [r[1] for r in rows]
    ts = np.array([r[2] * M for r in rows], dtype=np.int64)
    actions = [(users[i], rule, int(ts[i]), i) for rule, i in picks if i < len(rows)]
    got = {f.rule: f for f in rule_report(users, types, ts, actions, "purchase", gap)}
    want = reference(users, types, ts.tolist(), actions, gap)
    assert set(got) == set(want)
    for rule, (precision, recall, lead, acted) in want.items():
        f = got[rule]
        assert (f.precision, f.recall, f.actioned_sessions) == pytest.approx(
            (precision, recall, acted)
        )
        assert f.median_lead_seconds == (None if lead is None else pytest.approx(lead))
