"""The webhook benchmark's receiver, a process of its own: answers every POST 204 on a
keep-alive connection and notes when each action arrived; GET / returns the count, GET /delays
also each arrival's delay after the action's commit (ms) and the latest arrival's
time.monotonic(), as JSON. A bare asyncio protocol, so
that it costs far less per request than the deliverer it measures (bench --webhooks prints
both). `python -m worker.bench.receiver PORT`"""

from __future__ import annotations

import asyncio
import json
import sys
import time

_delays: list[float] = []
_last = [0.0]  # time.monotonic() of the latest POST (one clock for every process)
NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"


def _header(head: bytes, name: bytes) -> bytes:
    """A header's value in a request head (names matched lowercase, as the deliverer sends)."""
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return b""
    start = at + len(name) + 3
    return head[start : head.find(b"\r\n", start)].strip()


class _Receiver(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[: end + 2].lower()  # each header line ends with CRLF
            size = int(_header(head, b"content-length") or 0)
            if len(self.buffer) < end + 4 + size:
                return  # the body still coming
            self.buffer = self.buffer[end + 4 + size :]
            self.transport.write(self._answer(head))

    def _answer(self, head: bytes) -> bytes:
        if head.startswith(b"post"):
            # webhook-id act_<p>_<ms>-<seq>: the commit time is in the id
            committed_ms = int(_header(head, b"webhook-id").split(b"_")[2].split(b"-")[0])
            _delays.append(time.time() * 1000 - committed_ms)
            _last[0] = time.monotonic()
            return NO_CONTENT
        doc: dict = {"count": len(_delays)}
        if head.startswith(b"get /delays"):  # once, at the end: the count alone while it runs
            doc["delays_ms"], doc["last"] = _delays, _last[0]
        body = json.dumps(doc).encode()
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Receiver, "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
