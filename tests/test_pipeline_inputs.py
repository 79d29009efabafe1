"""Histories that keep the declared inputs (compute/recent.py) and the replays that read them:
a swapped-in format 2 model's rebuilt states equal the states it reaches scoring the events
live, whichever model (current or shadow) wrote the history, and differ from a rebuild with
the inputs missing; the reasons of a rich model's actions are their float64 definition's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from model.artifact import Model, state_shape
from model.item_memory import ITEM_MEMORY
from model.random_init import random_model
from model.reference import reference_step
from model.scoring import InMemoryScorer, ScoringModel
from tests.test_conformance import oracle_bucket, oracle_numeric
from worker.engine.compute.batch import Batch, parse_batch
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.recent import HASH, NUMBER, Recent, extended, pack, unpack
from worker.engine.compute.replay import replay
from worker.engine.compute.state_cache import StateCache, copy_known, written
from worker.engine.compute.user_states import ShadowStates, UserStates, distinct_users
from worker.rules.definition import Rule
from worker.rules.step import RuleTable

TYPES = ["view", "add_to_cart", "checkout", "purchase"]
T0 = 1_700_000_000_000
KEEP = 64  # more than any user's session here: histories hold whole sessions
SESSION_GAP = 60.0
PRICES = [b"12.5", b"3", b"0.25", b"abc", b"", b"-2", b"199.99", b"7"]


def declared(brand_buckets: int, item_buckets: int, transform: str = "log1p") -> list[dict]:
    return [
        {"kind": "numeric", "name": "price", "transform": transform, "mean": 2.0, "scale": 1.5},
        {"kind": "categorical", "name": "brand", "buckets": brand_buckets, "dim": 3},
        {"kind": "item", "name": "product", "buckets": item_buckets, "dim": 3},
    ]


def rich(seed: int, version: str, **buckets) -> ScoringModel:
    model = random_model(TYPES, hidden=6, features=["gap"], seed=seed, inputs=declared(**buckets),
                         session_gap_seconds=SESSION_GAP)  # fmt: skip
    return ScoringModel(model, version=version)


@pytest.fixture(scope="module")
def old() -> ScoringModel:
    """The model that scored the events first."""
    return rich(1, "A", brand_buckets=16, item_buckets=32)


@pytest.fixture(scope="module")
def new() -> ScoringModel:
    """The model swapped in: other weights, bucket counts and numeric transform."""
    inputs = declared(brand_buckets=7, item_buckets=61, transform="none")
    m = random_model(TYPES, hidden=6, features=["gap"], seed=2, session_gap_seconds=SESSION_GAP,
                     inputs=inputs)  # fmt: skip
    return ScoringModel(m, version="B")


def rich_events(n: int, seed: int) -> list[dict]:
    """Events of 5 users revisiting 4 products, sessions split now and then, some values
    missing or not numbers."""
    rng = np.random.default_rng(seed)
    t = T0
    out = []
    for i in range(n):
        t += int(rng.choice([1_000, 2_000, 5_000, 90_000], p=[0.5, 0.3, 0.17, 0.03]))
        e = {"user_id": f"u{rng.integers(5)}", "type": str(rng.choice(TYPES)), "ts": t,
             "price": PRICES[int(rng.integers(len(PRICES)))],
             "brand": [b"acme", b"globex", b"initech", b""][int(rng.integers(4))],
             "product": f"p{rng.integers(4)}".encode()}  # fmt: skip
        if i % 5 == 3:
            del e["product"]
        if i % 7 == 2:
            del e["price"]
        out.append(e)
    return out


def batches_of(events: list[dict], size: int, names: tuple[str, ...], start: int = 1) -> list:
    """The events as one partition's entries, parsed in batches with the inputs `names`."""

    def fields(e: dict) -> list[bytes]:
        return [x for k, v in e.items()
                for x in (k.encode(), v if isinstance(v, bytes) else str(v).encode())]  # fmt: skip

    entries = [[f"{start + i}-0".encode(), fields(e)] for i, e in enumerate(events)]
    return [parse_batch(0, entries[i : i + size], input_names=names, max_skew_ms=2**62)
            for i in range(0, len(entries), size)]  # fmt: skip


