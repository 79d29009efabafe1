"""The `intentstream deliver` command: the webhook deliverer (worker/webhooks/deliverer.py)
with its metrics endpoint, until SIGTERM/SIGINT. Exit 0 after SIGTERM, 130 after Ctrl-C, 2 on
a setting to fix or a metrics port taken."""

from __future__ import annotations

import argparse
import logging

from worker.commands.errors import say
from worker.commands.serve import stop_on_signals

log = logging.getLogger("intentstream.webhooks")


def run_deliver(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    from prometheus_client import start_http_server

    from worker.common.connection import connect_settings
    from worker.common.logs import setup_logging
    from worker.common.settings import DeliverySettings, SettingsError, load_settings
    from worker.webhooks.deliverer import Deliverer
    from worker.webhooks.metrics import DeliveryMetrics

    try:
        settings = load_settings(args, DeliverySettings, model=None)
    except SettingsError as exc:
        say("error", str(exc), args)
        return 2
    setup_logging(settings.log_format, settings.log_level)
    metrics = DeliveryMetrics()
    if settings.metrics_port:
        try:
            start_http_server(settings.metrics_port, settings.metrics_host, metrics.registry)
        except OSError as exc:
            say(
                "error",
                f"cannot serve metrics on {settings.metrics_host}:"
                f"{settings.metrics_port}: {exc.strerror} (--metrics-host / --metrics-port)",
                args,
            )
            return 2
    log.info(
        "deliverer started",
        extra={"consumer": settings.consumer, "metrics_port": settings.metrics_port},
    )
    Deliverer(lambda: connect_settings(settings), settings, metrics, stop).run()
    log.info("deliverer stopped", extra={"consumer": settings.consumer})
    return stop.exit_code(0)
