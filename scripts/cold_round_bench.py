"""A low-traffic round's CPU without Redis, on cold caches, for the code tree on PYTHONPATH:
rounds of 10 events over P = 1 and over P = 8 partitions alternated in one process, each after
a 10 ms sleep, as between two rounds at 1,000 events/s. At low traffic a round runs on caches
that other work evicted meanwhile, 3-15x its warm CPU on a shared VM, so a warm loop's figures
mislead (docs/experiments.md, Open leads). Each round goes the worker's way up to its EXEC:
the parse, the states' requests, early checks and reads' packing and their completion (as if
every user were new), the build (one batch, or the group as one: compute/joint.py), the
writes' packing (Committer.prepare, or adapters/group_packing.py) and each commit's
transaction body. Prints the median µs of each step and of the paired P = 8 / P = 1 ratio.
The ratio is the steady figure (1.29-1.38 in 7 runs on one VM); the µs drift 20-30% from one run
to the next there, so compare two trees by their ratios, or by many alternated runs. Usage:

    PYTHONPATH=<tree> .venv/bin/python scripts/cold_round_bench.py [ROUNDS]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import redis

from model.data.synthetic import EVENT_TYPES, LABEL_TYPE
from model.random_init import random_model
from model.scoring import ScoringModel
from worker.common.dedup import ResendWindow
from worker.common.keys import Keys, partition_of
from worker.engine.adapters.commit import CommitLimits, Committer
from worker.engine.adapters.early_checks import EarlyChecks
from worker.engine.adapters.group_packing import prepared_group
from worker.engine.adapters.states import FIELDS, StateReader
from worker.engine.compute.batch import parse_batch
from worker.engine.compute.joint import build_group
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.state_cache import StateCache
from worker.engine.compute.user_states import distinct_users
from worker.engine.models import tune_gc

STEPS = ("parse", "states", "build", "pack", "writes")
MODEL = ScoringModel(random_model([*EVENT_TYPES, LABEL_TYPE], hidden=64, seed=0))
COMMITTER = Committer(redis.Redis(), Keys(), "bench", CommitLimits(1000, 100, 64, 0))
EARLY = EarlyChecks(COMMITTER)
RESENDS = ResendWindow()


def entries(partitions: int, rng: np.random.Generator, first: int) -> dict[int, list]:
    """10 events of new users now, as XREADGROUP returns them, by partition."""
    now, out = int(time.time() * 1000), {}
    for n in range(first, first + 10):
        user = f"user-{rng.integers(10**9)}"
        fields = [b"user_id", user.encode(), b"type", EVENT_TYPES[n % 5].encode(), b"ts",
                  str(now).encode(), b"event_id", f"e{n}".encode()]  # fmt: skip
        out.setdefault(partition_of(user, partitions), []).append([f"{now}-{n}".encode(), fields])
    return out


def one_round(partitions: int, raw: dict[int, list]) -> list[float]:
    """The seconds of each step of one round over `raw`."""
    reader = StateReader(redis.Redis(), Keys(), StateCache(10**6), lambda version: version)
    t = [time.perf_counter()]
    batches = [parse_batch(p, r, partitions, 3_600_000) for p, r in sorted(raw.items())]
    t.append(time.perf_counter())
    requests = [reader.request(b.partition, distinct_users(b)) for b in batches]
    for b in batches:
        EARLY.of(b)
    reader.commands(requests)
    flats = [[b"5", *[None] * (len(FIELDS) * len(r.misses))] for r in requests]
    shape, space = MODEL.state_shape, MODEL.version
    if len(batches) > 1:
        joined = reader.complete_all(requests, flats, shape, space)
        assert joined is not None
        together, states = joined
    else:
        states = [reader.complete(requests[0], flats[0], shape, space)]
    t.append(time.perf_counter())
    if len(batches) > 1:
        group = build_group(batches, states, MODEL, 32, None, RESENDS, None, together)
        assert group is not None
        commits = group.commits
        t.append(time.perf_counter())
        prepared = prepared_group(COMMITTER, group) or [COMMITTER.prepare(c) for c in commits]
    else:
        commits = [build_commit(batches[0], states[0], MODEL, 32, None, RESENDS, None)]
        t.append(time.perf_counter())
        prepared = [COMMITTER.prepare(commits[0])]
    t.append(time.perf_counter())
    for c, packed in zip(commits, prepared, strict=True):
        COMMITTER.writes(c, packed, b"", 0)
    t.append(time.perf_counter())
    return list(np.diff(t))


def main(rounds: int) -> None:
    tune_gc()
    rng = np.random.default_rng(1)
    steps: dict[int, list[list[float]]] = {1: [], 8: []}
    for i in range(rounds + 20):
        for partitions in (1, 8) if i % 2 else (8, 1):
            raw = entries(partitions, rng, 10 * i)
            time.sleep(0.01)
            took = one_round(partitions, raw)
            if i >= 20:  # the first rounds load and compile
                steps[partitions].append(took)
    ratios = np.sum(steps[8], axis=1) / np.sum(steps[1], axis=1)
    for partitions, rows in steps.items():
        medians = np.median(np.asarray(rows) * 1e6, axis=0)
        total = np.median(np.sum(rows, axis=1)) * 1e6
        cells = "  ".join(f"{s} {m:.0f}" for s, m in zip(STEPS, medians, strict=True))
        print(f"P = {partitions}: {cells}  total {total:.0f} µs (medians of {len(rows)} rounds)")
    print(f"P = 8 / P = 1, paired by round: median {np.median(ratios):.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
