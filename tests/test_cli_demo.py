"""`intentstream demo` edges: its flags, its display, and a Redis where another worker
already holds the partition."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from model.artifact import save_model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE
from model.random_init import random_model
from tests.conftest import run_cli
from tests.workers import WorkerProcess, count_scores, wait_for
from worker.commands.demo import Publisher, latency_text, waiting_text
from worker.common.connection import connect
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish


def test_an_empty_latency_window_prints_a_dash_not_nan():
    assert latency_text(np.zeros(20)) == "latency p50 -, p99 -"
    window = np.zeros(20)
    window[3] = 10
    assert "nan" not in latency_text(window) and "p50 <= " in latency_text(window)


def test_latency_past_the_last_bucket_reads_as_a_bound_not_infinity():
    window = np.zeros(20)
    window[-1] = 10  # every event beyond the last bucket (10 s): the backlog of a first start
    text = latency_text(window)
    assert "inf" not in text and text == "latency p50 > 10000 ms, p99 > 10000 ms"


def test_before_the_first_score_the_report_says_what_it_waits_for():
    line = waiting_text(1234, "12:00:00")
    assert "events/s" not in line and "1234 events queued" in line
    assert "waiting for the worker's first batch" in line


def test_a_publisher_that_fails_keeps_its_error_and_stops_the_demo():
    stop = threading.Event()
    publisher = Publisher("redis://127.0.0.1:1/0", 100.0, 5, "", stop)
    publisher.start()
    publisher.join(timeout=30)
    assert stop.is_set()
    assert "Connection refused" in str(publisher.error) or "connecting" in str(publisher.error)


@pytest.mark.integration
def test_demo_where_another_worker_holds_the_lease_shows_its_scores_of_this_run(
    redis_server, tmp_path
):
    r = connect(redis_server.url)
    model = random_model([*EVENT_TYPES, LABEL_TYPE], hidden=8, features=["gap"], seed=2)
    save_model(model, tmp_path / "m.npz")
    Registry(r).publish_model(model, promote=True)  # the demo does not train
    worker = WorkerProcess(redis_server.url, tmp_path / "m.npz", tmp_path / "w.log").start()
    try:
        # old score history of users named like the demo's synthetic ones
        publish(r, [{"user_id": f"user-{i}", "type": "view"} for i in range(20)])
        wait_for(lambda: count_scores(r) == 20, what="the old events scored")
        wait_for(lambda: r.exists("intentstream:lease:{0}"), what="the worker's lease")
        holder = r.get("intentstream:lease:{0}").decode()
        result = run_cli("demo", "--redis-url", redis_server.url, "--seconds", "6",
                         "--rate", "200", "--users", "10", "--metrics-port", "0")  # fmt: skip
    finally:
        worker.terminate()
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert f"another worker ({holder}) holds partition 0's lease" in out
    assert "the registry was empty" not in out
    rates = [int(n) for n in re.findall(r"(\d+) events/s scored by the worker holding", out)]
    assert rates and max(rates) > 0, out  # the other worker scores the demo's events
    users = re.findall(r"^  (\S+) ", out, re.M)
    assert users, out
    assert all(u.startswith("demo-") for u in users), users  # this run's users only
    assert "nan" not in out


@pytest.mark.integration
def test_kernel_sets_compile_in_a_helper_process_and_are_then_cached():
    import subprocess
    import sys

    from worker.commands.kernels import COMPILE, is_cached

    result = subprocess.run(
        [sys.executable, "-m", "worker.commands.kernels", *COMPILE],
        capture_output=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert all(is_cached(name) for name in COMPILE)
