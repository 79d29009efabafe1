"""Scaling benchmark: real `intentstream worker` processes on one Redis or a local cluster.

    intentstream bench --workers 1,2,4 --partitions 8 [--cluster] [--events 200000]

For each worker count, on a private Redis (or a private 3-master, 3-replica cluster) that is
flushed between runs: preload a backlog over the partitions, start the workers behind a gate
(the bench holds every partition's lease until all workers are warmed up and announced), open
the gate and time the backlog from its first score to its last (the score entries' ids; the
worker's wait to notice the gate open, a second, is not the backlog's). Then a latency
phase: events published at a fraction of the measured rate (or --latency-rate), and latency
taken from each event's entry id time to its score entry's (Redis's clock both: commit time
minus arrival, not counting the producer's own time to build and send; each a whole ms, the
percentiles read as if each spread over its ms, `whole_ms_percentile`).

CPU: the workers' user+system time from /proc/<pid>/stat, and Redis's `used_cpu_user` +
`used_cpu_sys` from INFO and the commands' own time from INFO commandstats, summed over the
primaries (replicas reported apart), all as deltas over the backlog phase.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import redis

from model.artifact import save_model
from model.benchmarks.kernels import machine_line
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.random_init import random_model
from worker.bench.latency_phase import (
    KEYS,
    Feed,
    latency_phase,
    run_bursts,
    scored,
    wait,
    whole_ms_percentile,
)
from worker.bench.uncertainty import median_interval
from worker.common.cli_help import HelpFormatter
from worker.common.connection import Client, connect
from worker.common.local_redis import LocalCluster, LocalRedis
from worker.common.settings import DEFAULT_BATCH_SIZE
from worker.producers.publisher import publish

GATE = "bench-gate"
TICK = os.sysconf("SC_CLK_TCK")
TARGETS = (10_000, 100_000, 1_000_000)
# the commit's transaction, and the Lua scripts (the commit was one before 2026-12-05)
ATOMIC_COMMANDS = ("exec", "evalsha", "eval", "evalsha_ro", "eval_ro")
HEADROOM = 0.7  # plan shards and workers to run at 70% of a core


@dataclass
class Run:
    """The figures of one worker count."""

    workers: int
    events: int
    seconds: float
    worker_cpu: float  # seconds, summed over the worker processes
    redis_cpu: float  # seconds, summed over the primaries
    redis_cmd: float  # seconds inside EXEC and the scripts (commandstats), primaries
    replica_cpu: float
    p50: float  # seconds
    p99: float
    latency_events: int
    seen_p50: float = math.nan  # seconds, as a reader of the scores saw them (one Redis)
    seen_p99: float = math.nan

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    def per_event_us(self, seconds: float) -> float:
        return seconds / self.events * 1e6


class Servers:
    """The private Redis or cluster, its nodes by role, and a client."""

    def __init__(self, cluster: bool, replicas: int = 1, aof: bool = False) -> None:
        self.cluster = cluster
        # the same persistence on either: AOF with fsync every second, or none
        self.handle = (
            LocalCluster(replicas=replicas, appendonly=aof).start() if cluster
            else LocalRedis(appendonly=aof, extra=("--appendfsync", "everysec")).start()
        )  # fmt: skip
        self.url = self.handle.url
        self.client: Client = connect(self.url, socket_timeout=30, cluster=cluster)
        ports = [n.port for n in self.handle.nodes] if cluster else [self.handle.port]
        self.nodes = [redis.Redis(port=p, socket_timeout=30) for p in ports]

    def primaries(self) -> list[redis.Redis]:
        return [n for n in self.nodes if n.info("replication")["role"] == "master"]

    def replicas(self) -> list[redis.Redis]:
        return [n for n in self.nodes if n.info("replication")["role"] != "master"]

    def flush(self) -> None:
        for node in self.primaries():
            node.flushall()
        for node in self.nodes:
            node.config_resetstat()

    def close(self) -> None:
        self.client.close()
        for n in self.nodes:
            n.close()
        self.handle.close()


def redis_cpu(nodes: list[redis.Redis]) -> tuple[float, float]:
    """(process CPU seconds, seconds inside EXEC and the scripts from commandstats) summed over
    nodes.

    Only their time: commandstats counts a command run by EXEC or a script under its own name
    too, so a sum over every command would count their work twice."""
    cpu = scripts = 0.0
    for node in nodes:
        info = node.info("cpu")
        cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        stats = node.info("commandstats")
        scripts += sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ATOMIC_COMMANDS)
    return cpu, scripts / 1e6


def process_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes, from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / TICK


def start_workers(servers: Servers, n: int, args, model: Path, logs: Path) -> list:
    exe = shutil.which("intentstream") or str(Path(sys.executable).parent / "intentstream")
    procs = []
    for i in range(n):
        cmd = [exe, "worker", "--redis-url", servers.url, "--partitions", str(args.partitions),
               "--model", str(model), "--metrics-port", "0", "--log-format", "json",
               "--consumer", f"bench-{i}", "--lease-ms", "3000", "--block-ms", "100",
               "--batch-size", str(args.batch_size), "--retention-seconds", "0",
               *(["--cluster"] if servers.cluster else [])]  # fmt: skip
        env = dict(os.environ)
        if args.blas_threads is not None:
            env["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
        with open(logs / f"worker-{n}-{i}.log", "ab") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=env))
    return procs


def stop_workers(procs: list) -> None:
    """SIGTERM to each worker, then a kill for any still running after 30 s."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def announced(servers: Servers, n: int, procs: list) -> None:
    """Until `n` workers are warmed up and announced on `servers` (their heartbeats)."""
    now_ms = lambda: int(time.time() * 1000)  # noqa: E731
    wait(lambda: servers.client.zcount(KEYS.workers, now_ms(), "+inf") >= n, 120, "warm-up",
         procs)  # fmt: skip


