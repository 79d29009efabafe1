"""The write-through state cache (worker/engine/compute/state_cache.py): least recently
stored users go first, across partitions, and each partition's states hold at one sequence."""

from __future__ import annotations

import numpy as np

from worker.engine.compute.state_cache import StateCache, copy_known
from worker.engine.compute.user_states import UserStates


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


def test_below_half_the_bound_users_keep_their_place_then_every_store_moves_them():
    """Nothing is evicted below the bound, so below half of it a store updates in place; a
    user stored once the cache passed half its bound outlives every user not stored since."""
    cache = StateCache(max_users=10)
    cache.store(0, b"1", {u: state(1) for u in "abc"})
    cache.store(0, b"2", {"a": state(2)})  # 4 of 10: a keeps its place, first
    cache.store(0, b"3", {"d": state(3), "e": state(3)})  # 5 of 10
    cache.store(0, b"4", {"a": state(4)})  # past half: a moves to the end
    cache.store(0, b"5", {u: state(5) for u in "fghijk"})  # 11: one over, b goes
    assert cached(cache, 0, list("abcdefghijk")) == list("acdefghijk")
    assert cache.lookup(0, ["a"])[0][1] == 4


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


def known_state(k: int) -> tuple:
    """A cached state whose every field says k."""
    h = np.full((1, 2), k, np.float32).tobytes()
    return (h, k, (k, k), k, b"e%d" % k, b"r%d" % k, float(k), None, float("nan"), b"u%d" % k,
            b"", b"i%d" % k, 0.0)  # fmt: skip


def test_known_states_land_in_their_rows_whether_every_row_or_some_are_known():
    for rows in ([0, 1, 2], [2, 0], [1], [0, 2, 1]):
        states = UserStates.empty(["a", "b", "c"], (1, 2))
        copy_known(states, rows, [known_state(10 + r) for r in rows])
        for r in range(3):
            k = 10 + r if r in rows else None
            assert states.last_id[r] == ((k, k) if k else (-1, -1))
            assert states.event_ids[r] == (b"e%d" % k if k else b"")
            assert states.recent[r] == (b"r%d" % k if k else b"")
            assert states.rules[r] == (b"u%d" % k if k else b"")
            assert states.items[r] == (b"i%d" % k if k else b"")
            assert states.h[r].tolist() == ([[k, k]] if k else [[0, 0]])
            assert states.n[r] == (k or 0) and states.last_ts[r] == (k or -1)
        assert len(states.last_id) == len(states.recent) == 3
