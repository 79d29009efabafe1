"""The cluster path in one worker: a commit travels on its node's connection with the reads of
that node's partitions only, and a stale slot map (as after a resharding) redirects it, when
it is sent again to the slot's node by a fresh slot map: every event is scored once, as
offline. Idle partitions wait in blocking reads of their own, answered as soon as an entry
comes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from model.data.synthetic import synthetic_events
from tests.consumers import in_process_consumer
from tests.offline import offline_scores
from tests.workers import score_entries
from worker.common.connection import connect
from worker.common.keys import Keys
from worker.engine.adapters.nodes import REDIRECTS, PartitionNodes
from worker.engine.adapters.streams import Cursor, StreamReader
from worker.engine.consumer import Consumer
from worker.producers.publisher import publish

pytestmark = pytest.mark.integration

P = 8
KEYS = Keys()


def recorded(consumer: Consumer, stale_every: int = 0) -> tuple[list, list]:
    """Wrap the exchange and the take of batches computed ahead: (exchanges as (commit's
    node, nodes read) or the redirect raised, batches computed ahead or None). With
    stale_every, every so many exchanges the slot map goes stale just before: the commit's
    slot is mapped to another primary."""
    exchanges, used = [], []
    exchange, compute = consumer.readahead.exchange, consumer.flow.compute

    def record(node, commit, prepared, plan, cursors, *rest):
        if stale_every and len(exchanges) % stale_every == 0:
            slots = consumer.r.nodes_manager.slots_cache
            slot = consumer.r.keyslot(KEYS.events(commit.partition))
            slots[slot] = [next(n for n in consumer.r.get_primaries() if n is not slots[slot][0])]
            node = consumer.nodes.client(commit.partition)
        read = [c.partition for c in cursors] + ([plan.batch.partition] if plan else [])
        names = {consumer.nodes.name(p) for p in read}
        try:
            sent = exchange(node, commit, prepared, plan, cursors, *rest)
        except REDIRECTS as exc:
            exchanges.append(exc)
            raise
        exchanges.append((consumer.nodes.name(commit.partition), names))
        return sent

    consumer.readahead.exchange = record
    # whether each batch was computed while the commit before it ran
    consumer.flow.compute = lambda batch, *a: used.append(compute(batch, *a)) or used[-1]
    return exchanges, used


def published(url: str, seed: int):
    r = connect(url, cluster=True)
    r.flushall(target_nodes=r.PRIMARIES)
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(2400, 240, seed))]
    publish(r, events, partitions=P)
    return r, events


def assert_scored_once_as_offline(r, events, model_path) -> None:
    rows = score_entries(r, partitions=P)
    assert sorted(row["event_id"] for row in rows) == sorted(e["event_id"] for e in events)
    by_id = {row["event_id"]: float(row["score"]) for row in rows}
    want = offline_scores(model_path, events)
    np.testing.assert_allclose([by_id[e["event_id"]] for e in events], want, atol=1e-5)


def test_commits_read_ahead_on_their_node_only(cluster, model_path):
    r, events = published(cluster.url, seed=9)
    consumer = in_process_consumer(
        cluster.url, model_path, cluster=True, partitions=P, batch_size=60
    )
    exchanges, used = recorded(consumer)
    ticks = 0
    while consumer.metrics.count("scored") < len(events):
        consumer.tick()
        ticks += 1
        assert ticks < 5_000, "stuck"
    assert len(exchanges) > 20 and sum(c.ahead for c in used) > 10
    for node, read in exchanges:
        assert read <= {node}, "a read ahead went to another node than its commit's"
    assert_scored_once_as_offline(r, events, model_path)


def test_each_nodes_next_batch_is_computed_ahead_behind_other_nodes_batches(cluster, model_path):
    """A node's last batch of a round commits with its node's next batch computed ahead, even
    when other nodes' batches come first in the queue: on a backlog, at most one commit a
    node goes out alone (Redis running it while the worker waits for the reply)."""
    r, events = published(cluster.url, seed=12)
    consumer = in_process_consumer(
        cluster.url, model_path, cluster=True, partitions=P, batch_size=60
    )
    _, used = recorded(consumer)
    alone, run = [], consumer.committer.run
    consumer.committer.run = lambda commit, *a: alone.append(commit.partition) or run(commit, *a)
    ticks = 0
    while consumer.metrics.count("scored") < len(events):
        consumer.tick()
        ticks += 1
        assert ticks < 5_000, "stuck"
    batches = len(used)
    computed_ahead = sum(c.ahead for c in used)
    assert batches > 3 * P
    # each node's first batch is computed in line; a node whose partitions all wait in
    # blocking reads at the backlog's end may send one alone. Before the node's next batch
    # was looked for behind other nodes' (44 batches: 26 computed ahead, 12 sent alone).
    nodes = len(consumer.r.get_primaries())
    assert computed_ahead >= batches - 2 * nodes, (computed_ahead, batches, alone)
    assert len(alone) <= nodes, alone
    assert_scored_once_as_offline(r, events, model_path)


def test_a_stale_slot_map_redirects_the_commit_and_nothing_doubles(cluster, model_path):
    r, events = published(cluster.url, seed=10)
    consumer = in_process_consumer(
        cluster.url, model_path, cluster=True, partitions=P, batch_size=60
    )
    exchanges, _ = recorded(consumer, stale_every=4)
    ticks = 0
    while consumer.metrics.count("scored") < len(events):
        consumer.tick()
        ticks += 1
        assert ticks < 5_000, "stuck"
    assert sum(isinstance(e, Exception) for e in exchanges) > 3  # redirected (MOVED)
    assert_scored_once_as_offline(r, events, model_path)
    assert consumer.metrics.count("scored") == len(events)


def test_idle_partitions_wait_in_blocking_reads_woken_by_an_entry(cluster, model_path):
    r = connect(cluster.url, cluster=True)
    r.flushall(target_nodes=r.PRIMARIES)
    consumer = in_process_consumer(
        cluster.url, model_path, cluster=True, partitions=P, batch_size=60, block_ms=3000
    )
    consumer.tick()  # takes the partitions, which are idle: each parks a read, for 3 s
    parked = []
    collect = consumer.parked.collect
    consumer.parked.collect = lambda *a: parked.append(len(consumer.parked)) or collect(*a)
    event = {"user_id": "alice", "type": "view", "ts": 1_700_000_000_000, "event_id": "a1"}
    later = threading.Timer(0.3, publish, (r, [event]), {"partitions": P})
    later.start()
    t0 = time.monotonic()
    while consumer.metrics.count("scored") < 1:
        consumer.tick()
        assert time.monotonic() - t0 < 2, "not woken by the entry"
    assert parked[0] == P
    later.join()
    assert len(score_entries(r, partitions=P)) == 1
    # a rewind (as after an error) lets every parked read go; nothing is lost
    consumer.rewind()
    assert len(consumer.parked) == 0
    publish(r, [event | {"event_id": "a2", "ts": event["ts"] + 1}], partitions=P)
    while consumer.metrics.count("scored") < 2:
        consumer.tick()
        assert time.monotonic() - t0 < 10, "stuck"
    assert len(score_entries(r, partitions=P)) == 2


def test_commits_sent_alone_on_a_stale_slot_map_are_redirected_and_nothing_doubles(
    cluster, model_path
):
    """Commits without a read ahead (an idle partition's, the last of a backlog) go packed
    to the partition's node too: when the slot map is stale the node answers MOVED, the
    commit did not run, and it is sent again to the slot's node by a fresh slot map."""
    r, events = published(cluster.url, seed=11)
    consumer = in_process_consumer(
        cluster.url, model_path, cluster=True, partitions=P, batch_size=60
    )
    committer, redirected, sends = consumer.committer, [], []
    on, run = committer._on, committer.run

    def record(client, commit):
        try:
            return on(client, commit)
        except REDIRECTS as exc:
            redirected.append(exc)
            raise

    def stale_run(commit, node=None):
        sends.append(node)
        if len(sends) % 3 == 0:  # the commit's slot mapped to another primary
            slots = consumer.r.nodes_manager.slots_cache
            slot = consumer.r.keyslot(KEYS.events(commit.partition))
            slots[slot] = [next(n for n in consumer.r.get_primaries() if n is not slots[slot][0])]
            node = consumer.nodes.client(commit.partition)
        return run(commit, node)

    committer._on, committer.run = record, stale_run
    # every commit alone: none pipelined with reads ahead
    consumer.flow.commit = lambda commit, *_: committer.run(
        commit, consumer.nodes.node_client(commit.partition)
    )
    ticks = 0
    while consumer.metrics.count("scored") < len(events):
        consumer.tick()
        ticks += 1
        assert ticks < 5_000, "stuck"
    assert len(sends) > 20 and all(node is not None for node in sends)
    assert len(redirected) > 3  # MOVED from the stale node, then sent to the slot's node
    assert_scored_once_as_offline(r, events, model_path)
    assert consumer.metrics.count("scored") == len(events)


def test_reads_on_a_stale_slot_map_fall_back_to_the_cluster_client(cluster):
    """A round's reads go to the nodes the slot map names; a node that no longer serves a
    partition's slot answers MOVED (the read did not run) and that partition is read
    through the cluster client: every partition's entries come back, once."""
    r = connect(cluster.url, cluster=True)
    r.flushall(target_nodes=r.PRIMARIES)
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(400, 80, 12))]
    publish(r, events, partitions=P)
    for p in range(P):
        r.xgroup_create(KEYS.events(p), "intentstream-workers", id="0")
    reader = StreamReader(r, KEYS, "intentstream-workers", "c1", P, nodes=PartitionNodes(r, KEYS))
    slots = r.nodes_manager.slots_cache
    stale = [3, 5]
    for p in stale:  # their slots mapped to another primary
        slot = r.keyslot(KEYS.events(p))
        slots[slot] = [next(n for n in r.get_primaries() if n is not slots[slot][0])]
    cursors = [Cursor(p, b">") for p in range(P)]
    left: list[int] = []
    on_nodes = reader._read_on_nodes
    reader._read_on_nodes = lambda *a: left.extend(on_nodes(*a)) or left
    batches = reader.read(cursors, 1000, 100)
    assert sorted(cursors[i].partition for i in left) == stale  # redirected, read again
    got = sorted(eid.decode() for b in batches for eid in b.event_ids)
    assert got == sorted(e["event_id"] for e in events)
    assert {b.partition for b in batches} >= set(stale)
