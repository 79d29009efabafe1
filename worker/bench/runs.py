"""A run of real `intentstream worker` processes on a private Redis or local cluster, as the
scaling benchmarks make it (`run_one`): flush, preload a backlog over the partitions, start
the workers behind a gate (the bench holds every partition's lease until all workers are
warmed up and announced), open the gate and time the backlog from its first score to its last
(the score entries' ids; the worker's wait to notice the gate open, a second, is not the
backlog's); then a latency phase (latency_phase.py).

CPU: the workers' user+system time from /proc/<pid>/stat, and Redis's `used_cpu_user` +
`used_cpu_sys` from INFO and the commands' own time from INFO commandstats, summed over the
primaries (replicas reported apart), all as deltas over the backlog phase.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from worker.bench.latency_phase import (
    KEYS,
    id_ms,
    latency_phase,
    scored,
    wait,
    whole_ms_percentile,
)
from worker.common.connection import Client, connect
from worker.common.local_redis import LocalCluster, LocalRedis
from worker.producers.publisher import publish

GATE = "bench-gate"
TICK = os.sysconf("SC_CLK_TCK")
# the commit's transaction, and the Lua scripts (the commit was one before 2026-12-05)
ATOMIC_COMMANDS = ("exec", "evalsha", "eval", "evalsha_ro", "eval_ro")


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
    ends = [id_ms(entries[0][0]) for entries in pipe.execute() if entries]
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
