"""The shadow part: a challenger model scoring the same events beside the current one, from
its own states, through the same stages (cell, live quality, rule step); its score in each
score entry, its state beside the current's, the actions its scores would fire counted
(docs/models.md, Shadow scoring)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.scoring import ScoringModel
from worker.engine.compute import actions as act
from worker.engine.compute.items import memories_of
from worker.engine.compute.parts.actions import fired
from worker.engine.compute.parts.part import Part, Share, decimals
from worker.engine.compute.stages import ModelRun, Run
from worker.engine.compute.user_states import UserStates


@dataclass
class Shadow(Part):
    """The shadow model's scores, written states and counted firings."""

    model: str  # its version
    h: np.ndarray  # (K, L', H') each written row's state
    scores: np.ndarray  # (S,) float32, one per score entry
    user_scores: np.ndarray  # (K,) its score of each written user's last event
    rules: list[bytes] | None  # its rule states per written row (None: no rules set)
    fired: Counter[str]  # the actions its scores would fire, per rule

    def score_fields(self) -> list:
        return ["shadow_score", decimals(self.scores), "shadow_model", self.model]

    def state_writes(self, keys: list[str]) -> list[list]:
        template = ["HSET", keys, "shadow_h", self.h, "shadow_score",
                    decimals(self.user_scores), "shadow_model", self.model]  # fmt: skip
        template += ["shadow_rules", self.rules] if self.rules is not None else []
        return [template]

    def count(self, metrics: Any, quality: Any) -> None:
        for rule, n in self.fired.items():
            metrics.shadow_actions.labels(rule).inc(n)

    def share(self, s: Share) -> Shadow:
        rules = self.rules[s.rows] if self.rules is not None else None
        return Shadow(self.model, self.h[s.rows], self.scores[s.scores], self.user_scores[s.rows],
                      rules, self.fired if s.first else Counter())  # fmt: skip


def shadow_run(model: ScoringModel, states: UserStates) -> ModelRun:
    """The shadow model over the batch, from its own states (`states.shadow`); its item
    flags from the stored memories as they were before this batch."""
    sh = states.shadow
    assert sh is not None
    users = len(states.users)
    memory = memories_of(model.item_inputs, states.items) if model.item_inputs else None
    score = sh.score if sh.score is not None else np.full(users, np.nan)
    return ModelRun("shadow", model, sh.h, sh.last_ts, sh.replay, score,
                    sh.rules or [b""] * users, memory)  # fmt: skip


def shadow_stage(run: Run, runs: list[ModelRun]) -> Shadow | None:
    """The stage, when a shadow runs (`runs`' second): its part, its rules stepped over its
    scores when rules are set."""
    if len(runs) < 2:
        return None
    m = runs[1]
    touched, last = run.touched, run.last_event[run.touched]
    rules, counts = None, Counter()
    if run.rules is not None and len(run.rules):
        rule_states, firings, _ = fired(run, m)
        rules = act.packed_rows(run.rules, rule_states, touched, run.n_after())
        counts = act.fired_per_rule(run.rules, firings)
    return Shadow(m.model.version, m.h[touched], m.scores, m.scores[last], rules, counts)
