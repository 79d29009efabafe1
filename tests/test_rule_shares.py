"""The promotion gate's rule shares (worker/rules/shares.py): each live rule's share
of validation sessions it fires on at least once, by the rule's plain definition."""

from __future__ import annotations

import numpy as np

from model.random_init import random_model
from model.training.evaluate import model_step_scores
from model.training.sessions import Session
from worker.rules.definition import make_rule
from worker.rules.shares import UNKNOWN_TYPE, fire_shares, fires_in_session, share_lines

TYPES = ["view", "add_to_cart", "purchase"]


def test_a_session_fires_by_threshold_type_and_min_events():
    rule = make_rule(name="hot", above=0.5)
    assert fires_in_session(rule, ["view", "view"], [0.2, 0.5])
    assert not fires_in_session(rule, ["view", "view"], [0.2, 0.4999])
    carts = make_rule(name="carts", above=0.5, types=["add_to_cart"])
    assert not fires_in_session(carts, ["view", "view"], [0.9, 0.9])
    assert fires_in_session(carts, ["view", "add_to_cart"], [0.9, 0.6])
    assert not fires_in_session(carts, [UNKNOWN_TYPE], [0.9])
    late = make_rule(name="late", above=0.5, min_events=3)
    assert not fires_in_session(late, ["view"] * 3, [0.9, 0.9, 0.1])
    assert fires_in_session(late, ["view"] * 3, [0.9, 0.1, 0.9])
    # hysteresis and cooldown shape the firings after the first, never whether one happens
    sticky = make_rule(name="sticky", above=0.5, rearm_below=0.1, cooldown_ms=3_600_000)
    assert fires_in_session(sticky, ["view"] * 3, [0.6, 0.3, 0.7])


def test_fire_shares_follow_the_definition_on_a_models_scores():
    rng = np.random.default_rng(0)
    model = random_model(TYPES, hidden=8, features=["gap"], seed=2)
    sessions = [
        Session(f"u{i}", rng.integers(0, len(TYPES) + 1, n),
                rng.random((n, 1)).astype(np.float32), float(i % 2))
        for i, n in enumerate(rng.integers(1, 12, 200))
    ]  # fmt: skip
    _, scores, _, _ = model_step_scores(model, sessions)
    median = float(np.median(scores))
    carts = make_rule(name="carts", above=median, types=["add_to_cart"], min_events=2)
    rules = [make_rule(name="any", above=median), carts]
    shares = fire_shares(rules, model, sessions, scores)
    at, want_any, want_carts = 0, [], []
    for s in sessions:
        p = scores[at : at + len(s.types)]
        at += len(s.types)
        want_any.append(bool((p >= median).any()))
        want_carts.append(any(p[i] >= median and s.types[i] == 1 and i >= 1 for i in range(len(p))))
    assert shares == {"any": np.mean(want_any), "carts": np.mean(want_carts)}
    assert 0 < shares["carts"] < shares["any"] < 1


def test_share_lines_name_both_models():
    rules = [make_rule(name="hot", above=0.7)]
    assert share_lines(rules, {"hot": 0.25}, {"hot": 0.125}, "3", 400) == [
        "rule hot (above 0.7): fires on 12.5% under current version 3, 25.0% under the "
        "candidate, of 400 validation sessions"
    ]
    assert share_lines(rules, {"hot": 0.25}, None, None, 400) == [
        "rule hot (above 0.7): fires on 25.0% under the candidate, of 400 validation sessions"
    ]