def scoring_span(client: Client, partitions: int) -> float:
    """Seconds from the first score entry to the last (their ids' times): the backlog's
    time without the worker's wait to notice the gate open (up to lease-ms / 3, a fixed
    second here, added to every run and so pulling every ratio towards 1)."""
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xrange(KEYS.scores(p), count=1)
        pipe.xrevrange(KEYS.scores(p), count=1)
    ends = [int(entries[0][0].split(b"-")[0]) for entries in pipe.execute() if entries]
    return (max(ends) - min(ends)) / 1000 if ends else 0.0


def run_one(servers: Servers, n: int, args, events: list, model: Path, logs: Path) -> Run:
    servers.flush()
    client = servers.client
    publish(client, events, partitions=args.partitions, pipeline_size=5000)
    for p in range(args.partitions):  # the gate: no worker can take a partition yet
        client.set(KEYS.lease(p), GATE, px=600_000)
    procs = start_workers(servers, n, args, model, logs)
    try:
        announced(servers, n, procs)
        pids = [p.pid for p in procs]
        w0, (r0, c0), (q0, _) = (
            process_cpu(pids),
            redis_cpu(servers.primaries()),
            redis_cpu(servers.replicas()),
        )
        t0 = time.monotonic()
        for p in range(args.partitions):
            client.delete(KEYS.lease(p))
        wait(lambda: scored(client, args.partitions) >= len(events), 1800, "the backlog", procs)
        waited = time.monotonic() - t0
        seconds = scoring_span(client, args.partitions) or waited
        w1, (r1, c1), (q1, _) = (
            process_cpu(pids),
            redis_cpu(servers.primaries()),
            redis_cpu(servers.replicas()),
        )
        rate = len(events) / seconds
        fixed = args.latency_rate
        url = None if args.cluster else servers.url
        lat, seen = latency_phase(client, args, fixed or rate * args.latency_load, procs, url)
    finally:
        stop_workers(procs)
    return Run(n, len(events), seconds, w1 - w0, r1 - r0, c1 - c0, q1 - q0,
               whole_ms_percentile(lat, 50) / 1e3, whole_ms_percentile(lat, 99) / 1e3,
               len(lat), *seen_percentiles(seen))  # fmt: skip


def seen_percentiles(seen: np.ndarray) -> tuple[float, float]:
    """p50 and p99 of the latencies a reader saw (ms), in seconds; NaN without any."""
    if not len(seen):
        return math.nan, math.nan
    return float(np.percentile(seen, 50)) / 1e3, float(np.percentile(seen, 99)) / 1e3


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


