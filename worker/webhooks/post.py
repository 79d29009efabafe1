"""One attempt: the signed POST of a delivery to an endpoint, over httpx (a pooled keep-alive
client per endpoint, timeouts, TLS verified by default, redirects not followed)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from worker.webhooks.endpoints import Endpoint, shown_url
from worker.webhooks.payload import Delivery
from worker.webhooks.signing import signed_headers

USER_AGENT = "intentstream-webhooks/1"


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended: the HTTP status, or the error that stopped it."""

    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def result(self) -> str:
        """Its metric label: 2xx, 3xx, 4xx, 5xx, timeout, connection or error."""
        if self.status is not None:
            return f"{min(max(self.status // 100, 1), 5)}xx"
        return self.error.split(":", 1)[0] if self.error else "error"

    def describe(self) -> str:
        return f"HTTP {self.status}" if self.status is not None else str(self.error)


def make_client(endpoint: Endpoint, connections: int) -> httpx.Client:
    """A client for one endpoint's senders: `connections` kept alive, its timeout on each
    phase (connect, write, read, a pooled connection)."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.Client(
        timeout=httpx.Timeout(endpoint.timeout),
        limits=limits,
        follow_redirects=False,  # a redirect is a failed attempt, as the specification says
        headers={"user-agent": USER_AGENT},
    )


def send(client: httpx.Client, endpoint: Endpoint, delivery: Delivery) -> Attempt:
    """POST the delivery once, signed with this attempt's timestamp."""
    headers = signed_headers(endpoint.key, delivery.webhook_id, int(time.time()), delivery.body)
    try:
        reply = client.post(endpoint.url, content=delivery.body, headers=headers)
    except httpx.TimeoutException as exc:
        return Attempt(None, f"timeout: {type(exc).__name__}")
    except (httpx.TransportError, OSError) as exc:  # refused, reset, TLS, DNS, protocol
        return Attempt(None, f"connection: {_quiet(exc, endpoint)}")
    except httpx.HTTPError as exc:  # anything else httpx refuses (a URL it cannot send to)
        return Attempt(None, f"error: {_quiet(exc, endpoint)}")
    return Attempt(reply.status_code)


def _quiet(exc: BaseException, endpoint: Endpoint) -> str:
    """An error's text without the endpoint's full URL (it may hold a token)."""
    return f"{type(exc).__name__}: {exc}".replace(endpoint.url, shown_url(endpoint.url))[:300]
