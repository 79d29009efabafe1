"""What declared inputs cost the worker (`intentstream bench --inputs`).

Rounds of the in-process worker (the bench's variant a) over one backlog whose events carry
a product, its category, brand and price, the variants alternated in each round and rotated
between rounds:
  plain   a type-only model of the same size: the fields travel, nothing reads them
  rich    the same cell with the declared inputs a shop would declare: product_id (item),
          category_code and brand (categorical), price (numeric, log1p) — three hashed
          fields and one numeric, 1,024 buckets and 8 dimensions each, as `train` defaults
A third row, `bare`, is the type-only model on the same events without their fields (what
carrying them costs Redis and the parse). Worker CPU is this process's user + system time
over the run; Redis CPU is INFO cpu over the same run; the state's size is MEMORY USAGE of
sampled state keys after the run (the rich model keeps each user's item memory there).
Figures are medians over rounds; ratios are medians of the same round's ratios. Then the
same two models through the worker's pipeline without Redis (worker/bench/pipeline_cpu.py):
the computation's share of the cost.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from model.artifact import load_model, save_model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE
from model.random_init import random_model
from model.scoring import ScoringModel
from worker.bench.inprocess import timed_backlog
from worker.bench.pipeline_cpu import entries_of, pipeline_cost, print_pipeline_cost
from worker.bench.workload import preload, sampled_state_keys

FIELDS = ("product_id", "category_code", "brand", "price")
INPUTS = [
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 4.0, "scale": 1.2},
    {"kind": "categorical", "name": "category_code", "buckets": 1024, "dim": 8},
    {"kind": "categorical", "name": "brand", "buckets": 1024, "dim": 8},
    {"kind": "item", "name": "product_id", "buckets": 1024, "dim": 8},
]
VARIANTS = ("plain", "rich", "bare")
STATE_SAMPLE = 500  # state keys whose MEMORY USAGE is read after a run


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The inputs bench's flag on the bench's parser."""
    p.add_argument("--inputs", action="store_true",
                   help="run the declared-inputs bench instead of the variants: a type-only "
                   "model against one reading product, category, brand and price from the "
                   "same events, alternated --repeat times")  # fmt: skip


def with_fields(events: list[dict], seed: int = 2) -> list[dict]:
    """The events with a shop's fields: each user browses a few products of a catalogue of
    20,000 (popularity Zipf-like), each product with its category, brand and price."""
    rng = np.random.default_rng(seed)
    n_products = 20_000
    category = rng.integers(0, 300, n_products)
    brand = rng.integers(0, 2_000, n_products)
    price = np.round(rng.lognormal(3.5, 1.2, n_products), 2)
    favourite: dict[str, int] = {}
    popular = np.minimum((rng.pareto(1.2, len(events)) * 50).astype(np.int64), n_products - 1)
    again = rng.random(len(events)) < 0.4  # a user comes back to their product
    out = []
    for i, e in enumerate(events):
        user = e["user_id"]
        product = favourite[user] if again[i] and user in favourite else int(popular[i])
        favourite[user] = product
        fields = {"product_id": f"{product}", "category_code": f"cat.{category[product]}",
                  "brand": f"brand{brand[product]}", "price": f"{price[product]:.2f}"}  # fmt: skip
        out.append(e | fields)
    return out


@dataclass(frozen=True)
class Run:
    """One variant's run over the backlog."""

    variant: str
    rate: float  # events/s
    worker_us: float  # worker CPU per event
    redis_us: float  # Redis CPU per event
    state_bytes: float  # median MEMORY USAGE of a state key


def median_state_bytes(r: redis.Redis) -> float:
    """The median MEMORY USAGE of up to STATE_SAMPLE state keys of partition 0."""
    keys = sampled_state_keys(r, STATE_SAMPLE)
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return float(np.median([b or 0 for b in pipe.execute()])) if keys else 0.0