def compare_partitions(
    servers: Servers, n: int, sizes: list[int], args, events: list, model: Path, logs: Path
) -> list[list[float]]:  # fmt: skip
    """Alternated rounds of `n` workers at each partition count in `sizes`: each run's p50 as
    a reader of the scores saw it (on a cluster, where it cannot read them all at once, the
    entry-id p50), and each round's ratios to the first count's; on one Redis also the p50
    from an event's entry to its score's (their ids' whole ms: the commit, without the
    producer's send and the reader's wake) and its ratios. Then each ratio's median over the
    rounds. The seen p50s, seconds, by round. Every other round runs the counts in reverse,
    so that going first or last (after the other's run) weighs on each count alike."""
    rounds: list[list[float]] = []
    entered: list[list[float]] = []  # entry to score, by round
    for r in range(args.rounds):
        by_size = {}
        for size in sizes if r % 2 == 0 else sizes[::-1]:
            by_size[size] = run_one(servers, n, argparse.Namespace(**{**vars(args),
                                    "partitions": size}), events, model, logs)  # fmt: skip
        runs = [by_size[size] for size in sizes]
        _report_round(r, sizes, [run.seen_p50 for run in runs], [run.p50 for run in runs],
                      rounds, entered)  # fmt: skip
    _report_medians(sizes, rounds, entered)
    return rounds


def compare_interleaved(
    servers: Servers, n: int, sizes: list[int], args, model: Path, logs: Path
) -> list[list[float]]:  # fmt: skip
    """`compare_partitions` with the counts side by side: each on a Redis and `n` workers of
    its own, started once, their bursts interleaved in every round's latency phase
    (latency_phase.run_bursts). A round's runs are then the same seconds: on a shared VM the
    host's drift moved one count's p50 by a third from one minute to the next, and in turn
    it weighed on one count's run, not the other's. Every other round the counts' bursts go
    in reverse order within each period; a second's phase before the rounds is not counted.
    The first count runs on `servers`, each other on a Redis of its own."""
    systems: list[tuple[Servers, list]] = []
    try:
        for k, size in enumerate(sizes):
            systems.append((servers if k == 0 else Servers(False, 0, args.aof), []))
            sized = argparse.Namespace(**{**vars(args), "partitions": size})
            systems[-1][1].extend(start_workers(systems[-1][0], n, sized, model, logs))
        for system, procs in systems:
            announced(system, n, procs)
        rounds: list[list[float]] = []
        entered: list[list[float]] = []
        rngs = [np.random.default_rng(2) for _ in sizes]  # each count sent the same events
        for r in range(-1, args.rounds):
            order = list(range(len(sizes)))[:: 1 if r % 2 == 0 else -1]
            feeds = {i: Feed(systems[i][0].client, sizes[i], args.users, systems[i][0].url,
                             rngs[i]) for i in order}  # fmt: skip
            seconds = args.latency_seconds if r >= 0 else 1.0
            run_bursts([feeds[i] for i in order], seconds, args.latency_rate,
                       args.latency_every_ms)  # fmt: skip
            got = [feeds[i].latencies(systems[i][1]) for i in range(len(sizes))]
            if r >= 0:
                _report_round(r, sizes, [seen_percentiles(seen)[0] for _, seen in got],
                              [whole_ms_percentile(lat, 50) / 1e3 for lat, _ in got], rounds,
                              entered)  # fmt: skip
        _report_medians(sizes, rounds, entered)
        return rounds
    finally:
        for k, (system, procs) in enumerate(systems):
            stop_workers(procs)
            if k > 0:
                system.close()


def _report_round(
    r: int, sizes: list[int], seen: list[float], entry: list[float], rounds: list[list[float]],
    entered: list[list[float]],
) -> None:  # fmt: skip
    """Print round r's p50s (seconds; the reader's, or the entry ids' where there is no
    reader) with their ratios to the first count's, and the entry ids' beside a reader's;
    keep them in `rounds` and `entered`."""
    reader = not any(math.isnan(x) for x in seen)
    p50s = seen if reader else entry
    rounds.append(p50s)
    each = ", ".join(f"P = {k} {x * 1e3:.2f} ms" for k, x in zip(sizes, p50s, strict=True))
    line = f"  round {r + 1}: {each} ({_ratios(sizes, p50s)})"
    if reader:
        entered.append(entry)
        ids = ", ".join(f"{x * 1e3:.2f}" for x in entry)
        line += f"; entry to score {ids} ms ({_ratios(sizes, entry)})"
    print(line, flush=True)


