"""`intentstream demo`: the whole loop on one machine, live.

Starts a private redis-server unless a URL is given, makes sure the registry has a current
model (trained for a few seconds on synthetic sessions when the registry is empty), runs the
worker (with its metrics endpoint) and a synthetic shop publishing events, and prints once a
second what happens: events/s, latency, a few of this run's users' scores moving. Ctrl-C stops
everything it started.

On a Redis where another worker already holds the partition's lease, that worker scores the
demo's events: the demo says so and shows the scores it writes (its own worker stands by and
takes over if the other one stops).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from typing import TextIO

import numpy as np
import redis

from model.artifact import Model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.random_init import random_model
from worker.commands.kernels import compile_in_background, is_cached
from worker.common.connection import connect, connect_settings
from worker.common.keys import Keys
from worker.common.local_redis import LocalRedis, free_port
from worker.common.settings import Settings
from worker.engine.adapters.metrics import LATENCY_BUCKETS, Health, WorkerMetrics, serve_metrics
from worker.engine.consumer import Consumer
from worker.lifecycle.model_source import RegistryModelSource
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish

PREFIX = "intentstream"
PARTITION = 0  # the demo publishes with one partition

# The first model: trained on this many synthetic events (1 in 5 users held out), long enough
# to beat the order-blind baseline clearly (AUC 0.932 against 0.895; 4 epochs of 20k events
# gave 0.907 against 0.901), in about 2 s once the kernels are compiled.
FIRST_MODEL_EVENTS = 60_000
FIRST_MODEL_USERS = 3_000
FIRST_MODEL_CONFIG = {"hidden": 32, "epochs": 12, "lr": 0.005, "batch_size": 32}

AUC_EXPLAINED = (
    "(AUC: the chance that a session ending in a purchase scores above one that does not, at "
    "its last event, on held-out users; 0.5 is a coin toss. The baseline counts event types "
    "and ignores their order, so the gap is what the order of events adds.)"
)


def latency_quantile(counts: np.ndarray, q: float) -> float:
    """The upper bound of the bucket holding quantile q of a histogram's bucket counts."""
    total = counts.sum()
    if not total:
        return float("nan")
    i = int(np.searchsorted(np.cumsum(counts), q * total))
    return LATENCY_BUCKETS[i] if i < len(LATENCY_BUCKETS) else float("inf")


def latency_text(window: np.ndarray) -> str:
    """`latency p50 <= X ms, p99 <= Y ms` of a window of bucket counts; a dash when empty."""
    if not window.sum():
        return "latency p50 -, p99 -"
    return (f"latency p50 {_bound(latency_quantile(window, 0.5))}, "
            f"p99 {_bound(latency_quantile(window, 0.99))}")  # fmt: skip


def _bound(seconds: float) -> str:
    """A latency bucket's bound as text: `<= 5 ms`, or `> 10000 ms` past the last bucket."""
    if seconds == float("inf"):
        return f"> {LATENCY_BUCKETS[-1] * 1e3:g} ms"
    return f"<= {seconds * 1e3:g} ms"


def waiting_text(queued: int, stamp: str) -> str:
    """The report's line before the worker's first score: what it waits for, not a rate."""
    return (f"{stamp}  waiting for the worker's first batch: it compiles (or loads) its batch "
            f"kernels on a first run; {queued} events queued meanwhile")  # fmt: skip


def demo_events(users: int, user_prefix: str) -> Iterator[dict]:
    """Endless synthetic shop events, users named with this run's prefix, without `ts`:
    Redis dates them as they arrive (the generator's clock runs faster than real time, so
    its times would soon lie ahead of their receipt, which the timestamp rule refuses)."""
    for e in synthetic_events(10**12, users, seed=int(time.time())):
        e["user_id"] = user_prefix + e["user_id"]
        del e["ts"]
        yield e


class Publisher(threading.Thread):
    """The synthetic shop: publishes at `rate` events/s until stopped; keeps its error."""

    def __init__(self, url: str, rate: float, users: int, user_prefix: str,
                 stop: threading.Event, cluster: bool = False) -> None:  # fmt: skip
        super().__init__(name="publisher", daemon=True)
        self.url, self.rate, self.users, self.user_prefix = url, rate, users, user_prefix
        self.stop = stop
        self.cluster = cluster
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._publish()
        except Exception as exc:  # reported by the demo's loop, which then stops
            self.error = exc
            self.stop.set()

    def _publish(self) -> None:
        client = connect(self.url, cluster=self.cluster)
        events = demo_events(self.users, self.user_prefix)
        # 20 sends a second at most; below 20 events/s, one event per send
        t0, sent, chunk = time.monotonic(), 0, max(1, int(self.rate / 20))
        while not self.stop.is_set():
            publish(client, [next(events) for _ in range(chunk)], PREFIX)
            sent += chunk
            ahead = sent / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                self.stop.wait(ahead)
        client.close()


