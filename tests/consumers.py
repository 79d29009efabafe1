"""The one builder of an in-process Consumer for tests: a pinned model file (warmed up) or,
without one, the registry's current version followed every 10 ms."""

from __future__ import annotations

from pathlib import Path

from worker.common.connection import connect
from worker.common.settings import Settings
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.consumer import Consumer
from worker.lifecycle.model_source import FileModelSource, RegistryModelSource


def in_process_consumer(
    url: str, model: Path | str | None = None, *, cluster: bool = False, **settings: object
) -> Consumer:
    """A Consumer on `url` named c1, blocking 100 ms, no metrics port (following the
    registry: polled every 10 ms); `settings` override."""
    given = {"model": model} if model is not None else {"model_poll_seconds": 0.01}
    s = Settings(**{"redis_url": url, "cluster": cluster, "metrics_port": 0, "block_ms": 100,
                    "consumer": "c1", **given, **settings})  # fmt: skip
    client = connect(url, cluster=cluster)
    if model is None:
        source = RegistryModelSource(client, s.prefix, 0.01, s.max_model_bytes)
        return Consumer(s, client, source, WorkerMetrics())
    consumer = Consumer(s, client, FileModelSource(model), WorkerMetrics())
    consumer.model.warm_up()
    return consumer
