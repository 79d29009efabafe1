"""A numeric input's session statistics (model/session_stats.py): the running mean, minimum
and maximum of its standardised value, kept per user in the state's memory rows; every
path's agreement is in tests/test_conformance.py (its `-stats` cases)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.artifact import WIDE_HEAD, load_model, save_model, state_shape, statistics_rows
from model.inputs import STATS_FLOATS, input_columns, input_width, parse_inputs
from model.random_init import random_model
from model.scoring import InMemoryScorer, ScoringModel
from model.session_stats import write_session_stats
from model.training.train import TrainConfig, train
from tests.conftest import run_cli
from tests.statistics_weights import with_statistics_weights

TYPES = ["view", "cart", "purchase"]
PRICE = {"kind": "numeric", "name": "price", "transform": "none", "mean": 0.0, "scale": 1.0}


def empty_stats(n_users: int) -> np.ndarray:
    return np.zeros((n_users, STATS_FLOATS), np.float32)


def stats_of(values: list[float | None], new: list[bool], slot: list[int] | None = None,
             stats: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The kernel's three columns for a batch of values (None: missing)."""
    n = len(values)
    x = np.zeros((n, 5), np.float32)
    x[:, 0] = [0.0 if v is None else v for v in values]
    x[:, 1] = [v is None for v in values]
    slot_ = np.zeros(n, np.int64) if slot is None else np.array(slot, np.int64)
    stats = empty_stats(int(slot_.max(initial=0)) + 1) if stats is None else stats
    write_session_stats(x, 0, slot_, np.array(new, np.bool_), stats)
    return x[:, 2:]


def reference(values, new, slot) -> np.ndarray:
    """The three columns from a plain list of each user's session values."""
    kept: dict[int, list[float]] = {}
    out = []
    for v, n, s in zip(values, new, slot, strict=True):
        mine = kept.setdefault(s, [])
        if n:
            mine.clear()
        if v is not None:
            mine.append(float(np.float32(v)))
        out.append([np.mean(mine), min(mine), max(mine)] if mine else [0.0] * 3)
    return np.array(out).reshape(len(values), 3)


def test_the_statistics_hand_case():
    # one user: 2, missing, 4, 0 | a new session: missing, 1
    got = stats_of([2.0, None, 4.0, 0.0, None, 1.0], [False, False, False, False, True, False])
    assert got.tolist() == [[2, 2, 2], [2, 2, 2], [3, 2, 4], [2, 0, 4], [0, 0, 0], [1, 1, 1]]


events_st = st.lists(
    st.tuples(
        st.integers(0, 3),  # slot
        st.one_of(st.none(), st.floats(-3, 3, width=32)),  # a value, or missing
        st.integers(0, 5).map(lambda i: i == 0),  # a new session now and then
    ),
    max_size=100,
)


@settings(max_examples=100, deadline=None)
@given(events=events_st, cuts=st.lists(st.integers(0, 100), max_size=4))
def test_split_batches_equal_one_pass_and_the_reference(events, cuts):
    """Batches split at random points, the statistics carried between them (as the state's
    rows are committed), give one pass's columns and the plain reference's."""
    slot = [e[0] for e in events]
    values = [e[1] for e in events]
    new = [e[2] for e in events]
    whole = stats_of(values, new, slot, empty_stats(4))
    np.testing.assert_allclose(whole, reference(values, new, slot), rtol=1e-5, atol=1e-5)
    carried, parts = empty_stats(4), []
    bounds = [0, *sorted(c for c in cuts if c <= len(events)), len(events)]
    for a, b in itertools.pairwise(bounds):
        parts.append(stats_of(values[a:b], new[a:b], slot[a:b], carried))
    np.testing.assert_array_equal(np.concatenate([whole[:0], *parts]), whole)


def test_a_declaration_with_session_adds_three_columns_and_dumps_as_before_without():
    plain, stats = parse_inputs([PRICE]), parse_inputs([PRICE | {"session": True}])
    assert input_width(plain) == 2 and input_width(stats) == 5
    assert input_columns(stats) == ["price.value", "price.missing", "price.session_mean",
                                    "price.session_min", "price.session_max"]  # fmt: skip
    assert "session" not in plain[0].model_dump()  # an older artifact's meta is unchanged
    assert stats[0].model_dump()["session"] is True


