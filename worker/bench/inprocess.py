"""The worker in the benchmark's own process: started, warmed up and tuned as `Consumer.run`
does, then ticked until the backlog is scored (the bench's variant a, and the rules bench)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from model.scoring import ScoringModel
from worker.common.connection import connect
from worker.common.settings import Settings
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.consumer import Consumer, pin_blas, tune_gc
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
    consumer.model.warm_up()
    pin_blas()  # as Consumer.run does
    tune_gc()
    return consumer, metrics


def consume(consumer: Consumer, metrics: WorkerMetrics, n: int) -> tuple[float, list]:
    """Tick until n events are scored: (seconds, per-tick (events, seconds)); then stop
    following the registry and the rules (their threads would outlive the run)."""
    latencies = []
    t0 = time.perf_counter()
    while (before := metrics.count("scored")) < n:
        t = time.perf_counter()
        consumer.tick()
        latencies.append((int(metrics.count("scored") - before), time.perf_counter() - t))
    seconds = time.perf_counter() - t0
    consumer.close()
    return seconds, latencies
