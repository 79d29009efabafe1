"""The actions part: with intent rules set, the rule step over the current model's scores
(rules/step.py, one kernel call), the actions it fires with their reasons, appended to the
partition's actions stream, and each written user's rule states, in their state."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from worker.common.keys import Keys
from worker.engine.compute import actions as act
from worker.engine.compute.actions import Action, ScoredEvents
from worker.engine.compute.parts.part import Command, Part, Rows, Share, decimals
from worker.engine.compute.stages import ModelRun, Run, gap_ms
from worker.rules.step import Firings, RuleStates


@dataclass
class Actions(Part):
    """Each written row's rule states, and the actions the current model's scores fired."""

    model: str  # the version whose scores fired them
    rules: list[bytes]  # the `rules` field of each written row
    actions: list[Action]

    def watched(self, keys: Keys, p: int) -> list[str]:
        return [keys.actions(p)] if self.actions else []

    def writes(self, keys: Keys, p: int, limits: Any) -> list[Command | Rows]:
        """The actions' XADDs (user_id, rule, score, event_id, ts, model, reasons) and the
        stream's trim, once a commit."""
        a = self.actions
        if not a:
            return []
        score = decimals(np.asarray([x.score for x in a], np.float32))
        template = [
            "XADD", keys.actions(p), "*", "user_id", [x.user_id for x in a],
            "rule", [x.rule for x in a], "score", score, "event_id", [x.event_id for x in a],
            "ts", [x.ts for x in a], "model", self.model, "reasons", [x.reasons for x in a],
        ]  # fmt: skip
        return [Rows(template, len(a)), ("XTRIM", keys.actions(p), "MAXLEN", "~",
                                         limits.scores_maxlen)]  # fmt: skip

    def state_fields(self, rewrite: bool) -> list:
        return ["rules", self.rules]

    def count(self, metrics: Any, quality: Any) -> None:
        for action in self.actions:
            metrics.actions.labels(action.rule).inc()

    def share(self, s: Share) -> Actions:
        first, end = s.scores.start, s.scores.stop
        mine = [replace(a, row=a.row - first) for a in self.actions if first <= a.row < end]
        return Actions(self.model, self.rules[s.rows], mine)


def fired(run: Run, m: ModelRun) -> tuple[RuleStates, Firings, ScoredEvents]:
    """The rules stepped over one model's scores of the batch, from its users' rule states:
    the states after, the firings, the events as the rules saw them."""
    table, states = run.rules, run.states
    assert table is not None
    rule_states = act.rule_states_of(table, m.rules, states.recent, states.n)
    columns = run.columns if m.role == "current" else {}
    events = ScoredEvents(run.k_slot, run.types, m.type_idx, run.ts, m.scores, run.ts_before,
                          columns)  # fmt: skip
    return rule_states, act.fire(table, rule_states, events, m.model), events


def actions_stage(run: Run, runs: list[ModelRun]) -> Actions | None:
    """The stage, when rules are set: the rule states and the actions with their reasons
    (the fired events' sessions replayed without each event, one kernel call)."""
    table, states = run.rules, run.states
    if table is None or not len(table):
        return None
    rule_states, firings, events = fired(run, runs[0])
    model = runs[0].model
    packed = act.packed_rows(table, rule_states, run.touched, run.n_after())
    actions: list[Action] = []
    if len(firings.event):
        sessions = act.sessions_at(firings, events, states.recent, run.history_events,
                                   gap_ms(model), model)  # fmt: skip
        reasons = act.reasons_json(model, sessions)
        actions = act.actions_of(table, firings, events, states.users, run.score_event_ids,
                                 reasons)  # fmt: skip
    return Actions(model.version, packed, actions)
