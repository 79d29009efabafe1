"""Redis clients with an explicit timeout and retry policy (SPEC §4).

redis-py 8 defaults to a 5 s socket timeout and retries on timeouts, resending a command whose
reply was lost. The worker's commit script is idempotent, so a resend is safe; blocking reads
stay below the socket timeout (see Settings).
"""

from __future__ import annotations

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from worker.settings import Settings


def connect(url: str, socket_timeout: float = 5.0, retries: int = 3) -> redis.Redis:
    """A client for redis://, rediss:// (TLS) or unix:// URLs; ACL user:password in the URL.

    Replies stay bytes (no decoding): event fields may be any bytes and are validated here.
    Connection errors and timeouts are retried `retries` times with jittered exponential
    backoff (10 ms doubling, capped at 1 s); the caller's loop handles longer outages.
    """
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 5.0),
        health_check_interval=30,
        retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.01), retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        decode_responses=False,
    )


def connect_settings(settings: Settings) -> redis.Redis:
    """The worker's client for its settings."""
    return connect(settings.redis_url, settings.socket_timeout)
