"""One keep-alive HTTP/1.1 connection to a webhook endpoint: an asyncio protocol that sends
one request at a time (bytes its owner built), reads the reply with h11 and bounds it by the
endpoint's timeout."""

from __future__ import annotations

import asyncio
from typing import Protocol

import h11

from worker.webhooks.attempt import TIMED_OUT, Attempt


class Owner(Protocol):
    """What a connection reports to: the client that opened it (post.py)."""

    loop: asyncio.AbstractEventLoop
    template: h11.Request

    def ended(
        self, conn: Connection | None, job: object, attempt: Attempt, first: bool, stale: bool
    ) -> None: ...

    def forget(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its reply read by h11."""

    def __init__(self, owner: Owner, timeout: float) -> None:
        self.owner, self.timeout, self.transport = owner, timeout, None
        self.http = h11.Connection(h11.CLIENT)
        self.job: object = None
        self.reused = self.replied = False
        self.status = 0
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, job: object, wire: bytes) -> None:
        """Send a request's bytes; its end goes to the owner's `ended` with `job`."""
        self.job, self.replied, self.status = job, False, 0
        # h11 is told of a request like the one on the wire (POST, HTTP/1.1, keep-alive, its
        # body complete) so that it frames the reply; the wire bytes are built by the owner
        self.http.send(self.owner.template)
        self.http.send(h11.EndOfMessage())
        self.transport.write(wire)  # type: ignore[union-attr]
        self.timer = self.owner.loop.call_later(self.timeout, self._timed_out)

    def data_received(self, data: bytes) -> None:
        self.replied = True
        self._read(data)

    def eof_received(self) -> bool:
        self._read(b"")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.job is not None:
            self._lost(_name(exc) or "closed by the receiver")
        self.owner.forget(self)

    def _read(self, data: bytes) -> None:
        if self.job is None:
            if data:  # a reply to no request: the connection cannot be trusted
                self.close()
            return
        try:
            self.http.receive_data(data)
            while self.job is not None:
                event = self.http.next_event()
                if event is h11.NEED_DATA:
                    return
                if isinstance(event, h11.Response):
                    self.status = event.status_code
                elif isinstance(event, h11.EndOfMessage):
                    self._end(Attempt(self.status), False)
                elif isinstance(event, h11.ConnectionClosed):
                    self._lost("closed by the receiver")
        except h11.ProtocolError as exc:  # a reply h11 refuses, or none before the close
            self._lost(_name(exc))

    def _lost(self, why: str) -> None:
        """The request failed on the connection; stale if it was kept alive and closed by
        the receiver with no byte of reply (its idle timeout, not this request)."""
        self._end(Attempt(None, f"connection: {why}"), self.reused and not self.replied)

    def _timed_out(self) -> None:
        self.timer = None
        self._end(TIMED_OUT, False)

    def _end(self, attempt: Attempt, stale: bool) -> None:
        job, self.job = self.job, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        h = self.http
        if attempt.status is not None and h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
        reusable = h.our_state is h11.IDLE and not self.transport.is_closing()  # type: ignore[union-attr]
        if not reusable:
            self.close()
        first, self.reused = not self.reused, True
        self.owner.ended(self if reusable else None, job, attempt, first, stale)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _name(exc: BaseException | None) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {exc}"[:300]
