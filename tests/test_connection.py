"""refresh_topology: a cluster client re-reads its slot map after an outage; one Redis is left
alone; a refresh that reaches no node never raises (the next retry calls it again)."""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

from worker.common.connection import refresh_topology


class _Nodes:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls = 0
        self.error = error

    def initialize(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error


def _cluster(nodes: _Nodes) -> redis.RedisCluster:
    client = redis.RedisCluster.__new__(redis.RedisCluster)  # no node to connect to
    client.nodes_manager = nodes
    return client


def test_a_cluster_client_rereads_its_slot_map():
    nodes = _Nodes()
    assert refresh_topology(_cluster(nodes)) is True
    assert nodes.calls == 1


def test_a_refresh_that_reaches_no_node_does_not_raise():
    for error in (RedisClusterException("Redis Cluster cannot be connected"),
                  redis.ConnectionError("Error 111")):  # fmt: skip
        nodes = _Nodes(error)
        assert refresh_topology(_cluster(nodes)) is False
        assert nodes.calls == 1


def test_one_redis_is_left_alone():
    client = redis.Redis(host="127.0.0.1", port=1)  # never connected: nothing is sent
    assert refresh_topology(client) is False
