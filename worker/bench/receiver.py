"""The webhook benchmark's receiver, a process of its own: answers every POST 204 on a
keep-alive connection and notes when each action arrived; GET / returns the count, GET /delays
also each arrival's delay after the action's commit (ms), as JSON.
`python -m worker.bench.receiver PORT`"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_delays: list[float] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        # webhook-id act_<p>_<ms>-<seq>: the commit time is in the id
        committed_ms = int(self.headers["webhook-id"].split("_")[2].split("-")[0])
        _delays.append(time.time() * 1000 - committed_ms)
        self.send_response(204)
        self.end_headers()

    def do_GET(self) -> None:
        doc: dict = {"count": len(_delays)}
        if self.path == "/delays":  # once, at the end: the count alone while it runs
            doc["delays_ms"] = _delays
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve(port: int) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