@pytest.mark.parametrize("cell", ["rnn", "lstm"])
def test_the_state_keeps_the_statistics_in_memory_rows_across_batches(cell, tmp_path):
    """A model without session features gets memory rows for the statistics alone; scoring
    a user's events one batch at a time, through a saved and loaded artifact, gives the
    scores of one batch."""
    declared = [PRICE | {"session": True, "transform": "log1p"}]
    m = random_model(TYPES, hidden=2, features=["gap"], seed=4, cell=cell, inputs=declared,
                     session_gap_seconds=600, wide_head=True)  # fmt: skip
    m = with_statistics_weights(m)
    width = state_shape(m.meta)[1]
    assert state_shape(m.meta) == (1 + -(-4 // width), width)
    path = tmp_path / "m.npz"
    save_model(m, path)
    model = ScoringModel(load_model(path))
    users = ["a", "b", "a", "a", "b", "a"]
    types = ["view", "view", "cart", "view", "view", "view"]
    ts = np.array([0, 1_000, 2_000, 3_000, 4_000, 2_000_000], np.int64)  # the last: a new session
    prices = ["10", "99", "3", None, "7", "50"]
    whole = InMemoryScorer(model).score(users, types, ts, {"price": prices})
    one_by_one = InMemoryScorer(model)
    parts = [one_by_one.score(users[i : i + 1], types[i : i + 1], ts[i : i + 1],
                              {"price": prices[i : i + 1]}) for i in range(len(users))]  # fmt: skip
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-6)
    plain = [PRICE | {"transform": "log1p"}]
    without = random_model(TYPES, hidden=2, features=["gap"], seed=4, cell=cell, inputs=plain)
    assert state_shape(without.meta) == (1, width)


@pytest.mark.integration
def test_the_cli_declares_the_statistics_and_refuses_a_bad_option(tmp_path):
    out = tmp_path / "m.npz"
    run = run_cli("model", "init", "--event-types", "view,cart", "--hidden", "4",
                  "--numeric", "price:log1p:session,qty:session", "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    inputs = load_model(out).inputs
    assert [(s.name, s.transform, s.session) for s in inputs] == [
        ("price", "log1p", True), ("qty", "none", True)]  # fmt: skip
    for bad in ("price:session:session", "price:log1p:none", "price:sqrt", ":session"):
        run = run_cli("model", "init", "--event-types", "view", "--numeric", bad,
                      "--out", str(tmp_path / "bad.npz"))  # fmt: skip
        assert run.returncode == 2, bad
        assert run.stderr.count("\n") == 1 and "--numeric" in run.stderr, run.stderr
        assert not (tmp_path / "bad.npz").exists()


@pytest.mark.parametrize("cell", ["rnn", "gru"])
def test_a_model_with_statistics_starts_as_the_model_without_them(cell):
    """random_model draws every other weight as it would without the statistics and starts
    their rows at 0: a run with and without them differs by them alone."""
    declared = [PRICE, {"kind": "item", "name": "sku", "buckets": 8, "dim": 2},
                PRICE | {"name": "qty"}]  # fmt: skip
    stats = [declared[0] | {"session": True}, declared[1], declared[2] | {"session": True}]
    plain = random_model(TYPES, hidden=3, features=["gap"], seed=2, cell=cell, inputs=declared,
                         wide_head=True)  # fmt: skip
    m = random_model(TYPES, hidden=3, features=["gap"], seed=2, cell=cell, inputs=stats,
                     wide_head=True)  # fmt: skip
    rows = statistics_rows(m.meta)
    assert rows.tolist() == [1 + 2, 1 + 3, 1 + 4, 1 + 5 + 4 + 2, 1 + 5 + 4 + 3, 1 + 5 + 4 + 4]
    D = m.arrays["embedding"].shape[1]
    for name, want in plain.arrays.items():
        got = m.arrays[name]
        if got.shape == want.shape:
            np.testing.assert_array_equal(got, want, err_msg=name)
            continue
        at = rows if name == WIDE_HEAD else D + rows
        assert not got[at].any(), name
        np.testing.assert_array_equal(np.delete(got, at, axis=0), want, err_msg=name)


def test_with_a_wide_head_training_leaves_the_statistics_to_the_wide_part():
    """Layer 0's rows for the statistics stay 0 through training; the wide part reads them."""
    rng = np.random.default_rng(3)
    events = []
    for u in range(160):
        buyer, ts = u % 4 == 0, 1_000_000
        for k in range(int(rng.integers(2, 7))):
            ts += 30_000
            price = float(rng.uniform(50, 80) if buyer and k else rng.uniform(5, 60))
            events.append({"user_id": f"u{u}", "type": "view", "ts": ts, "price": price})
        if buyer:
            events.append({"user_id": f"u{u}", "type": "purchase", "ts": ts + 1_000})
    price = {"kind": "numeric", "name": "price", "transform": "log1p", "session": True}
    config = TrainConfig(hidden=4, epochs=2, wide_head=True, test_fraction=0.0, calibrate=False,
                         min_type_count=1, inputs=[price])  # fmt: skip
    model = train(events, config).model
    rows = statistics_rows(model.meta)
    D = model.arrays["embedding"].shape[1]
    assert not model.arrays["layer0.W_xh"][D + rows].any()
    assert model.arrays[WIDE_HEAD][rows].any()
