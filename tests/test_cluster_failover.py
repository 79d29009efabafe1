"""kill -9 of a Redis Cluster master while a worker runs (its replica promoted after the node
timeout): the worker recovers by itself, and its lag gauge is true once it drains.

Unlike the manual `CLUSTER FAILOVER` of tests/test_cluster.py, the old master is gone: every
connection to it is refused, and only a client that refreshes its slot map from the
surviving nodes reaches the promoted replica."""

from __future__ import annotations

import contextlib

import pytest
import redis

from model.data.synthetic import synthetic_events
from tests.actions_check import assert_actions_exactly_once, set_firing_rules
from tests.test_cluster import KEYS, P, start_worker
from tests.test_worker import scrape
from tests.test_worker_faults import assert_exactly_once_and_equal, with_event_ids
from tests.workers import all_committed, count_scores, wait_for
from worker.common.connection import connect
from worker.common.keys import partition_of
from worker.common.local_redis import LocalCluster, free_port
from worker.common.settings import Settings
from worker.engine.consumer import Consumer
from worker.lifecycle.model_source import FileModelSource
from worker.producers.publisher import publish

pytestmark = pytest.mark.integration

GROUP = "intentstream-workers"


def kill_master_of_partition_0(cluster: LocalCluster, r, key: str = KEYS.events(0)) -> str:
    """kill -9 the master holding partition 0's slot (or `key`'s); returns its address."""
    old = r.get_node_from_key(key).name
    node = next(n for n in cluster.nodes if f"127.0.0.1:{n.port}" == old)
    node.stop(kill=True)
    return old


def wait_promoted(cluster: LocalCluster, old: str, key: str = KEYS.events(0)) -> None:
    """Wait until a surviving node maps partition 0's slot (or `key`'s) to a new master
    and every surviving node says the cluster is ok."""
    alive = next(n for n in cluster.nodes if n.process is not None)

    def promoted() -> bool:
        fresh = connect(alive.url, cluster=True)  # a fresh map, asked of a surviving node
        try:
            return fresh.get_node_from_key(key).name != old
        finally:
            fresh.close()

    wait_for(promoted, timeout=60, what="partition 0's replica to be promoted")
    cluster.wait_ok(timeout=120)


def held_events(r, events: list[dict]) -> list[dict]:
    """The events the cluster's streams hold now, in publication order. An XADD the old
    master acknowledged but had not replicated is lost with it (docs/operators.md,
    "A Redis failover"): only what the new master holds can be asked of the worker."""
    held = set()
    for p in range(P):
        held |= {(p, f[b"event_id"].decode()) for _, f in r.xrange(KEYS.events(p))}
    return [e for e in events if (partition_of(e["user_id"], P), e["event_id"]) in held]


def assert_held_scored_once_and_states_equal(r, held: list[dict], model_path) -> None:
    """Every event the streams hold is scored exactly once, with the score and the final
    states of one uninterrupted run over those events; nothing pending. (A commit the old
    master acknowledged but did not replicate is lost whole, its scores and its XACK
    together, so on the new master its entries are scored once, again.)"""
    assert_exactly_once_and_equal(r, held, model_path, partitions=P)


def true_undelivered(r, p: int) -> int:
    """Entries of partition p after its group's last-delivered-id, counted with XRANGE
    (independently of adapters/lag.py and of Redis's entries-read counter)."""
    group = next(g for g in r.xinfo_groups(KEYS.events(p)) if g["name"] == GROUP.encode())
    last = group["last-delivered-id"].decode()
    return len(r.xrange(KEYS.events(p), f"({last}", "+"))