def run_once(
    r: redis.Redis, url: str, model_path: Path, events: list[dict], args: argparse.Namespace,
    variant: str, fields: tuple[str, ...],
) -> Run:  # fmt: skip
    """Preload (with the fields given), and time the in-process worker over the backlog."""
    preload(r, events, args.event_ids, fields)
    run = timed_backlog(r, url, model_path, len(events), args.batch_size, args.history_events)
    return Run(variant, run.rate, run.worker_us, run.redis_us, median_state_bytes(r))


def _median(values) -> float:
    return float(np.median(list(values)))


def print_table(runs: dict[str, list[Run]], names: dict[str, str]) -> None:
    """Medians per variant, the rich model's extra CPU per event and state bytes."""
    print(f"{'variant':<44} {'events/s':>9} {'worker µs/ev':>12} {'redis µs/ev':>11} "
          f"{'state B':>8}  runs (events/s)")  # fmt: skip
    for variant, rs in runs.items():
        print(f"{names[variant]:<44} {_median(x.rate for x in rs):>9,.0f} "
              f"{_median(x.worker_us for x in rs):>12.2f} {_median(x.redis_us for x in rs):>11.2f} "
              f"{_median(x.state_bytes for x in rs):>8,.0f}  "
              + " ".join(f"{x.rate:,.0f}" for x in rs))  # fmt: skip
    pairs = list(zip(runs["rich"], runs["plain"], strict=True))
    extra = sorted(x.worker_us - y.worker_us for x, y in pairs)
    ratio = sorted(x.rate / y.rate for x, y in pairs)
    grown = _median(x.state_bytes for x, _ in pairs) - _median(y.state_bytes for _, y in pairs)
    rounds = ", ".join(f"{v:.2f}" for v in extra)
    print(f"\nthe inputs add {np.median(extra):.2f} µs of worker CPU per event (rounds: "
          f"{rounds}; goal <= 2), events/s {np.median(ratio):.3f} of the plain model's; "
          f"a state grows by {grown:,.0f} bytes")  # fmt: skip


def run_inputs_bench(r: redis.Redis, url: str, events: list[dict], args: argparse.Namespace,
                     tmp: Path) -> dict[str, list[Run]]:  # fmt: skip
    """Alternate the variants over --repeat rounds, print each run and the table."""
    types = [*EVENT_TYPES, LABEL_TYPE]
    plain, rich = tmp / "plain.npz", tmp / "rich.npz"
    save_model(random_model(types, hidden=args.hidden, seed=0, cell=args.cell), plain)
    save_model(random_model(types, hidden=args.hidden, seed=0, cell=args.cell, inputs=INPUTS),
               rich)  # fmt: skip
    events = with_fields(events)
    variants = {"plain": (plain, FIELDS), "rich": (rich, FIELDS), "bare": (plain, ())}
    names = {
        "plain": "type-only model, events with the 4 fields",
        "rich": "the model reading the 4 fields",
        "bare": "type-only model, bare events",
    }
    print("declared inputs: " + ", ".join(f"{d['name']} ({d['kind']})" for d in INPUTS))
    run_once(r, url, rich, events[:20_000], args, "warm-up", FIELDS)  # the input kernels load
    runs: dict[str, list[Run]] = {v: [] for v in VARIANTS}
    for k in range(max(1, args.repeat)):
        for variant in VARIANTS[k % 3 :] + VARIANTS[: k % 3]:
            path, fields = variants[variant]
            run = run_once(r, url, path, events, args, variant, fields)
            runs[variant].append(run)
            print(f"  {names[variant]:<44} {run.rate:>9,.0f} ev/s  worker {run.worker_us:6.2f} "
                  f"µs/ev  redis {run.redis_us:5.2f} µs/ev  state {run.state_bytes:,.0f} B",
                  flush=True)  # fmt: skip
    print()
    print_table(runs, names)
    plain_model, rich_model = (ScoringModel(load_model(x), "1") for x in (plain, rich))
    for m in (plain_model, rich_model):
        m.warm_up()
    batches = entries_of(events, FIELDS)
    print_pipeline_cost(*pipeline_cost(plain_model, rich_model, batches, args.history_events,
                                       max(3, args.repeat)))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return runs