class Run:
    """Batches through build_commit with the states carried in a cache, as the worker does."""

    def __init__(self) -> None:
        self.cache = StateCache(10**6)

    def batch(self, batch: Batch, model: ScoringModel, shadow: ScoringModel | None = None,
              replay_all: bool = False, strip: bool = False):  # fmt: skip
        users = distinct_users(batch)
        states = UserStates.empty(users, model.state_shape)
        if shadow is not None:
            n = len(users)
            states.shadow = ShadowStates(np.zeros((n, *shadow.state_shape), np.float32),
                                         states.last_ts.copy(), score=np.full(n, np.nan),
                                         rules=[b""] * n)  # fmt: skip
        known = self.cache.lookup(0, users)
        rows = [i for i, k in enumerate(known) if k is not None]
        if rows:
            copy_known(states, rows, [known[i] for i in rows])  # type: ignore[misc]
            if shadow is not None:
                states.shadow.last_ts[:] = states.last_ts
        if replay_all:  # another model's states: rebuilt from the histories
            states.replay = [i for i in rows if states.recent[i]]
        if strip:  # the histories as the layout before inputs kept them
            states.recent = [pack(Recent(r.prev_ts, r.ts_raw, r.names))
                             for r in map(unpack, states.recent)]  # fmt: skip
        commit = build_commit(batch, states, model, KEEP, shadow)
        self.cache.store(0, b"", written(commit))
        return commit

    def states(self, users: list[str]) -> dict[str, np.ndarray]:
        """The cached h of each user, flat (the cache keeps its float32 bytes)."""
        return {u: np.frombuffer(k[0], "<f4")
                for u, k in zip(users, self.cache.lookup(0, users), strict=True)}  # fmt: skip

    def shadow_states(self, users: list[str]) -> dict[str, np.ndarray]:
        return {u: np.frombuffer(k[7], "<f4")
                for u, k in zip(users, self.cache.lookup(0, users), strict=True)}  # fmt: skip


USERS = [f"u{i}" for i in range(5)]


def live(events: list[dict], model: ScoringModel, size: int = 50) -> Run:
    run = Run()
    for b in batches_of(events, size, tuple(model.input_names)):
        run.batch(b, model)
    return run


def swapped(events: list[dict], before: int, first, new: ScoringModel, strip: bool = False,
            shadow: ScoringModel | None = None) -> tuple[Run, list]:  # fmt: skip
    """`first` scores events[:before] (with `shadow` beside it), then `new` is swapped in
    (every state rebuilt from its history) for the rest."""
    run = Run()
    names = tuple(dict.fromkeys([*first.input_names, *(shadow.input_names if shadow else [])]))
    for b in batches_of(events[:before], 40, names):
        run.batch(b, first, shadow)
    rest = batches_of(events[before:], 10, tuple(new.input_names), start=before + 1)
    commits = [run.batch(rest[0], new, replay_all=True, strip=strip)]
    commits += [run.batch(b, new) for b in rest[1:]]
    return run, commits


def test_a_swapped_in_models_rebuilt_states_are_its_live_states(old, new):
    events = rich_events(400, seed=3)
    got, commits = swapped(events, 300, old, new)
    _, without = swapped(events, 300, old, new, strip=True)
    swap, bare = commits[0], without[0]  # the swap batch: 10 events, the states rebuilt first
    assert swap.users == bare.users and len(swap.users) >= 4
    ref = Run()
    for b in batches_of(events[:310], 10, tuple(new.input_names)):
        last = ref.batch(b, new)
    want = ref.states(swap.users)
    assert swap.input_counts == last.input_counts  # the replayed events are not counted again
    assert sum(missing for missing, _ in swap.input_counts.values()) > 0
    differ = 0
    for k, u in enumerate(swap.users):
        np.testing.assert_allclose(swap.h[k].ravel(), want[u], atol=2e-5)
        differ += np.abs(bare.h[k].ravel() - want[u]).max() > 1e-3
    assert differ >= 3  # the inputs replayed are what makes them equal
    # the swap batch's and the later scores are the live run's, and so are the last states
    scores = [float(s) for c in commits for s in c.scores]
    live_scores = InMemoryScorer(new).score(
        [e["user_id"] for e in events], [e["type"] for e in events],
        np.array([e["ts"] for e in events]),
        {n: [e.get(n) for e in events] for n in new.input_names},
    )[300:]  # fmt: skip
    np.testing.assert_allclose(scores, live_scores, atol=2e-5)
    final = live(events, new).states(USERS)
    for u in USERS:
        np.testing.assert_allclose(got.states([u])[u], final[u], atol=2e-5)


def test_a_history_a_shadow_wrote_rebuilds_the_shadow_once_promoted(new):
    """A type-only current model and a rich shadow: the histories keep the shadow's inputs,
    so promoting it rebuilds states equal to its own."""
    plain = ScoringModel(random_model(TYPES, hidden=6, features=["gap"], seed=9,
                                      session_gap_seconds=SESSION_GAP), version="T")  # fmt: skip
    events = rich_events(300, seed=4)
    run = Run()
    for b in batches_of(events[:200], 40, tuple(new.input_names)):
        run.batch(b, plain, new)
    first_users = sorted({e["user_id"] for e in events[:200]})
    assert all(unpack(k[5]).fields == [(NUMBER, "price"), (HASH, "brand"), (HASH, "product")]
               for k in run.cache.lookup(0, first_users))  # fmt: skip
    shadow_h = run.shadow_states(first_users)
    want = live(events[:200], new).states(first_users)
    for u in first_users:
        np.testing.assert_allclose(shadow_h[u], want[u], atol=2e-5)
    rest = batches_of(events[200:], 30, tuple(new.input_names), start=201)
    run.batch(rest[0], new, replay_all=True)
    for b in rest[1:]:
        run.batch(b, new)
    full = live(events, new).states(USERS)
    for u in USERS:
        np.testing.assert_allclose(run.states([u])[u], full[u], atol=2e-5)


