"""Where a live low-traffic round's time goes: the worker in this process on a private Redis,
a producer process publishing RATE events/s (in bursts EVERY_MS apart, 10 by default) over P
partitions, and wall timers around the round's steps. Per round (a tick that scored events)
it prints the median µs of each step and its calls, and the p50 from an event's entry to its
score entry (their ids' times, as `intentstream bench --latency-rate` takes it).
scripts/cold_round_bench.py measures the CPU of a round's way to EXEC without Redis; this one
sees the round as it runs: the waits on Redis, the caches other processes evicted, the
settling after EXEC. Last, Redis's side: its CPU a round and its commands' µs and calls a
round (INFO commandstats; the producer's FCALL and XADDs among them). With --reader, the
bench's reader of the scores (worker/bench/observer.py) runs beside it, as in `intentstream
bench --workers`, and the latency it sees from the producer's send is printed too (the events
then carry event_ids stamped with their send time). With --timeline, every send to Redis and
every reply read is stamped: per round, when each send went and its first reply came, µs after
the blocking read's wake (and the producer's send before it, the events stamped as above).

A step is `module:Qualname`. A class's method is timed wherever it is called; a function is
timed where the named module calls it (name the module that imports it, as
`worker.engine.flow:prepared_group`). Steps nest: an outer step's time holds its inner ones'.
Usage:

    PYTHONPATH=<tree> .venv/bin/python scripts/live_round_bench.py [--partitions 8]
        [--rate 1000] [--every-ms 10 | --poisson] [--seconds 8] [--reader] [--timeline]
        [--step module:Qualname ...]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import redis

from model.artifact import save_model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE
from model.random_init import random_model
from worker.bench.latency_phase import id_ms, run_bursts, whole_ms_percentile
from worker.bench.load import redis_cpu
from worker.bench.observer import Observer, sent_id, sent_us
from worker.common import connection
from worker.common.connection import Client, connect
from worker.common.keys import Keys
from worker.common.local_redis import LocalRedis
from worker.common.settings import Settings
from worker.engine.adapters import streams
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.consumer import Consumer, tune_gc
from worker.lifecycle.model_source import FileModelSource
from worker.producers.publisher import publish

STEPS = (
    "worker.engine.consumer:Consumer._upkeep",
    "worker.engine.consumer:Consumer._poll",
    "worker.engine.flow:BatchFlow.together_on_nodes",
    "worker.engine.consumer:Consumer._run_queued",
    "worker.engine.adapters.states:StateReader.request",
    "worker.engine.adapters.early_checks:EarlyChecks.of",
    "worker.engine.adapters.states:StateReader.complete",
    "worker.engine.adapters.states:StateReader.complete_all",
    "worker.engine.models:Models.build",
    "worker.engine.models:Models.build_group",
    "worker.engine.flow:prepared_group",
    "worker.engine.adapters.commit:Committer.prepare",
    "worker.engine.flow:BatchFlow._settle_together",
)
KEYS = Keys()


def timed(steps: list[str], took: dict[str, float], calls: dict[str, int]) -> None:
    """Wrap each step so that its wall time adds up in took[step], its calls in calls[step]."""
    for step in steps:
        module_name, qualname = step.split(":")
        owner = importlib.import_module(module_name)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        raw = inspect.getattr_static(owner, name)
        # a static or class method stays one: its function is wrapped, not what getattr binds
        kind = type(raw) if isinstance(raw, staticmethod | classmethod) else None
        inner = raw.__func__ if kind else raw

        def wrapper(*args, _inner=inner, _step=step, **kwargs):
            t = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                took[_step] += time.perf_counter() - t
                calls[_step] += 1

        wrapped = functools.wraps(inner)(wrapper)
        setattr(owner, name, kind(wrapped) if kind else wrapped)


class Timeline:
    """Stamps every send to Redis and every reply read (redis-py's `send_packed_command`
    and `read_response`, and `read_replies` wherever the worker imported it), and the send
    times the stamped events carry, a round at a time."""

    def __init__(self) -> None:
        self.log: list[tuple[float, str]] = []  # (perf_counter, the command sent or "reply")
        self.sent_us: list[int] = []  # the round's events' send times (observer.sent_id), µs
        self.rounds: list[dict[str, float]] = []
        # time.time() in µs at perf_counter() == 0: the producer stamps wall-clock µs
        self._wall_us = time.time() * 1e6 - time.perf_counter() * 1e6

    def install(self) -> None:
        """Wrap the sends, the reads and the parse, for the rest of this process."""
        conn = redis.connection.Connection
        send, read = conn.send_packed_command, conn.read_response

        def sending(c, command, *args, **kwargs):
            first = command[0] if isinstance(command, list | tuple) else command
            self.log.append((time.perf_counter(), _command_name(bytes(first[:256]))))
            return send(c, command, *args, **kwargs)

        def reading(c, *args, **kwargs):
            reply = read(c, *args, **kwargs)
            self.log.append((time.perf_counter(), "reply"))
            return reply

        conn.send_packed_command, conn.read_response = sending, reading
        replies, parse = connection.read_replies, streams.parse_batch

        def reading_all(c, n):
            got = replies(c, n)
            self.log.append((time.perf_counter(), "reply"))
            return got

        def parsing(*args, **kwargs):
            batch = parse(*args, **kwargs)
            self.sent_us += [us for e in batch.event_ids if e and (us := sent_us(e)) is not None]
            return batch

        for module in list(sys.modules.values()):  # the worker's modules import it by name
            if getattr(module, "read_replies", None) is replies:
                module.read_replies = reading_all
        streams.parse_batch = parsing

    def start(self) -> None:
        """A round begins: forget the last one's stamps."""
        self.log.clear()
        self.sent_us.clear()

    def end(self) -> None:
        """Keep the round's offsets from the wake: the first reply after a blocking read."""
        at = next((i for i, (_, what) in enumerate(self.log) if what == "XREADGROUP BLOCK"), None)
        if at is None:
            return  # a round that did not wait: nothing to measure from
        wake = next((t for t, what in self.log[at:] if what == "reply"), None)
        if wake is None:
            return
        row: dict[str, float] = {}
        if self.sent_us:
            row["0 the producer's send"] = min(self.sent_us) - (wake * 1e6 + self._wall_us)
        n, replied = 0, True
        for t, what in self.log[at + 1 :]:
            if t <= wake:
                continue
            if what != "reply":
                n, replied = n + 1, False
                row[f"{n} send: {what}"] = (t - wake) * 1e6
            elif not replied:
                row[f"{n} its first reply"], replied = (t - wake) * 1e6, True
        self.rounds.append(row)

    def report(self) -> None:
        """Each mark's median over the rounds that had it, in order."""
        marks = sorted({m for r in self.rounds for m in r},
                       key=lambda m: (int(m.split()[0]), "reply" in m))  # fmt: skip
        print(f"timeline: µs after the blocking read's wake, medians ({len(self.rounds)} rounds)")
        for mark in marks:
            values = [r[mark] for r in self.rounds if mark in r]
            print(f"  {np.median(values):8.0f} {len(values):6d}  {mark.split(' ', 1)[1]}")


