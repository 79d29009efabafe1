"""A synthetic shop whose true purchase probability is known after every event: the test bed
for calibration (model/calibration.py).

Each session has a hidden intent z (P(z = 1) = 0.3). Its events follow a first-order Markov
chain over the shop's types with a transition matrix of its intent (order matters: a cart
after a coupon says more than a coupon after a cart), and after each event the session goes
on with a fixed probability. When the inputs end, a buyer (z = 1) purchases with
probability 0.9, a browser with 0.05. So after the first t events the exact posterior is

    P(purchase | e_1..e_t) = sum_z P(z | e_1..e_t, at least t events) P(purchase | z)

with P(z | ...) proportional to P(z) P(e_1 | z) prod P(e_k | e_{k-1}, z) * go_on_z^(t-1).
Times: events 5-60 s apart, sessions of a user 2-10 hours apart; the gaps carry nothing.
"""

from __future__ import annotations

import numpy as np

TYPES = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout"]
LABEL = "purchase"
P_INTENT = 0.3
P_BUY = (0.05, 0.9)  # P(purchase | z)
# P(another event), the same under either intent: where a session stops says nothing of its
# intent, so the posterior after its last event is the one above (a shop where buyers stay
# longer would make "this was the last event" evidence no model sees when it scores)
GO_ON = (0.78, 0.78)
MAX_EVENTS = 20


def _chains() -> tuple[np.ndarray, np.ndarray]:
    """(first-event probabilities per intent (2, K), transitions per intent (2, K, K))."""
    first = np.array([[0.6, 0.3, 0.05, 0.01, 0.05, 0.01], [0.45, 0.3, 0.1, 0.01, 0.15, 0.01]])
    browse = np.array([
        [0.55, 0.3, 0.06, 0.01, 0.07, 0.01],
        [0.5, 0.35, 0.07, 0.01, 0.06, 0.01],
        [0.4, 0.2, 0.1, 0.2, 0.05, 0.05],
        [0.6, 0.3, 0.05, 0.02, 0.03, 0.01],
        [0.55, 0.25, 0.1, 0.02, 0.05, 0.03],
        [0.5, 0.2, 0.1, 0.15, 0.05, 0.01],
    ])  # fmt: skip
    buy = np.array([
        [0.45, 0.25, 0.15, 0.01, 0.1, 0.04],
        [0.45, 0.25, 0.15, 0.01, 0.1, 0.04],
        [0.25, 0.1, 0.2, 0.05, 0.05, 0.35],
        [0.5, 0.3, 0.15, 0.02, 0.03, 0.01],
        [0.2, 0.1, 0.45, 0.02, 0.03, 0.2],
        [0.3, 0.1, 0.3, 0.05, 0.05, 0.2],
    ])  # fmt: skip
    trans = np.stack([browse, buy])
    return first / first.sum(1, keepdims=True), trans / trans.sum(2, keepdims=True)


FIRST, TRANS = _chains()


def posterior_after(events: list[int]) -> np.ndarray:
    """The exact P(purchase) after each prefix of a session's event indices."""
    log_w = np.log([1 - P_INTENT, P_INTENT]) + np.log(FIRST[:, events[0]])
    out = []
    for t, e in enumerate(events):
        if t:
            log_w = log_w + np.log(TRANS[:, events[t - 1], e]) + np.log(GO_ON)
        w = np.exp(log_w - log_w.max())
        pz = w / w.sum()
        out.append(pz @ np.array(P_BUY))
    return np.asarray(out)


def posterior_shop(
    n_users: int, sessions_per_user: int = 3, seed: int = 0, start_ms: int = 1_700_000_000_000
) -> tuple[list[dict], dict[tuple[str, int], float]]:
    """The shop's events (user_id, type, ts; time order per user), and the exact posterior
    after each input event, keyed by (user_id, ts)."""
    rng = np.random.default_rng(seed)
    events: list[dict] = []
    posterior: dict[tuple[str, int], float] = {}
    for u in range(n_users):
        user = f"user-{u}"
        t = start_ms + int(rng.integers(0, 3_600_000))
        for _ in range(sessions_per_user):
            z = int(rng.random() < P_INTENT)
            seq = [int(rng.choice(len(TYPES), p=FIRST[z]))]
            while len(seq) < MAX_EVENTS and rng.random() < GO_ON[z]:
                seq.append(int(rng.choice(len(TYPES), p=TRANS[z, seq[-1]])))
            post = posterior_after(seq)
            for e, p in zip(seq, post, strict=True):
                t += int(rng.integers(5_000, 60_000))
                events.append({"user_id": user, "type": TYPES[e], "ts": t})
                posterior[(user, t)] = float(p)
            if rng.random() < P_BUY[z]:
                t += int(rng.integers(5_000, 60_000))
                events.append({"user_id": user, "type": LABEL, "ts": t})
            t += int(rng.integers(2 * 3_600_000, 10 * 3_600_000))
    events.sort(key=lambda e: e["ts"])
    return events, posterior
