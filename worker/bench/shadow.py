"""What a shadow model costs the worker (`intentstream bench --shadow`).

Rounds of the in-process worker (the bench's variant a) over the same backlog, the two
variants alternated in each round and rotated between rounds:
  current  the current model alone
  shadow   the same, with a second model of the same size scoring every event beside it as
           a shadow (docs/models.md): both models' states read, stepped and written, the
           shadow's score on every score entry
Worker CPU is this process's user + system time from the first tick to the last (start-up
and the kernels' warm-up excluded); Redis CPU is INFO cpu over the same run. Figures are
medians over rounds; ratios are medians of the same round's ratios.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import redis

from model.artifact import save_model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE
from model.random_init import random_model
from worker.bench.inprocess import Timed, timed_backlog
from worker.bench.workload import SCORES, preload

VARIANTS = ("current", "shadow")
WARM_UP_EVENTS = 20_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The shadow bench's flag on the bench's parser."""
    p.add_argument("--shadow", action="store_true",
                   help="run the shadow bench instead of the variants: the worker with its "
                   "model alone and with a shadow model of the same size beside it, "
                   "alternated --repeat times")  # fmt: skip


def shadow_model_file(args: argparse.Namespace, into: Path) -> Path:
    """A model as the bench's (its cell, size and event types), with other weights."""
    shadow = random_model([*EVENT_TYPES, LABEL_TYPE], hidden=args.hidden, seed=1,
                          cell=args.cell)  # fmt: skip
    path = into / "shadow.npz"
    save_model(shadow, path)
    return path


def run_once(
    r: redis.Redis, url: str, model_path: Path, shadow: Path | None, events: list[dict],
    args: argparse.Namespace, variant: str,
) -> Timed:  # fmt: skip
    """Preload and time the in-process worker over the backlog (with `shadow` beside it)."""
    preload(r, events, args.event_ids)
    run = timed_backlog(r, url, model_path, len(events), args.batch_size, args.history_events,
                        shadow)  # fmt: skip
    if (shadow is not None) != _shadow_scored(r):
        raise RuntimeError(f"variant {variant}: the score entries do not match it (a shadow "
                           "score where none runs, or none where one does)")  # fmt: skip
    return run


def _shadow_scored(r: redis.Redis) -> bool:
    last = r.xrevrange(SCORES, count=1)
    return bool(last) and b"shadow_score" in last[0][1]


def _ratios(runs: dict[str, list[Timed]], of) -> list[float]:
    return sorted(of(x) / of(y) for x, y in zip(runs["shadow"], runs["current"], strict=True))


def print_table(runs: dict[str, list[Timed]]) -> None:
    """Medians per variant and the shadow's ratios against the current model alone."""
    names = {"current": "the current model alone", "shadow": "with a shadow model"}
    print(f"{'variant':<26} {'events/s':>9} {'worker µs/ev':>12} {'redis µs/ev':>11}  "
          f"runs (events/s)")  # fmt: skip
    for variant, rs in runs.items():
        print(f"{names[variant]:<26} {np.median([x.rate for x in rs]):>9,.0f} "
              f"{np.median([x.worker_us for x in rs]):>12.2f} "
              f"{np.median([x.redis_us for x in rs]):>11.2f}  "
              + " ".join(f"{x.rate:,.0f}" for x in rs))  # fmt: skip
    rates = _ratios(runs, lambda x: x.rate)
    cpus = _ratios(runs, lambda x: x.worker_us)
    reds = _ratios(runs, lambda x: x.redis_us)
    print(f"\nwith a shadow against without (medians of same-round ratios): events/s "
          f"{np.median(rates):.3f} ({', '.join(f'{v:.3f}' for v in rates)}), worker CPU per "
          f"event {np.median(cpus):.3f}, Redis CPU per event {np.median(reds):.3f}")  # fmt: skip


def run_shadow_bench(
    r: redis.Redis, url: str, model_path: Path, events: list[dict], args: argparse.Namespace,
    tmp: Path,
) -> dict[str, list[Timed]]:  # fmt: skip
    """Alternate the variants over --repeat rounds, print each run and the table."""
    shadow = shadow_model_file(args, tmp)
    files = {"current": None, "shadow": shadow}
    # the shadow's kernels and state layout load on its first batches: not in a round
    run_once(r, url, model_path, shadow, events[:WARM_UP_EVENTS], args, "warm-up")
    runs: dict[str, list[Timed]] = {v: [] for v in VARIANTS}
    for k in range(max(1, args.repeat)):
        for variant in VARIANTS[k % 2 :] + VARIANTS[: k % 2]:
            run = run_once(r, url, model_path, files[variant], events, args, variant)
            runs[variant].append(run)
            print(f"  {variant:<8} {run.rate:>9,.0f} ev/s  worker {run.worker_us:6.2f} µs/ev  "
                  f"redis {run.redis_us:5.2f} µs/ev", flush=True)  # fmt: skip
    print()
    print_table(runs)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return runs