def _command_name(head: bytes) -> str:
    """The first command's name in packed RESP (`XREADGROUP BLOCK` for a blocking read)."""
    parts = head.split(b"\r\n")
    name = parts[2].decode(errors="replace") if len(parts) > 2 else "?"
    return f"{name} BLOCK" if name == "XREADGROUP" and b"BLOCK" in head else name


class _Shop:
    """The producer's bursts (latency_phase.run_bursts schedules them): new users mostly;
    `stamped`: each event with an event_id that carries its send time (observer.sent_id)."""

    def __init__(self, url: str, partitions: int, stamped: bool) -> None:
        self.client, self.partitions, self.stamped = connect(url), partitions, stamped
        self.rng, self.sent = np.random.default_rng(2), 0

    def burst(self, chunk: int) -> None:
        users = self.rng.integers(0, 50_000, chunk)
        types = self.rng.integers(0, len(EVENT_TYPES), chunk)
        now_ms = int(time.time() * 1000)
        batch = [{"user_id": f"u{u}", "type": EVENT_TYPES[t], "ts": now_ms}
                 for u, t in zip(users, types, strict=True)]  # fmt: skip
        if self.stamped:
            for n, event in enumerate(batch, start=self.sent):
                event["event_id"] = sent_id(n)
        publish(self.client, batch, partitions=self.partitions, pipeline_size=chunk)
        self.sent += chunk


def produce(
    url: str, rate: float, seconds: float, partitions: int, every_ms: float, stamped: bool,
    poisson: bool = False,
) -> None:  # fmt: skip
    """Publish `rate` events/s for `seconds`, in bursts `every_ms` apart (each at a random
    point of its ms) or, `poisson`, one by one at random gaps, as the bench's latency phase
    does."""
    run_bursts([_Shop(url, partitions, stamped)], seconds, rate, every_ms, poisson=poisson)


