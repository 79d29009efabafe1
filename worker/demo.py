"""`intentstream demo`: the whole loop on one machine, live.

Starts a private redis-server unless a URL is given, makes sure the registry has a current
model (trained for a few seconds on synthetic sessions when the registry is empty), runs the
worker (with its metrics endpoint) and a synthetic shop publishing events, and prints once a
second what happens: events/s, latency, a few users' scores moving. Ctrl-C stops everything
it started.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import TextIO

import numpy as np

from model.artifact import Model, random_model
from model.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.train import TrainConfig, train
from worker.connection import connect
from worker.consumer import Consumer
from worker.keys import Keys
from worker.local_redis import LocalRedis, free_port
from worker.metrics import LATENCY_BUCKETS, Health, WorkerMetrics, serve_metrics
from worker.model_source import RegistryModelSource
from worker.publisher import publish
from worker.registry import Registry
from worker.settings import Settings


def latency_quantile(counts: np.ndarray, q: float) -> float:
    """The upper bound of the bucket holding quantile q of a histogram's bucket counts."""
    total = counts.sum()
    if not total:
        return float("nan")
    i = int(np.searchsorted(np.cumsum(counts), q * total))
    return LATENCY_BUCKETS[i] if i < len(LATENCY_BUCKETS) else float("inf")


def _publisher(url: str, prefix: str, rate: float, users: int, stop: threading.Event) -> None:
    client = connect(url)
    events = synthetic_events(10**9, users, seed=int(time.time()), start_ms=int(time.time() * 1000))
    t0, sent, chunk = time.monotonic(), 0, max(1, int(rate / 20))
    while not stop.is_set():
        batch = [next(events) for _ in range(chunk)]
        publish(client, batch, prefix)
        sent += chunk
        ahead = sent / rate - (time.monotonic() - t0)
        if ahead > 0:
            stop.wait(ahead)
    client.close()


class ScoreWatch:
    """Follows the score stream and keeps the last few scores of the first users seen."""

    def __init__(self, url: str, stream: str, users: int = 4, depth: int = 6) -> None:
        self.client = connect(url)
        self.stream = stream
        self.last_id = b"0-0"
        self.tracked: list[str] = []
        self.n_users = users
        self.history: dict[str, deque] = defaultdict(lambda: deque(maxlen=depth))

    def update(self) -> None:
        reply = self.client.xread({self.stream: self.last_id}, count=20_000)
        pairs = reply.items() if isinstance(reply, dict) else reply or []
        for _, entries in pairs:
            for entry_id, fields in entries:
                self.last_id = entry_id
                user = fields[b"user_id"].decode()
                if user not in self.tracked and len(self.tracked) < self.n_users:
                    self.tracked.append(user)
                if user in self.tracked:
                    self.history[user].append((fields[b"type"].decode(), float(fields[b"score"])))

    def lines(self) -> list[str]:
        return [
            f"  {u:<12} " + " → ".join(f"{t} {s:.2f}" for t, s in self.history[u])
            for u in self.tracked
        ]


def first_model(train_first: bool, out: TextIO) -> Model:
    """A model for an empty registry: trained briefly on synthetic sessions, or random."""
    if not train_first:
        print("using a random model (scores mean nothing until you train one)", file=out)
        return random_model([*EVENT_TYPES, LABEL_TYPE], hidden=32, features=["gap"], seed=0)
    print("training a first model on synthetic sessions (the first run compiles, ~30 s)...",
          file=out, flush=True)  # fmt: skip
    result = train(synthetic_events(20_000, 1000, seed=0), TrainConfig(hidden=16, epochs=4))
    m, b = result.report["metrics"], result.report["baseline"]
    print(f"trained: validation AUC {m['auc_last']:.3f} (bag-of-event-types baseline "
          f"{b['auc_last']:.3f})", file=out)  # fmt: skip
    return result.model


def run_demo(
    redis_url: str | None,
    rate: float,
    users: int,
    seconds: float | None,
    metrics_port: int,
    stop: threading.Event,
    out: TextIO,
    train_first: bool = True,
) -> int:
    """Run the demo until `stop` is set (Ctrl-C) or `seconds` pass; return the exit code."""
    server = None
    if redis_url is None:
        server = LocalRedis().start()
        redis_url = server.url
        print(f"started a private redis-server at {redis_url} (pid {server.process.pid})", file=out)
    prefix = "intentstream"
    threads: list[threading.Thread] = []
    source = None
    try:
        client = connect(redis_url)
        registry = Registry(client, prefix)
        if registry.current() is None:
            version = registry.publish_model(first_model(train_first, out), promote=True)
            print(f"the registry was empty: published it as version {version}", file=out)
        settings = Settings(redis_url=redis_url, prefix=prefix, consumer="demo-worker",
                            block_ms=200, metrics_port=metrics_port, log_format="text")  # fmt: skip
        metrics, health = WorkerMetrics(), Health()
        port = metrics_port or free_port()
        try:
            serve_metrics(metrics, health, settings.metrics_host, port)
        except OSError:
            port = free_port()
            serve_metrics(metrics, health, settings.metrics_host, port)
        print(f"metrics: http://{settings.metrics_host}:{port}/metrics", file=out)
        source = RegistryModelSource(client, prefix, settings.model_poll_seconds)
        consumer = Consumer(settings, connect(redis_url), source, metrics, health, stop)
        threads = [
            threading.Thread(target=consumer.run, name="worker", daemon=True),
            threading.Thread(
                target=_publisher, args=(redis_url, prefix, rate, users, stop),
                name="publisher", daemon=True,
            ),
        ]  # fmt: skip
        for t in threads:
            t.start()
        print(
            f"publishing ~{rate:g} synthetic events/s for {users} users; Ctrl-C stops\n", file=out
        )
        watch = ScoreWatch(redis_url, Keys(prefix).scores(0))
        last_count, last_buckets = 0.0, metrics.latency.bucket_counts()
        deadline = None if seconds is None else time.monotonic() + seconds
        while not stop.wait(1.0):
            count, buckets = metrics.count("scored"), metrics.latency.bucket_counts()
            window = buckets - last_buckets
            p50, p99 = latency_quantile(window, 0.5), latency_quantile(window, 0.99)
            watch.update()
            print(
                f"{time.strftime('%H:%M:%S')}  {count - last_count:6.0f} events/s  "
                f"latency p50 <= {p50 * 1e3:g} ms, p99 <= {p99 * 1e3:g} ms  "
                f"scored {count:.0f}  model v{consumer.model.version}",
                file=out,
            )
            print("\n".join(watch.lines()), file=out, flush=True)
            last_count, last_buckets = count, buckets
            if deadline is not None and time.monotonic() > deadline:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
        if source is not None:
            source.close()
        if server is not None:
            server.close()
            print("stopped the private redis-server", file=out)
    print("demo stopped", file=out, flush=True)
    return 0
