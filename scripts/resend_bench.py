"""The worker's pipeline without Redis (worker/bench/pipeline_cpu.py: parse, states from the
cache, build_commit, the commit packed) over synthetic events that carry their own event
ids, for the code tree on PYTHONPATH: µs of process time per event, one line per round. Run
it for two trees alternately to compare them. Usage (BENCHMARKS.md, "Producers"):

    PYTHONPATH=<tree> .venv/bin/python scripts/resend_bench.py EVENTS USERS ROUNDS
"""

from __future__ import annotations

import sys

from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.random_init import random_model
from model.scoring import ScoringModel
from worker.bench.pipeline_cpu import entries_of, step_seconds
from worker.engine.compute import resends
from worker.engine.models import tune_gc


def main(events: int, users: int, rounds: int) -> None:
    model = ScoringModel(random_model([*EVENT_TYPES, LABEL_TYPE], hidden=64, seed=0), "1")
    model.warm_up()
    resends.warm_up()
    batches = entries_of(list(synthetic_events(events, users, seed=1)), ())
    tune_gc()
    n = sum(map(len, batches))
    for _ in range(rounds):
        seconds = sum(step_seconds(model, batches, 32))
        print(f"{seconds / n * 1e6:.3f} µs/event", flush=True)


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
