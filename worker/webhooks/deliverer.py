"""`intentstream deliver`: follows the endpoints in Redis and runs each one's senders
(sender.py), each sender a thread with its own Redis connection, each endpoint its own HTTP
client (post.py: its connections on an event loop thread), until stopped."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from worker.common.connection import Client, refresh_topology
from worker.common.keys import Keys
from worker.common.settings import DeliverySettings
from worker.webhooks.backoff import RetrySchedule
from worker.webhooks.endpoints import Endpoint, shown_url
from worker.webhooks.group import ActionsGroup
from worker.webhooks.metrics import DeliveryMetrics
from worker.webhooks.post import EndpointClient
from worker.webhooks.sender import Sender, SenderConfig
from worker.webhooks.store import load_endpoints

log = logging.getLogger("intentstream.webhooks")


class _Running:
    """One endpoint's senders, their HTTP client and their stop."""

    def __init__(
        self,
        endpoint: Endpoint,
        http: EndpointClient,
        threads: list[threading.Thread],
        stop: threading.Event,
    ) -> None:
        self.endpoint, self.http, self.threads, self.stop = endpoint, http, threads, stop

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        self.http.close()


class Deliverer:
    """Every endpoint's senders in this process; `run` until `stop` is set (each sender
    then ends its current attempt and its blocking read, at most block_ms)."""

    def __init__(
        self,
        connect: Callable[[], Client],
        settings: DeliverySettings,
        metrics: DeliveryMetrics,
        stop: threading.Event,
    ) -> None:
        self.connect, self.settings, self.metrics, self.stop = connect, settings, metrics, stop
        self.keys = Keys(settings.prefix)
        self.client = connect()
        self.running: dict[str, _Running] = {}
        self._last_error, self._said_at = "", 0.0
        self.config = SenderConfig(
            schedule=RetrySchedule(
                cap=settings.webhook_retry_cap_seconds, max_age=settings.webhook_max_age_seconds
            ),
            max_held=settings.webhook_max_held,
            claim_idle_ms=int(settings.webhook_claim_idle_seconds * 1000),
            block_ms=settings.block_ms,
            measure_seconds=settings.webhook_measure_seconds,
        )

    def run(self) -> None:
        """Re-read the endpoints every poll; start, restart (changed) and stop senders."""
        try:
            while not self.stop.is_set():
                try:
                    self.follow(load_endpoints(self.client, self.keys), self._partitions())
                    self._last_error = ""
                except redis.RedisError as exc:
                    self.metrics.redis_errors.inc()
                    self._say_once(f"{type(exc).__name__}: {exc}")
                    refresh_topology(self.client)
                self.stop.wait(self.settings.webhook_poll_seconds)
        finally:
            for name in list(self.running):
                self._stop_endpoint(name)

    def _say_once(self, error: str) -> None:
        """Log a failure to read the endpoints when it is new, or a minute after the last."""
        now = time.monotonic()
        if error != self._last_error or now - self._said_at > 60:
            log.warning("redis error reading the endpoints; retrying", extra={"error": error})
            self._last_error, self._said_at = error, now

    def _partitions(self) -> int:
        """The partition count recorded by the workers, else the setting."""
        recorded = self.client.hget(self.keys.config, "partitions")
        return int(recorded) if recorded else self.settings.partitions

    def follow(self, endpoints: dict[str, Endpoint], partitions: int) -> None:
        for name in list(self.running):
            if endpoints.get(name) != self.running[name].endpoint:
                self._stop_endpoint(name)
        for name, endpoint in endpoints.items():
            if name not in self.running:
                self._start_endpoint(endpoint, partitions)
        self.metrics.endpoints.set(len(self.running))

    def _start_endpoint(self, endpoint: Endpoint, partitions: int) -> None:
        n = self.settings.webhook_senders
        http = EndpointClient(endpoint, self.settings.webhook_connections)
        stop = threading.Event()
        threads = []
        self.metrics.start(endpoint.name)
        for k in range(n):
            client = self.connect()
            consumer = f"{self.settings.consumer}-{k}"
            group = ActionsGroup(client, self.keys, endpoint, partitions, consumer)
            sender = Sender(
                client,
                self.keys,
                endpoint,
                group,
                http,
                self.config,
                self.metrics,
                stop,
                measures_oldest=k == 0,
            )
            threads.append(
                threading.Thread(
                    target=sender.run, daemon=True, name=f"webhook-{endpoint.name}-{k}"
                )
            )
        for t in threads:
            t.start()
        self.running[endpoint.name] = _Running(endpoint, http, threads, stop)
        log.info(
            "delivering",
            extra={
                "endpoint": endpoint.name,
                "url": shown_url(endpoint.url),
                "senders": n,
                "connections": self.settings.webhook_connections,
                "partitions": partitions,
            },
        )

    def _stop_endpoint(self, name: str) -> None:
        self.running.pop(name).close()
        self.metrics.forget(name)
        log.info("stopped delivering", extra={"endpoint": name})
