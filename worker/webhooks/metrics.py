"""The deliverer's Prometheus metrics, labelled by endpoint name (never a URL or a secret)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# delivered: a 2xx; dead_letter: given up at the maximum age; skipped: a rule the endpoint
# does not take; lost: the entry was trimmed from the actions stream before it was delivered
OUTCOMES = ("delivered", "dead_letter", "skipped", "lost")
ATTEMPT_RESULTS = ("2xx", "3xx", "4xx", "5xx", "timeout", "connection", "error")
# from the action's commit to the receiver's 2xx: milliseconds when all is well, up to the
# maximum age when an endpoint was down
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
    4 * 3600,
    86400,
)


class DeliveryMetrics:
    """Every metric of one deliverer process, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.deliveries = Counter(
            "intentstream_webhook_deliveries",
            "Actions done with per endpoint, by outcome",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.attempts = Counter(
            "intentstream_webhook_attempts",
            "POSTs to endpoints, by result (HTTP status class or error)",
            ["endpoint", "result"],
            registry=r,
        )
        self.latency = Histogram(
            "intentstream_webhook_delivery_latency_seconds",
            "From the action's commit to the endpoint's 2xx",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.oldest = Gauge(
            "intentstream_webhook_oldest_undelivered_seconds",
            "Age of the oldest action not yet delivered to the endpoint (0: none waits)",
            ["endpoint"],
            registry=r,
        )
        self.endpoints = Gauge(
            "intentstream_webhook_endpoints", "Endpoints this deliverer delivers to", registry=r
        )
        self.redis_errors = Counter(
            "intentstream_webhook_redis_errors", "Redis errors the deliverer retried", registry=r
        )

    def start(self, endpoint: str) -> None:
        """Export an endpoint's series from 0, so a first failure shows as an increase."""
        for outcome in OUTCOMES:
            self.deliveries.labels(endpoint, outcome)
        for result in ATTEMPT_RESULTS:
            self.attempts.labels(endpoint, result)
        self.latency.labels(endpoint)
        self.oldest.labels(endpoint).set(0)

    def forget(self, endpoint: str) -> None:
        """Drop a removed endpoint's series."""
        for outcome in OUTCOMES:
            self.deliveries.remove(endpoint, outcome)
        for result in ATTEMPT_RESULTS:
            self.attempts.remove(endpoint, result)
        self.latency.remove(endpoint)
        self.oldest.remove(endpoint)
