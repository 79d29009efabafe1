"""The worker's start and stop as a supervisor sees them: a Redis that is not there yet is
waited for (a boot race, a Redis restart), SIGTERM exits 0, Ctrl-C exits 130."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request

import pytest
import redis

from tests.conftest import run_cli
from tests.workers import WorkerProcess, count_scores, wait_for
from worker.common.local_redis import LocalRedis, free_port
from worker.common.publisher import publish

pytestmark = pytest.mark.integration


def test_worker_waits_for_redis_at_start_then_scores(golden_path, tmp_path):
    port, metrics = free_port(), free_port()
    worker = WorkerProcess(f"redis://127.0.0.1:{port}/0", golden_path, tmp_path / "w.log",
                           "--metrics-port", str(metrics))  # fmt: skip
    worker.start()
    server = None
    try:
        wait_for(lambda: worker.log().count("is unreachable") >= 2, 30, "two retries logged")
        assert worker.proc.poll() is None, worker.log()
        retries = [json.loads(line) for line in worker.log().splitlines()]
        assert all(r["level"] == "warning" and "retrying in" in r["msg"] for r in retries)
        # waiting is healthy (no restart by a liveness probe), not ready
        assert run_cli("healthcheck", "--metrics-port", str(metrics)).returncode == 0
        with pytest.raises(urllib.error.HTTPError) as ready:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=30)
        assert ready.value.code == 503
        server = LocalRedis(port=port).start()
        client = redis.Redis.from_url(server.url)
        publish(client, [{"user_id": "u", "type": "view"}, {"user_id": "u", "type": "coupon"}])
        wait_for(lambda: count_scores(client) == 2, 60, "scores once Redis is there")
        assert worker.terminate() == 0
    finally:
        worker.kill()
        if server is not None:
            server.close()


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
