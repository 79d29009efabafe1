"""The health check's probe: GET the worker's /healthz on a socket, loading nothing else.

A container runs `intentstream healthcheck` every 15 s for as long as it lives. The whole CLI
loads numpy, Numba and pydantic (1.4 s of CPU), so the console script answers a plain
`healthcheck` (its flags or the environment) here first (worker/commands/entry.py) and
leaves anything else (--help, a value to reject) to the full CLI, which gives the same
answer through the settings (a unit test holds the two equal).
"""

from __future__ import annotations

import _socket  # not `socket`: its enums alone would double the probe's CPU (~20 ms)
import os
import sys
from collections.abc import Mapping

# A worker bound to every address is reached on loopback from inside its own container.
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
# The worker's defaults for these two settings (a unit test holds them equal to Settings').
DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_METRICS_PORT = 9108


def healthz_url(host: str, port: int) -> str:
    """The /healthz URL of a worker serving metrics on host:port."""
    host = _ANY_ADDRESS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


def _split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path) of an http:// URL; ValueError if it is not one."""
    if not url.startswith("http://"):
        raise ValueError(f"not an http:// URL: {url}")
    netloc, _, path = url.removeprefix("http://").partition("/")
    if netloc.startswith("["):  # [IPv6]:port
        host, _, port = netloc[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = netloc.partition(":")
    if port and not port.isdigit():
        raise ValueError(f"not a port in {url}")
    return host, int(port or 80), "/" + path


def _connect(host: str, port: int, timeout: float) -> _socket.socket:
    """A TCP connection to the first address of host that answers."""
    error: OSError = OSError(f"no address for {host}")
    # host as bytes: a str would load the IDNA codec and `re` (~15 ms) to encode it
    found = _socket.getaddrinfo(host.encode("ascii", "replace"), port, 0, _socket.SOCK_STREAM)
    for family, kind, proto, _, address in found:
        conn = _socket.socket(family, kind, proto)
        try:
            conn.settimeout(timeout)
            conn.connect(address)
            return conn
        except OSError as exc:
            conn.close()
            error = exc
    raise error


def check(url: str, timeout: float) -> tuple[bool, str]:
    """GET url: (True, body) on HTTP 200, else (False, why)."""
    try:
        host, port, path = _split_url(url)
        conn = _connect(host, port, timeout)
        try:
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            reply = b""
            while len(reply) < 4096 and (chunk := conn.recv(4096)):
                reply += chunk
        finally:
            conn.close()
    except ValueError as exc:
        return False, str(exc)
    except OSError as exc:
        return False, f"cannot reach {url}: {exc}"
    head, _, body = reply.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(b" ", 2)
    text = body[:200].decode(errors="replace").strip()
    if len(status) < 2 or not status[1].isdigit():
        return False, f"not an HTTP reply from {url}"
    code = int(status[1])
    return code == 200, text if code == 200 else f"HTTP {code}: {text}"


def report(url: str, timeout: float) -> int:
    """Check url and print the outcome; 0 healthy, 1 not."""
    ok, detail = check(url, timeout)
    print(f"{'healthy' if ok else 'unhealthy'}: {detail}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


_FLAGS = {"--metrics-host": "metrics_host", "--metrics-port": "metrics_port",
          "--url": "url", "--timeout": "timeout"}  # fmt: skip


def plain_request(argv: list[str], env: Mapping[str, str]) -> tuple[str, float] | None:
    """(url, timeout) that `intentstream healthcheck ARGV` checks, or None when the request
    needs the full CLI: help, a flag or value it would reject, metrics turned off."""
    given: dict[str, str] = {}
    words = iter(argv)
    for word in words:
        flag, eq, value = word.partition("=")
        if flag not in _FLAGS or _FLAGS[flag] in given:
            return None
        value = value if eq else next(words, None)
        if value is None:
            return None
        given[_FLAGS[flag]] = value
    try:
        timeout = float(given.get("timeout", "3"))
    except ValueError:
        return None
    if not 0 < timeout < 3600:
        return None
    if "url" in given:
        return given["url"], timeout
    host = given.get("metrics_host", env.get("INTENTSTREAM_METRICS_HOST", DEFAULT_METRICS_HOST))
    port = given.get("metrics_port", env.get("INTENTSTREAM_METRICS_PORT"))
    port = str(DEFAULT_METRICS_PORT) if port is None else port
    if not port.isascii() or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    return healthz_url(host, int(port)), timeout


def plain_healthcheck(argv: list[str]) -> int | None:
    """Run `intentstream healthcheck ARGV` here if it is a plain one (see plain_request)."""
    request = plain_request(argv, os.environ)
    return None if request is None else report(*request)