def test_a_type_only_model_keeps_no_inputs(old):
    plain = ScoringModel(random_model(TYPES, hidden=6, features=["gap"], seed=9,
                                      session_gap_seconds=SESSION_GAP), version="T")  # fmt: skip
    events = rich_events(60, seed=5)
    run = live(events[:40], old)
    for b in batches_of(events[40:], 20, (), start=41):
        commit = run.batch(b, plain)
    assert commit.recent and all(not unpack(r).fields for r in commit.recent)


# ---- the reasons -------------------------------------------------------------------------


def reference_replay(model: Model, prev_ts: int, events: list[dict]) -> float:
    """The score after replaying the events (type, ts and their inputs' fields) from h = 0
    and empty item memories with the clock at prev_ts, in float64, by the contract."""
    meta, a = model.meta, model.arrays
    index = {t: i for i, t in enumerate(meta.event_types)}
    h = np.zeros(state_shape(meta))
    z = float(a["head.b_q"][0])
    score = 1.0 / (1.0 + np.exp(-z))
    last, items = prev_ts, []
    for e in events:
        t = e["ts"]
        gap = (t - last) / 1000.0 if last >= 0 and t > last else 0.0
        if last >= 0 and meta.session_gap_seconds > 0 and gap > meta.session_gap_seconds:
            h[:] = 0.0
            items = []
        last = max(last, t)
        x = [float(np.float32(np.log1p(gap)))]
        for spec in model.inputs:
            value = e.get(spec.name)
            value = value.decode() if isinstance(value, bytes) else value
            if spec.kind == "numeric":
                x += oracle_numeric(spec, value)
                continue
            x += list(np.asarray(a[f"input.{spec.name}.embedding"][oracle_bucket(spec, value)],
                                 np.float64))  # fmt: skip
            if spec.kind == "item":
                if not value:
                    x += [0.0, 0.0]
                    continue
                x += [float(bool(items) and items[-1] == value), float(value in items)]
                items = [*[i for i in items if i != value][-(ITEM_MEMORY - 1) :], value]
        h, score = reference_step(a, h, index.get(e["type"], len(index)), np.array(x),
                                  meta.head, meta.cell)  # fmt: skip
    return score


def test_a_rich_models_reasons_are_the_leave_one_out_deltas_in_float64(old):
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(rich_events(500, seed=6))]
    batches = batches_of(events, 64, tuple(old.input_names))
    scores = replay(batches, old, RuleTable.of([]), 0).scores
    q80, q50 = np.quantile(scores, [0.8, 0.5]).tolist()
    rules = RuleTable.of([Rule(name="hot", above=q80, rearm_below=q50)], version=1)
    run = replay(batches_of(events, 64, tuple(old.input_names)), old, rules, KEEP)
    gap_ms = SESSION_GAP * 1000
    checked = moved = 0
    for action, e in list(zip(run.actions, run.action_events, strict=True))[:30]:
        mine = [events[i] for i in range(e + 1) if events[i]["user_id"] == action.user_id]
        kept = extended(Recent(), [x["ts"] for x in mine], [x["type"] for x in mine], KEEP, gap_ms)
        session = mine[len(mine) - len(kept) :]
        full = reference_replay(old.model, kept.prev_ts, session)
        deltas = np.array([full - reference_replay(old.model, kept.prev_ts,
                                                   session[:j] + session[j + 1 :])
                           for j in range(len(session))])  # fmt: skip
        reasons = json.loads(action.reasons)
        top = sorted(range(len(session)), key=lambda j: (-abs(deltas[j]), -j))[: len(reasons)]
        assert [(r["type"], r["ts"]) for r in reasons] == [
            (session[j]["type"], session[j]["ts"]) for j in top
        ], (reasons, deltas)
        np.testing.assert_allclose([r["delta"] for r in reasons], deltas[top], atol=1e-5)
        assert math.isclose(action.score, full, abs_tol=2e-5)
        blind = [{"type": x["type"], "ts": x["ts"]} for x in session]  # the inputs missing
        moved += abs(reference_replay(old.model, kept.prev_ts, blind) - full) > 1e-3
        checked += 1
    assert checked >= 15 and moved >= checked // 2


def test_a_shadows_item_memories_are_kept_with_the_states(new):
    """A type-only current model and a shadow with an item input: the states keep the
    shadow's item memories, as its own run would, so its flags hold across batches."""
    plain = ScoringModel(random_model(TYPES, hidden=6, features=["gap"], seed=9,
                                      session_gap_seconds=SESSION_GAP), version="T")  # fmt: skip
    events = rich_events(200, seed=6)
    run = Run()
    for b in batches_of(events, 15, tuple(new.input_names)):
        run.batch(b, plain, new)
    alone = live(events, new, size=15)
    users = sorted({e["user_id"] for e in events})
    kept = [k[11] for k in run.cache.lookup(0, users)]
    want = [k[11] for k in alone.cache.lookup(0, users)]
    assert kept == want and all(kept)
