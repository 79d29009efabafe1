"""Judged on real shop events: the RNNs, type-only and with declared inputs, beside counting
and gradient boosting, on the same sessions and the same user splits, on the REES46 slice or
on a synthetic shop where the product and price fields carry the intent (model/data/rich_shop.py,
with its Bayes-optimal AUC).

    python -m model.benchmarks.real_shop [--data FILE.csv[.gz]] [--seeds 10]
    python -m model.benchmarks.real_shop --generator [--users 3000] [--seeds 10]

Sessions are cut as training cuts them (model/training/sessions.py: a gap over 30 minutes
starts one,
the inputs stop before the first purchase); each seed splits the users (20% held out) as
`intentstream train --seed` does, and every row is the AUC at each held-out session's last
input event: intentstream Elman and GRU with TrainConfig's defaults (the type and the gap),
the same with the inputs `intentstream train --numeric price:log1p --categorical
brand,category_code --item product_id` declares (RICH_FLAGS, the flags' default buckets and
dim), the bag-of-types baseline (model/training/evaluate.py), and scikit-learn's
HistGradientBoosting on (a) type counts, length and gap statistics and (b) those plus product
and price features.
Paired rows give per-seed differences (the inputs' gain to each cell and to gradient
boosting, the rich Elman against gradient boosting with the same fields) and, with --generator,
each rich row as a fraction of the Bayes row. The gradient boosting rows need scikit-learn
(`pip install -e '.[bench]'`) and are skipped with a note without it.

The REES46 data: REES46 Marketing Platform (rees46.com), Kaggle
`mkechinov/ecommerce-behavior-data-from-multi-category-store`; credit it with any result.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model.benchmarks.kernels import machine_line
from model.data.opencdp import opencdp_events
from model.training.config import TrainConfig
from model.training.evaluate import BagOfTypes, roc_auc
from model.training.prepare import vocabulary
from model.training.sessions import Session, sessionize, split_by_user
from model.training.train import train

CREDIT = ("REES46 Marketing Platform (rees46.com), Kaggle "
          "mkechinov/ecommerce-behavior-data-from-multi-category-store")  # fmt: skip
GBDT = {"max_iter": 200, "learning_rate": 0.05, "max_leaf_nodes": 15, "min_samples_leaf": 20,
        "l2_regularization": 1.0, "early_stopping": False}  # fmt: skip

# The declared inputs of `intentstream train --numeric price:log1p --categorical
# brand,category_code --item product_id` with the flags' default buckets and dim
# (worker/commands/input_flags.py; tests/test_real_bench.py checks they are the same).
RICH_FLAGS = "--numeric price:log1p --categorical brand,category_code --item product_id"
RICH_INPUTS = [{"kind": "numeric", "name": "price", "transform": "log1p"},
               *({"kind": "categorical", "name": n, "buckets": 1024, "dim": 8}
                 for n in ("brand", "category_code")),
               {"kind": "item", "name": "product_id", "buckets": 1024, "dim": 8}]  # fmt: skip

BAYES, BAYES_TYPES = "Bayes-optimal (every field)", "Bayes-optimal (types only)"
ELMAN, GRU = "intentstream Elman (type, gap)", "intentstream GRU (type, gap)"
ELMAN_RICH = "intentstream Elman (+ product, price, brand, category)"
GRU_RICH = "intentstream GRU (+ product, price, brand, category)"
GBDT_COUNTS, GBDT_RICH = "GBDT: type counts, length, gaps", "GBDT: + product and price features"
SHORT = {BAYES: "Bayes", BAYES_TYPES: "Bayes types", ELMAN: "Elman", GRU: "GRU",
         ELMAN_RICH: "Elman+", GRU_RICH: "GRU+", "bag-of-types logistic regression": "bag",
         GBDT_COUNTS: "GBDT", GBDT_RICH: "GBDT+"}  # fmt: skip
# Paired rows of the table: (label, the row with more, the row without), per seed.
GAINS = (("GBDT gain of the product and price features", GBDT_RICH, GBDT_COUNTS),
         ("Elman gain of the declared inputs", ELMAN_RICH, ELMAN),
         ("GRU gain of the declared inputs", GRU_RICH, GRU),
         ("Elman with the declared inputs against GBDT with product and price features",
          ELMAN_RICH, GBDT_RICH))  # fmt: skip
RATIOS = (ELMAN_RICH, GRU_RICH, GBDT_RICH)  # shown as a fraction of the Bayes row


@dataclass(frozen=True)
class ShopSession:
    """One session's input events (dicts, in time order), its label, and the seconds since
    the user's previous event (-1 for a user's first)."""

    user_id: str
    events: list[dict]
    label: float
    gap_before: float


def shop_sessions(events: list[dict], gap_seconds: float = 1800.0,
                  label_type: str = "purchase") -> list[ShopSession]:  # fmt: skip
    """Sessions as model/training/sessions.py's `sessionize` cuts them, in its order (users by first
    appearance), keeping every field of their events."""
    by_user: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        by_user[e["user_id"]].append(e)
    out = []
    for user, evs in by_user.items():
        evs = sorted(evs, key=lambda e: -1 if e.get("ts") is None else int(e["ts"]))
        ts = [-1 if e.get("ts") is None else int(e["ts"]) for e in evs]
        starts = [0] + [
            i for i in range(1, len(evs))
            if ts[i] >= 0 and ts[i - 1] >= 0 and gap_seconds > 0
            and (ts[i] - ts[i - 1]) / 1000 > gap_seconds
        ]  # fmt: skip
        for a, b in zip(starts, [*starts[1:], len(evs)], strict=True):
            names = [e["type"] for e in evs[a:b]]
            end = names.index(label_type) if label_type in names else len(names)
            if end == 0:
                continue
            before = (ts[a] - ts[a - 1]) / 1000 if a and ts[a] >= 0 and ts[a - 1] >= 0 else -1.0
            out.append(ShopSession(user, evs[a : a + end], float(label_type in names), before))
    return out


def _gaps(s: ShopSession) -> np.ndarray:
    ts = np.array([e.get("ts") or 0 for e in s.events], np.float64)
    return np.diff(ts) / 1000


def count_features(s: ShopSession, types: list[str]) -> list[float]:
    """Counts of each vocabulary type (and of the rest), length, duration, mean, max and last
    gap within the session, log1p of the gap before it."""
    counts = Counter(e["type"] for e in s.events)
    known = [float(counts.get(t, 0)) for t in types]
    gaps = _gaps(s)
    g = [float(gaps.mean()), float(gaps.max()), float(gaps[-1])] if len(gaps) else [-1.0] * 3
    before = math.log1p(s.gap_before) if s.gap_before >= 0 else -1.0
    return [*known, len(s.events) - sum(known), float(len(s.events)), float(gaps.sum()), *g,
            before]  # fmt: skip


def _price(e: dict) -> float:
    try:
        value = float(e.get("price", "nan"))
    except ValueError:
        return math.nan
    return math.log1p(value) if value >= 0 else math.nan


def product_features(s: ShopSession) -> list[float]:
    """Distinct products, most events on one product, log1p price mean, min, max and last
    (nan without prices), and whether the last event's product was seen earlier in it."""
    products = [e.get("product_id") for e in s.events]
    seen = Counter(p for p in products if p is not None)
    prices = np.array([_price(e) for e in s.events])
    known = prices[~np.isnan(prices)]
    stats = [float(known.mean()), float(known.min()), float(known.max())] if len(known) else \
        [math.nan] * 3  # fmt: skip
    last = products[-1]
    again = float(last is not None and last in products[:-1])
    return [float(len(seen)), float(max(seen.values(), default=0)), *stats,
            float(prices[-1]), again]  # fmt: skip


