"""The `intentstream worker` command: the consumer loop on the configured Redis, with its
model source and metrics endpoint, until SIGTERM/SIGINT or --max-seconds."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from model.artifact import ArtifactError
from worker.common.connection import connect_settings
from worker.common.keys import Keys
from worker.common.logs import setup_logging
from worker.common.partitions import check_partitions
from worker.common.registry import RegistryError
from worker.common.settings import SettingsError, load_settings


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, installed before slow start-up work."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def cmd_worker(args: argparse.Namespace) -> int:
    """The `intentstream worker` command; returns its exit code."""
    stop = stop_on_signals()
    # The engine is imported here, after the signal handlers (a SIGTERM during its start-up
    # stops it cleanly), and only by this command (the others start without it).
    from worker.engine.adapters.metrics import Health, WorkerMetrics, serve_metrics
    from worker.engine.adapters.model_source import FileModelSource, RegistryModelSource
    from worker.engine.consumer import Consumer

    try:
        settings = load_settings(args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_format, settings.log_level)
    client = connect_settings(settings)
    try:
        check_partitions(client, Keys(settings.prefix), settings.partitions)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if settings.model is not None:
            source = FileModelSource(settings.model)
        else:
            source = RegistryModelSource(
                client, settings.prefix, settings.model_poll_seconds, settings.max_model_bytes
            )
    except (ArtifactError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    metrics, health = WorkerMetrics(), Health()
    if settings.metrics_port:
        try:
            serve_metrics(metrics, health, settings.metrics_host, settings.metrics_port)
        except OSError as exc:
            print(
                f"error: cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: "
                f"{exc.strerror} (--metrics-host / --metrics-port)",
                file=sys.stderr,
            )
            return 2
    consumer = Consumer(settings, client, source, metrics, health, stop)
    consumer.run(max_seconds=args.max_seconds)
    source.close()
    return consumer.exit_code