def _report_medians(
    sizes: list[int], rounds: list[list[float]], entered: list[list[float]]
) -> None:
    """Each count's ratio to the first's over the rounds: the p50s', then the entry ids'."""
    for k, size in enumerate(sizes[1:], start=1):
        _print_median(f"P = {size} / P = {sizes[0]}", [_ratio(p50s, k) for p50s in rounds])
        if entered:
            _print_median(f"entry to score, P = {size} / P = {sizes[0]}",
                          [_ratio(p50s, k) for p50s in entered])  # fmt: skip


def _print_median(what: str, ratios: list[float]) -> None:
    """The ratios' median over the rounds, their range and the median's 90% interval."""
    ratios = sorted(ratios)
    low, high = median_interval(ratios)
    print(f"{what}: median {np.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) over "
          f"{len(ratios)} round(s); the median's 90% interval {low:.2f}-{high:.2f}x (bootstrap "
          "over the rounds)")  # fmt: skip


def compare_cluster(
    cluster: Servers, one: Servers, n: int, args, events: list, model: Path, logs: Path
) -> list[tuple[float, float, float]]:  # fmt: skip
    """Alternated pairs of `n` workers on the cluster and on one Redis (one Redis first every
    other pair): each pair's events/s, Redis CPU per event (the primaries') and entry-id p50,
    the cluster's over one Redis's; then their medians and the lowest events/s ratio. The
    ratios, by pair."""
    alone = argparse.Namespace(**{**vars(args), "cluster": False})
    pairs = []
    for r in range(args.rounds):
        if r % 2 == 0:
            c = run_one(cluster, n, args, events, model, logs)
            o = run_one(one, n, alone, events, model, logs)
        else:  # in reverse every other pair: going first weighs on each alike
            o = run_one(one, n, alone, events, model, logs)
            c = run_one(cluster, n, args, events, model, logs)
        cpu = (c.per_event_us(c.redis_cpu), o.per_event_us(o.redis_cpu))
        pairs.append((c.rate / o.rate, cpu[0] / cpu[1], c.p50 / o.p50 if o.p50 > 0 else math.nan))
        rate, redis_cpu, p50 = pairs[-1]
        print(f"  pair {r + 1}: events/s {c.rate:,.0f} / {o.rate:,.0f} ({rate:.2f}x), Redis "
              f"µs/event {cpu[0]:.1f} / {cpu[1]:.1f} ({redis_cpu:.2f}x), p50 ms "
              f"{c.p50 * 1e3:.1f} / {o.p50 * 1e3:.1f} ({p50:.2f}x)", flush=True)  # fmt: skip
    rates, cpus, p50s = (sorted(x) for x in zip(*pairs, strict=True))
    print(f"cluster / one Redis over {len(pairs)} pair(s): events/s median "
          f"{np.median(rates):.2f}x (lowest {rates[0]:.2f}x), Redis CPU per event median "
          f"{np.median(cpus):.2f}x, p50 median {np.median(p50s):.2f}x")  # fmt: skip
    return pairs


def _ratio(p50s: list[float], k: int) -> float:
    """The k-th count's p50 over the first's; nan when the first's is not above 0 (whole ms
    of ids can say 0)."""
    return p50s[k] / p50s[0] if p50s[0] > 0 else math.nan


def _ratios(sizes: list[int], p50s: list[float]) -> str:
    """Each count's p50 against the first's, as text."""
    return ", ".join(f"P = {s} / P = {sizes[0]}: {_ratio(p50s, k):.2f}x"
                     for k, s in enumerate(sizes[1:], start=1))  # fmt: skip


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
                   "phase sends every count its bursts in turn, half a period apart, so a "
                   "round's runs share the host's same seconds (needs --latency-rate; no "
                   "backlog; bursts far enough apart that one count's round ends before the "
                   "other's bursts come, as the default 10 ms)")  # fmt: skip
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
            print(f"latency: {args.latency_seconds:.0f} s at {at} (a burst every "
                  f"{args.latency_every_ms:g} ms), entry to score (ids); "
                  f"worker BLAS threads: {blas}\n")  # fmt: skip
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
