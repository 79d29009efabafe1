"""Many workers on a real local Redis Cluster (3 masters, 3 replicas), and on one Redis:
kills, a slot migration, a failover and paused workers lose nothing and apply nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import redis

from model.data.synthetic import synthetic_events
from tests.conftest import run_cli
from tests.test_worker import scrape
from tests.test_worker_faults import uninterrupted, with_event_ids
from tests.workers import WorkerProcess, all_committed, count_scores, score_entries, wait_for
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.common.local_redis import free_port
from worker.engine.compute.lean_state import as_fields
from worker.producers.publisher import publish

pytestmark = pytest.mark.integration

P = 8
KEYS = Keys()


def start_worker(url: str, model: Path, log: Path, name: str, *extra: str) -> WorkerProcess:
    return WorkerProcess(
        url, model, log, "--partitions", str(P), "--batch-size", "100", "--lease-ms", "1000",
        "--consumer", name, *extra,
    ).start()  # fmt: skip


def assert_each_event_scored_and_states_equal(r, events, model_path) -> int:
    """Every event has a score; final states equal one uninterrupted in-memory run.
    Returns how many score entries were emitted more than once (re-emitted)."""
    rows = score_entries(r, partitions=P)
    seen = Counter((row["partition"], row["event_id"]) for row in rows)
    wanted = {(partition_of(e["user_id"], P), e["event_id"]) for e in events}
    assert set(seen) == wanted, "an event was not scored, or scored on another partition"
    _, states = uninterrupted(model_path, events)
    for user, h in states.items():
        stored = as_fields(r.hgetall(KEYS.state(partition_of(user, P), user)))[b"h"]
        np.testing.assert_allclose(np.frombuffer(stored, "<f4").reshape(h.shape), h, atol=1e-5)
    assert all_committed(r, partitions=P)
    return sum(n - 1 for n in seen.values())


def test_two_workers_on_the_cluster_survive_kill_9_twice(cluster_url, model_path, tmp_path):
    """Worker a writes the lean layout, b the full one (a rollout between layouts): the
    partitions that move between them at each kill carry their states across."""
    r = connect(cluster_url, cluster=True)
    events = with_event_ids(synthetic_events(20_000, 2000, seed=31))
    publish(r, events, partitions=P)
    log = tmp_path / "w.log"
    a = start_worker(cluster_url, model_path, log, "a", "--cluster", "--layout", "lean")
    b = start_worker(cluster_url, model_path, log, "b", "--cluster")
    try:
        for k, step in enumerate((3000, 6000)):
            wait_for(lambda s=step: count_scores(r, partitions=P) >= s, timeout=120,
                     what=f"{step} scores")  # fmt: skip
            a.kill()
            a = start_worker(cluster_url, model_path, log, f"a{k}", "--cluster", "--layout",
                             "lean")  # fmt: skip
        wait_for(lambda: count_scores(r, partitions=P) >= len(events), timeout=180,
                 what="all scores")  # fmt: skip
    finally:
        a.kill()
        assert b.terminate() == 0
    assert assert_each_event_scored_and_states_equal(r, events, model_path) == 0


def cluster_nodes(url: str) -> dict:
    """CLUSTER NODES as redis-py parses it: 'host:port' -> {node_id, flags, master_id, ...}."""
    return redis.Redis.from_url(url).execute_command("CLUSTER NODES")


def masters_of(url: str) -> dict[str, str]:
    """Master node id -> 'host:port'."""
    return {
        info["node_id"]: addr.split("@")[0]
        for addr, info in cluster_nodes(url).items()
        if "master" in info["flags"]
    }


def test_a_slot_migration_while_workers_run_loses_and_doubles_nothing(
    cluster_url, model_path, tmp_path
):
    r = connect(cluster_url, cluster=True)
    events = with_event_ids(synthetic_events(15_000, 1500, seed=32))
    log = tmp_path / "w.log"
    workers = [start_worker(cluster_url, model_path, log, n, "--cluster") for n in "ab"]
    masters = masters_of(cluster_url)
    slot = r.keyslot(KEYS.events(3))  # partition 3's slot
    source = next(i for i, addr in masters.items()
                  if r.get_node_from_key(KEYS.events(3)).name == addr)  # fmt: skip
    target = next(i for i in masters if i != source)
    try:
        publish(r, events[:5000], partitions=P)
        wait_for(lambda: count_scores(r, partitions=P) >= 2000, timeout=120, what="progress")
        moved = subprocess.run(
            ["redis-cli", "--cluster", "reshard", masters[source], "--cluster-from", source,
             "--cluster-to", target, "--cluster-slots", str(slot + 1), "--cluster-yes"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert moved.returncode == 0, moved.stderr[-2000:]
        publish(r, events[5000:], partitions=P)
        wait_for(lambda: count_scores(r, partitions=P) >= len(events), timeout=180,
                 what="all scores")  # fmt: skip
    finally:
        for w in workers:
            assert w.terminate() == 0
    assert r.get_node_from_key(KEYS.events(3)).name == masters[target]  # it did move
    assert assert_each_event_scored_and_states_equal(r, events, model_path) == 0


def test_a_failover_while_workers_run_loses_nothing_and_states_agree(
    cluster, cluster_url, model_path, tmp_path
):
    r = connect(cluster_url, cluster=True)
    events = with_event_ids(synthetic_events(15_000, 1500, seed=33))
    log = tmp_path / "w.log"
    workers = [start_worker(cluster_url, model_path, log, n, "--cluster") for n in "ab"]
    try:
        publish(r, events[:5000], partitions=P)
        wait_for(lambda: count_scores(r, partitions=P) >= 2000, timeout=120, what="progress")
        old_master = r.get_node_from_key(KEYS.events(0)).name
        master_id = next(i for i, a in masters_of(cluster_url).items() if a == old_master)
        replica = _replica_of(master_id, cluster_url)
        host, port = replica.split(":")
        redis.Redis(host=host, port=int(port)).execute_command("CLUSTER", "FAILOVER")
        wait_for(lambda: master_id not in masters_of(cluster_url), timeout=60,
                 what="the replica to take over")  # fmt: skip
        cluster.wait_ok()
        publish(r, events[5000:], partitions=P)
        wait_for(lambda: count_scores(r, partitions=P) >= len(events), timeout=180,
                 what="all scores")  # fmt: skip
    finally:
        for w in workers:
            assert w.terminate() == 0
    reemitted = assert_each_event_scored_and_states_equal(r, events, model_path)
    # A manual failover waits for the replica to catch up: nothing acknowledged is lost, so
    # nothing is scored again. (An automatic failover after a crash can re-emit the scores
    # of commits the old master acknowledged but never replicated: see docs/operators.md.)
    assert reemitted == 0


def _replica_of(master_id: str, url: str) -> str:
    for addr, info in cluster_nodes(url).items():
        if info.get("master_id") == master_id:
            return addr.split("@")[0]
    raise AssertionError(f"no replica of {master_id}")


def test_paused_workers_past_their_lease_have_their_late_commits_refused(
    redis_server, model_path, tmp_path
):
    # A worker is paused (SIGSTOP) mid-backlog past its lease, the others take its
    # partitions, and it is resumed: a batch it held when paused must be refused
    # (not_owned), never applied. Whether it held one at that instant is chance, so the
    # pause repeats (at least twice) until a refusal shows; each pause is a real test of
    # "nothing lost or doubled" either way.
    r = connect(redis_server.url)
    events = with_event_ids(synthetic_events(24_000, 2000, seed=34))
    ports = [free_port() for _ in range(3)]
    workers = [
        start_worker(redis_server.url, model_path, tmp_path / f"w{i}.log", f"w{i}",
                     "--metrics-port", str(port))
        for i, port in enumerate(ports)
    ]  # fmt: skip
    paused = workers[0]

    def holders() -> list[bytes]:
        return [(r.get(KEYS.lease(p)) or b"-").split(b":")[0] for p in range(P)]

    refused, pauses, sent = 0.0, 0, 0
    try:
        while sent < len(events) and (pauses < 2 or not refused):
            wait_for(lambda: b"w0" in holders(), timeout=60, what="w0 to hold partitions")
            publish(r, events[sent : sent + 6000], partitions=P)
            sent += 6000
            # pause it early in the backlog: it holds a batch then
            wait_for(lambda s=sent: count_scores(r, partitions=P) >= s - 5500, timeout=120,
                     what="progress")  # fmt: skip
            os.kill(paused.proc.pid, signal.SIGSTOP)
            wait_for(lambda: b"w0" not in holders() and b"-" not in holders(), timeout=60,
                     what="the others to take its partitions")  # fmt: skip
            os.kill(paused.proc.pid, signal.SIGCONT)
            pauses += 1
            wait_for(lambda s=sent: count_scores(r, partitions=P) >= s, timeout=120,
                     what="the backlog")  # fmt: skip
            refused = scrape(ports[0]).get(
                'intentstream_commit_retries_total{reason="not_owned"}', 0
            )
        publish(r, events[sent:], partitions=P)
        wait_for(lambda: count_scores(r, partitions=P) >= len(events), timeout=180,
                 what="all scores")  # fmt: skip
    finally:
        for w in workers:
            os.kill(w.proc.pid, signal.SIGCONT)
            assert w.terminate() == 0
    assert assert_each_event_scored_and_states_equal(r, events, model_path) == 0
    assert pauses >= 2
    assert refused > 0, f"no late commit refused in {pauses} pauses"


def test_partitions_repair_on_the_cluster_puts_a_stopped_partition_back(
    cluster, cluster_url, model_path, tmp_path
):
    """`acked` of a partition on another master than the URL's node set past its stream: the
    worker stops that partition only; `partitions repair --cluster` (dry run first, then for
    real, through the cluster client) puts it back, and the worker scores what waited."""
    r = connect(cluster_url, cluster=True)
    first = [{"user_id": f"u{i}", "type": "view", "event_id": f"a{i}"} for i in range(400)]
    publish(r, first, partitions=P)
    port = free_port()
    worker = start_worker(cluster_url, model_path, tmp_path / "w.log", "w", "--cluster",
                          "--metrics-port", str(port))  # fmt: skip
    here = f"127.0.0.1:{cluster.nodes[0].port}"  # the node the URL names
    assert here in {n.name for n in r.get_primaries()}
    p = next(q for q in range(P) if r.get_node_from_key(KEYS.events(q)).name != here)
    try:
        wait_for(lambda: count_scores(r, partitions=P) == 400 and all_committed(r, partitions=P),
                 120, "the first events committed")  # fmt: skip
        r.set(KEYS.acked(p), "99999999999999-0")  # ahead of the stream
        later = [
            e
            for e in ({"user_id": f"v{i}", "type": "view", "event_id": f"b{i}"} for i in range(400))
            if partition_of(e["user_id"], P) == p
        ]
        publish(r, later, partitions=P)
        stopped = f'intentstream_partition_stopped{{partition="{p}",reason="ahead"}}'
        wait_for(lambda: scrape(port).get(stopped) == 1, 90, f"partition {p} stopped")
        assert r.xlen(KEYS.scores(p)) == sum(partition_of(e["user_id"], P) == p for e in first)

        args = ["partitions", "repair", str(p), "--cluster", "--redis-url", cluster_url]
        dry = run_cli(*args, "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert f"would run: SET intentstream:acked:{{{p}}}" in dry.stdout
        assert r.get(KEYS.acked(p)) == b"99999999999999-0"  # a dry run writes nothing
        done = run_cli(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"did: SET intentstream:acked:{{{p}}}" in done.stdout
        wait_for(lambda: count_scores(r, partitions=P) == 400 + len(later)
                 and all_committed(r, partitions=P), 120, "the waiting events scored")  # fmt: skip
        wait_for(lambda: stopped not in scrape(port), 60, "the stopped gauge gone")
        again = run_cli(*args)
        assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout
    finally:
        assert worker.terminate() == 0, worker.log()
    rows = score_entries(r, partitions=P)
    assert (
        len({(row["partition"], row["event_id"]) for row in rows}) == len(rows) == 400 + len(later)
    )
