"""A group's commits packed at once (adapters/group_packing.py): each commit's writes are byte
for byte, count for count, what Committer.prepare gives it alone, in both state layouts, with
and without a state TTL, through the groups of test_joint_build's streams; and a round's state
reads packed at once are each request's read alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import redis

from model.random_init import random_model
from model.scoring import ScoringModel
from tests.test_joint_build import RESENDS, RULES, Stream, models  # noqa: F401 (a fixture)
from worker.common.keys import Keys
from worker.engine.adapters.commit import CommitLimits, Committer, PreparedCommit
from worker.engine.adapters.group_packing import GROUP_ROWS, prepared_group
from worker.engine.adapters.states import FEW_READS, StateReader
from worker.engine.compute.batch import parse_batch
from worker.engine.compute.joint import build_group
from worker.engine.compute.pipeline import Commit, build_commit
from worker.engine.compute.state_cache import StateCache, written
from worker.engine.compute.user_states import UserStates


def cached_commit(p: int) -> Commit:
    """A commit of one user, cached-{p}, for the cache to hold."""
    model = ScoringModel(random_model(["view"], hidden=4, seed=1))
    raw = [[b"1700000000000-0", [b"user_id", f"cached-{p}".encode(), b"type", b"view"]]]
    batch = parse_batch(p, raw, 1, max_skew_ms=2**62)
    return build_commit(batch, UserStates.empty([f"cached-{p}"], model.state_shape, b"7"), model)


def same(a: PreparedCommit, b: PreparedCommit) -> bool:
    return (b"".join(map(bytes, a.body)) == b"".join(map(bytes, b.body))
            and (a.n_writes, a.previous_at, a.states_at) == (b.n_writes, b.previous_at, b.states_at)
            and a.state_rows.tolist() == b.state_rows.tolist())  # fmt: skip


@pytest.mark.parametrize("layout", ["full", "lean"])
@pytest.mark.parametrize("ttl_ms", [0, 60_000])
def test_a_groups_commits_packed_at_once_are_each_packed_alone(models, layout, ttl_ms):  # noqa: F811
    model, shadow = models
    committer = Committer(redis.Redis(), Keys(), "w1", CommitLimits(1000, 100, 64, ttl_ms), layout)
    stream = Stream(seed=11)
    names = tuple(dict.fromkeys([*model.input_names, *shadow.input_names]))
    packed = 0
    for _ in range(60):
        batches = stream.round(names)
        states = [stream.states(b, model, shadow) for b in batches]
        group = build_group(batches, copy.deepcopy(states), model, 8, shadow, RESENDS, RULES)
        if group is None:  # one batch
            stream.keep([])
            continue
        together = prepared_group(committer, group)
        if together is not None:
            # packed and judged from what a share makes at once (compute/deferred.py): the
            # rest is sliced while Redis runs the transaction
            for c, prepared in zip(group.commits, together, strict=True):
                committer.checks(c), committer.writes(c, prepared), committer.token(c)
            assert all(c.deferring for c in group.commits)
            alone = [committer.prepare(c) for c in group.commits]
            assert all(same(a, b) for a, b in zip(alone, together, strict=True))
            packed += 1
        stream.keep(group.commits)
    assert packed > 30


def test_a_group_of_more_rows_is_packed_commit_by_commit(models):  # noqa: F811
    model, shadow = models
    committer = Committer(redis.Redis(), Keys(), "w1", CommitLimits(1000, 100, 64, 0))
    stream = Stream(seed=12)
    names = tuple(dict.fromkeys([*model.input_names, *shadow.input_names]))
    batches = stream.round(names, events=4 * GROUP_ROWS)
    states = [stream.states(b, model, shadow) for b in batches]
    group = build_group(batches, states, model, 8, shadow, RESENDS, RULES)
    assert group is not None and len(group.whole.scores) > GROUP_ROWS
    assert prepared_group(committer, group) is None


@pytest.mark.parametrize("seed", [1, 2])
def test_a_rounds_state_reads_packed_at_once_are_each_packed_alone(seed):
    """StateReader.commands: each request's read as `command` gives it, for rounds of a few
    partitions' requests, some users cached (no read, or one without the sequence), and for
    more keys than FEW_READS (each packed alone)."""
    rng = np.random.default_rng(seed)
    cache = StateCache(10**6)
    reader = StateReader(redis.Redis(), Keys(), cache, lambda version: version)
    for p in (1, 3):  # partitions 1 and 3 have a sequence and a cached user
        cache.store(p, b"7", written(cached_commit(p)))
    for _ in range(50):
        many = int(rng.integers(1, 3 * FEW_READS // 4))
        parts = sorted(set(rng.integers(0, 5, 4).tolist()))
        users = {p: sorted({f"u{p}-{i}" for i in rng.integers(0, 40, many)}) for p in parts}
        requests = [reader.request(p, [*users[p], *([f"cached-{p}"] if p == 3 else [])])
                    for p in parts]  # fmt: skip
        requests.append(reader.request(1, ["cached-1"]))  # known: no read
        assert reader.commands(requests) == [reader.command(r) for r in requests]
