"""The backtest's figures per rule: how often a rule would have fired over replayed events,
and how well its actions anticipated purchases. Pure: columns in, figures out.

The definitions, exactly:

- A **session** is one user's run of events between splits. A user's events are taken in
  the order given (stream order); a session starts at the user's first event and at every
  event whose gap to the user's latest earlier event time exceeds the session gap (the
  worker's rule: model/features.py `event_gaps` and `session_resets`; gap 0 never splits).
- A session is **purchasing** when it holds an event of the label type.
- An action is **followed by a purchase** when a label event comes later in its session
  (strictly after the action's event: a rule firing at a purchase is not followed by it).
- **actions**: the rule's actions. **actions_per_day**: actions / the data's span in days,
  span = max ts - min ts over all events: the rate the replay shows, per day (35 actions
  over 1.4 h are 600 a day); None when the span is 0 (no time passed: no rate).
- **precision**: of the sessions where the rule acted, the share in which a purchase came
  after one of its actions (None when it never acted).
- **recall**: of the purchasing sessions, the share in which the rule acted before the
  session's first purchase (None when no session purchased).
- **median_lead_seconds**: over the actions followed by a purchase, the median of (the
  session's next purchase's ts - the action's ts) / 1000 (None when there is none).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from model.features import event_gaps, session_resets

DAY_MS = 86_400_000

# (user_id, rule name, ts in epoch ms, index of the event it fired at)
Action = tuple[str, str, int, int]


@dataclass(frozen=True)
class RuleFigures:
    """One rule's backtest figures (the module docstring defines each)."""

    rule: str
    actions: int
    actions_per_day: float | None
    actioned_sessions: int
    converted_sessions: int  # actioned sessions with a purchase after an action
    purchasing_sessions: int
    anticipated_sessions: int  # purchasing sessions acted on before their first purchase
    precision: float | None
    recall: float | None
    median_lead_seconds: float | None


@dataclass(frozen=True)
class _Sessions:
    """The events laid out user by user, in order: sessions are contiguous runs."""

    rank: np.ndarray  # event index -> position in the layout
    session: np.ndarray  # position -> session number
    ts: np.ndarray  # position -> ts
    next_purchase: np.ndarray  # position -> position of the session's next later purchase, -1
    first_purchase: np.ndarray  # session -> position of its first purchase, -1


def _sessions(
    user_ids: Sequence[str], types: Sequence[str], ts: np.ndarray, label_type: str, gap_ms: int
) -> _Sessions:
    n = len(user_ids)
    users, first_of_user, codes = np.unique(
        np.asarray(user_ids, dtype=str), return_index=True, return_inverse=True
    )
    codes = codes.reshape(-1).astype(np.int64)
    gaps, has_prev = event_gaps(codes, ts, np.full(len(users), -1, np.int64))
    starts = session_resets(gaps, has_prev, gap_ms / 1000.0)
    starts[first_of_user] = True
    order = np.argsort(codes, kind="stable")  # user by user, each user's events in order
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    starts = starts[order]
    session = np.cumsum(starts) - 1
    purchase = (np.asarray(types, dtype=str) == label_type)[order]
    # the first purchase at or after each position (n: none), then strictly after it
    at_or_after = np.minimum.accumulate(np.where(purchase, np.arange(n), n)[::-1])[::-1]
    after = np.concatenate((at_or_after[1:], [n]))[:n]
    nxt = np.where(after < n, after, 0)
    next_purchase = np.where((after < n) & (session[nxt] == session), after, -1)
    first = at_or_after[np.flatnonzero(starts)]
    first_ok = first < n
    first_ok[first_ok] = session[first[first_ok]] == np.arange(len(first))[first_ok]
    return _Sessions(rank, session, ts[order], next_purchase, np.where(first_ok, first, -1))


def _figures(
    name: str, positions: np.ndarray, action_ts: np.ndarray, s: _Sessions, days: float | None
) -> RuleFigures:
    by_position = np.argsort(positions, kind="stable")  # then session numbers ascend too
    positions, action_ts = positions[by_position], action_ts[by_position]
    following = s.next_purchase[positions]
    followed = following >= 0
    acted, first_idx = np.unique(s.session[positions], return_index=True)
    converted = np.unique(s.session[positions[followed]]).size
    first_act = positions[first_idx]  # the earliest action of each acted session
    first_buy = s.first_purchase[acted]
    anticipated = int(np.count_nonzero((first_buy >= 0) & (first_act < first_buy)))
    purchasing = int(np.count_nonzero(s.first_purchase >= 0))
    leads = (s.ts[following[followed]] - action_ts[followed]) / 1000.0
    return RuleFigures(
        rule=name,
        actions=int(positions.size),
        actions_per_day=positions.size / days if days else None,
        actioned_sessions=int(acted.size),
        converted_sessions=int(converted),
        purchasing_sessions=purchasing,
        anticipated_sessions=anticipated,
        precision=converted / acted.size if acted.size else None,
        recall=anticipated / purchasing if purchasing else None,
        median_lead_seconds=float(np.median(leads)) if leads.size else None,
    )


def rule_report(
    user_ids: Sequence[str],
    types: Sequence[str],
    ts: np.ndarray,
    actions: Iterable[Action],
    label_type: str,
    session_gap_ms: int,
    rules: Iterable[str] = (),
) -> list[RuleFigures]:
    """The figures of every rule that acted or is named in `rules`, sorted by name.

    user_ids, types and ts (int64 epoch ms) are the replayed events' columns, each user's in
    stream order; an action's event index points into them (ValueError when it points
    outside or at another user's event).
    """
    n = len(user_ids)
    ts = np.asarray(ts, dtype=np.int64)
    if len(types) != n or ts.shape != (n,):
        raise ValueError(f"columns of unequal length: {n} users, {len(types)} types, {ts.size} ts")
    by_rule: dict[str, list[tuple[int, int]]] = {name: [] for name in rules}
    for user_id, name, t, index in actions:
        if not 0 <= index < n or user_ids[index] != user_id:
            raise ValueError(f"action of rule {name!r} for {user_id!r}: no such event {index}")
        by_rule.setdefault(name, []).append((int(index), int(t)))
    span_ms = int(ts.max() - ts.min()) if n else 0
    days = span_ms / DAY_MS if span_ms > 0 else None
    s = _sessions(user_ids, types, ts, label_type, session_gap_ms)
    report = []
    for name in sorted(by_rule):
        pairs = np.array(by_rule[name], dtype=np.int64).reshape(-1, 2)
        report.append(_figures(name, s.rank[pairs[:, 0]], pairs[:, 1], s, days))
    return report
