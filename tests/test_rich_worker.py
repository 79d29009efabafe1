"""A worker scoring events with declared inputs (a format 2 model: price, brand, product) gives
the scores `intentstream score` gives, through restarts that carry each user's item memory in
their state, with fields sent flat or in a `json` object, missing or unusable."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model.artifact import load_model, save_model
from model.random_init import random_model
from tests.actions_check import action_entries
from tests.conftest import NO_TEST_USERS, run_cli
from tests.offline import offline_scores
from tests.test_actions_live import as_entries
from tests.test_worker import scrape
from tests.workers import WorkerProcess, count_scores, score_entries, wait_for
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.common.local_redis import free_port
from worker.engine.compute.lean_state import as_fields
from worker.lifecycle.history import read_history
from worker.rules.definition import make_rule
from worker.rules.store import set_rule

pytestmark = pytest.mark.integration

P = 2
TYPES = ["view", "add_to_cart", "purchase"]
INPUTS = [
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 3.0, "scale": 1.5},
    {"kind": "categorical", "name": "brand", "buckets": 32, "dim": 4},
    {"kind": "item", "name": "product_id", "buckets": 64, "dim": 4},
]


def rich_events(n: int, seed: int) -> list[dict]:
    """Events of 20 users revisiting a few products; some prices missing or not numbers."""
    rng = np.random.default_rng(seed)
    t = 1_700_000_000_000
    out = []
    for i in range(n):
        t += int(rng.integers(1_000, 20_000))
        e = {"user_id": f"u{rng.integers(20)}", "type": str(rng.choice(TYPES)), "ts": t,
             "event_id": f"e{i}", "product_id": f"p{rng.integers(6)}",
             "brand": str(rng.choice(["acme", "globex", "initech"]))}  # fmt: skip
        price = rng.random()
        if price < 0.1:
            e["price"] = "n/a"  # unusable: the input's default, counted
        elif price > 0.2:
            e["price"] = f"{rng.uniform(1, 500):.2f}"
        if i % 7 == 0:
            del e["product_id"]  # an event without the item
        out.append(e)
    return out


def publish_raw(r, events: list[dict]) -> None:
    """Plain XADDs as a producer sends them: every third one as a `json` object."""
    for k, e in enumerate(events):
        stream = f"intentstream:events:{{{partition_of(e['user_id'], P)}}}"
        if k % 3 == 0:
            r.xadd(stream, {"json": json.dumps(e)})
        else:
            r.xadd(stream, {key: str(v) for key, v in e.items()})


def assert_worker_scored_as_score_does(r, path, events: list[dict]) -> dict[str, float]:
    """The worker's score entries are `intentstream score`'s scores of the same events (as
    JSON lines), matched by event id; returns score's, by event id."""
    offline = offline_scores(path, events)
    want = {e["event_id"]: s for e, s in zip(events, offline, strict=True)}
    got = {row["event_id"]: float(row["score"]) for row in score_entries(r, partitions=P)}
    assert set(got) == set(want)
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), atol=2e-5)
    return want


def test_the_worker_scores_declared_inputs_as_score_does_across_restarts(redis_server, tmp_path):
    model = random_model(TYPES, hidden=8, features=["gap"], seed=5, inputs=INPUTS,
                         session_gap_seconds=60.0)  # fmt: skip
    path = tmp_path / "rich.npz"
    save_model(model, path)
    events = rich_events(600, seed=3)
    r = connect(redis_server.url)
    port = free_port()
    args = ["--partitions", str(P), "--batch-size", "37"]
    set_rule(r, Keys(), make_rule(name="first", above=0.0, rearm_below=0.0))  # reasons too
    publish_raw(r, events[:300])
    # the first worker writes the lean layout (item memories inside `s`), the second the
    # full one: it reads them from there
    first = WorkerProcess(redis_server.url, path, tmp_path / "w.log", *args, "--layout",
                          "lean").start()  # fmt: skip
    try:
        wait_for(lambda: count_scores(r, partitions=P) >= 300, what="the first half")
    finally:
        assert first.terminate() == 0
    publish_raw(r, events[300:])  # a new process: the item memories come from the states
    second = WorkerProcess(redis_server.url, path, tmp_path / "w2.log", *args, "--metrics-port",
                           str(port)).start()  # fmt: skip
    try:
        wait_for(lambda: count_scores(r, partitions=P) >= len(events), what="all scores")
        metrics = scrape(port)
    finally:
        assert second.terminate() == 0

    assert_worker_scored_as_score_does(r, path, events)
    # the item memory is in the state, packed per input
    some = as_fields(r.hgetall(f"intentstream:state:{{{partition_of('u1', P)}}}:u1"))
    assert b"product_id" in some.get(b"items", b"")
    assert metrics.get('intentstream_input_values_total{input="price",outcome="bad"}', 0) > 0
    assert sum(r.xlen(f"intentstream:actions:{{{p}}}") for p in range(P)) > 10
    # the backtest replays the retained events with their fields: the same actions, each
    # with the same reasons, as the two workers wrote
    report = run_cli("rules", "backtest", "--redis-url", redis_server.url, "--from-redis",
                     "--model", str(path), "--json")  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert as_entries(json.loads(report.stdout)) == action_entries(r, P)


