"""`intentstream explain USER`: the installed script's reasons equal `leave_one_out` over the
user's kept session, for a state a real worker wrote and for hand-built ones; and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model.artifact import Model, file_version, save_model
from model.explain import Session, leave_one_out
from model.random_init import random_model
from model.scoring import ScoringModel
from tests.conftest import run_cli
from tests.workers import WorkerProcess, count_scores, wait_for
from worker.commands.explain import shown_input
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.engine.compute.recent import Recent, pack
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish

TYPES = ["view", "search", "add_to_cart", "coupon", "checkout", "purchase"]
T0 = 1_700_000_000_000
PARTITIONS = 3


def a_model(seed: int, cell: str = "gru") -> Model:
    return random_model(
        TYPES, hidden=8, features=["gap"], session_gap_seconds=60, seed=seed, cell=cell
    )


def explain(redis_server, *args: str):
    return run_cli("explain", *args, "--redis-url", redis_server.url)


def explained(redis_server, user: str, *args: str) -> dict:
    out = explain(redis_server, user, "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def expected(model: Model, recent: Recent):
    (ex,) = leave_one_out(ScoringModel(model), [Session(recent.prev_ts, recent.types, recent.ts)])
    return ex


def assert_report_is(report: dict, ex, recent: Recent) -> None:
    assert report["score_all"] == pytest.approx(ex.score_all, abs=1e-6)
    assert [e["type"] for e in report["events"]] == recent.types
    assert [e["ts"] for e in report["events"]] == recent.ts
    np.testing.assert_allclose([e["delta"] for e in report["events"]], ex.deltas, atol=1e-6)
    np.testing.assert_allclose(
        [e["score_without"] for e in report["events"]], ex.scores_without, atol=1e-6
    )
    top = ex.top()
    assert [r["position"] for r in report["reasons"]] == [r.position for r in top]
    ranks = {e["position"]: e["reason"] for e in report["events"] if e["reason"] is not None}
    assert ranks == {r.position: k for k, r in enumerate(top, start=1)}


def write_state(r, user: str, recent: Recent, score: float, model: str) -> None:
    p = partition_of(user, PARTITIONS)
    r.hset(
        Keys().state(p, user),
        mapping={"h": b"\0" * 32, "score": repr(score), "model": model, "recent": pack(recent)},
    )


def test_explains_the_session_a_worker_kept(redis_server, tmp_path: Path):
    model = a_model(1)
    path = tmp_path / "m.npz"
    save_model(model, path)
    steps = [0, 4_000, 4_000, 30_000, 0, 2_000]  # a repeated time
    ts = (T0 + np.cumsum(steps)).tolist()
    kinds = ["view", "search", "add_to_cart", "view", "coupon", "checkout"]
    events = [{"user_id": "alice", "type": k, "ts": t} for k, t in zip(kinds, ts, strict=True)]
    events.append({"user_id": "bob", "type": "view", "ts": T0})
    r = connect(redis_server.url)
    publish(r, events, partitions=PARTITIONS)
    worker = WorkerProcess(
        redis_server.url, path, tmp_path / "w.log", "--partitions", str(PARTITIONS)
    ).start()
    try:
        wait_for(lambda: count_scores(r, partitions=PARTITIONS) == 7, what="7 scores")
    finally:
        assert worker.terminate() == 0

    report = explained(redis_server, "alice", "--model", str(path))
    recent = Recent.of(-1, ts, kinds)
    assert_report_is(report, expected(model, recent), recent)
    assert report["partition"] == partition_of("alice", PARTITIONS)
    assert report["partitions"] == PARTITIONS
    assert report["model"] == report["state_model"] == file_version(model, path)
    # the whole session was kept and the model is the worker's: the replay is the stored score
    assert report["history_complete"] and report["same_score"] and report["notes"] == []
    assert report["stored_score"] == pytest.approx(report["score_all"], abs=1e-5)
    assert len(report["reasons"]) == 3

    table = explain(redis_server, "alice", "--model", str(path))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "user 'alice'" in lines[0] and f"of {PARTITIONS}" in lines[0]
    assert "score with all 6 events" in lines[1] and "(the stored score)" in lines[1]
    rows = lines[4:10]
    assert [row.split()[1] for row in rows] == kinds
    assert "2023-11-14T22:13:20.000Z" in rows[0]
    assert sorted(row.split()[-1] for row in rows if "*" in row) == ["*1", "*2", "*3"]

    one = explained(redis_server, "bob", "--model", str(path))
    (only,) = one["events"]
    assert only["reason"] == 1 and only["delta"] == pytest.approx(
        one["score_all"] - only["score_without"]
    )


def test_the_registry_current_model_and_the_notes(redis_server):
    r = connect(redis_server.url)
    r.hset(Keys().config, "partitions", PARTITIONS)
    registry = Registry(r)
    registry.publish_model(a_model(2, "rnn"))
    current = a_model(3)
    version = registry.publish_model(current, promote=True)
    # a history cut by history-events (its first gap is inside the session), stored by v1
    recent = Recent.of(T0 - 10_000, [T0, T0 + 5_000, T0 + 5_000, T0 + 90_000],
                       ["search", "coupon", "view", "checkout"])  # fmt: skip
    write_state(r, "carol", recent, 0.5, "1")
    report = explained(redis_server, "carol")
    assert report["model"] == version and report["state_model"] == "1"
    assert_report_is(report, expected(current, recent), recent)
    assert not report["history_complete"] and not report["same_score"]
    assert report["stored_score"] == 0.5 and len(report["notes"]) == 2
    table = explain(redis_server, "carol").stdout
    assert "computed by model 1, these replays use model 2" in table
    assert "history-events bounds them" in table and "differs from the stored score" in table

    # a session that started after a long gap, replayed by the model that stored it
    fresh = Recent.of(T0 - 3_600_000, [T0, T0 + 1_000], ["view", "purchase"])
    score = expected(current, fresh).score_all
    write_state(r, "dan", fresh, score, version)
    report = explained(redis_server, "dan")
    assert report["history_complete"] and report["same_score"] and report["notes"] == []


def test_errors(redis_server, tmp_path: Path):
    r = connect(redis_server.url)
    r.hset(Keys().config, "partitions", PARTITIONS)
    unknown = explain(redis_server, "nobody")
    assert unknown.returncode == 2  # as an unknown rule or version: exit 1 is for skipped input
    assert unknown.stderr == "error: no state for user 'nobody' under prefix 'intentstream'\n"

    write_state(r, "erin", Recent(), 0.3, "1")  # history-events 0: an empty `recent`
    empty = explain(redis_server, "erin")
    assert empty.returncode == 2 and "has no recent events kept" in empty.stderr
    assert empty.stderr.count("\n") == 1 and empty.stdout == ""

    recent = Recent.of(-1, [T0], ["view"])
    write_state(r, "fay", recent, 0.3, "1")
    no_model = explain(redis_server, "fay")
    assert no_model.returncode == 2
    assert no_model.stderr == (
        "error: no current model in the registry (promote one, or give --model FILE)\n"
    )
    missing = explain(redis_server, "fay", "--model", str(tmp_path / "absent.npz"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: ")
    assert missing.stderr.count("\n") == 1

    r.set(Keys().state(partition_of("gus", PARTITIONS), "gus"), "a string")
    wrong = explain(redis_server, "gus")
    assert wrong.returncode == 2 and "WRONGTYPE" in wrong.stderr

    down = run_cli("explain", "fay", "--redis-url", "redis://127.0.0.1:1")
    assert down.returncode == 2 and "is unreachable" in down.stderr


def test_kept_inputs_are_shown_as_numbers_hashes_or_nothing():
    assert shown_input(None) == "-"
    assert shown_input(12.5) == "12.5" and shown_input(1234567.0) == "1.23457e+06"
    assert shown_input("not a number") == "bad"
    assert shown_input({"hash": 3_000_000_000}) == "#b2d05e00"


def test_explains_a_rich_models_user_with_the_inputs_it_scored(redis_server, tmp_path: Path):
    """A format 2 model's user: the replay with the kept inputs is the stored score; a history
    without them (the layout before inputs) replays them as missing, and says so."""
    from tests.test_pipeline_inputs import SESSION_GAP, declared, live, rich_events
    from tests.test_pipeline_inputs import TYPES as RICH_TYPES
    from worker.engine.compute.actions import session_of
    from worker.engine.compute.recent import unpack

    inputs = declared(brand_buckets=16, item_buckets=32)
    model = random_model(RICH_TYPES, hidden=6, features=["gap"], seed=1, inputs=inputs,
                         session_gap_seconds=SESSION_GAP)  # fmt: skip
    path = tmp_path / "rich.npz"
    save_model(model, path)
    scoring = ScoringModel(model, version=file_version(model, path))
    events = [e for e in rich_events(200, seed=7) if e["user_id"] in ("u1", "u2")]
    (state,) = live(events, scoring).cache.lookup(0, ["u1"])
    assert state is not None
    recent, score = unpack(state[5]), state[6]
    assert len(recent) >= 4 and recent.fields
    r = connect(redis_server.url)
    r.hset(Keys().config, "partitions", PARTITIONS)
    write_state(r, "u1", recent, score, scoring.version)

    report = explained(redis_server, "u1", "--model", str(path))
    (ex,) = leave_one_out(scoring, [session_of(recent, scoring)])
    assert_report_is(report, ex, recent)
    assert report["same_score"] and report["inputs_missing"] == [] and report["notes"] == []
    # each event lists the kept values: the number, or the hash (the raw value is not kept)
    kept = session_of(recent, scoring).inputs
    for j, event in enumerate(report["events"]):
        price, brand = kept["price"].values[j], kept["brand"].values[j]
        number = None if np.isnan(price) else "not a number" if np.isinf(price) else price
        assert event["inputs"]["price"] == number
        assert event["inputs"]["brand"] == (None if brand < 0 else {"hash": int(brand)})
    products = [e["inputs"]["product"] for e in report["events"]]
    assert None in products and any(isinstance(p, dict) for p in products)
    # the table shows them too: a column per input
    table = run_cli("explain", "u1", "--redis-url", redis_server.url, "--model", str(path))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("#"))
    assert all(name in header for name in ("price", "brand", "product"))
    rows = lines[lines.index(header) + 1 : lines.index(header) + 1 + len(report["events"])]
    for row, event in zip(rows, report["events"], strict=True):
        assert shown_input(event["inputs"]["product"]) in row.split()

    write_state(r, "u1", Recent(recent.prev_ts, recent.ts_raw, recent.names), score,
                scoring.version)  # fmt: skip
    bare = explained(redis_server, "u1", "--model", str(path))
    assert bare["inputs_missing"] == ["price", "brand", "product"]
    assert any("replay as missing" in n for n in bare["notes"])
    assert abs(bare["score_all"] - report["score_all"]) > 1e-4
