"""The real worker process against a plain consumer (`intentstream bench --against-plain`).

The plain consumer is what an outsider writes with redis-py and no model (as described in the
issue that set the goal): read a batch (XREADGROUP), one pipeline of HMGETs of its distinct
users' states (h, last_id), one pipeline of writes (an HSET of h and last_id per user, h the
size a model of --hidden units writes, and per event an XADD of its score and an XACK). It
scores nothing and keeps no history, no producer ids and no exactly-once checks: a floor for
the work a scorer cannot avoid. Each round runs both over the same preloaded backlog, the
order alternated between rounds; both are timed from their first score entry's id time to
their last's (Redis's clock), so start-up is not counted in either.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import redis

from worker.bench.latency_phase import id_ms
from worker.bench.load import backlog, redis_cpu, start_worker, stop
from worker.bench.workload import GROUP, SCORES, STATE, STREAM, preload

GOAL = 2.0  # the worker's events/s over the plain consumer's, in every round


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The comparison's flag on the bench's parser."""
    p.add_argument("--against-plain", action="store_true",
                   help="run the real worker process and a plain redis-py consumer (no model) "
                   "over the same backlog, alternated --repeat times, and print their ratio "
                   "per round")  # fmt: skip


def consume_plainly(r: redis.Redis, n: int, batch: int, hidden: int) -> None:
    """The plain consumer over n entries of the backlog (see the module's docstring); a
    user without a state gets a zero h of `hidden` float32, as a scorer writes one."""
    zero = bytes(4 * hidden)
    done = 0
    while done < n:
        reply = r.xreadgroup(GROUP, "plain", {STREAM: ">"}, count=batch, block=100)
        entries = reply[0][1] if reply else []
        if not entries:
            continue
        users = list(dict.fromkeys(f[b"user_id"] for _, f in entries))
        keys = [STATE + u.decode() for u in users]
        reads = r.pipeline(transaction=False)
        for key in keys:
            reads.hmget(key, "h", "last_id")
        states = {u: h for u, (h, _) in zip(users, reads.execute(), strict=True)}
        last = {f[b"user_id"]: eid for eid, f in entries}
        writes = r.pipeline(transaction=False)
        for key, user in zip(keys, users, strict=True):
            writes.hset(key, mapping={"h": states[user] or zero, "last_id": last[user]})
        for eid, f in entries:
            writes.xadd(SCORES, {"user_id": f[b"user_id"], "score": 0.0, "event_id": eid})
            writes.xack(STREAM, GROUP, eid)
        writes.execute()
        done += len(entries)


def plain_rate(r: redis.Redis, n: int, batch: int, hidden: int) -> tuple[float, float]:
    """(events/s from the first score entry to the last, Redis CPU µs/event) of the plain
    consumer over the preloaded backlog."""
    cpu0 = redis_cpu(r)
    consume_plainly(r, n, batch, hidden)
    cpu = redis_cpu(r) - cpu0
    first = r.xrange(SCORES, count=1)[0][0]
    last = r.xrevrange(SCORES, count=1)[0][0]
    seconds = max(0.001, (id_ms(last) - id_ms(first)) / 1000)
    return n / seconds, cpu / n * 1e6


def worker_rate(
    r: redis.Redis, url: str, model: Path, n: int, args: argparse.Namespace
) -> tuple[float, float, float]:
    """(events/s, Redis CPU µs/event, worker CPU µs/event) of the real `intentstream worker`
    over the backlog."""
    with open(Path(model).parent / "worker-plain.log", "ab") as log:
        proc = start_worker(url, model, args.batch_size, args.history_events, log, args.layout)
        try:
            return backlog(r, proc, n)
        finally:
            stop(proc)


def run_against_plain(
    r: redis.Redis, url: str, model: Path, events: list[dict], args: argparse.Namespace
) -> list[float]:
    """Alternate the worker and the plain consumer over --repeat rounds; print each run and
    each round's ratio; return the ratios."""
    print(f"the real worker process (history-events {args.history_events}, producer ids "
          f"{'on' if args.event_ids else 'off'}, layout {args.layout}) against a plain "
          "consumer, events/s from first score to last:")  # fmt: skip
    ratios = []
    for k in range(max(1, args.repeat)):
        rates: dict[str, tuple[float, ...]] = {}
        busy = os.getloadavg()[0]
        for who in ("worker", "plain") if k % 2 == 0 else ("plain", "worker"):
            preload(r, events, args.event_ids)
            time.sleep(0.5)  # the preload's writes settle before the clock starts
            if who == "worker":
                rates[who] = worker_rate(r, url, model, len(events), args)
            else:
                rates[who] = plain_rate(r, len(events), args.batch_size, args.hidden)
        ratio = rates["worker"][0] / rates["plain"][0]
        ratios.append(ratio)
        worker, plain = rates["worker"], rates["plain"]
        print(f"  round {k + 1}: worker {worker[0]:,.0f} ev/s (Redis {worker[1]:.1f} µs/ev, "
              f"worker {worker[2]:.1f}), plain {plain[0]:,.0f} ev/s (Redis {plain[1]:.1f} "
              f"µs/ev): {ratio:.2f}x; load average {busy:.2f} at its start",
              flush=True)  # fmt: skip
    every = all(x >= GOAL for x in ratios)
    print(f"worker / plain: median {np.median(ratios):.2f}x, lowest {min(ratios):.2f}x; "
          f"{'every' if every else 'not every'} round at {GOAL:.1f}x or more")  # fmt: skip
    return ratios
