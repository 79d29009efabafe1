"""A synthetic shop whose intent shows in the product and price fields more than in the event
types, with the exact Bayes-optimal score of every input event: the test bed for inputs
beyond the type and the gap (`python -m model.benchmarks.real_shop --generator`).

Each session has a hidden intent z, P(z) = `buy_rate`; a session with z ends in a purchase,
one without does not, so the label is z. Its inputs (1 + Geometric(`p_stop`) events, the
same for both, so a session's length says nothing) are, event by event, given z:

- the type: `add_to_cart` with probability P_CART[z], else `view` (a weak signal);
- the product: with probability P_REVISIT[z] one of the session's earlier events' products
  (uniformly over those events), else a draw from the catalog: uniform without intent, tilted
  towards pricier items with it (weight price ** PRICE_TILT) — buyers come back to a product
  and look at dearer ones;
- the gap before it: exponential, mean 60 s, for both.

The product carries its catalog price, category and brand. A user has 1-3 sessions hours
apart, each with its own intent. The exact posterior P(z | the session's events so far)
multiplies the likelihood ratio of each event's type and product, so it is also the Bayes
score at a session's last input event (the length carries nothing); the same with the types
alone is the best a type-only model can do.
"""

from __future__ import annotations

import numpy as np

P_CART = (0.04, 0.10)  # P(add_to_cart | z)
P_REVISIT = (0.15, 0.50)  # P(an event revisits a product of the session | z)
PRICE_TILT = 1.0  # with intent, a fresh product is drawn with weight price ** PRICE_TILT
START_MS = 1_569_888_000_000  # 2019-10-01 00:00 UTC
CATEGORIES = ("electronics.smartphone", "electronics.audio", "appliances.kitchen",
              "computers.notebook", "furniture.living_room", "apparel.shoes")  # fmt: skip


def catalog(n_products: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Prices (log-normal, median ~$60) and the draw probability of each product under
    z = 0 (uniform) and z = 1 (tilted to price): (prices, (2, n) probabilities)."""
    rng = np.random.default_rng([seed, 1])
    prices = np.round(np.exp(rng.normal(np.log(60.0), 1.0, n_products)), 2) + 0.99
    q = np.stack([np.full(n_products, 1.0), prices**PRICE_TILT])
    return prices, q / q.sum(axis=1, keepdims=True)


def session_inputs(rng: np.random.Generator, z: int, q: np.ndarray, p_stop: float):
    """One session's inputs given its intent: (types, products, gaps in ms)."""
    n = int(rng.geometric(p_stop))  # 1 + Geometric(p_stop) counted from 0
    types, products = [], []
    for t in range(n):
        types.append("add_to_cart" if rng.random() < P_CART[z] else "view")
        if t and rng.random() < P_REVISIT[z]:
            products.append(products[int(rng.integers(t))])
        else:
            products.append(int(rng.choice(len(q[z]), p=q[z])))
    gaps = np.maximum(1000, rng.exponential(60_000, n)).astype(np.int64)
    return types, products, gaps


def posteriors(types: list[str], products: list[int], q: np.ndarray, buy_rate: float):
    """P(z | events 1..t) for every t, with every field and with the types alone."""
    log_prior = np.log(buy_rate / (1 - buy_rate))
    full, typed = [], []
    lr_full = lr_type = log_prior
    for t, (kind, p) in enumerate(zip(types, products, strict=True)):
        c = kind == "add_to_cart"
        step = np.log(P_CART[1] if c else 1 - P_CART[1]) - np.log(P_CART[0] if c else 1 - P_CART[0])
        seen = products[:t].count(p) / t if t else 0.0
        like = [(P_REVISIT[z] * seen if t else 0.0) + ((1 - P_REVISIT[z]) if t else 1.0) * q[z][p]
                for z in (0, 1)]  # fmt: skip
        lr_type += step
        lr_full += step + np.log(like[1]) - np.log(like[0])
        full.append(1 / (1 + np.exp(-lr_full)))
        typed.append(1 / (1 + np.exp(-lr_type)))
    return full, typed


def rich_shop(users: int = 3000, seed: int = 0, buy_rate: float = 0.1, p_stop: float = 0.3,
              n_products: int = 2000):  # fmt: skip
    """(events in stream order, {(user_id, ts): (Bayes score with every field, with the
    types alone)} for every input event). Events carry product_id, category_code, brand and
    price as strings, as model/data/opencdp.py reads them from a shop's export."""
    rng = np.random.default_rng(seed)
    prices, q = catalog(n_products, seed)
    events, bayes = [], {}
    for u in range(users):
        user = f"shopper-{u}"
        ts = START_MS + int(rng.integers(0, 6 * 3600_000))
        for _ in range(int(rng.integers(1, 4))):
            z = int(rng.random() < buy_rate)
            types, products, gaps = session_inputs(rng, z, q, p_stop)
            full, typed = posteriors(types, products, q, buy_rate)
            for kind, p, gap, b, bt in zip(types, products, gaps, full, typed, strict=True):
                ts += int(gap)
                events.append({"user_id": user, "type": kind, "ts": ts, "product_id": str(p),
                               "category_code": CATEGORIES[p % len(CATEGORIES)],
                               "brand": f"brand{p % 97}", "price": f"{prices[p]:.2f}"})  # fmt: skip
                bayes[(user, ts)] = (float(b), float(bt))
            if z:
                ts += int(rng.integers(5_000, 120_000))
                p = products[-1]
                events.append({"user_id": user, "type": "purchase", "ts": ts,
                               "product_id": str(p), "price": f"{prices[p]:.2f}"})  # fmt: skip
            ts += int(rng.integers(2 * 3600_000, 30 * 3600_000))  # the next session, hours on
    events.sort(key=lambda e: e["ts"])  # stable: a user's events stay in order
    return events, bayes
