"""Events replayed offline through the worker's own pipeline: what `intentstream rules
backtest` runs, so that its actions are the ones a worker would have written.

Each partition's batches go through `build_commit`, as in the worker; the users' states
between batches stay in memory in a StateCache (the worker's write-through cache, unbounded
here), so they take the same values a state read from Redis would give.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from model.scoring import ScoringModel
from worker.common.dedup import DEFAULT_RESENDS, ResendWindow
from worker.engine.compute.actions import Action
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.state_cache import StateCache, copy_known, written
from worker.engine.compute.user_states import UserStates, distinct_users
from worker.rules.step import RuleTable


@dataclass
class Replayed:
    """What a replay saw and did: every scored event, in order, and the actions fired."""

    users: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    action_events: list[int] = field(default_factory=list)  # index of each action's event
    outcomes: dict[str, int] = field(default_factory=dict)


def replay(
    batches: Iterable[Batch], model: ScoringModel, rules: RuleTable, history_events: int,
    resends: ResendWindow = DEFAULT_RESENDS,
) -> Replayed:  # fmt: skip
    """Run the batches (each of one partition, in stream order per partition) through the
    pipeline with `rules`; the users' states carry over from batch to batch."""
    cache = StateCache(sys.maxsize)
    out = Replayed()
    for batch in batches:
        users = distinct_users(batch)
        known = cache.lookup(batch.partition, users)
        states = UserStates.empty(users, model.state_shape)
        rows = [i for i, k in enumerate(known) if k is not None]
        if rows:
            copy_known(states, rows, [known[i] for i in rows])  # type: ignore[misc]
        commit = build_commit(batch, states, model, history_events, None, resends,
                              rules)  # fmt: skip
        cache.store(batch.partition, b"", written(commit))
        first = len(out.users)
        out.users += [commit.users[u] for u in commit.score_user.tolist()]
        out.types += commit.score_types
        out.ts += commit.score_ts.tolist()
        out.scores += commit.scores.tolist()
        out.actions += commit.actions
        out.action_events += [first + a.row for a in commit.actions]
        for outcome, n in commit.outcomes.items():
            out.outcomes[outcome] = out.outcomes.get(outcome, 0) + n
    return out
