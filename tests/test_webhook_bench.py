"""`intentstream bench --webhooks`, small: it names the machine, delivers a backlog and a
fixed rate, and prints the rate and the delays it measured."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

from tests.conftest import run_cli
from tests.workers import wait_for
from worker.common.local_redis import free_port


def test_webhook_bench_runs_small():
    result = run_cli("bench", "--webhooks", "--actions", "300", "--rate", "50", "--seconds", "1",
                     "--senders", "2", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("machine: ") and "CPUs" in lines[0]
    backlog = (r"backlog of 300: [\d,]+ deliveries/s, deliverer CPU [\d,]+ us per delivery "
               r"\(receiver [\d,]+ us\)")  # fmt: skip
    assert re.fullmatch(backlog, lines[1]), lines[1]
    assert re.fullmatch(r"50 actions/s for 1 s \(50\): commit to arrival p50 [\d.]+ ms, "
                        r"p99 [\d.]+ ms, max [\d.]+ ms", lines[2]), lines[2]  # fmt: skip


def test_the_bench_receiver_answers_any_header_order_on_one_connection():
    """Another client's requests (content-length last, the body in a second write) on one
    keep-alive connection: each answered 204 and counted, the body never taken for a request."""
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-m", "worker.bench.receiver", str(port)])
    try:
        wait_for(lambda: _connects(port), 30, "the receiver")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for i in range(3):
                head = (f"POST / HTTP/1.1\r\nhost: x\r\nwebhook-id: act_0_{1000 + i}-0\r\n"
                        f"Content-Length: 2\r\n\r\n")  # fmt: skip
                sock.sendall(head.encode())
                sock.sendall(b"{}")
                assert sock.recv(100) == b"HTTP/1.1 204 No Content\r\n\r\n"
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert sock.recv(200).endswith(b'{"count": 3}')
    finally:
        receiver.kill()
        receiver.wait()


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
