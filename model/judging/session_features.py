"""The session features a data scientist builds in an afternoon, for every step of every
session, each from the events up to the scored one (never a later one): what the baselines
(model/judging/baselines.py) are fitted on.

Counts per event type, length, duration, gap statistics, the gap before the session, the
user's earlier sessions and purchases, distinct products, categories and brands, the most
seen product's count and share, price statistics (log1p: mean, min, max, last, spread, last
minus mean), the last event's type, whether its product was seen or carted before in the
session, and how many products are carted. Counts and durations enter as log1p.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from model.judging.shop_sessions import ShopSession

CART_TYPES = ("add_to_cart", "cart")
_FIXED = [
    "length", "duration", "gap_mean", "gap_max", "gap_last", "gap_before",
    "earlier_sessions", "earlier_purchases", "distinct_products", "distinct_categories",
    "distinct_brands", "top_product_count", "top_product_share", "price_mean", "price_min",
    "price_max", "price_last", "price_spread", "price_last_minus_mean", "price_missing",
    "product_seen_before", "product_carted_before", "products_carted",
]  # fmt: skip


def feature_names(types: list[str]) -> list[str]:
    """The columns of `step_features`, in order."""
    return ([f"count_{t}" for t in types] + ["count_other"] + _FIXED
            + [f"last_is_{t}" for t in types] + ["last_is_other"])  # fmt: skip


def _log_price(e: dict) -> float:
    try:
        value = float(e.get("price", "nan"))
    except (TypeError, ValueError):
        return math.nan
    return math.log1p(value) if value >= 0 else math.nan


def _log1p_secs(ms: float) -> float:
    return math.log1p(max(0.0, ms / 1000))


def session_rows(s: ShopSession, types: list[str]) -> np.ndarray:
    """One row per step of the session (float64, `feature_names` columns)."""
    index = {t: i for i, t in enumerate(types)}
    V = len(types) + 1
    rows = np.zeros((len(s.events), len(feature_names(types))), np.float64)
    counts = np.zeros(V)
    products: Counter = Counter()
    categories, brands, carted = set(), set(), set()
    prices: list[float] = []
    gaps: list[float] = []
    first_ts = prev_ts = None
    before = math.log1p(s.gap_before) if s.gap_before >= 0 else -1.0
    for t, e in enumerate(s.events):
        k = index.get(e["type"], V - 1)
        counts[k] += 1
        ts = e.get("ts")
        if ts is not None and prev_ts is not None:
            gaps.append(_log1p_secs(int(ts) - prev_ts))
        if ts is not None:
            first_ts = int(ts) if first_ts is None else first_ts
            prev_ts = int(ts)
        product = e.get("product_id")
        seen_before = float(product is not None and product in products)
        carted_before = float(product is not None and product in carted)
        if product is not None:
            products[product] += 1
            if e["type"] in CART_TYPES:
                carted.add(product)
        if e.get("category_code"):
            categories.add(e["category_code"])
        if e.get("brand"):
            brands.add(e["brand"])
        price = _log_price(e)
        if not math.isnan(price):
            prices.append(price)
        top = max(products.values(), default=0)
        if prices:
            mean = sum(prices) / len(prices)
            last = price if not math.isnan(price) else prices[-1]
            stats = [mean, min(prices), max(prices), last, max(prices) - min(prices),
                     last - mean, 0.0]  # fmt: skip
        else:
            stats = [0.0] * 6 + [1.0]
        duration = _log1p_secs(prev_ts - first_ts) if first_ts is not None else 0.0
        g = [sum(gaps) / len(gaps), max(gaps), gaps[-1]] if gaps else [-1.0] * 3
        fixed = [math.log1p(t + 1), duration, *g, before, math.log1p(s.earlier_sessions),
                 math.log1p(s.earlier_labels), math.log1p(len(products)),
                 math.log1p(len(categories)), math.log1p(len(brands)), math.log1p(top),
                 top / (t + 1), *stats, seen_before, carted_before,
                 math.log1p(len(carted))]  # fmt: skip
        last_type = np.zeros(V)
        last_type[k] = 1.0
        rows[t] = np.concatenate([np.log1p(counts), fixed, last_type])
    return rows


def step_features(sessions: list[ShopSession], types: list[str]) -> list[np.ndarray]:
    """Each session's per-step rows (`session_rows`)."""
    return [session_rows(s, types) for s in sessions]
