"""A group's batches built as one (compute/joint.py): each batch's share of the group's Commit
is the Commit `build_commit` gives it alone, field by field and part by part, with the
group's sums (resends forgotten early, live quality's samples, input counts, the shadow's
firings) on the first batch's alone; through rules, a shadow, declared and item inputs,
resends, dead letters, misrouted entries, replays and rewritten keys."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import fields

import numpy as np
import pytest

from model.random_init import random_model
from model.scoring import ScoringModel
from tests.test_pipeline_inputs import declared, rich
from worker.common.dedup import ResendWindow
from worker.common.keys import partition_of
from worker.engine.compute.batch import Batch, parse_batch
from worker.engine.compute.joint import _joined, build_commits, build_group
from worker.engine.compute.parts.input_counts import InputCounts
from worker.engine.compute.parts.quality import Quality
from worker.engine.compute.parts.shadow import Shadow
from worker.engine.compute.pipeline import Commit, build_commit
from worker.engine.compute.state_cache import StateCache, copy_known, written
from worker.engine.compute.user_states import ShadowStates, UserStates, distinct_users
from worker.rules.definition import Rule
from worker.rules.step import RuleTable

P = 4
TYPES = ["view", "add_to_cart", "checkout", "purchase"]
USERS = [f"u{i}" for i in range(14)]
UNSTAMPED = set(USERS[10:])
RESENDS = ResendWindow(3600, 3)  # a small bound: ids are forgotten early, and counted
RULES = RuleTable.of([Rule(name="hot", above=0.3, rearm_below=0.2),
                      Rule(name="warm", above=0.05, cooldown_ms=3000, types=("view",))],
                     version=1)  # fmt: skip
# the group's sums: on the first batch's commit alone
SUMS = {Quality: "samples", InputCounts: "counts", Shadow: "fired"}
COMMIT_FIELDS = {f.name for f in fields(Commit)}


@pytest.fixture(scope="module")
def models() -> tuple[ScoringModel, ScoringModel]:
    current = rich(3, "A", brand_buckets=16, item_buckets=32)
    inputs = declared(brand_buckets=5, item_buckets=11)
    shadow = random_model(TYPES, hidden=4, features=["gap"], seed=4, inputs=inputs,
                          session_gap_seconds=60.0)  # fmt: skip
    return current, ScoringModel(shadow, version="S")


class Stream:
    """Rounds of a few events of random users, as P partitions' entries, with resends,
    invalid and misrouted entries, and the states of the users kept as the worker does."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.caches = StateCache(10**6)
        self.ids = [0] * P  # each stream's last entry id
        self.t = 1_700_000_000_000
        self.sent: dict[str, list[str]] = {u: [] for u in USERS}
        self.n = 0

    def event(self, user: str) -> list[bytes]:
        rng = self.rng
        self.t += int(rng.choice([500, 2_000, 90_000], p=[0.6, 0.35, 0.05]))
        self.n += 1
        event_id = f"e{self.n}"
        if self.sent[user] and rng.random() < 0.15:  # a producer's resend
            event_id = str(rng.choice(self.sent[user]))
        self.sent[user].append(event_id)
        e = {"user_id": user, "type": str(rng.choice(TYPES)), "ts": self.t,
             "event_id": event_id, "price": ["12.5", "abc", "", "3"][int(rng.integers(4))],
             "brand": ["acme", "globex", ""][int(rng.integers(3))],
             "product": f"p{rng.integers(4)}"}  # fmt: skip
        if user in UNSTAMPED:  # a producer without event ids: the state keeps none
            del e["event_id"]
        if rng.random() < 0.2:
            del e["price"]
        if rng.random() < 0.05:
            del e["type"]  # a dead letter
        return [x for k, v in e.items() for x in (k.encode(), str(v).encode())]

    def round(self, names: tuple[str, ...], events: int = 0) -> list[Batch]:
        """A round's batches: a few events (or `events`) of random users, each on its user's
        partition (now and then one on another: misrouted)."""
        entries: dict[int, list] = {}
        self.rewriting = self.rng.random() < 0.2  # the round's states: some rewritten whole
        for _ in range(events or int(self.rng.integers(2, 9))):
            user = USERS[int(self.rng.integers(len(USERS)))]
            p = partition_of(user, P)
            if self.rng.random() < 0.04:
                p = (p + 1) % P
            self.ids[p] += 1
            entries.setdefault(p, []).append([f"{self.ids[p]}-0".encode(), self.event(user)])
        return [parse_batch(p, raw, P, max_skew_ms=2**62, input_names=names)
                for p, raw in sorted(entries.items())]  # fmt: skip

    def states(self, batch: Batch, model: ScoringModel, shadow: ScoringModel) -> UserStates:
        """The batch's users' states as the cache holds them (new ones empty); now and then
        some to replay (a model swapped in) or to rewrite whole (the other layout)."""
        users = distinct_users(batch)
        states = UserStates.empty(users, model.state_shape)
        n = len(users)
        states.shadow = ShadowStates(np.zeros((n, *shadow.state_shape), np.float32),
                                     states.last_ts.copy(), score=np.full(n, np.nan),
                                     rules=[b""] * n)  # fmt: skip
        known = self.caches.lookup(batch.partition, users)
        rows = [i for i, k in enumerate(known) if k is not None]
        if rows:
            copy_known(states, rows, [known[i] for i in rows])  # type: ignore[misc]
        states.seq = f"{batch.partition}-{self.n}".encode()
        if self.rng.random() < 0.2:
            states.replay = [i for i in rows if states.recent[i]]
        if self.rewriting:
            states.rewrite = [i for i in range(n) if self.rng.random() < 0.5]
        return states

    def keep(self, commits: list[Commit]) -> None:
        for c in commits:
            self.caches.store(c.partition, b"", written(c))


