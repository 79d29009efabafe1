"""A node's round's states completed as one (StateReader.complete_all): each batch's view is
the UserStates `complete` gives its read alone, field by field (resets by reason, rows to
replay and to rewrite, the shadow's), and the whole is them joined in order; through every
kind of stored state, cached states, and a shadow model."""

from __future__ import annotations

import copy
import time
from dataclasses import fields
from itertools import chain

import numpy as np
import pytest

from tests.test_joint_build import same
from worker.common.keys import Keys
from worker.engine.adapters.states import FIELDS, WRONG_TYPE, StateReader
from worker.engine.compute.state_cache import StateCache
from worker.engine.compute.user_states import ShadowStates, UserStates

SHAPE, SHADOW = (1, 4), ((1, 3), "S")


def row(rng: np.random.Generator, kind: str) -> list:
    """A state's FIELDS as read, of one kind."""
    h = rng.standard_normal(SHAPE).astype("<f4")
    state = dict.fromkeys(FIELDS)
    state.update(h=h.tobytes(), last_id=b"%d-0" % rng.integers(1, 99), last_ts=b"1700",
                 model=b"A", n=b"3", event_ids=b"e1 e2", score=b"0.25", rules=b"r",
                 items=b"")  # fmt: skip
    if kind == "absent":
        return [None] * len(FIELDS)
    if kind == "wrong_type":
        return [WRONG_TYPE] + [None] * (len(FIELDS) - 1)
    if kind == "other_space":
        state["model"] = b"B"
    elif kind == "wrong_size":
        state["h"] = b"\0" * 3
    elif kind == "not_finite":
        state["h"] = np.full(SHAPE, np.nan, "<f4").tobytes()
    elif kind == "bad_id":
        state["last_id"] = b"x"
    elif kind == "shadowed":
        state.update(shadow_h=rng.standard_normal(SHADOW[0]).astype("<f4").tobytes(),
                     shadow_model=b"S", shadow_score=b"0.5", shadow_rules=b"q")  # fmt: skip
    elif kind == "bad_lean":
        state.update(s=b"not a packed state", last_id=None)
    return [state[f] for f in FIELDS]


KINDS = ["valid", "absent", "wrong_type", "other_space", "wrong_size", "not_finite", "bad_id",
         "shadowed", "bad_lean"]  # fmt: skip


def cached(rng: np.random.Generator) -> tuple:
    """A state as the cache keeps it (a commit's)."""
    h = rng.standard_normal(SHAPE).astype("<f4").tobytes()
    return (h, 1700, (7, 0), 2, b"e9", b"", 0.75, None, float("nan"), b"", b"", b"",
            time.monotonic())  # fmt: skip


def reader(rng: np.random.Generator) -> StateReader:
    cache = StateCache(1000)
    for p in range(3):
        cache.store(p, b"%d" % (10 + p), {f"p{p}-hit{i}": cached(rng) for i in range(2)})
    return StateReader(None, Keys("t"), cache, lambda version: version)  # type: ignore[arg-type]


def fields_equal(a: UserStates, b: UserStates) -> None:
    for f in fields(UserStates):
        if f.name != "shadow":
            assert same(getattr(a, f.name), getattr(b, f.name)), f.name
    assert (a.shadow is None) == (b.shadow is None)
    if a.shadow is not None:
        for f in fields(ShadowStates):
            assert same(getattr(a.shadow, f.name), getattr(b.shadow, f.name)), f.name


@pytest.mark.parametrize("shadow", [None, SHADOW])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_batchs_view_is_its_states_completed_alone(seed, shadow):
    rng = np.random.default_rng(seed)
    states = reader(rng)
    requests, flats = [], []
    for p in range(3):
        users = [f"p{p}-u{i}" for i in range(int(rng.integers(1, 6)))]
        users += [f"p{p}-hit{i}" for i in range(2) if rng.random() < 0.5]  # cached
        if p == seed % 3:
            users = [f"p{p}-hit1", f"p{p}-hit0"]  # all known: no read
        rng.shuffle(users)
        request = states.request(p, users)
        seq = request.seq or b"%d" % (10 + p)
        kinds = [KINDS[i % len(KINDS)] for i in request.misses]
        read = states.command(request) is not None
        flats.append([seq, *(x for kind in kinds for x in row(rng, kind))] if read else None)
        requests.append(request)
    assert None in flats
    alone = [states.complete(r, copy.deepcopy(f), SHAPE, "A", shadow)
             for r, f in zip(requests, flats, strict=True)]  # fmt: skip
    whole, each = states.complete_all(requests, flats, SHAPE, "A", shadow)
    for a, b in zip(alone, each, strict=True):
        fields_equal(a, b)
    assert sum((s.resets for s in alone), start=type(alone[0].resets)()) == whole.resets
    starts = np.cumsum([0, *(len(s.users) for s in alone)]).tolist()
    for f in fields(UserStates):
        mine = getattr(whole, f.name)
        if f.name in ("replay", "rewrite"):
            assert mine == [r + at for s, at in zip(alone, starts, strict=False)
                            for r in getattr(s, f.name)], f.name  # fmt: skip
        elif f.name not in ("seq", "resets", "shadow"):
            theirs = [getattr(s, f.name) for s in alone]
            joined = np.concatenate(theirs) if isinstance(mine, np.ndarray) else [*chain(*theirs)]
            assert same(mine, joined), f.name
    if shadow is not None:
        assert same(whole.shadow.h, np.concatenate([s.shadow.h for s in alone]))
        assert whole.shadow.replay == [r + at for s, at in zip(alone, starts, strict=False)
                                       for r in s.shadow.replay]  # fmt: skip
    # the views are of the whole: the pipeline's advance of the whole is each batch's
    whole.h += 1
    assert same(each[-1].h, alone[-1].h + 1)


def test_the_reads_every_kind_came_through():
    """The kinds above each give what the read makes of them (so the comparison covers them)."""
    rng = np.random.default_rng(0)
    states = reader(rng)
    request = states.request(5, [f"u{i}" for i in range(len(KINDS))])
    flat = [b"1", *(x for kind in KINDS for x in row(rng, kind))]
    got = states.complete_all([request], [flat], SHAPE, "A", SHADOW)[0]
    assert got.resets == {"wrong_type": 1, "model": 1, "invalid": 4}
    assert got.rewrite == [KINDS.index("bad_lean")] and got.n[KINDS.index("valid")] == 3
    assert got.shadow is not None and got.shadow.score[KINDS.index("shadowed")] == 0.5


def test_a_moved_sequence_or_a_state_in_flight_is_completed_alone():
    rng = np.random.default_rng(0)
    states = reader(rng)
    request = states.request(0, ["p0-hit0", "new"])  # the cache holds p0 at b"10"
    moved = [b"11", *row(rng, "absent")]
    assert states.complete(request, moved, SHAPE, "A") is None
    assert states.complete_all([request], [moved], SHAPE, "A") is None
    pending = states.request(1, ["a", "b"], in_flight={"a"}, in_flight_seq=b"11")
    assert states.complete_all([pending], [[b"11", *row(rng, "absent")]], SHAPE, "A") is None
