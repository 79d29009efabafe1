"""An endpoint's HTTP client: signed POSTs over keep-alive HTTP/1.1 connections
(connection.py), many in flight, on an event loop thread of the endpoint's own. TLS is verified
by default, redirects are not followed, each POST is bounded by the endpoint's timeout
(connecting, then sending and the reply)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Sequence
from urllib.parse import urlsplit

import certifi
import h11

from worker.webhooks.attempt import NOT_CONNECTED, Attempt
from worker.webhooks.connection import Connection
from worker.webhooks.endpoints import Endpoint, shown_url
from worker.webhooks.payload import Delivery
from worker.webhooks.signing import signature

USER_AGENT = b"intentstream-webhooks/1"
# what a webhook-id may hold to be sent as a header (ours: act_<p>_<entry id>, ping_<hex>)
HEADER_ID = re.compile(rb"[A-Za-z0-9_.:-]{1,200}")
# after the head common to an endpoint's requests: each one's length, headers and body
REQUEST = b"%s%d\r\nwebhook-id: %s\r\nwebhook-timestamp: %d\r\nwebhook-signature: %s\r\n\r\n%s"


# new connections not yet answered on: more at once would let a burst of connects overflow
# the listen backlog of a server slow to accept (Python's http.server: 5), and a dropped SYN
# costs a second or more; so the connections grow as the receiver proves it takes them
UNPROVEN_AT_ONCE = 2


def tls_context() -> ssl.SSLContext:
    """Certificates and host names verified, against SSL_CERT_FILE when set, else certifi's
    bundle (what httpx, the client before this one, trusted)."""
    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where())


class _Batch:
    """Deliveries handed over together, their attempts as they end, the future waited on."""

    def __init__(self, deliveries: Sequence[Delivery], stop: threading.Event | None) -> None:
        self.todo = deque(enumerate(deliveries))
        self.results: list[Attempt | None] = [None] * len(deliveries)
        self.left, self.stop = len(deliveries), stop
        self.future: concurrent.futures.Future[list[Attempt | None]] = concurrent.futures.Future()
        if not deliveries:
            self.future.set_result([])

    def take(self) -> tuple[int, Delivery] | None:
        """The next delivery to POST; none once stopped (those left are not sent: None)."""
        if self.todo and self.stop is not None and self.stop.is_set():
            self.left -= len(self.todo)
            self.todo.clear()
            self._maybe_done()
        return self.todo.popleft() if self.todo else None

    def settle(self, i: int, attempt: Attempt) -> None:
        self.results[i] = attempt
        self.left -= 1
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.left == 0 and not self.future.done():
            self.future.set_result(self.results)


class EndpointClient:
    """An endpoint's connections, at most `connections` open, on an event loop thread of its
    own; `submit` a batch from any thread, each POST signed when it is sent."""

    def __init__(self, endpoint: Endpoint, connections: int) -> None:
        self.endpoint, self.connections = endpoint, connections
        parts = urlsplit(endpoint.url)
        self.tls = parts.scheme == "https"
        self.host, self.port = parts.hostname or "", parts.port or (443 if self.tls else 80)
        self.ssl = tls_context() if self.tls else None
        self.key = endpoint.key
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rsplit("@", 1)[-1]  # credentials are not sent in the Host
        self.error, self._head = "", b""
        try:  # h11 checks the path and the host once, as it would check each request
            host_b = host.encode("idna")
            self.template = h11.Request(
                method=b"POST", target=path, headers=[(b"host", host_b), (b"content-length", b"0")]
            )
            self._head = (
                b"POST " + path.encode("ascii") + b" HTTP/1.1\r\nhost: " + host_b
                + b"\r\nuser-agent: " + USER_AGENT
                + b"\r\ncontent-type: application/json\r\ncontent-length: "
            )  # fmt: skip
        except (h11.LocalProtocolError, UnicodeError) as exc:
            self.error = f"error: {self._quiet(exc)}"
        self._idle: list[Connection] = []
        self._open = self._unproven = 0
        self._waiting: deque[_Batch] = deque()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name=f"http-{endpoint.name}"
        )
        self._thread.start()

    def submit(
        self, deliveries: Sequence[Delivery], stop: threading.Event | None = None
    ) -> concurrent.futures.Future[list[Attempt | None]]:
        """POST each delivery once, up to `connections` at a time; the attempts in order.
        Once `stop` is set no further POST starts: those not sent are None."""
        batch = _Batch(deliveries, stop)
        if deliveries:
            self.loop.call_soon_threadsafe(self._add, batch)
        return batch.future

    def post_all(self, deliveries: Sequence[Delivery]) -> list[Attempt]:
        """`submit` and wait: every delivery's attempt."""
        return [a or Attempt(None, "error: not sent") for a in self.submit(deliveries).result()]

    def close(self) -> None:
        """Close the connections and end the loop's thread."""

        def shut() -> None:
            while self._idle:
                self._idle.pop().close()
            self.loop.call_soon(self.loop.stop)  # after the closes are handled

        self.loop.call_soon_threadsafe(shut)
        self._thread.join()
        self.loop.close()

    def __enter__(self) -> EndpointClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the rest runs on the loop's thread

    def _add(self, batch: _Batch) -> None:
        self._waiting.append(batch)
        self._dispatch()

    def _dispatch(self) -> None:
        """Start waiting requests on idle connections, then on new ones, up to the limit."""
        while self._waiting:
            if self._idle:
                self._run_on(self._idle.pop())
            elif self._open < self.connections and self._unproven < UNPROVEN_AT_ONCE:
                job = self._next()
                if job is None:
                    return
                self._connect(*job)
            else:
                return

    def _next(self) -> tuple[_Batch, int, Delivery] | None:
        while self._waiting:
            batch = self._waiting[0]
            job = batch.take()
            if job is not None:
                return (batch, *job)
            self._waiting.popleft()
        return None

    def _run_on(self, conn: Connection) -> None:
        """The next waiting request on a kept-alive connection; idle if none waits."""
        while (job := self._next()) is not None:
            batch, i, delivery = job
            wire = self._wire(delivery)
            if wire is None:
                batch.settle(i, self._unsendable())
                continue
            conn.send((batch, i, delivery), wire)
            return
        self._idle.append(conn)

    def ended(
        self, conn: Connection | None, job: object, attempt: Attempt, first: bool, stale: bool
    ) -> None:
        """A request ended on a connection (None: closed): settle it or, stale, send it again
        on a new connection; then the next request on it, and maybe a new connection."""
        batch, i, delivery = job  # type: ignore[misc]
        if first:
            self._unproven -= 1
        if stale:
            self._connect(batch, i, delivery)
        else:
            batch.settle(i, attempt)
        if conn is not None:
            self._run_on(conn)
        if first:
            self._dispatch()

    def forget(self, conn: Connection) -> None:
        """A connection closed: its place goes to a waiting request."""
        self._open -= 1
        if conn in self._idle:
            self._idle.remove(conn)
        self._dispatch()

    def _connect(self, batch: _Batch, i: int, delivery: Delivery) -> None:
        self._open += 1
        self._unproven += 1
        self.loop.create_task(self._connect_then_send(batch, i, delivery))

    async def _connect_then_send(self, batch: _Batch, i: int, delivery: Delivery) -> None:
        attempt = self._unsendable() if self.error else None
        if attempt is None:
            try:
                async with asyncio.timeout(self.endpoint.timeout):
                    _, conn = await self.loop.create_connection(
                        lambda: Connection(self, self.endpoint.timeout),
                        self.host,
                        self.port,
                        ssl=self.ssl,
                        server_hostname=self.host if self.tls else None,
                    )
            except TimeoutError:
                attempt = NOT_CONNECTED
            except OSError as exc:  # refused, unreachable, DNS, TLS (a certificate refused)
                attempt = Attempt(None, f"connection: {self._quiet(exc)}")
        if attempt is not None:
            self._open -= 1
            self._unproven -= 1
            batch.settle(i, attempt)
        else:
            wire = self._wire(delivery)
            if wire is None:
                batch.settle(i, self._unsendable())
                self._run_on(conn)
            else:
                conn.send((batch, i, delivery), wire)
        self._dispatch()  # another connection may open now

    def _unsendable(self) -> Attempt:
        return Attempt(None, self.error or "error: a webhook-id that is no header value")

    def _wire(self, delivery: Delivery) -> bytes | None:
        """The request's bytes, signed with this attempt's timestamp; None if unsendable."""
        wid = delivery.webhook_id.encode(errors="replace")
        if self.error or not HEADER_ID.fullmatch(wid):
            return None
        ts = int(time.time())
        sig = signature(self.key, delivery.webhook_id, ts, delivery.body).encode()
        return REQUEST % (self._head, len(delivery.body), wid, ts, sig, delivery.body)

    def _quiet(self, exc: BaseException) -> str:
        """An error's text without the endpoint's full URL (it may hold a token)."""
        url = self.endpoint.url
        return f"{type(exc).__name__}: {exc}".replace(url, shown_url(url))[:300]


def post_once(endpoint: Endpoint, delivery: Delivery) -> Attempt:
    """One POST on a connection of its own (`webhooks test`)."""
    with EndpointClient(endpoint, 1) as client:
        return client.post_all([delivery])[0]
