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
from worker.bench.observer import Observer, sent_id
from worker.bench.uncertainty import median_interval
from worker.common.cli_help import HelpFormatter
from worker.common.connection import Client, connect
from worker.common.keys import Keys
from worker.common.local_redis import LocalCluster, LocalRedis
from worker.common.settings import DEFAULT_BATCH_SIZE
from worker.producers.publisher import publish

KEYS = Keys()
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


def wait(condition, timeout: float, what: str, procs: list) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def scored(client: Client, partitions: int) -> int:
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xlen(KEYS.scores(p))
    return sum(pipe.execute())


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


def latency_phase(
    client: Client, args, rate: float, procs: list, url: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Publish at `rate` for args.latency_seconds; per-event latency in whole ms, from the
    event entry's id time to its score entry's (both Redis's clock: the producer's own time
    to build and send its events is not the worker's); and, on one Redis (`url`), the
    latency a reader of the scores sees, ms to the µs (observer.py; empty on a cluster)."""
    before = scored(client, args.partitions)
    starts = {p: (client.xinfo_stream(KEYS.scores(p))["last-generated-id"]) for p in
              range(args.partitions)}  # fmt: skip
    observer = None
    if url is not None:
        streams = {KEYS.scores(p): starts[p] for p in range(args.partitions)}
        observer = Observer(url, streams)
    users = [f"u{i}" for i in range(args.users)]
    rng = np.random.default_rng(2)
    # a shop's events come one by one; the default's bursts leave the worker idle between
    # rounds, so what it does after a commit is off their latency
    chunk = max(1, round(rate * args.latency_every_ms / 1000))
    entered: dict[bytes, int] = {}  # event_id -> its entry's id time
    sent, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < args.latency_seconds:
        now_ms = int(time.time() * 1000)
        batch = [
            {"user_id": users[u], "type": EVENT_TYPES[t], "ts": now_ms,
             "event_id": sent_id(sent + i)}
            for i, (u, t) in enumerate(zip(rng.integers(0, len(users), chunk),
                                           rng.integers(0, len(EVENT_TYPES), chunk),
                                           strict=True))
        ]  # fmt: skip
        ids = publish(client, batch, partitions=args.partitions, pipeline_size=chunk)
        for event, entry in zip(batch, ids, strict=True):
            entered[event["event_id"].encode()] = id_ms(entry)
        sent += chunk
        ahead = sent / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    wait(lambda: scored(client, args.partitions) >= before + sent, 120, "latency phase", procs)
    seen = observer.stop() if observer is not None else np.zeros(0)
    latencies = []
    for p in range(args.partitions):
        for sid, f in client.xrange(KEYS.scores(p), f"({starts[p].decode()}", "+"):
            latencies.append(id_ms(sid) - entered[f[b"event_id"]])
    return np.asarray(latencies, np.float64), seen


def id_ms(entry_id: bytes | str) -> int:
    """A stream entry id's time, ms."""
    raw = entry_id.encode() if isinstance(entry_id, str) else entry_id
    return int(raw.split(b"-")[0])


def whole_ms_percentile(ms: np.ndarray, q: float) -> float:
    """The q-th percentile of latencies counted in whole ms (each the difference of two
    ids' times: the true one within a ms either side), read as if each spread evenly over
    its ms: 2.3 where a bare percentile can only say 2 or 3."""
    values, counts = np.unique(ms, return_counts=True)
    below = np.concatenate([[0], np.cumsum(counts)]) / len(ms)
    k = int(np.searchsorted(below[1:], q / 100))
    k = min(k, len(values) - 1)
    return float(values[k] - 0.5 + (q / 100 - below[k]) / (below[k + 1] - below[k]))


def run_one(servers: Servers, n: int, args, events: list, model: Path, logs: Path) -> Run:
    servers.flush()
    client = servers.client
    publish(client, events, partitions=args.partitions, pipeline_size=5000)
    for p in range(args.partitions):  # the gate: no worker can take a partition yet
        client.set(KEYS.lease(p), GATE, px=600_000)
    procs = start_workers(servers, n, args, model, logs)
    try:
        now_ms = lambda: int(time.time() * 1000)  # noqa: E731
        wait(lambda: client.zcount(KEYS.workers, now_ms(), "+inf") >= n, 120, "warm-up", procs)
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
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
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
    entry-id p50), and each round's ratios to the first count's; the p50s, seconds, by round.
    Every other round runs the counts in reverse, so that going first or last (after the
    other's run) weighs on each count alike."""
    rounds: list[list[float]] = []
    for r in range(args.rounds):
        by_size = {}
        for size in sizes if r % 2 == 0 else sizes[::-1]:
            run = run_one(servers, n, argparse.Namespace(**{**vars(args), "partitions": size}),
                          events, model, logs)  # fmt: skip
            by_size[size] = run.p50 if math.isnan(run.seen_p50) else run.seen_p50
        p50s = [by_size[size] for size in sizes]
        rounds.append(p50s)
        each = ", ".join(f"P = {k} {x * 1e3:.2f} ms" for k, x in zip(sizes, p50s, strict=True))
        print(f"  round {r + 1}: {each} ({_ratios(sizes, p50s)})", flush=True)
    for k, size in enumerate(sizes[1:], start=1):
        ratios = sorted(p50s[k] / p50s[0] for p50s in rounds)
        low, high = median_interval(ratios)
        print(f"P = {size} / P = {sizes[0]}: median {np.median(ratios):.2f}x "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f}) over {len(rounds)} round(s); the median's "
              f"90% interval {low:.2f}-{high:.2f}x (bootstrap over the rounds)")  # fmt: skip
    return rounds


def compare_cluster(
    cluster: Servers, one: Servers, n: int, args, events: list, model: Path, logs: Path
) -> list[tuple[float, float, float]]:  # fmt: skip
    """Alternated pairs of `n` workers on the cluster, then on one Redis: each pair's
    events/s, Redis CPU per event (the primaries') and entry-id p50, the cluster's over one
    Redis's; then their medians and the lowest events/s ratio. The ratios, by pair."""
    alone = argparse.Namespace(**{**vars(args), "cluster": False})
    pairs = []
    for r in range(args.rounds):
        c = run_one(cluster, n, args, events, model, logs)
        o = run_one(one, n, alone, events, model, logs)
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


def _ratios(sizes: list[int], p50s: list[float]) -> str:
    """Each count's p50 against the first's, as text."""
    return ", ".join(f"P = {s} / P = {sizes[0]}: {x / p50s[0]:.2f}x"
                     for s, x in zip(sizes[1:], p50s[1:], strict=True))  # fmt: skip


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
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds, with several --partitions or --against-one")  # fmt: skip
    p.add_argument("--cluster", action="store_true", help="a local 3-master, 3-replica cluster")
    p.add_argument("--against-one", action="store_true",
                   help="with --cluster: each of --rounds runs the worker (the first count) "
                   "on the cluster, then on one Redis, and prints each pair's events/s, Redis "
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
    servers = Servers(args.cluster, args.replicas, args.aof)
    try:
        with TemporaryDirectory() as tmp:
            model = Path(tmp) / "bench.npz"
            save_model(random_model([*EVENT_TYPES, LABEL_TYPE], hidden=args.hidden, seed=0),
                       model)  # fmt: skip
            events = list(synthetic_events(args.events, args.users, seed=1))
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
