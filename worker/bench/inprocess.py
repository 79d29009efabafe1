"""The worker in the benchmark's own process: started, warmed up and tuned as `Consumer.run`
does, then ticked until the backlog is scored (the bench's variant a, and the rules, inputs and
shadow benches, which time it by `timed_backlog`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from model.scoring import ScoringModel
from worker.bench.load import redis_cpu
from worker.common.connection import connect
from worker.common.settings import Settings
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.consumer import Consumer, tune_gc
from worker.lifecycle.model_source import FileModelSource


class _NoModel(ScoringModel):
    """The worker's I/O path alone: states pass through, every score is 0."""

    def advance(self, state, last_ts, slot, type_idx, ts_ms):
        return np.zeros(slot.shape[0], np.float32)


def start_worker(
    url: str, model_path: Path, batch: int, no_model: bool, history_events: int = 32,
    shadow_path: Path | None = None,
) -> tuple[Consumer, WorkerMetrics]:  # fmt: skip
    """The worker in this process, warmed up and tuned as Consumer.run does; with
    `shadow_path`, that model scoring beside the current one as a shadow."""
    settings = Settings(redis_url=url, model=model_path, batch_size=batch, consumer="bench",
                        metrics_port=0, block_ms=100, retention_seconds=0,
                        history_events=history_events)  # fmt: skip
    source = FileModelSource(model_path)
    if no_model:
        source.current = _NoModel(source.current.model, source.current.version)
    if shadow_path is not None:
        source.shadow = FileModelSource(shadow_path).current
    metrics = WorkerMetrics()
    consumer = Consumer(settings, connect(url), source, metrics)
    consumer.models.warm_up()  # every kernel, and BLAS pinned, as Consumer.run does
    tune_gc()
    return consumer, metrics


def consume(consumer: Consumer, metrics: WorkerMetrics, n: int) -> tuple[float, list]:
    """Tick until n events are scored: (seconds, per-tick (events, seconds)); then shut down
    as a stopped worker does: its leases released (the next run's worker would wait them
    out), the registry and the rules no longer followed (their threads would outlive it)."""
    latencies = []
    t0 = time.perf_counter()
    while (before := metrics.count("scored")) < n:
        t = time.perf_counter()
        consumer.tick()
        latencies.append((int(metrics.count("scored") - before), time.perf_counter() - t))
    seconds = time.perf_counter() - t0
    consumer.shutdown()
    return seconds, latencies


@dataclass(frozen=True)
class Timed:
    """The in-process worker's run over a backlog: its pace and its CPU."""

    events: int
    seconds: float
    worker_cpu: float  # this process's CPU seconds from the first tick to the last
    redis_cpu: float  # Redis's CPU seconds over the same run

    @property
    def rate(self) -> float:
        """Events per second."""
        return self.events / self.seconds

    @property
    def worker_us(self) -> float:
        """The worker's CPU per event, µs."""
        return self.worker_cpu / self.events * 1e6

    @property
    def redis_us(self) -> float:
        """Redis's CPU per event, µs."""
        return self.redis_cpu / self.events * 1e6


def timed_backlog(
    r: redis.Redis, url: str, model_path: Path, n: int, batch: int, history_events: int,
    shadow_path: Path | None = None,
) -> Timed:  # fmt: skip
    """The in-process worker (`start_worker`) over the n events preloaded in r, timed:
    start-up and the kernels' warm-up excluded."""
    consumer, metrics = start_worker(url, model_path, batch, False, history_events, shadow_path)
    redis0, cpu0 = redis_cpu(r), time.process_time()
    seconds, _ = consume(consumer, metrics, n)
    return Timed(n, seconds, time.process_time() - cpu0, redis_cpu(r) - redis0)