class ScoreWatch:
    """Follows the score stream from now on; keeps the last scores of this run's first users."""

    def __init__(self, url: str, stream: str, user_prefix: str, users: int = 4,
                 depth: int = 6, cluster: bool = False) -> None:  # fmt: skip
        self.client = connect(url, cluster=cluster)
        self.stream = stream
        self.user_prefix = user_prefix.encode()
        last = self.client.xrevrange(stream, count=1)  # older scores are not this run's
        self.last_id = last[0][0] if last else b"0-0"
        self.tracked: list[str] = []
        self.n_users = users
        self.history: dict[str, deque] = defaultdict(lambda: deque(maxlen=depth))
        self.model = ""
        self.seen = 0  # scores of this run's users

    def update(self) -> int:
        """Read new score entries; return how many were of this run's users."""
        new = 0
        while True:
            reply = self.client.xread({self.stream: self.last_id}, count=10_000)
            pairs = reply.items() if isinstance(reply, dict) else reply or []
            entries = [e for _, batch in pairs for e in batch]
            for entry_id, fields in entries:
                self.last_id = entry_id
                new += self._take(fields)
            if len(entries) < 10_000:
                break
        self.seen += new
        return new

    def _take(self, fields: dict) -> int:
        user = fields.get(b"user_id", b"")
        if not user.startswith(self.user_prefix):
            return 0
        name = user.decode(errors="replace")
        if name not in self.tracked and len(self.tracked) < self.n_users:
            self.tracked.append(name)
        if name in self.tracked:
            kind = fields.get(b"type", b"").decode(errors="replace")
            self.history[name].append((kind, float(fields[b"score"])))
        self.model = fields.get(b"model", b"").decode(errors="replace")
        return 1

    def lines(self) -> list[str]:
        width = max([12, *map(len, self.tracked)])
        return [
            f"  {u:<{width}} " + " → ".join(f"{t} {s:.2f}".strip() for t, s in self.history[u])
            for u in self.tracked
        ]


def first_model(train_first: bool, out: TextIO) -> Model:
    """A model for an empty registry: trained briefly on synthetic sessions, or random."""
    if not train_first:
        print("using a random model (scores mean nothing until you train one)", file=out)
        return random_model([*EVENT_TYPES, LABEL_TYPE], hidden=32, features=["gap"], seed=0)
    from model.training.config import TrainConfig
    from model.training.train import train  # about a second (scipy): when training only

    config = TrainConfig(**FIRST_MODEL_CONFIG)
    print(f"training a first model on {FIRST_MODEL_EVENTS} synthetic events, at most "
          f"{config.epochs} epochs (a line per epoch)...", file=out, flush=True)  # fmt: skip
    t0 = time.monotonic()
    events = synthetic_events(FIRST_MODEL_EVENTS, FIRST_MODEL_USERS, seed=0)
    result = train(events, config, progress=_epoch_lines(out, t0))
    m, b = result.report["metrics"], result.report["baseline"]
    # fewer lines than "at most" epochs is early stopping: say so, not leave it a puzzle
    print(f"  {result.report['kept_epoch']['reason']}", file=out)
    print(f"trained: validation AUC {m['auc_last']:.3f}, bag-of-event-types baseline "
          f"{b['auc_last']:.3f} ({time.monotonic() - t0:.0f} s)", file=out)  # fmt: skip
    print(AUC_EXPLAINED, file=out)
    return result.model


def _epoch_lines(out: TextIO, t0: float):
    """train's progress as one line per finished epoch on the demo's output."""

    class EpochLine:
        def __init__(self, total: int, desc: str, unit: str = "batch") -> None:
            self.desc, self.loss = desc, None

        def update(self, n: int) -> None:
            pass

        def set_postfix(self, **values: str) -> None:
            self.loss = values.get("loss")

        def close(self) -> None:
            # the time since training began (the first epoch's holds the kernels' compiling)
            print(f"  {self.desc}: training loss {self.loss} (at {time.monotonic() - t0:.0f} s)",
                  file=out, flush=True)  # fmt: skip

    return EpochLine


def lease_holder(client: redis.Redis) -> str | None:
    """Who holds the demo partition's lease (consumer name:token), or None."""
    value = client.get(Keys(PREFIX).lease(PARTITION))
    return None if value is None else value.decode(errors="replace")


def _start_metrics(metrics: WorkerMetrics, health: Health, host: str, port: int) -> int:
    port = port or free_port()
    try:
        serve_metrics(metrics, health, host, port)
        return port
    except OSError:  # taken: any free port will do for a demo
        port = free_port()
        serve_metrics(metrics, health, host, port)
        return port


def _compile_kernels(must_train: bool, out: TextIO) -> subprocess.Popen | None:
    """Say which kernels a first run compiles; start the helper process for some of them.

    Training's kernel compiles in this process as it trains; the worker's and the
    evaluation's meanwhile in a helper process, when a core is idle.
    """
    cold = [k for k in (["training", "evaluation", "scoring"] if must_train else ["scoring"])
            if not is_cached(k)]  # fmt: skip
    if cold:
        print(f"first run: compiling the {', '.join(cold)} kernels (Numba: about half a "
              "minute on a quiet 2-core machine, a minute or more on a busy one; cached in "
              "model/__pycache__, so later runs start in seconds)...", file=out,
              flush=True)  # fmt: skip
    return compile_in_background([k for k in cold if k != "training"])


