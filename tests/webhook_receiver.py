"""A real HTTP receiver for the webhook tests: it records every POST and answers as its plan
says for each request: ok (200), 500, stall (answers after the client's timeout), reset (closes
the connection with a TCP RST); stop() and start() again on the same port make it down, then up."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from worker.common.local_redis import free_port

MODES = ("ok", "500", "stall", "reset")


@dataclass(frozen=True)
class Received:
    """One POST as the receiver saw it, and how it answered."""

    headers: dict[str, str]
    body: bytes
    mode: str
    at: float = 0.0  # time.time() when it arrived

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's backlog of 5: reconnects after resets and stalls could fill it, and a
    # dropped SYN costs its client a 1-s retransmit
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up (a stall) or a reset: expected here


class Receiver:
    """The receiver; `plan(n)` names the mode of the n-th request (from 0)."""

    def __init__(self, plan: Callable[[int], str] = lambda n: "ok", stall_s: float = 3.0,
                 delay_s: float = 0.0) -> None:  # fmt: skip
        self.port = free_port()
        self.plan, self.stall_s, self.delay_s = plan, stall_s, delay_s
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> Receiver:
        self._server = _Server(("127.0.0.1", self.port), self._handler())
        # a short poll: stop() (shutdown) waits for the loop to see it, 0.5 s by default
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def ok_ids(self) -> list[str]:
        """The webhook-ids of the POSTs answered 200 in time (ok mode), one per receipt."""
        with self._lock:
            return [r.webhook_id for r in self.received if r.mode == "ok"]

    def all(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def _record(self, headers: dict[str, str], body: bytes) -> str:
        with self._lock:
            mode = self.plan(len(self.received))
            self.received.append(Received(headers, body, mode, time.time()))
        return mode

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: no request, as a server
                    self.close_connection = True  # would have it (nothing recorded, no answer)
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                mode = receiver._record(headers, body)
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                if mode == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))  # fmt: skip
                    self.connection.close()
                    self.close_connection = True
                    return
                if mode == "stall":
                    time.sleep(receiver.stall_s)
                status = 500 if mode == "500" else 200
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

        return Handler
