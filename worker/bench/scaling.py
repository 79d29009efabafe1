"""Scaling benchmark: real `intentstream worker` processes on one Redis or a local cluster.

    intentstream bench --workers 1,2,4 --partitions 8 [--cluster] [--events 200000]

For each worker count, a run (runs.py: a backlog behind a gate, then a latency phase) on a
private Redis (or a private 3-master, 3-replica cluster) flushed between runs; then a table of
events/s, latency and CPU per event, and the fleet each target rate needs. With several
--partitions or --against-one, comparisons.py's rounds instead.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from tempfile import TemporaryDirectory

from model.artifact import save_model
from model.benchmarks.kernels import machine_line
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.random_init import random_model
from worker.bench.comparisons import compare_cluster, compare_interleaved, compare_partitions
from worker.bench.runs import Run, Servers, run_one
from worker.common.cli_help import HelpFormatter
from worker.common.settings import DEFAULT_BATCH_SIZE

TARGETS = (10_000, 100_000, 1_000_000)
HEADROOM = 0.7  # plan shards and workers to run at 70% of a core


def print_table(runs: list[Run], cluster: bool) -> None:
    head = (f"{'workers':>7} {'events/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'worker µs/ev':>12} "
            f"{'redis µs/ev':>11} {'exec+lua µs/ev':>14}")  # fmt: skip
    print(head + (f" {'replica µs/ev':>13}" if cluster else f" {'seen p50':>8} {'seen p99':>8}"))
    for r in runs:
        line = (f"{r.workers:>7} {r.rate:>9,.0f} {r.p50 * 1e3:>7.1f} {r.p99 * 1e3:>7.1f} "
                f"{r.per_event_us(r.worker_cpu):>12.1f} {r.per_event_us(r.redis_cpu):>11.1f} "
                f"{r.per_event_us(r.redis_cmd):>14.1f}")  # fmt: skip
        seen = f" {r.seen_p50 * 1e3:>8.2f} {r.seen_p99 * 1e3:>8.2f}"
        print(line + (f" {r.per_event_us(r.replica_cpu):>13.1f}" if cluster else seen))


def print_fleet(runs: list[Run], partitions: int, cluster: bool) -> None:
    """Redis µs/event per shard -> events/s per shard -> shards and workers per target."""
    # the costliest run's figures: more workers mean smaller batches, which cost more
    redis_us = max(r.per_event_us(r.redis_cpu) for r in runs)
    worker_us = max(r.per_event_us(r.worker_cpu) for r in runs)
    per_shard = HEADROOM * 1e6 / redis_us
    per_worker = HEADROOM * 1e6 / worker_us
    print(f"\nfleet arithmetic (the costliest run's CPU per event; each Redis shard and worker at "
          f"{HEADROOM:.0%} of one core):")  # fmt: skip
    print(f"  Redis {redis_us:.1f} µs of primary CPU per event (all primaries together): "
          f"one shard carries {HEADROOM:.0%} x 1e6 / {redis_us:.1f} = {per_shard:,.0f} "
          "events/s")  # fmt: skip
    if cluster:
        replica_us = max(r.per_event_us(r.replica_cpu) for r in runs)
        print(f"  and each shard's replica spends {replica_us:.1f} µs per event on its own core")
    print(f"  worker {worker_us:.1f} µs/event -> {per_worker:,.0f} events/s per worker process")
    for target in TARGETS:
        need_shards = math.ceil(target / per_shard)
        need_workers = math.ceil(target / per_worker)
        print(f"  {target:>9,} events/s: {need_shards:>3} shard(s), {need_workers:>3} worker(s), "
              f"P >= {max(need_shards, need_workers)} partitions")  # fmt: skip
    print(
        f"  (this run: P = {partitions}; a partition lives in one slot, so P bounds both "
        "the shards that get load and the workers that get work)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="intentstream bench --workers",
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
    )
    p.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    p.add_argument("--partitions", default="8",
                   help="partitions of the streams; several (1,8): each of --rounds runs one "
                   "worker (the first count) at each in turn (in reverse every other round), "
                   "and prints each one's seen p50, its ratio to the first's, and the median "
                   "ratio's 90%% interval over the rounds")  # fmt: skip
    p.add_argument("--interleaved", action="store_true",
                   help="with several --partitions on one Redis: the counts side by side, each "
                   "on a Redis and workers of its own, started once; each round's latency "
                   "phase sends every count its bursts in turn (spread over each period when 5 "
                   "ms apart or more, as two counts' at the default 10 ms; else a second at a "
                   "time), so a round's runs share the host's same seconds (needs "
                   "--latency-rate; no backlog)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds, with several --partitions or --against-one")  # fmt: skip
    p.add_argument("--cluster", action="store_true", help="a local 3-master, 3-replica cluster")
    p.add_argument("--against-one", action="store_true",
                   help="with --cluster: each of --rounds runs the worker (the first count) "
                   "on the cluster and on one Redis (one Redis first every other round), and "
                   "prints each pair's events/s, Redis "
                   "CPU per event and p50 as the cluster's over one Redis's, and their "
                   "medians")  # fmt: skip
    p.add_argument("--replicas", type=int, default=1,
                   help="replicas per master with --cluster (0: none)")  # fmt: skip
    p.add_argument("--aof", action="store_true",
                   help="Redis (every node of a cluster) keeps an AOF, fsync every second, as "
                   "deploy/redis/redis.conf runs it; default: no persistence, on one Redis "
                   "and on a cluster alike")  # fmt: skip
    p.add_argument("--events", type=int, default=200_000, help="backlog size")
    p.add_argument("--users", type=int, default=50_000, help="distinct users in the backlog")
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the random model")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="entries per read (the worker's default)")  # fmt: skip
    p.add_argument("--latency-seconds", type=float, default=5.0, help="the latency phase")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="OPENBLAS_NUM_THREADS for the workers (default: inherited)")  # fmt: skip
    p.add_argument("--latency-load", type=float, default=0.5,
                   help="latency phase rate, as a fraction of the backlog rate")  # fmt: skip
    p.add_argument("--latency-rate", type=float, default=None,
                   help="latency phase rate in events/s (instead of --latency-load)")  # fmt: skip
    p.add_argument("--latency-every-ms", type=float, default=10.0,
                   help="the latency phase publishes its events in bursts this far apart (1 at "
                   "1,000 events/s: one by one, as a shop's come)")  # fmt: skip
    p.add_argument("--latency-poisson", action="store_true",
                   help="the latency phase publishes its events one by one at random "
                   "gaps (exponential, 1 / rate on average: many users' clicks), not in "
                   "bursts")  # fmt: skip
    args = p.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",") if n.strip()]
    sizes = [int(n) for n in args.partitions.split(",") if n.strip()]
    args.partitions = sizes[0]
    if args.interleaved and (len(sizes) < 2 or args.cluster or not args.latency_rate):
        p.error("--interleaved compares several --partitions on one Redis at a --latency-rate")
    servers = Servers(args.cluster, args.replicas, args.aof)
    try:
        with TemporaryDirectory() as tmp:
            model = Path(tmp) / "bench.npz"
            save_model(random_model([*EVENT_TYPES, LABEL_TYPE], hidden=args.hidden, seed=0),
                       model)  # fmt: skip
            backlog = 0 if args.interleaved else args.events  # side by side: latency alone
            events = list(synthetic_events(backlog, args.users, seed=1))
            version = servers.nodes[0].info("server")["redis_version"]
            where = "one Redis"
            if args.cluster:
                where = f"local cluster, {len(servers.primaries())} primaries + "
                where += f"{len(servers.replicas())} replicas"
            print(f"machine: {machine_line()}, load average {os.getloadavg()[0]:.2f} at start")
            where += ", AOF (fsync every second)" if args.aof else ", no persistence"
            print(f"redis {version}: {where}; {len(events)} events backlog, {args.users} "
                  f"users, P = {','.join(map(str, sizes))}, H = {args.hidden}, batch "
                  f"{args.batch_size}")  # fmt: skip
            blas = os.environ.get("OPENBLAS_NUM_THREADS", "OpenBLAS's default")
            blas = blas if args.blas_threads is None else args.blas_threads
            at = (
                f"{args.latency_rate:,.0f} events/s"
                if args.latency_rate
                else f"{args.latency_load:.0%} of the backlog rate"
            )
            arrivals = ("one by one at random gaps (Poisson)" if args.latency_poisson
                        else f"a burst every {args.latency_every_ms:g} ms")  # fmt: skip
            print(f"latency: {args.latency_seconds:.0f} s at {at} ({arrivals}), entry to "
                  f"score (ids); worker BLAS threads: {blas}\n")  # fmt: skip
            if len(sizes) > 1 and args.interleaved:
                compare_interleaved(servers, counts[0], sizes, args, model, Path(tmp))
                return 0
            if len(sizes) > 1:
                compare_partitions(servers, counts[0], sizes, args, events, model, Path(tmp))
                return 0
            if args.cluster and args.against_one:
                one = Servers(False, 0, args.aof)
                try:
                    compare_cluster(servers, one, counts[0], args, events, model, Path(tmp))
                finally:
                    one.close()
                return 0
            runs = []
            for n in counts:
                runs.append(run_one(servers, n, args, events, model, Path(tmp)))
                print(f"  {n} worker(s): {runs[-1].rate:,.0f} events/s", flush=True)
            print()
            print_table(runs, args.cluster)
            print_fleet(runs, args.partitions, args.cluster)
    finally:
        servers.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
