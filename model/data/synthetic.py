"""Synthetic shop sessions whose purchase odds depend on the order of events.

For demos, tests, benchmarks and training. Each session is a walk through a small funnel;
its purchase intent moves with every event, and how much depends on what came before: a cart
add after a coupon counts more than one without, a checkout counts only with something in the
cart, a removal undoes the cart, and ending on two views in a row cools intent down. So two
sessions with the same bag of events in another order have different odds, which a
bag-of-events model cannot see and a recurrent one can.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import numpy as np

EVENT_TYPES = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout"]
LABEL_TYPE = "purchase"

# next-event probabilities by funnel stage: browsing, carted, checking out
_NEXT = {
    0: [0.55, 0.2, 0.15, 0.0, 0.1, 0.0],
    1: [0.35, 0.1, 0.15, 0.15, 0.1, 0.15],
    2: [0.3, 0.05, 0.1, 0.2, 0.1, 0.25],
}


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))


def purchase_probability(types: list[str]) -> float:
    """The chance that a session of these events, in this order, ends in a purchase."""
    intent, coupon, carted = -1.5, False, False
    for t in types:
        if t == "coupon":
            coupon = True
            intent -= 1.0 if carted else 0.0  # a coupon hunt after carting: cold feet
        elif t == "add_to_cart":
            intent += 2.0 if coupon else 0.3  # a coupon first makes the cart count
            carted = True
        elif t == "remove_from_cart" and carted:
            intent -= 2.0  # undoes the cart
            carted = False
        elif t == "checkout":
            intent += 1.5 if carted else -1.0
        elif t == "search":
            intent += 0.1
    if len(types) >= 2 and types[-1] == types[-2] == "view":
        intent -= 2.0  # drifting off at the end
    return float(_sigmoid(2.0 * intent))


def _stage_after(stage: int, t: str) -> int:
    if t == "add_to_cart":
        return max(stage, 1)
    if t == "remove_from_cart":
        return 0
    if t == "checkout" and stage >= 1:
        return 2
    return stage


def session(rng: np.random.Generator, max_len: int = 20) -> tuple[list[str], bool]:
    """One session's event types (a walk through the funnel) and whether it ends in a purchase."""
    n = int(min(max_len, 2 + rng.geometric(0.15)))
    stage = 0
    types: list[str] = []
    for _ in range(n):
        t = EVENT_TYPES[int(rng.choice(6, p=_NEXT[stage]))]
        types.append(t)
        stage = _stage_after(stage, t)
    return types, bool(rng.random() < purchase_probability(types))


def synthetic_events(
    n_events: int,
    n_users: int,
    seed: int = 0,
    start_ms: int = 1_700_000_000_000,
    session_gap_seconds: float = 1800.0,
) -> Iterator[dict]:
    """About n_events events of n_users users, interleaved in time order.

    Within a session events are seconds to minutes apart; a user's next session starts more
    than `session_gap_seconds` later. A purchasing session ends with a `purchase` event.
    """
    rng = np.random.default_rng(seed)
    per_user = max(1, n_events // max(1, n_users))
    heap: list[tuple[int, int, int]] = []  # (ts, user, seq) of each user's next session start
    for u in range(n_users):
        heapq.heappush(heap, (start_ms + int(rng.uniform(0, 3_600_000)), u, 0))
    budget = {u: per_user for u in range(n_users)}
    sent = 0
    pending: list[tuple[int, int, str]] = []  # (ts, user, type), merged in time order
    while heap and sent < n_events:
        t0, u, _ = heapq.heappop(heap)
        types, bought = session(rng)
        if bought:
            types.append(LABEL_TYPE)
        t = t0
        for typ in types:
            heapq.heappush(pending, (t, u, typ))
            t += int(rng.exponential(20_000)) + 500
        budget[u] -= len(types)
        if budget[u] > 0:
            heapq.heappush(heap, (t + int(session_gap_seconds * 1000 * (1.5 + rng.random())), u, 0))
        # release events that no future session can precede
        horizon = heap[0][0] if heap else None
        while pending and (horizon is None or pending[0][0] <= horizon) and sent < n_events:
            ts, uu, typ = heapq.heappop(pending)
            yield {"user_id": f"user-{uu}", "type": typ, "ts": ts}
            sent += 1
    while pending and sent < n_events:
        ts, uu, typ = heapq.heappop(pending)
        yield {"user_id": f"user-{uu}", "type": typ, "ts": ts}
        sent += 1
