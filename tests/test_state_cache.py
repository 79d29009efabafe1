"""The write-through state cache (worker/engine/compute/state_cache.py): least recently
stored users go first, across partitions, and each partition's states hold at one sequence."""

from __future__ import annotations

import numpy as np

from worker.engine.compute.state_cache import StateCache


def state(n: int) -> tuple:
    return (np.zeros((1, 2), np.float32).tobytes(), n, (n, 0), n, b"", b"", 0.5, None, float("nan"),
            b"", b"", b"", 0.0)  # fmt: skip


def cached(cache: StateCache, p: int, users: list[str]) -> list[str]:
    return [u for u, hit in zip(users, cache.lookup(p, users), strict=True) if hit is not None]


def test_the_least_recently_stored_users_are_evicted_first():
    cache = StateCache(max_users=4)
    cache.store(0, b"1", {u: state(1) for u in "abcd"})
    cache.store(0, b"2", {"a": state(2)})  # a is stored again: now the most recent
    cache.store(0, b"3", {"e": state(3), "f": state(3)})  # two over: b and c go
    assert cached(cache, 0, list("abcdef")) == ["a", "d", "e", "f"]
    assert cache.lookup(0, ["a"])[0][1] == 2 and cache.seq(0) == b"3"


def test_the_bound_counts_every_partition_and_evicts_from_the_one_storing():
    cache = StateCache(max_users=3)
    cache.store(0, b"1", {"a": state(1), "b": state(1)})
    cache.store(1, b"7", {"x": state(1), "y": state(1)})  # 4 in all: partition 1's x goes
    assert cached(cache, 0, ["a", "b"]) == ["a", "b"] and cached(cache, 1, ["x", "y"]) == ["y"]
    cache.drop(0)
    assert cached(cache, 0, ["a", "b"]) == [] and cache.seq(0) is None and cache.seq(1) == b"7"


def test_a_cache_of_no_users_keeps_nothing():
    cache = StateCache(max_users=0)
    cache.store(0, b"1", {"a": state(1)})
    assert cache.lookup(0, ["a"]) == [None] and cache.seq(0) is None
