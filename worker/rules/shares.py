"""What a promotion does to the intent rules: the share of the validation sessions each live
rule would fire on, at least once, under a model's scores (docs/models.md, The promotion
gate). A threshold means a probability only as long as the model's scores do; this shows
what moves when the model under a rule changes.

Each session is stepped alone through the rule's plain definition
(worker/rules/step.py, `reference_step`), from a fresh rule state (armed, never
fired), at the model's score after each of its events (float64, as `model evaluate` scores):
the threshold, the listed types, `min_events` and the hysteresis (`rearm_below`) apply as in
the worker. What the share leaves out: the sessions stop before their label event (the score
after the purchase itself, and any event after it, is not stepped); cooldowns carried over
from a user's earlier sessions (within one session a cooldown cannot hold back its first
firing, so it does not change the share); and the names of types outside the model's
vocabulary (the sessions keep only type indices: such an event matches no listed type, where
the worker would check its name).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.artifact import Model
from model.training.sessions import Session
from worker.rules.step import NEVER, RuleLike, reference_step

UNKNOWN_TYPE = "\x00unknown"  # no rule can list it: not 1-64 bytes of a valid type name


def fires_in_session(rule: RuleLike, types: Sequence[str], scores: Sequence[float]) -> bool:
    """Whether the rule fires at least once over one session's events (their type names and
    the score after each), stepped from a fresh state."""
    state: dict = {}
    last_ts = NEVER
    for i, (type_, score) in enumerate(zip(types, scores, strict=True)):
        # times 0, 1, 2 ms, no session gap: one session; cooldowns only follow a firing
        fired, state, last_ts = reference_step([rule], state, last_ts, 0, float(score), type_, i)
        if fired:
            return True
    return False


def session_types(model: Model, session: Session) -> list[str]:
    """The type names of a session's events, by the model's vocabulary."""
    names = model.meta.event_types
    return [names[t] if t < len(names) else UNKNOWN_TYPE for t in session.types.tolist()]


def fire_shares(
    rules: Sequence[RuleLike], model: Model, sessions: list[Session], all_scores: np.ndarray
) -> dict[str, float]:
    """Per rule name: the share of the sessions it fires on at least once. `all_scores` are
    the model's scores of every step of the sessions, in order (model_step_scores()[1])."""
    ends = np.cumsum([len(s.types) for s in sessions])
    per_session = np.split(np.asarray(all_scores, np.float64), ends[:-1])
    types = [session_types(model, s) for s in sessions]
    return {
        rule.name: float(np.mean([fires_in_session(rule, t, p)
                                  for t, p in zip(types, per_session, strict=True)]))
        if sessions else float("nan")
        for rule in rules
    }  # fmt: skip


def share_lines(
    rules: Sequence[RuleLike],
    candidate: dict[str, float],
    current: dict[str, float] | None,
    current_version: str | None,
    sessions: int,
) -> list[str]:
    """One line per rule: its share under the current model and under the candidate."""
    lines = []
    for rule in rules:
        now = (
            f"{100 * current[rule.name]:.1f}% under current version {current_version}, "
            if current is not None
            else ""
        )
        lines.append(
            f"rule {rule.name} (above {rule.above:g}): fires on {now}"
            f"{100 * candidate[rule.name]:.1f}% under the candidate, of {sessions} validation "
            "sessions"
        )
    return lines