def same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_shared(alone: list[Commit], shared: list[Commit]) -> None:
    """Each shared Commit is its batch's alone, but for the group's sums, which are the
    first's."""
    for a, s in zip(alone, shared, strict=True):
        for f in fields(Commit):
            if f.name in ("parts", "resend_overflow", "_kinds"):
                continue
            assert same(getattr(a, f.name), getattr(s, f.name)), f.name
        assert [type(x) for x in a.parts] == [type(x) for x in s.parts]
        for pa, ps in zip(a.parts, s.parts, strict=True):
            for f in fields(pa):  # a field left out of comparisons (Quality's pending) too
                if f.compare and SUMS.get(type(pa)) != f.name:
                    assert same(getattr(pa, f.name), getattr(ps, f.name)), (type(pa), f.name)
    assert shared[0].resend_overflow == sum(c.resend_overflow for c in alone)
    assert all(c.resend_overflow == 0 for c in shared[1:])
    for kind, name in SUMS.items():
        mine = [getattr(c.part(kind), name) for c in shared]
        theirs = [getattr(c.part(kind), name) for c in alone]
        assert same(mine[0], summed(theirs)), kind
        assert all(not any_count(x) for x in mine[1:]), kind


def summed(values: list) -> object:
    """The group's sum of per-batch counts: samples joined in order, counts added."""
    if isinstance(values[0], Counter):
        return sum(values, Counter())
    first = values[0]
    if all(isinstance(v, tuple) for v in first.values()) and not isinstance(
        next(iter(first.values()), (0,))[0], np.ndarray
    ):
        return {k: tuple(map(sum, zip(*(v[k] for v in values), strict=True))) for k in first}
    return {k: tuple(np.concatenate([v[k][j] for v in values]) for j in range(2)) for k in first}


def any_count(value: object) -> bool:
    if isinstance(value, Counter):
        return bool(+value)
    return any(len(v[0]) if isinstance(v[0], np.ndarray) else any(v) for v in value.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_batchs_share_of_a_group_commit_is_its_commit_alone(models, seed):
    model, shadow = models
    stream = Stream(seed)
    names = tuple(dict.fromkeys([*model.input_names, *shadow.input_names]))
    groups, seen = 0, Counter()
    for _ in range(60):
        batches = stream.round(names)
        states = [stream.states(b, model, shadow) for b in batches]
        alone = [build_commit(b, copy.deepcopy(s), model, 8, shadow, RESENDS, RULES)
                 for b, s in zip(batches, states, strict=True)]  # fmt: skip
        given = copy.deepcopy(states)  # as StateReader.complete_all gives them: joined, read once
        joined = _joined(batches, given)
        shared = build_commits(batches, states, model, 8, shadow, RESENDS, RULES)
        assert_shared(alone, shared)
        if joined is not None:
            group = build_group(batches, given, model, 8, shadow, RESENDS, RULES, joined[1])
            assert group is not None
            for c in group.commits:  # made in two parts (compute/deferred.py): every field once
                head = set(vars(c)) - {"_deferred_rest"}
                c.fill()
                assert set(vars(c)) == COMMIT_FIELDS and head < COMMIT_FIELDS
            assert_shared(alone, group.commits)
        groups += len(batches) > 1
        stream.keep(alone)
        for c in alone:
            seen.update({k: v for k, v in c.outcomes.items() if v})
            seen.update(actions=len(c.actions), overflow=c.resend_overflow,
                        rewrite=len(c.rewrite), samples=len(c.quality["current"][1]),
                        fired=sum(c.shadow_actions.values()))  # fmt: skip
    assert groups > 30
    # the stream went through what the shares split
    assert all(seen[k] > 0 for k in ("scored", "duplicate", "deadletter", "misrouted", "actions",
                                     "overflow", "rewrite", "samples", "fired")), seen  # fmt: skip


def test_batches_that_cannot_be_joined_are_built_one_by_one(models):
    """Batches sharing a user (read from partitions of another count) are not joined."""
    model, _ = models
    raw = [[b"1700000000000-0", [b"user_id", b"u1", b"type", b"view"]]]
    batches = [parse_batch(p, raw, 1, max_skew_ms=2**62) for p in (0, 1)]
    states = [UserStates.empty(["u1"], model.state_shape, b"1") for _ in batches]
    alone = [build_commit(b, copy.deepcopy(s), model, 0, None, RESENDS, None)
             for b, s in zip(batches, states, strict=True)]  # fmt: skip
    shared = build_commits(batches, states, model, 0, None, RESENDS, None)
    assert [c.partition for c in shared] == [0, 1]
    for a, s in zip(alone, shared, strict=True):
        assert a.outcomes == s.outcomes == {**dict.fromkeys(a.outcomes, 0), "scored": 1}
        assert same(a.h, s.h) and same(a.scores, s.scores) and a.users == s.users == ["u1"]
