"""publish() then the in-process worker (the bench's variant a) for the code tree on
PYTHONPATH: producer events/s and Redis CPU per event, worker events/s and Redis CPU per
event, state bytes per user. One JSON line. Usage (BENCHMARKS.md, "Producers"):

    PYTHONPATH=<tree> .venv/bin/python scripts/producer_bench.py EVENTS USERS fcall|xadd
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import redis

from model.artifact import save_model
from model.data.synthetic import synthetic_events
from model.random_init import random_model
from worker.bench.throughput import run_worker
from worker.common.keys import Keys
from worker.common.local_redis import LocalRedis
from worker.common.settings import Settings
from worker.producers.publisher import publish

TYPES = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout", "purchase"]


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    n, users, via = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    events = list(synthetic_events(n, users, seed=1))
    model = Path(tempfile.mkdtemp()) / "m.npz"
    save_model(random_model(TYPES, hidden=64, features=["gap"], seed=3), model)
    keys, group = Keys(), Settings.model_fields["group"].default
    with LocalRedis(extra=("--hash-max-listpack-value", "1024")) as server:
        r = redis.Redis.from_url(server.url)
        if via == "fcall":  # as a running worker leaves it (trees with the function only)
            from worker.producers.append_function import install, set_routes

            install(r)
            set_routes(r, keys, 1, 1)
        cpu0, t0 = redis_cpu(r), time.perf_counter()
        publish(r, events)
        publish_s, publish_cpu = time.perf_counter() - t0, redis_cpu(r) - cpu0
        r.xgroup_create(keys.events(0), group, id="0")
        cpu0 = redis_cpu(r)
        seconds, _ = run_worker(server.url, model, n, 512, False)
        worker_cpu = redis_cpu(r) - cpu0
        states = list(r.scan_iter(keys.state_match(), count=1000))
        state_bytes = sum(r.memory_usage(k, samples=0) for k in states) / len(states)
    print(json.dumps({
        "via": via, "publish_eps": round(n / publish_s),
        "publish_redis_us": round(publish_cpu / n * 1e6, 2),
        "worker_eps": round(n / seconds), "worker_redis_us": round(worker_cpu / n * 1e6, 2),
        "state_bytes": round(state_bytes),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