def test_train_from_redis_reads_the_declared_inputs_the_streams_carry(redis_server, tmp_path):
    events = rich_events(400, seed=4)
    r = connect(redis_server.url)
    publish_raw(r, events)  # flat fields and `json` objects, as producers send them
    read, skipped = read_history(r, "intentstream", P, fields=["price", "product_id", "x"])
    assert skipped == 0 and len(read) == len(events)
    by_user = {}
    for e in read:
        by_user.setdefault(e["user_id"], []).append(e)
    for e in events:  # a user's events keep their order (one partition per user)
        got = by_user[e["user_id"]].pop(0)
        assert (got["type"], got["ts"]) == (e["type"], e["ts"])
        want = {k: str(e[k]) for k in ("price", "product_id") if k in e}
        assert {k: v for k, v in got.items() if k not in ("user_id", "type", "ts")} == want
    every = read_history(r, "intentstream", P, fields=None)[0]
    assert sum("brand" in e for e in every) == len(events)

    out = tmp_path / "m.npz"
    result = run_cli(
        "train", "--from-redis", "--redis-url", redis_server.url, "--partitions", str(P),
        "--hidden", "8", "--epochs", "1", "--session-gap", "60", "--item", "product_id",
        "--numeric", "price:log1p", "--buckets", "16", "--input-dim", "2", "--out", str(out),
        *NO_TEST_USERS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    prices = [np.log1p(float(e["price"])) for e in events if e.get("price", "n/a") != "n/a"]
    fitted = load_model(out).inputs
    price = next(spec for spec in fitted if spec.name == "price")
    assert price.mean == pytest.approx(np.mean(prices), abs=0.3)  # fitted on training users
    assert [spec.name for spec in fitted] == ["price", "product_id"]


def typed_events(n: int, seed: int) -> list[dict]:
    """Events as a shop's JSON carries them: prices as numbers (some whole: 12.0), product ids
    as integers, a boolean brand now and then, a null, a nested object no model reads."""
    rng = np.random.default_rng(seed)
    t = 1_700_000_000_000
    out = []
    for i in range(n):
        t += int(rng.integers(1_000, 20_000))
        e = {"user_id": f"u{rng.integers(15)}", "type": str(rng.choice(TYPES)), "ts": t,
             "event_id": f"t{i}", "product_id": int(rng.integers(8)),
             "price": float(rng.choice([12.0, 9.99, 250.0, 0.5])),
             "brand": str(rng.choice(["acme", "globex"])), "ctx": {"page": i}}  # fmt: skip
        if i % 5 == 0:
            e["brand"] = True
        if i % 6 == 0:
            e["price"] = None
        out.append(e)
    return out


def test_events_sent_by_intentstream_publish_carry_their_inputs(redis_server, tmp_path):
    """`intentstream publish` of JSON lines sends the fields models declare: the worker then
    scores them as `intentstream score` scores the same file."""
    model = random_model(TYPES, hidden=8, features=["gap"], seed=6, inputs=INPUTS,
                         session_gap_seconds=60.0)  # fmt: skip
    path = tmp_path / "rich.npz"
    save_model(model, path)
    events = typed_events(300, seed=8)
    lines = "\n".join(json.dumps(e) for e in events)
    sent = run_cli("publish", "--redis-url", redis_server.url, "--partitions", str(P),
                   stdin=lines)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    r = connect(redis_server.url)
    worker = WorkerProcess(redis_server.url, path, tmp_path / "w.log", "--partitions",
                           str(P)).start()  # fmt: skip
    try:
        wait_for(lambda: count_scores(r, partitions=P) >= len(events), what="all scores")
    finally:
        assert worker.terminate() == 0
    want = assert_worker_scored_as_score_does(r, path, events)
    # the fields as sent: whole prices as their digits, booleans as their text, no nested
    # object, no null
    entries = [f for p in range(P) for _, f in r.xrange(f"intentstream:events:{{{p}}}")]
    assert {f.get(b"price") for f in entries} == {b"12", b"9.99", b"250", b"0.5", None}
    assert b"True" in {f.get(b"brand") for f in entries}
    assert not any(b"ctx" in f for f in entries)
    # without the fields the scores would differ: the inputs are read, not defaulted
    bare = offline_scores(path, [{k: e[k] for k in ("user_id", "type", "ts")} for e in events])
    assert bare != list(want.values())