def design(sessions: list[ShopSession], types: list[str], rich: bool) -> np.ndarray:
    return np.array([count_features(s, types) + (product_features(s) if rich else [])
                     for s in sessions], np.float64)  # fmt: skip


def check_aligned(shop: list[ShopSession], sessions: list[Session]) -> None:
    """The harness's sessions are training's, one for one (users, lengths, labels)."""
    assert len(shop) == len(sessions), (len(shop), len(sessions))
    for a, b in zip(shop, sessions, strict=True):
        assert (a.user_id, len(a.events), a.label) == (b.user_id, len(b.types), b.label)


def check_same_validation(got: list[Session], want: list[Session]) -> None:
    """A training run's validation sessions are the harness's, one for one."""
    assert len(got) == len(want), (len(got), len(want))
    for a, b in zip(got, want, strict=True):
        assert (a.user_id, len(a.types), a.label) == (b.user_id, len(b.types), b.label)


def read_opencdp(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    bad = []
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        events = list(opencdp_events(f, lambda n, why: bad.append(f"{path}:{n}: {why}")))
    for line in bad[:5]:
        print(f"skipped {line}", file=sys.stderr)
    return events


def _gbdt():
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier
    except ImportError:
        return None
    return HistGradientBoostingClassifier


def run(events: list[dict], seeds: list[int], epochs: int | None, bayes: dict | None = None,
        log=print) -> dict[str, list[float]]:  # fmt: skip
    """AUC at the last input event per row and seed: {row: [auc per seed]}."""
    # its own user splits per seed: training holds no test users of its own here
    config = TrainConfig(test_fraction=0.0, **({} if epochs is None else {"epochs": epochs}))
    types = vocabulary(events, config)
    shop = shop_sessions(events, config.session_gap_seconds, config.label_type)
    sessions = sessionize(events, types, config.features, config.session_gap_seconds,
                          config.label_type)  # fmt: skip
    check_aligned(shop, sessions)
    index = {id(s): i for i, s in enumerate(shop)}
    n_pos = int(sum(s.label for s in shop))
    log(f"{len(events)} events, {len({e['user_id'] for e in events})} users, {len(shop)} "
        f"sessions, {n_pos} buying ({n_pos / len(shop):.1%}); vocabulary {types}")  # fmt: skip
    X = {rich: design(shop, types, rich) for rich in (False, True)}
    Gbdt = _gbdt()
    if Gbdt is None:
        log("(scikit-learn not installed: the gradient boosting rows are skipped; "
            "pip install -e '.[bench]' for them)")  # fmt: skip
    rows: dict[str, list[float]] = defaultdict(list)
    for seed in seeds:
        t0 = time.time()
        train_s, valid_s = split_by_user(sessions, config.validation_fraction, seed)
        shop_train, shop_valid = split_by_user(shop, config.validation_fraction, seed)
        y_valid = np.array([s.label for s in valid_s])
        if bayes is not None:
            last = [bayes[(s.user_id, s.events[-1]["ts"])] for s in shop_valid]
            rows[BAYES].append(roc_auc(y_valid, [b[0] for b in last]))
            rows[BAYES_TYPES].append(roc_auc(y_valid, [b[1] for b in last]))
        for name, cell, inputs in ((ELMAN, "rnn", []), (GRU, "gru", []),
                                   (ELMAN_RICH, "rnn", RICH_INPUTS),
                                   (GRU_RICH, "gru", RICH_INPUTS)):  # fmt: skip
            update = {"seed": seed, "cell": cell, "inputs": inputs}
            result = train(events, TrainConfig.model_validate(config.model_dump() | update))
            check_same_validation(result.validation_sessions, valid_s)
            rows[name].append(result.report["metrics"]["auc_last"])
        base = BagOfTypes(len(types) + 1).fit(train_s)
        rows["bag-of-types logistic regression"].append(roc_auc(*base.step_scores(valid_s)[2:]))
        if Gbdt is not None:
            tr = [index[id(s)] for s in shop_train]
            va = [index[id(s)] for s in shop_valid]
            y_train = np.array([s.label for s in shop_train])
            for rich, name in ((False, GBDT_COUNTS), (True, GBDT_RICH)):
                model = Gbdt(random_state=seed, **GBDT).fit(X[rich][tr], y_train)
                rows[name].append(roc_auc(y_valid, model.predict_proba(X[rich][va])[:, 1]))
        shown = ", ".join(f"{SHORT.get(k, k)} {v[-1]:.3f}" for k, v in rows.items())
        log(f"seed {seed}: {len(valid_s)} validation sessions, {int(y_valid.sum())} buying; "
            f"{shown} ({time.time() - t0:.0f} s)")  # fmt: skip
    return dict(rows)


def _std(v: np.ndarray) -> float:
    return float(np.std(v, ddof=1 if len(v) > 1 else 0))


def table(rows: dict[str, list[float]]) -> str:
    """The Markdown table: mean ± std (ddof 1) over the seeds, the paired gains and, with a
    Bayes row, the rich rows as a fraction of it (mean of the per-seed ratios)."""
    lines = ["| model | AUC at the last input event |", "| --- | --- |"]
    for name, v in rows.items():
        lines.append(f"| {name} | {np.mean(v):.3f} ± {_std(np.array(v)):.3f} |")
    for label, more, less in GAINS:
        if rows.get(more) and rows.get(less):
            d = np.array(rows[more]) - np.array(rows[less])
            lines.append(f"| {label} (paired) | {d.mean():+.3f} ± {_std(d):.3f}, ahead on "
                         f"{int((d > 0).sum())} of {len(d)} seeds |")  # fmt: skip
    for name in RATIOS:
        if rows.get(name) and rows.get(BAYES):
            r = np.array(rows[name]) / np.array(rows[BAYES])
            lines.append(f"| {name} as a fraction of the Bayes-optimal AUC (mean of per-seed "
                         f"ratios) | {r.mean():.3f} ± {_std(r):.3f}, lowest {r.min():.3f} "
                         "|")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.benchmarks.real_shop",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--data", type=Path, default=None,
                   help="Open CDP / REES46 CSV (.gz ok), e.g. the first rows of Kaggle's "
                   "2019-Oct.csv")  # fmt: skip
    p.add_argument("--generator", action="store_true",
                   help="model/data/rich_shop.py's synthetic shop instead of --data")  # fmt: skip
    p.add_argument("--users", type=int, default=3000, help="--generator: users")
    p.add_argument("--seeds", type=int, default=10, help="seeds of user splits: 0..N-1")
    p.add_argument("--epochs", type=int, default=None, help="default: TrainConfig's")
    args = p.parse_args(argv)
    print(f"machine: {machine_line()}")
    bayes = None
    if args.generator:
        from model.data.rich_shop import rich_shop

        events, bayes = rich_shop(args.users, seed=0)
        print(f"data: model/data/rich_shop.py, {args.users} users, seed 0")
    else:
        path = args.data
        if path is None or not path.exists():
            print(f"error: no data at {path} (--data FILE: an Open CDP / REES46 CSV)",
                  file=sys.stderr)  # fmt: skip
            return 2
        events = read_opencdp(path)
        print(f"data: {path}; credit: {CREDIT}")
    rows = run(events, list(range(args.seeds)), args.epochs, bayes)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
