"""The worker's start and stop as a supervisor sees them: a Redis that is not there yet is
waited for (a boot race, a Redis restart), SIGTERM exits 0, Ctrl-C exits 130."""

from __future__ import annotations

import itertools
import json
import signal
import urllib.error
import urllib.request
from datetime import datetime

import pytest
import redis

from tests.conftest import run_cli
from tests.workers import WorkerProcess, count_scores, wait_for
from worker.common.local_redis import LocalRedis, free_port
from worker.producers.publisher import publish

pytestmark = pytest.mark.integration


def test_worker_waits_for_redis_at_start_then_scores(golden_path, tmp_path):
    port, metrics = free_port(), free_port()
    worker = WorkerProcess(f"redis://127.0.0.1:{port}/0", golden_path, tmp_path / "w.log",
                           "--metrics-port", str(metrics))  # fmt: skip
    worker.start()
    server = None
    try:
        wait_for(lambda: "is unreachable" in worker.log(), 30, "the wait logged")
        assert worker.proc.poll() is None, worker.log()
        # waiting is healthy (no restart by a liveness probe), not ready
        assert run_cli("healthcheck", "--metrics-port", str(metrics)).returncode == 0
        with pytest.raises(urllib.error.HTTPError) as ready:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=30)
        assert ready.value.code == 503
        # said once, what it waits for and how long; then at most every 30 s
        waits = [json.loads(line) for line in worker.log().splitlines()]
        assert all(w["level"] == "warning" for w in waits), waits
        assert f"Redis at redis://127.0.0.1:{port}/0 is unreachable (" in waits[0]["msg"]
        assert (
            "waiting up to 300 s (--wait-for-redis / INTENTSTREAM_WAIT_FOR_REDIS)"
            in (waits[0]["msg"])
        )
        assert all("is still unreachable after" in w["msg"] for w in waits[1:]), waits
        times = [datetime.fromisoformat(w["ts"]) for w in waits]
        assert all((b - a).total_seconds() >= 29 for a, b in itertools.pairwise(times)), waits
        server = LocalRedis(port=port).start()
        client = redis.Redis.from_url(server.url)
        publish(client, [{"user_id": "u", "type": "view"}, {"user_id": "u", "type": "coupon"}])
        wait_for(lambda: count_scores(client) == 2, 60, "scores once Redis is there")
        assert worker.terminate() == 0
    finally:
        worker.kill()
        if server is not None:
            server.close()


def wait_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "unreachable" in line]


@pytest.mark.parametrize(
    ("flags", "env", "bound"),
    [
        (["--max-seconds", "2"], {}, "after 2 s (--max-seconds)"),
        (["--max-seconds", "600", "--wait-for-redis", "1.5"], {},
         "after 1.5 s (--wait-for-redis / INTENTSTREAM_WAIT_FOR_REDIS)"),
        ([], {"INTENTSTREAM_WAIT_FOR_REDIS": "1"},
         "after 1 s (--wait-for-redis / INTENTSTREAM_WAIT_FOR_REDIS)"),
    ],
)  # fmt: skip
def test_the_wait_for_redis_is_bounded_and_ends_in_one_error_line(
    golden_path, monkeypatch, flags, env, bound
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = run_cli("worker", "--redis-url", url, "--model", str(golden_path),
                     "--metrics-port", "0", "--log-format", "text", *flags)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = wait_lines(result.stderr)
    # the wait said once, then the error; --max-seconds counts from the start, so a start
    # slower than its bound (a loaded machine) leaves no wait to announce: the error alone
    announced = len(lines) == 2 or "--max-seconds" not in bound
    assert len(lines) == (2 if announced else 1), result.stderr
    if announced:
        assert (
            "is unreachable (" in lines[0]
            and f"waiting up to {bound.removeprefix('after ')}" in (lines[0])
        )
    assert lines[-1].startswith(f"error: Redis at {url} is still unreachable {bound}: "), lines
    assert result.stderr.strip().splitlines()[-1] == lines[-1]


def test_wait_for_redis_0_tries_once(golden_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = run_cli("worker", "--redis-url", url, "--model", str(golden_path),
                     "--metrics-port", "0", "--log-format", "text",
                     "--wait-for-redis", "0")  # fmt: skip
    assert result.returncode == 2, result.stderr
    # no wait to announce: the one error line
    assert wait_lines(result.stderr) == [result.stderr.strip().splitlines()[-1]], result.stderr
    assert f"error: Redis at {url} is still unreachable after 0 s (--wait-for-redis" in (
        result.stderr
    )


def test_a_refused_login_is_not_waited_for(redis_server, golden_path, tmp_path):
    url = redis_server.url.replace("redis://", "redis://nobody:wrong@")
    worker = WorkerProcess(url, golden_path, tmp_path / "w.log").start()
    try:
        assert worker.proc.wait(60) == 2
        assert "refused the login" in worker.log()
    finally:
        worker.kill()


def test_ctrl_c_stops_cleanly_with_130_and_sigterm_with_0(redis_server, golden_path, tmp_path):
    client = redis.Redis.from_url(redis_server.url)
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        worker = WorkerProcess(redis_server.url, golden_path, tmp_path / f"{sig}.log").start()
        try:
            before = count_scores(client)
            publish(client, [{"user_id": f"u{sig}", "type": "view"}])
            wait_for(lambda b=before: count_scores(client) == b + 1, 60, "a score")
            worker.proc.send_signal(sig)
            assert worker.proc.wait(30) == code, worker.log()
            assert client.exists("intentstream:lease:{0}") == 0, "leases released"
        finally:
            worker.kill()
