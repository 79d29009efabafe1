"""Lease renewals in a backlog: on time they leave the batches read ahead queued (each then
commits in its turn, computed beside the commit before it); after a pause they commit them
first, so a late commit meets the commit's own lease check. Either way every event is scored
once, as offline scoring scores it."""

from __future__ import annotations

import time

import pytest
import redis

from model.data.synthetic import synthetic_events
from tests.consumers import in_process_consumer
from tests.test_worker import assert_each_scored_once_as_offline
from worker.common.connection import connect
from worker.common.keys import Keys
from worker.engine.adapters.ownership import Ownership
from worker.producers.publisher import publish

LEASE_MS = 3000
PARTITIONS = 4


def test_renewals_are_lapsing_from_half_a_lease_on():
    ownership = Ownership(redis.Redis(), Keys("intentstream"), "c1:x", 4, LEASE_MS)
    assert ownership.lapsing(time.monotonic())  # never renewed
    ownership._last_renewal = 100.0
    assert ownership.due(101.01) and not ownership.lapsing(101.01)
    assert ownership.lapsing(101.5) and ownership.lapsing(104.0)


def _renewing_every_round(url: str, model_path, lapse_s: float, cluster: bool = False):
    """A backlog over four partitions, each round's renewal due, the last one `lapse_s` ago;
    (the queued batches seen as each renewal began, the events, the consumer, a client)."""
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(3000, 150, seed=5))]
    r = connect(url, cluster=cluster)
    publish(r, events, partitions=PARTITIONS)
    consumer = in_process_consumer(
        url, model_path, cluster=cluster, partitions=PARTITIONS, batch_size=100,
        lease_ms=LEASE_MS,
    )  # fmt: skip
    queued_at_renewal: list[int] = []
    renew = consumer._renew_leases

    def counted_renew() -> None:
        queued_at_renewal.append(consumer.parts.queued())
        renew()

    consumer._renew_leases = counted_renew
    ticks = 0
    while consumer.metrics.count("scored") < len(events):
        consumer.ownership._last_renewal = time.monotonic() - lapse_s
        consumer.tick()
        ticks += 1
        assert ticks < 5_000, "stuck"
    return queued_at_renewal, events, consumer, r


@pytest.mark.parametrize("where", ["one Redis", "cluster"])
def test_a_renewal_on_time_leaves_the_batches_read_ahead_queued(request, model_path, where):
    cluster = where == "cluster"
    url = request.getfixturevalue("cluster_url" if cluster else "redis_server")
    url = url if cluster else url.url
    queued, events, consumer, r = _renewing_every_round(url, model_path, 1.1, cluster)
    assert max(queued) > 0  # renewed with batches in hand, which committed after
    assert_each_scored_once_as_offline(r, consumer, model_path, events, partitions=PARTITIONS)


def test_a_lapsing_renewal_commits_the_batches_in_hand_first(redis_server, model_path):
    queued, events, consumer, r = _renewing_every_round(redis_server.url, model_path, 2.0)
    assert len(queued) > 3 and max(queued) == 0
    assert_each_scored_once_as_offline(r, consumer, model_path, events, partitions=PARTITIONS)


@pytest.fixture
def sends(monkeypatch) -> list[int]:
    """A count of the sends to Redis (a pipeline is one), by any connection of this process."""
    count = [0]
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, *args, **kwargs):
        count[0] += 1
        return send(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return count


@pytest.mark.parametrize("where", ["one Redis", "cluster"])
def test_the_held_leases_renew_in_one_pipeline_per_node(request, where, sends):
    cluster = where == "cluster"
    url = request.getfixturevalue("cluster_url" if cluster else "redis_server")
    r = connect(url if cluster else url.url, cluster=cluster)
    keys = Keys("intentstream")
    ownership = Ownership(r, keys, "c1:x", 8, LEASE_MS)
    assert ownership.renew().gained == list(range(8))
    ownership.renew()  # loads the script everywhere
    nodes = {ownership.nodes.name(p) for p in range(8)}
    assert len(nodes) == (3 if cluster else 1)
    before = sends[0]
    ownership.renew()
    # the live-workers transaction, then one pipeline a node
    assert sends[0] - before == 1 + len(nodes)
    assert all(r.pttl(keys.lease(p)) > LEASE_MS - 1000 for p in range(8))
    r.set(keys.lease(5), "c2:y", px=LEASE_MS)  # taken over meanwhile
    changes = ownership.renew()
    assert changes.lost == [5] and sorted(ownership.owned) == [0, 1, 2, 3, 4, 6, 7]
    assert r.get(keys.lease(5)) == b"c2:y"


def test_a_node_without_the_script_has_it_loaded_and_renews(redis_server):
    r = connect(redis_server.url)
    keys = Keys("intentstream")
    ownership = Ownership(r, keys, "c1:x", 4, LEASE_MS)
    ownership.renew()
    r.script_flush()
    r.delete(keys.lease(2))  # expired meanwhile: taken again, as a free lease
    ownership.renew()
    assert sorted(ownership.owned) == [0, 1, 2, 3]
    assert all(r.get(keys.lease(p)) == b"c1:x" for p in range(4))
    assert r.script_exists(ownership._renew.sha) == [True]  # loaded again


def test_the_leases_handed_back_are_released_in_one_pipeline(redis_server, sends):
    r = connect(redis_server.url)
    keys = Keys("intentstream")
    ownership = Ownership(r, keys, "c1:x", 8, LEASE_MS)
    ownership.renew()
    r.set(keys.lease(3), "c2:y", px=LEASE_MS)  # no longer this holder's: left alone
    before = sends[0]
    ownership.release_all()
    # the releases, the script's load on the node's first (and the releases again), leaving
    assert sends[0] - before == 4
    assert [r.get(keys.lease(p)) for p in range(8)] == [None] * 3 + [b"c2:y"] + [None] * 4