def run_kill_9(cluster, model_path, tmp_path, seed: int, *extra: str):
    """Publish a backlog, start a worker, kill -9 partition 0's master once the worker is
    well into partition 0 (with most of it left), and wait until it drains what the new
    master holds; intent rules that fire are set first. Returns (client, held events,
    worker, address killed, rules)."""
    r = connect(cluster.url, cluster=True)
    events = with_event_ids(synthetic_events(16_000, 1600, seed=seed))
    rules = set_firing_rules(r, model_path, events)
    publish(r, events, partitions=P)
    in_0 = sum(partition_of(e["user_id"], P) == 0 for e in events)
    worker = start_worker(cluster.url, model_path, tmp_path / "w.log", "a", "--cluster", *extra)
    try:
        wait_for(lambda: r.xlen(KEYS.scores(0)) >= 200, timeout=120, what="progress on 0")
        before = r.xlen(KEYS.scores(0))
        old = kill_master_of_partition_0(cluster, r)
        assert before < in_0 - 200, "partition 0 drained before the kill: no backlog left"
        wait_promoted(cluster, old)
        held = held_events(r, events)
        wait_for(lambda: count_scores(r, partitions=P) >= len(held), timeout=180,
                 what=f"all {len(held)} held events scored after the failover")  # fmt: skip
        wait_for(lambda: all_committed(r, partitions=P), timeout=60,
                 what="every entry committed")  # fmt: skip
    except BaseException:
        worker.kill()
        print(worker.log()[-5000:])
        raise
    return r, held, worker, old, rules


def test_kill_9_of_a_master_is_recovered_with_every_held_event_scored_once_and_true_lag(
    own_cluster, model_path, tmp_path
):
    cluster = own_cluster
    # The worker recovers by itself, scores what the new master holds exactly once; and
    # the promoted replica's group counter may be stale (XINFO GROUPS then counts a lag
    # with nothing undelivered): the gauge must equal what is really undelivered, for every
    # partition, once the worker drains; 0, no phantom lag.
    port = free_port()
    r, held, worker, old, rules = run_kill_9(cluster, model_path, tmp_path, 37, "--metrics-port",
                                      str(port))  # fmt: skip
    try:

        def gauges() -> dict[int, float | None]:
            samples = scrape(port)
            return {
                p: samples.get(f'intentstream_lag_entries{{partition="{p}"}}') for p in range(P)
            }

        def gauges_true() -> bool:
            return gauges() == {p: true_undelivered(r, p) for p in range(P)}

        # the maintenance tick (every 10 s) sets the gauges
        wait_for(gauges_true, timeout=60, what="every lag gauge to equal the undelivered count")
        assert gauges() == dict.fromkeys(range(P), 0)
        assert all(true_undelivered(r, p) == 0 for p in range(P))
    finally:
        assert worker.terminate() == 0
    log = worker.log()
    assert old in log and "redis unavailable" in log  # it did see the dead node
    assert len(held) >= 15_000  # replication keeps up with a publisher on loopback
    assert_held_scored_once_and_states_equal(r, held, model_path)
    # the actions too: a commit lost with the old master took its actions with it
    assert_actions_exactly_once(r, held, model_path, P, rules)


def test_after_a_master_is_killed_the_retry_reaches_the_promoted_replica_on_every_path(
    own_cluster, model_path
):
    cluster = own_cluster
    # The worker's paths that redis-py never re-routes by itself after a master dies: the
    # lease renewal's MULTI on the live-workers set (a fresh cluster pipeline re-reads the
    # slot map only at its fifth connection error; it retries three times) and the model
    # source's pub/sub. Here they are the first to touch the dead node after its replica's
    # promotion, so the client's map is stale; one outage retry of the worker's loop must
    # bring every path to the new master.
    client = connect(cluster.url, cluster=True)
    s = Settings(redis_url=cluster.url, cluster=True, partitions=P, lease_ms=60_000,
                 consumer="a", model=str(model_path))  # fmt: skip
    consumer = Consumer(s, client, FileModelSource(model_path))
    assert len(consumer.ownership.renew().gained) == P
    # the live-workers set and the model channel share partition 0's master on 3 masters
    key = KEYS.workers
    assert client.get_node_from_key(key).name == client.get_node_from_key(KEYS.events(0)).name
    old = kill_master_of_partition_0(cluster, client, key)
    wait_promoted(cluster, old, key)
    # it dials the dead node, as every retry did before (unless a refresh of the slot map,
    # under load, already came first)
    with contextlib.suppress(redis.ConnectionError):
        consumer.ownership.renew()
    consumer.recover(redis.ConnectionError("test"))  # what the loop does after an outage
    assert client.get_node_from_key(key).name != old
    changes = consumer.ownership.renew()
    assert sorted(consumer.ownership.owned) == list(range(P)) and not changes.lost
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(KEYS.model_updates)
        assert pubsub.get_message(timeout=5) is not None  # the subscribe confirmation
        assert pubsub.get_pubsub_node().name != old
    finally:
        pubsub.close()
        client.close()
