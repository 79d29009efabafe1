"""Sessions with every field of their events, cut as training cuts them (model/training/sessions.py:
a gap over the session gap starts one, the inputs stop before the first label event), plus
what the user did before each: the sessions and label events of their earlier timeline."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class ShopSession:
    """One session's input events (dicts, in time order), its label, the seconds since the
    user's previous event (-1 for a user's first), and the user's earlier sessions and label
    events (purchases)."""

    user_id: str
    events: list[dict]
    label: float
    gap_before: float
    earlier_sessions: int = 0
    earlier_labels: int = 0


def _ts(e: dict) -> int:
    return -1 if e.get("ts") is None else int(e["ts"])


def shop_sessions(
    events: list[dict], gap_seconds: float = 1800.0, label_type: str = "purchase"
) -> list[ShopSession]:
    """Sessions as model/training/sessions.py's `sessionize` cuts them, in its order (users by first
    appearance, then time), keeping every field of their events."""
    by_user: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        by_user[e["user_id"]].append(e)
    out = []
    for user, evs in by_user.items():
        evs = sorted(evs, key=_ts)
        ts = [_ts(e) for e in evs]
        starts = [0] + [
            i for i in range(1, len(evs))
            if ts[i] >= 0 and ts[i - 1] >= 0 and gap_seconds > 0
            and (ts[i] - ts[i - 1]) / 1000 > gap_seconds
        ]  # fmt: skip
        labels_before = 0
        for k, (a, b) in enumerate(zip(starts, [*starts[1:], len(evs)], strict=True)):
            names = [e["type"] for e in evs[a:b]]
            end = names.index(label_type) if label_type in names else len(names)
            if end > 0:
                before = (ts[a] - ts[a - 1]) / 1000 if a and ts[a] >= 0 and ts[a - 1] >= 0 else -1.0
                label = float(label_type in names)
                out.append(ShopSession(user, evs[a : a + end], label, before, k, labels_before))
            labels_before += names.count(label_type)
    return out
