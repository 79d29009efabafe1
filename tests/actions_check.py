"""Helpers that hold a worker's actions to exactly-once: rules that fire on a model's scores,
the actions an uninterrupted replay of the same events writes, and the actions in Redis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import redis

from model.artifact import file_version, load_model
from model.scoring import InMemoryScorer, ScoringModel
from worker.commands.backtest import batches_of, event_entries
from worker.common.events import Event
from worker.common.keys import Keys
from worker.engine.adapters.commit import decimals
from worker.engine.compute.replay import replay
from worker.rules.definition import RuleSet, make_rule
from worker.rules.step import RuleTable
from worker.rules.store import read_rules, set_rule

HISTORY_EVENTS = 32  # the worker's default history-events


def pinned(model_path: Path) -> ScoringModel:
    """The model as a worker started with --model names it."""
    model = load_model(model_path)
    return ScoringModel(model, version=file_version(model, model_path))


def set_firing_rules(r: redis.Redis, model_path: Path, events: list[dict]) -> RuleSet:
    """Three rules (hysteresis, types and cooldown, min events) at thresholds the model's
    scores of these events cross now and then; set in Redis, and returned as read back."""
    scorer = InMemoryScorer(pinned(model_path))
    scores = scorer.score([e["user_id"] for e in events], [e["type"] for e in events],
                          np.array([e["ts"] for e in events]))  # fmt: skip
    q95, q80, q60 = np.quantile(scores, [0.95, 0.8, 0.6]).tolist()
    for rule in (
        make_rule(name="hot", above=q95, rearm_below=q60),
        make_rule(name="cart", above=q80, types=("add_to_cart", "checkout"), cooldown_ms=600_000),
        make_rule(name="late", above=q60, min_events=6),
    ):
        set_rule(r, Keys(), rule)
    return read_rules(r, Keys())


def expected_actions(
    model_path: Path, events: list[dict], partitions: int, rules: RuleSet
) -> dict[int, list[tuple]]:
    """Per partition, the actions one uninterrupted run over the events writes, in order, as
    (user_id, rule, score, event_id, ts, model, reasons) strings."""
    model = pinned(model_path)
    streams = event_entries([Event(**e) for e in events], partitions)
    out: dict[int, list[tuple]] = {}
    for p in range(partitions):
        run = replay(batches_of({p: streams[p]}, partitions, 512, 2**62), model,
                     RuleTable.of(rules.rules, rules.version), HISTORY_EVENTS)  # fmt: skip
        scores = decimals(np.asarray([a.score for a in run.actions], np.float32))
        out[p] = [
            (a.user_id, a.rule, s, a.event_id.decode(), str(a.ts), model.version,
             a.reasons.decode())
            for a, s in zip(run.actions, scores, strict=True)
        ]  # fmt: skip
    return out


def action_entries(r: redis.Redis, partitions: int) -> dict[int, list[tuple]]:
    """Per partition, the actions stream's entries as the same tuples."""
    names = ("user_id", "rule", "score", "event_id", "ts", "model", "reasons")
    out = {}
    for p in range(partitions):
        rows = r.xrange(f"intentstream:actions:{{{p}}}")
        out[p] = [tuple(f[n.encode()].decode() for n in names) for _, f in rows]
    return out


def assert_actions_exactly_once(
    r: redis.Redis, events: list[dict], model_path: Path, partitions: int, rules: RuleSet
) -> int:
    """The actions in Redis are those of an uninterrupted run, each once, in order; and each
    names an event that has its score entry. Returns how many there are."""
    got = action_entries(r, partitions)
    want = expected_actions(model_path, events, partitions, rules)
    for p in range(partitions):
        assert got[p] == want[p], f"partition {p}: the actions differ from one clean run"
        scored = {f[b"event_id"].decode() for _, f in r.xrange(f"intentstream:scores:{{{p}}}")}
        assert {a[3] for a in got[p]} <= scored, "an action without its score entry"
    total = sum(map(len, got.values()))
    assert total > 20, "the rules should have fired"
    return total