def latencies_ms(url: str, partitions: int) -> np.ndarray:
    """Each score entry's id time minus its event entry's, whole ms."""
    client = connect(url)
    out = []
    for p in range(partitions):
        entered = {f[b"event_id"]: id_ms(i) for i, f in client.xrange(KEYS.events(p))}
        out += [id_ms(i) - entered[f[b"event_id"]] for i, f in client.xrange(KEYS.scores(p))]
    return np.asarray(out, np.float64)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--every-ms", type=float, default=10.0, help="ms between the bursts")
    p.add_argument("--poisson", action="store_true",
                   help="events one by one at random gaps, not in bursts")  # fmt: skip
    p.add_argument("--step", action="append", help="module:Qualname to time (default: a round's)")
    p.add_argument("--reader", action="store_true", help="the bench's reader of the scores beside")
    p.add_argument("--timeline", action="store_true", help="stamp every send and reply")
    p.add_argument("--produce", metavar="URL", help=argparse.SUPPRESS)  # the producer process
    args = p.parse_args(argv)
    if args.produce:
        produce(args.produce, args.rate, args.seconds, args.partitions, args.every_ms, args.reader,
                args.poisson)  # fmt: skip
        return
    steps = args.step or list(STEPS)
    took: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    timed(steps, took, calls)
    timeline = Timeline() if args.timeline else None
    if timeline is not None:
        timeline.install()
    with tempfile.TemporaryDirectory() as tmp, LocalRedis() as server:
        model = Path(tmp) / "model.npz"
        save_model(random_model([*EVENT_TYPES, LABEL_TYPE], hidden=64, seed=0), model)
        settings = Settings(redis_url=server.url, model=model, partitions=args.partitions,
                            consumer="live", metrics_port=0, block_ms=100,
                            retention_seconds=0)  # fmt: skip
        metrics = WorkerMetrics()
        consumer = Consumer(settings, connect(server.url), FileModelSource(model), metrics)
        consumer.models.warm_up()  # every kernel, and BLAS pinned, as Consumer.run does
        tune_gc()
        for _ in range(3):  # groups created, leases taken
            consumer.tick()
        probe = connect(server.url)  # reads Redis's INFO; not the bench's score Observer
        cpu0, stats0 = redis_cpu(probe), probe.info("commandstats")
        reader = None
        if args.reader:  # started before the first event, on every score stream
            reader = Observer(server.url, {KEYS.scores(p): b"0-0" for p in range(args.partitions)})
        producer = subprocess.Popen([sys.executable, __file__, "--produce", server.url,
                                     "--rate", str(args.rate), "--seconds", str(args.seconds),
                                     "--every-ms", str(args.every_ms),
                                     "--partitions", str(args.partitions),
                                     *(["--poisson"] if args.poisson else []),
                                     *(["--reader"] if args.reader or args.timeline else [])
                                     ])  # fmt: skip
        rounds: list[dict[str, tuple[float, int]]] = []
        deadline, published = time.monotonic() + args.seconds + 60, None
        while published is None or metrics.count("scored") < published:
            if time.monotonic() > deadline or producer.poll() not in (None, 0):
                raise RuntimeError("the events were not all scored (or the producer failed)")
            if published is None and producer.returncode == 0:  # counted once, when it ends
                published = _published(connect(server.url), args)
            took.clear()
            calls.clear()
            before = metrics.count("scored")
            if timeline is not None:
                timeline.start()
            t = time.perf_counter()
            consumer.tick()
            if metrics.count("scored") > before:
                rounds.append(
                    {"tick": (time.perf_counter() - t, 1), **{s: (took[s], calls[s]) for s in took}}
                )
                if timeline is not None:
                    timeline.end()
        seen = reader.stop() if reader is not None else None
        consumer.close()
        cpu, stats = redis_cpu(probe) - cpu0, probe.info("commandstats")
        lat = latencies_ms(server.url, args.partitions)
    print(f"P = {args.partitions}, {args.rate:.0f} events/s for {args.seconds:.0f} s: "
          f"{len(rounds)} rounds that scored, {len(lat)} events; entry to score p50 "
          f"{whole_ms_percentile(lat, 50):.2f} ms")  # fmt: skip
    print("median µs and calls per round (a step not run in a round counts 0 there):")
    for step in ["tick", *steps]:
        times, counts = np.array([r.get(step, (0.0, 0)) for r in rounds]).T
        print(f"  {np.median(times) * 1e6:8.0f} {np.median(counts):4.0f}  {step}")
    print_redis_share(cpu, stats0, stats, len(rounds))
    if seen is not None:
        print(f"reader: {len(seen)} scores seen, from the producer's send p50 "
              f"{np.median(seen):.2f} ms, mean {np.mean(seen):.2f} ms")  # fmt: skip
    if timeline is not None:
        timeline.report()


def print_redis_share(cpu: float, before: dict, after: dict, rounds: int) -> None:
    """Redis's CPU a round (the producer's commands in it) and its commands' µs and calls a
    round, the costliest first."""
    print(f"Redis: {cpu / max(1, rounds) * 1e6:.0f} µs of CPU a round (the producer's included); "
          "its commands' µs and calls a round:")  # fmt: skip
    rows = []
    for name, now in after.items():
        was = before.get(name, {"usec": 0, "calls": 0})
        rows.append((now["usec"] - was["usec"], now["calls"] - was["calls"], name[8:]))
    for usec, calls, name in sorted(rows, reverse=True)[:12]:
        print(f"  {usec / max(1, rounds):8.1f} {calls / max(1, rounds):6.1f}  {name}")


def _published(client: Client, args: argparse.Namespace) -> int:
    return sum(client.xlen(KEYS.events(p)) for p in range(args.partitions))


if __name__ == "__main__":
    main()