def run_demo(
    redis_url: str | None,
    rate: float,
    users: int,
    seconds: float | None,
    metrics_port: int,
    stop: threading.Event,
    out: TextIO,
    train_first: bool = True,
    cluster: bool = False,
) -> int:
    """Run the demo until `stop` is set (Ctrl-C) or `seconds` pass; return the exit code.
    With cluster, redis_url names a node of a Redis Cluster."""
    server = None
    if redis_url is None:
        server = LocalRedis().start()
        redis_url = server.url
        print(f"started a private redis-server at {redis_url} (pid {server.process.pid})", file=out)
    # On a shared Redis this run's users carry a tag, so only their scores are shown.
    user_prefix = "" if server else f"demo-{secrets.token_hex(2)}-"
    threads: list[threading.Thread] = []
    source = None
    try:
        client = connect(redis_url, cluster=cluster)
        holder = lease_holder(client)
        if holder is not None:
            print(f"another worker ({holder}) holds partition {PARTITION}'s lease "
                  f"({Keys(PREFIX).lease(PARTITION)}): it scores the demo's events, the demo "
                  "shows its scores; the demo's worker stands by", file=out)  # fmt: skip
        registry = Registry(client, PREFIX)
        must_train = train_first and registry.current() is None
        helper = _compile_kernels(must_train, out)
        if registry.current() is None:
            version = registry.publish_model(first_model(train_first, out), promote=True)
            print(f"the registry was empty: published it as version {version}", file=out)
        if helper is not None:
            helper.wait()  # its kernels are cached now (or compile at first use if it failed)
        consumer_name = f"demo-{socket.gethostname()}-{os.getpid()}"
        settings = Settings(redis_url=redis_url, prefix=PREFIX, consumer=consumer_name,
                            block_ms=200, metrics_port=metrics_port, log_format="text",
                            cluster=cluster)  # fmt: skip
        metrics, health = WorkerMetrics(), Health()
        port = _start_metrics(metrics, health, settings.metrics_host, metrics_port)
        print(f"metrics: http://{settings.metrics_host}:{port}/metrics", file=out)
        source = RegistryModelSource(
            client, PREFIX, settings.model_poll_seconds, settings.max_model_bytes
        )
        source.current.warm_up()  # compiled (or loaded) before the first event arrives
        consumer = Consumer(settings, connect_settings(settings), source, metrics, health, stop)
        watch = ScoreWatch(redis_url, Keys(PREFIX).scores(PARTITION), user_prefix,
                           cluster=cluster)  # fmt: skip
        publisher = Publisher(redis_url, rate, users, user_prefix, stop, cluster=cluster)
        threads = [threading.Thread(target=consumer.run, name="worker", daemon=True), publisher]
        for t in threads:
            t.start()
        print(f"publishing ~{rate:g} synthetic events/s for {users} users; Ctrl-C stops\n",
              file=out)  # fmt: skip
        _report_loop(client, consumer, consumer_name, metrics, watch, seconds, stop, out)
        if publisher.error is not None:
            raise publisher.error
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


def _queued(client: redis.Redis) -> int:
    """Entries in the demo partition's stream (all unscored before the first score)."""
    try:
        return int(client.xlen(Keys(PREFIX).events(PARTITION)))
    except redis.RedisError:
        return 0


def _report_loop(client, consumer, consumer_name, metrics, watch, seconds, stop, out) -> None:
    """Once a second: this run's events/s, latency, who scores, a few users' scores."""
    last_count, last_buckets = 0.0, metrics.latency.bucket_counts()
    deadline = None if seconds is None else time.monotonic() + seconds
    ours_before = None
    while not stop.wait(1.0):
        holder = lease_holder(client)
        ours = holder is None or holder.startswith(consumer_name + ":")
        if ours_before is not None and ours != ours_before:
            who = "the demo's worker" if ours else f"another worker ({holder})"
            print(f"partition {PARTITION} is now scored by {who}", file=out)
        ours_before = ours
        count, buckets = metrics.count("scored"), metrics.latency.bucket_counts()
        new = watch.update()
        stamp = time.strftime("%H:%M:%S")
        model = watch.model or consumer.model.version
        model = f"v{model}" if model.isdigit() else model  # registry versions are numbers
        if ours and not count:
            print(waiting_text(_queued(client), stamp), file=out, flush=True)
        elif ours:
            print(f"{stamp}  {count - last_count:6.0f} events/s  "
                  f"{latency_text(buckets - last_buckets)}  scored {count:.0f}  model {model}",
                  file=out)  # fmt: skip
        else:
            print(f"{stamp}  {new:6d} events/s scored by the worker holding the lease  "
                  f"scored {watch.seen}  model {model}", file=out)  # fmt: skip
        print("\n".join(watch.lines()), file=out, flush=True)
        last_count, last_buckets = count, buckets
        if deadline is not None and time.monotonic() > deadline:
            break
