"""The deliverer's HTTP client (worker/webhooks/post.py) against real HTTP servers on
loopback: many POSTs in flight over few kept-alive connections, new connections only as the
receiver answers, a connection the receiver closed replaced without a failed attempt,
redirects not followed, TLS verified by default."""

from __future__ import annotations

import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from worker.webhooks.endpoints import Endpoint
from worker.webhooks.payload import Delivery
from worker.webhooks.post import EndpointClient
from worker.webhooks.signing import new_secret


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64


class Probe:
    """A keep-alive HTTP/1.1 server on loopback that counts connections, requests and the
    most in flight at once; `answer(handler)` (default 204) replies to each POST."""

    def __init__(self, answer=None, delay_s: float = 0.0, tls: ssl.SSLContext | None = None):
        self.connections = self.requests = self.in_flight = self.most = 0
        self.lock, self.delay_s, self.answer = threading.Lock(), delay_s, answer
        self.gate = threading.Event()
        self.gate.set()
        probe = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with probe.lock:
                    probe.connections += 1

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                with probe.lock:
                    probe.requests += 1
                    probe.in_flight += 1
                    probe.most = max(probe.most, probe.in_flight)
                probe.gate.wait(30)
                time.sleep(probe.delay_s)
                with probe.lock:
                    probe.in_flight -= 1
                if probe.answer is not None:
                    probe.answer(self)
                    return
                self.send_response(204)
                self.end_headers()

        self.server = _Server(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}/hooks"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def endpoint(url: str, timeout: float = 5.0) -> Endpoint:
    return Endpoint(name="probe", url=url, secret=new_secret(), timeout=timeout)


def deliveries(n: int) -> list[Delivery]:
    return [Delivery(f"act_0_{i}-0", b'{"n":%d}' % i, "coupon", i) for i in range(n)]


def test_many_posts_in_flight_over_few_kept_alive_connections():
    probe = Probe(delay_s=0.05)
    try:
        with EndpointClient(endpoint(probe.url()), 8) as client:
            attempts = client.post_all(deliveries(80))
            again = client.post_all(deliveries(8))
    finally:
        probe.close()
    assert [a.status for a in attempts + again] == [204] * 88
    assert probe.requests == 88
    assert 2 < probe.most <= 8, probe.most
    assert probe.connections <= 8, "connections are kept alive and reused"


def test_new_connections_open_only_as_the_receiver_answers():
    probe = Probe()
    probe.gate.clear()  # no answer yet
    try:
        with EndpointClient(endpoint(probe.url()), 16) as client:
            future = client.submit(deliveries(32))
            time.sleep(0.5)  # would be time enough to open all 16
            held = probe.connections
            probe.gate.set()
            attempts = future.result(30)
    finally:
        probe.close()
    assert held <= 2, f"{held} connections opened before any answer"
    assert [a.status for a in attempts] == [204] * 32


def closes_after_answering(handler: BaseHTTPRequestHandler) -> None:
    """204, then the connection closed with no `connection: close` (a receiver's idle timeout)."""
    handler.send_response(204)
    handler.end_headers()
    handler.wfile.flush()
    handler.close_connection = True


def test_a_connection_the_receiver_closed_is_replaced_without_a_failed_attempt():
    probe = Probe(answer=closes_after_answering)
    try:
        with EndpointClient(endpoint(probe.url()), 1) as client:
            attempts = [client.post_all(deliveries(1))[0] for _ in range(20)]
    finally:
        probe.close()
    assert [a.status for a in attempts] == [204] * 20, [a.describe() for a in attempts]
    assert probe.requests == 20 and probe.connections == 20


def redirects(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(307)
    handler.send_header("location", "http://127.0.0.1:1/elsewhere")
    handler.send_header("content-length", "3")
    handler.end_headers()
    handler.wfile.write(b"bye")


def test_a_redirect_is_a_failed_attempt_not_followed():
    probe = Probe(answer=redirects)
    try:
        with EndpointClient(endpoint(probe.url()), 2) as client:
            attempts = client.post_all(deliveries(3))
    finally:
        probe.close()
    assert [(a.status, a.ok, a.result) for a in attempts] == [(307, False, "3xx")] * 3
    assert probe.requests == 3


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for localhost and 127.0.0.1 (openssl), and its key."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)  # fmt: skip
    return cert, key


def test_tls_is_verified_by_default(certificate, monkeypatch):
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    probe = Probe(tls=server_tls)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    try:
        with EndpointClient(endpoint(probe.url("https")), 2) as client:
            refused = client.post_all(deliveries(2))
        monkeypatch.setenv("SSL_CERT_FILE", cert)  # the receiver's CA trusted: delivered
        with EndpointClient(endpoint(probe.url("https", "localhost")), 2) as client:
            trusted = client.post_all(deliveries(2))
    finally:
        probe.close()
    assert all(a.result == "connection" and "CERTIFICATE_VERIFY_FAILED" in a.describe()
               for a in refused), [a.describe() for a in refused]  # fmt: skip
    assert [a.status for a in trusted] == [204, 204]
    assert probe.requests == 2, "nothing was sent to the receiver it could not verify"
