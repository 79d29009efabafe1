"""The `intentstream worker` command: the consumer loop on the configured Redis, with its
model source and metrics endpoint, until SIGTERM/SIGINT or --max-seconds.

A Redis that cannot be reached at start is waited for, with backoff, as the loop waits for
one that goes away later: after a boot race or a Redis restart the worker starts by itself
(a supervisor that restarted it instead would back off for minutes). The wait is bounded by
--wait-for-redis and by --max-seconds (counted from the start, waits included): the worker
says once what it waits for, then every WAIT_REPORT_SECONDS. Exit 0 after SIGTERM or
--max-seconds, 130 after Ctrl-C (SIGINT), 2 on a setting or model to fix or a Redis still
unreachable when the wait's bound passed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable

import redis
from redis.exceptions import RedisClusterException

from model.artifact import ArtifactError
from worker.commands.errors import acl_refusal, not_a_cluster, redacted, say
from worker.common.connection import Client, connect_settings
from worker.common.keys import Keys
from worker.common.logs import setup_logging
from worker.common.partition_count import check_partitions
from worker.common.settings import Settings, SettingsError, load_settings
from worker.lifecycle.registry import RegistryError

log = logging.getLogger("intentstream.worker")

# Failures at start that Redis coming back cures (a refused login or command does not).
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError,
                RedisClusterException)  # fmt: skip
# The longest wait stays well inside /healthz's 30 s staleness: waiting is healthy.
FIRST_RETRY_SECONDS, MAX_RETRY_SECONDS = 0.5, 10.0
# A wait for Redis is logged when it starts, then once per this many seconds.
WAIT_REPORT_SECONDS = 30.0


class Stop(threading.Event):
    """Set by SIGTERM or SIGINT; remembers which, for the exit code."""

    signal: int | None = None

    def exit_code(self, code: int) -> int:
        """The exit code of a run that ended with `code`: 130 for a clean stop by SIGINT
        (Ctrl-C), as a shell reports it."""
        return 130 if code == 0 and self.signal == signal.SIGINT else code


def stop_on_signals() -> Stop:
    """A Stop set by SIGTERM or SIGINT, installed before slow start-up work."""
    stop = Stop()

    def handler(sig: int, _frame: object) -> None:
        stop.signal = sig
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return stop


def _is_unreachable(exc: BaseException) -> bool:
    return (
        isinstance(exc, _UNREACHABLE)
        and not isinstance(exc, redis.AuthenticationError)  # a ConnectionError in redis-py
        and acl_refusal(exc) is None
        and not not_a_cluster(exc)  # --cluster on a plain server: a setting to fix
    )


class RedisWaitExpiredError(Exception):
    """Redis was still unreachable when the wait's bound passed; the message says which."""


def connected(
    settings: Settings,
    stop: Stop,
    alive: Callable[[], None] = lambda: None,
    deadline: float | None = None,
    bound: str = "",
) -> Client | None:
    """A client whose Redis answered PING, retried with backoff while Redis is unreachable
    (calling `alive` at each try: the process is healthy, only not ready); None if stopped
    first. Past `deadline` (time.monotonic()'s clock; `bound` names it: `300 s
    (--wait-for-redis / ...)`) it raises RedisWaitExpiredError. The wait is logged once, then every
    WAIT_REPORT_SECONDS."""
    url = redacted(settings.redis_url)
    delay = FIRST_RETRY_SECONDS
    start = next_report = time.monotonic()
    while True:
        alive()
        try:
            client = connect_settings(settings)
            client.ping()
            if next_report > start:  # the wait was logged: say it ended
                log.info("Redis at %s answered after %.0f s", url, time.monotonic() - start)
            return client
        except Exception as exc:
            if not _is_unreachable(exc):
                raise
            problem = exc
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise RedisWaitExpiredError(
                f"Redis at {url} is still unreachable after {bound}: {problem}"
            )
        if now >= next_report:
            if next_report == start:
                limit = "" if deadline is None else f" up to {bound}"
                log.warning("Redis at %s is unreachable (%s): waiting%s, retrying with backoff",
                            url, problem, limit)  # fmt: skip
            else:
                log.warning("Redis at %s is still unreachable after %.0f s (%s): waiting",
                            url, now - start, problem)  # fmt: skip
            next_report = now + WAIT_REPORT_SECONDS
        if stop.wait(delay if deadline is None else min(delay, deadline - now)):
            return None
        delay = min(delay * 2, MAX_RETRY_SECONDS)


def wait_bound(settings: Settings, max_seconds: float | None, started: float) -> tuple[float, str]:
    """The start-up wait's deadline and its flag: --wait-for-redis counted from now (the first
    try: a start-up slowed by a busy machine does not eat the wait), or --max-seconds (counted
    from `started`) when that ends the run first."""
    deadline = time.monotonic() + settings.wait_for_redis
    bound = f"{settings.wait_for_redis:g} s (--wait-for-redis / INTENTSTREAM_WAIT_FOR_REDIS)"
    if max_seconds is not None and started + max_seconds < deadline:
        deadline, bound = started + max_seconds, f"{max_seconds:g} s (--max-seconds)"
    return deadline, bound


def cmd_worker(args: argparse.Namespace) -> int:
    """The `intentstream worker` command; returns its exit code."""
    started = time.monotonic()  # --max-seconds counts from here: every wait inside it
    stop = stop_on_signals()
    # The engine is imported here, after the signal handlers (a SIGTERM during its start-up
    # stops it cleanly), and only by this command (the others start without it).
    from worker.engine.adapters.metrics import Health, WorkerMetrics, serve_metrics
    from worker.engine.consumer import Consumer
    from worker.lifecycle.model_source import FileModelSource, RegistryModelSource

    try:
        settings = load_settings(args)
    except SettingsError as exc:
        say("error", str(exc), args)
        return 2
    setup_logging(settings.log_format, settings.log_level)
    # Every check that needs no Redis first, and the one write (recording the partition
    # count) last: a worker that refuses to start leaves nothing behind in Redis.
    metrics, health = WorkerMetrics(), Health()
    if settings.metrics_port:
        try:
            serve_metrics(metrics, health, settings.metrics_host, settings.metrics_port)
        except OSError as exc:
            say("error", f"cannot serve metrics on {settings.metrics_host}:"
                f"{settings.metrics_port}: {exc.strerror} (--metrics-host / --metrics-port)",
                args)  # fmt: skip
            return 2
    try:
        raw = settings.raw_scores
        source = FileModelSource(settings.model, raw) if settings.model is not None else None
        deadline, bound = wait_bound(settings, args.max_seconds, started)
        client = connected(settings, stop, health.beat, deadline, bound)
        if client is None:
            return stop.exit_code(0)
        if source is None:
            source = RegistryModelSource(client, settings.prefix, settings.model_poll_seconds,
                                         settings.max_model_bytes, raw)  # fmt: skip
        check_partitions(client, Keys(settings.prefix), settings.partitions)
    except (ArtifactError, RegistryError, SettingsError, RedisWaitExpiredError) as exc:
        say("error", str(exc), args)
        return 2
    consumer = Consumer(settings, client, source, metrics, health, stop)
    end = None if args.max_seconds is None else started + args.max_seconds
    consumer.run(deadline=end)  # closes the source at its end
    return stop.exit_code(consumer.exit_code)
