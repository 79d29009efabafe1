"""Shared fixtures: the golden model and a runner for the installed console script."""

from __future__ import annotations

import os

# One BLAS and one OpenMP thread in every command the tests start (and in this process,
# below): four pytest workers share two cores, and the idle threads of OpenBLAS and of
# scikit-learn's OpenMP (the judging's baselines) spin. A judged `train` took 11-20 s of CPU
# with the defaults, 5-6.5 with one thread (EPYC, load 1-2). test_worker's BLAS probe drops
# these, to see the worker pin BLAS itself.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import inspect
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from threadpoolctl import threadpool_limits

from model.artifact import save_model
from tests.golden import golden_model

# Hypothesis's timing checks (a deadline per example, a health check on slow generation) are
# timed assertions: on two cores shared by four pytest workers, some of which compile kernels
# or start clusters, one draw once took 2.4 s and failed a run that had found no bug.
settings.register_profile(
    "intentstream", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("intentstream")

# NumPy's OpenBLAS may be loaded before this file (a plugin imports NumPy): limited here too,
# for the tests that train or judge in this process.
threadpool_limits(limits=1)

# A test that starts redis-server or a subprocess is an integration test: `pytest -m "not
# integration"` runs the rest in seconds. Marked here from what a test uses, so a new test
# cannot forget it; a test may also carry the mark itself.
_SERVER_FIXTURES = {"redis_server", "aof_redis_server", "cluster", "own_cluster"}
# (getfixturevalue: a fixture chosen at run time, a server as a rule)
_PROCESS_CALLS = ("run_cli(", "WorkerProcess(", "subprocess.", "LocalRedis(", "console_script(",
                  "getfixturevalue(")  # fmt: skip


# The longest files, longest first (two suite runs on 4 workers, EPYC at load 5-9, 2026-12-06:
# 60-250 s of wall time each, by their CPU and their wall; test_cluster_failover, 24-34 s of wall
# in a 2-worker run, mostly waiting, added after it): run first (scripts/test.sh keeps this
# order), so that on the suite's workers they start at once instead of becoming the tail.
_LONG_FILES = ("test_deploy_image.py", "test_readme.py", "test_longrange.py",
               "test_cli_errors.py", "test_cli_judging.py", "test_resize.py", "test_cluster.py",
               "test_deploy_acl.py", "test_lifecycle.py", "test_bench.py", "test_training.py",
               "test_worker_faults.py", "test_cli_explain.py", "test_cli_train.py",
               "test_cli_rules.py", "test_promotion_cli.py", "test_cli_model.py",
               "test_webhooks_delivery.py", "test_cluster_failover.py", "test_registry.py",
               "test_deploy_prometheus.py", "test_cli_help.py", "test_actions_live.py",
               "test_worker.py")  # fmt: skip


def _start_rank(item: pytest.Item) -> int:
    name = item.path.name
    return _LONG_FILES.index(name) if name in _LONG_FILES else len(_LONG_FILES)


def _sources(item: pytest.Item) -> Iterator[str]:
    """The test's source and its fixtures' (a module fixture may run the command)."""
    fn = getattr(item, "function", None)
    if fn is not None:
        yield inspect.getsource(fn)
    info = getattr(item, "_fixtureinfo", None)
    fixtures = info.name2fixturedefs.values() if info is not None else ()
    for defs in fixtures:
        func = defs[-1].func
        if getattr(func, "__module__", "").startswith("tests."):
            yield inspect.getsource(func)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: each file's tests keep their order
    for item in items:
        if item.get_closest_marker("integration"):
            continue
        if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or any(
            call in source for source in _sources(item) for call in _PROCESS_CALLS
        ):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _close_followers(monkeypatch):
    """Close every registry model source and rule source a test made. Their threads follow
    Redis for as long as they live: left open, they poll a stopped server with redis-py's
    jittered retries for the rest of the session, in the process later tests run in
    (Hypothesis warned of the `random` calls inside its strategies)."""
    from worker.lifecycle.model_source import RegistryModelSource
    from worker.rules.source import RuleSource

    made: list = []
    for cls in (RegistryModelSource, RuleSource):

        def tracked(self, *args, __init=cls.__init__, **kwargs):
            __init(self, *args, **kwargs)
            made.append(self)

        monkeypatch.setattr(cls, "__init__", tracked)
    yield
    for follower in made:
        follower.close()


# `train` judges its model against two fitted baselines on held-out test users (what
# tests/test_cli_judging.py checks): 10-20 s of CPU on a few thousand events, eight times the
# training's. A test of anything else trains without test users.
NO_TEST_USERS = ("--test-fraction", "0")


def console_script() -> str:
    """Path of the installed `intentstream` script (the venv's, beside this interpreter)."""
    beside = Path(sys.executable).parent / "intentstream"
    found = str(beside) if beside.exists() else shutil.which("intentstream")
    if not found:
        raise RuntimeError("the intentstream console script is not installed (pip install -e .)")
    return found


def run_cli(
    *args: str, stdin: str | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run `intentstream ARGS...` and capture its output. The timeout only stops a hung
    command: at load 9-11 a judged train run once took over 120 s."""
    return subprocess.run(
        [console_script(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def golden_path(tmp_path: Path) -> Path:
    path = tmp_path / "golden.npz"
    save_model(golden_model(), path)
    return path


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    """A seeded Elman model (H = 16, the gap feature) over the synthetic shop's types; a
    module may define its own."""
    from model.random_init import random_model

    path = tmp_path / "model.npz"
    types = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout", "purchase"]
    save_model(random_model(types, hidden=16, features=["gap"], seed=3), path)
    return path


@pytest.fixture
def redis_server():
    """A private redis-server on a free loopback port, stopped after the test."""
    from worker.common.local_redis import LocalRedis

    server = LocalRedis().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def aof_redis_server():
    """A private redis-server with AOF on (fsync always), so a restart keeps the data."""
    from worker.common.local_redis import LocalRedis

    server = LocalRedis(appendonly=True).start()
    try:
        yield server
    finally:
        server.close()


def local_cluster(**options: object) -> Iterator:
    """The one way the tests make a local Redis Cluster (3 masters, 3 replicas unless
    `options`, LocalCluster's, say otherwise), stopped when the fixture ends."""
    from worker.common.local_redis import LocalCluster

    with LocalCluster(**options) as c:
        yield c


@pytest.fixture(scope="module")
def cluster():
    """One local cluster shared by a module's tests (a start costs seconds); a test that
    needs it empty flushes it (see `cluster_url`)."""
    yield from local_cluster()


@pytest.fixture
def cluster_url(cluster) -> str:
    """The module's cluster, emptied."""
    from worker.common.connection import connect

    client = connect(cluster.url, cluster=True)
    client.flushall(target_nodes=client.PRIMARIES)
    client.close()
    return cluster.url


@pytest.fixture
def own_cluster():
    """A cluster of the test's own: a kill -9 changes who is master of what."""
    yield from local_cluster()
