"""The model registry, hot reload in a running worker, and `intentstream demo`."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from model.artifact import load_model, model_to_bytes, save_model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.random_init import random_model
from tests.conftest import console_script, run_cli
from tests.workers import WorkerProcess, count_scores, score_entries, wait_for
from worker.common.connection import connect
from worker.common.local_redis import free_port
from worker.lifecycle.registry import Registry, RegistryError
from worker.producers.publisher import publish

TYPES = [*EVENT_TYPES, LABEL_TYPE]


def a_model(seed: int, hidden: int = 16, layers: int = 1):
    return random_model(TYPES, hidden=hidden, layers=layers, features=["gap"], seed=seed)


def cli(redis_server, *args: str):
    return run_cli(*args, "--redis-url", redis_server.url)


def test_publish_list_show_promote_rollback_export_through_the_cli(redis_server, tmp_path):
    for seed in (1, 2):
        save_model(a_model(seed), tmp_path / f"m{seed}.npz")
    out = cli(redis_server, "model", "publish", str(tmp_path / "m1.npz"), "--promote")
    assert out.returncode == 0 and "published version 1 (current)" in out.stdout
    assert cli(redis_server, "model", "publish", str(tmp_path / "m2.npz")).stdout.startswith(
        "published version 2"
    )
    listing = cli(redis_server, "model", "list").stdout.splitlines()
    assert listing[1].startswith("* ") and listing[1].split()[1] == "1"
    assert listing[2].split()[0] == "2"
    shown = cli(redis_server, "model", "show", "2")
    assert "version:       2" in shown.stdout and "current:       no" in shown.stdout

    assert cli(redis_server, "model", "promote", "2").returncode == 0
    assert Registry(connect(redis_server.url)).current() == "2"
    back = cli(redis_server, "model", "rollback")
    assert back.returncode == 0 and "version 1 is current again" in back.stdout
    assert Registry(connect(redis_server.url)).current() == "1"

    exported = tmp_path / "out.npz"
    assert cli(redis_server, "model", "export", "2", "--out", str(exported)).returncode == 0
    assert exported.read_bytes() == (tmp_path / "m2.npz").read_bytes()


def test_registry_errors_are_clear(redis_server, tmp_path):
    r = connect(redis_server.url)
    missing = cli(redis_server, "model", "promote", "7")
    assert missing.returncode == 2 and "no model version '7'" in missing.stderr
    empty = cli(redis_server, "model", "rollback")
    assert empty.returncode == 2 and "nothing to roll back to" in empty.stderr
    no_model = run_cli("worker", "--redis-url", redis_server.url, "--metrics-port", "0")
    assert no_model.returncode == 2 and "no current model in the registry" in no_model.stderr

    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a model")
    refused = cli(redis_server, "model", "publish", str(bad))
    assert refused.returncode == 2 and "not a valid .npz archive" in refused.stderr

    version = Registry(r).publish_model(a_model(1))
    r.setrange(f"intentstream:model:{version}", 100, b"\x00garbage\x00")
    corrupt = cli(redis_server, "model", "show", version)
    assert corrupt.returncode == 2 and "corrupt" in corrupt.stderr
    with pytest.raises(RegistryError, match="corrupt"):
        Registry(r).promote(version)

    unreachable = run_cli("model", "list", "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert unreachable.returncode == 2 and "error: Redis" in unreachable.stderr


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_hot_reload_promote_corrupt_and_rollback_while_the_worker_runs(redis_server, tmp_path):
    r = connect(redis_server.url)
    registry = Registry(r)
    registry.publish_model(a_model(1), promote=True)
    port = free_port()
    worker = WorkerProcess(
        redis_server.url, tmp_path / "unused.npz", tmp_path / "w.log",
        "--model-poll-seconds", "0.5", "--metrics-port", str(port),
    )  # fmt: skip
    worker.args.remove("--model")
    worker.args.remove(str(tmp_path / "unused.npz"))
    worker.start()
    events = iter(synthetic_events(100_000, 300, seed=4))
    sent = []

    def send(n: int) -> None:
        batch = [next(events) | {"event_id": f"e{len(sent) + i}"} for i in range(n)]
        publish(r, batch)
        sent.extend(e["event_id"] for e in batch)

    def scored_by(version: str) -> bool:
        """Send a few events until the newest score comes from `version`."""
        if newest_model() == version:
            return True
        send(20)
        return False

    def newest_model() -> str:
        return r.xrevrange("intentstream:scores:{0}", count=1)[0][1][b"model"].decode()

    try:
        send(300)
        wait_for(lambda: count_scores(r) == len(sent), what="scores by version 1")
        assert newest_model() == "1"

        registry.publish_model(a_model(2), promote=True)  # announced on pub/sub
        wait_for(lambda: scored_by("2"), timeout=120, what="scores by version 2")

        # a corrupt artifact made current behind the registry's back: refused, 2 keeps scoring
        v3 = registry.publish_model(a_model(3))
        r.setrange(f"intentstream:model:{v3}", 200, b"\xffcorrupt")
        r.set("intentstream:model:current", v3)
        r.publish("intentstream:model:updates", v3)
        wait_for(
            lambda: scrape(port)["intentstream_model_reloads_total[('result', 'rejected')]"] == 1,
            what="the corrupt model to be refused",
        )
        send(50)
        wait_for(lambda: count_scores(r) == len(sent), what="scores after the refusal")
        assert newest_model() == "2"

        # current changed without an announcement (a lost pub/sub message): polling finds it
        r.set("intentstream:model:current", "1")
        wait_for(lambda: scored_by("1"), timeout=120, what="scores by version 1 again")
        send(100)
        wait_for(lambda: count_scores(r) == len(sent), what="all scores")
        metrics = scrape(port)
    finally:
        assert worker.terminate() == 0
    rows = score_entries(r)
    assert sorted(row["event_id"] for row in rows) == sorted(sent)
    assert metrics["intentstream_model_reloads_total[('result', 'loaded')]"] == 2
    assert metrics["intentstream_model_version[]"] == 1
    assert "new model refused" in worker.log()
    # in commit order: version 1, then 2 (3 refused), then 1 again; never interleaved
    runs = [version for version, _ in itertools.groupby(row["model"] for row in rows)]
    assert runs == ["1", "2", "1"]


def test_demo_scores_live_and_leaves_nothing_behind_on_ctrl_c(tmp_path):
    proc = subprocess.Popen(
        [console_script(), "demo", "--rate", "300", "--users", "30", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if re.search(r"events/s .* scored [1-9]", line):
                break
        for _ in range(3):
            lines.append(proc.stdout.readline())
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    # the private Redis outlives the worker's stop: no outage, the leases released
    assert "unavailable" not in output and "could not release" not in output, output
    assert "trained: validation AUC" in output
    assert re.search(r"kept epoch \d+ of \d+", output), output  # which epoch, and why
    assert "the registry was empty: published it as version 1" in output
    assert re.search(r"→ \w+ \d\.\d\d", output), output  # a user's scores moving
    pid = int(re.search(r"redis-server at \S+ \(pid (\d+)\)", output).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "demo stopped" in output


def test_model_loads_from_registry_bytes_like_from_a_file(redis_server, tmp_path):
    model = a_model(9)
    version = Registry(connect(redis_server.url)).publish(model_to_bytes(model))
    out = tmp_path / "x.npz"
    Registry(connect(redis_server.url)).export(version, out)
    assert load_model(out).meta == model.meta
    assert Path(out).stat().st_size > 0
